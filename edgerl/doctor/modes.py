"""``edgerl doctor --deep``'s update modes: a learner whose update runs in modes (its kind's
``update_modes``: DQN's) makes a few updates on the same batches, from the same weights, in every
mode that applies to the device (eager NCHW, channels_last, each autocast dtype, CUDA graph), and
each mode's losses must match its reference's (a CUDA graph's weights too: the graph must compute
what eager updates compute)."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from edgerl.doctor.core import Check, Context
from edgerl.doctor.deep_state import UPDATES, DeepState, Outcome

# How closely a mode's first loss (same weights, same batch: the forward pass alone) must match
# its reference's, relative. fp32 on the CPU differs only by the order of sums; on CUDA, TF32 (on,
# as in training) leaves ~1e-3; autocast ~1e-2. Later losses are not compared across precisions:
# Adam moves every weight by about lr whatever the gradient's size, so a rounding difference in a
# tiny gradient moves a weight as much as a real one does.
FP32_CPU_RTOL = 1e-4
FP32_CUDA_RTOL = 2e-2
AMP_RTOL = 5e-2
# A CUDA graph replays the kernels of the eager update it captured: every loss must match, and the
# weights to within one Adam step (lr).
GRAPH_RTOL = 1e-3


@dataclass(frozen=True)
class Mode:
    """One way to run the update, and the mode whose results it must reproduce."""

    name: str
    amp: str  # perf.amp
    cuda_graphs: str  # perf.cuda_graphs
    channels_last: bool
    reference: str | None
    rtol: float
    graph: bool = False  # compare the weights after the updates too


def update_modes(device: torch.device) -> list[Mode]:
    """The update modes that apply on ``device``, references first."""
    if device.type != "cuda":
        return [
            Mode("eager", "off", "off", False, None, 0.0),
            Mode("channels_last", "off", "off", True, "eager", FP32_CPU_RTOL),
        ]
    modes = [
        Mode("eager", "off", "off", False, None, 0.0),
        Mode("channels_last", "off", "off", True, "eager", FP32_CUDA_RTOL),
    ]
    bf16 = torch.cuda.get_device_capability(device) >= (8, 0)
    if bf16:
        modes.append(Mode("amp-bf16", "bf16", "off", True, "channels_last", AMP_RTOL))
    modes.append(Mode("amp-fp16", "fp16", "off", True, "channels_last", AMP_RTOL))
    modes.append(Mode("graph", "off", "on", True, "channels_last", GRAPH_RTOL, graph=True))
    if bf16:  # what auto picks on a Jetson, and what perf.amp=bf16 runs anywhere
        modes.append(Mode("graph-bf16", "bf16", "on", True, "amp-bf16", GRAPH_RTOL, graph=True))
    return modes


def run_mode(state: DeepState, mode: Mode) -> Outcome:
    """The updates of one mode, from the shared initial weights, on the shared batches."""
    from edgerl.learners.factory import build_learner, policy_network

    spec, cfg = state.spec, state.cfg
    if state.init is None:
        torch.manual_seed(0)
        state.init = policy_network(cfg, spec).state_dict()
    perf = dataclasses.replace(cfg.perf, amp=mode.amp, cuda_graphs=mode.cuda_graphs, compile="off")
    learner = build_learner(dataclasses.replace(cfg, perf=perf), spec, state.device)
    learner.q.load_state_dict(state.init)
    learner.target.load_state_dict(state.init)
    learner.q.use_channels_last(mode.channels_last)
    learner.target.use_channels_last(mode.channels_last)
    assert state.batches is not None
    losses = [float(learner.update(b)) for b in state.batches]
    weights = [p.detach().float().cpu() for p in learner.q.parameters()]
    return Outcome(losses, weights, learner.describe(), learner)


def _max_rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / max(abs(y), 1e-3) for x, y in zip(a, b, strict=True))


def check_update(ctx: Context, state: DeepState, mode: Mode) -> Check:
    """One mode's updates: finite losses, weights that move, agreement with its reference."""
    name = f"update/{mode.name}"
    started = time.monotonic()
    out = run_mode(state, mode)
    seconds = round(time.monotonic() - started, 2)
    state.outcomes[mode.name] = out
    assert state.init is not None
    moved = max(
        float((w - p.float()).abs().max())
        for w, p in zip(out.weights, state.init.values(), strict=True)
    )
    losses = ", ".join(f"{v:.4f}" for v in out.losses)
    found = f"{UPDATES} updates ({out.describe}): losses {losses}"
    data: dict[str, Any] = {"losses": out.losses, "seconds": seconds, "moved": moved}
    fix = "a bug in edgerl or this PyTorch build: report it with this output"
    if not all(math.isfinite(v) for v in out.losses) or not moved > 0:
        how = "the weights did not move" if moved == 0 else "a loss is not finite"
        if mode.amp == "fp16" and moved == 0:
            fix = "the fp16 grad scaler skipped every step: use perf.amp=bf16 or off; " + fix
        return Check(name, "fail", f"{found}; {how}", fix, data)
    ref = state.outcomes.get(mode.reference) if mode.reference else None
    if mode.reference is None:
        return Check(name, "pass", f"{found}; the weights moved", data=data)
    if ref is None:
        return Check(name, "skip", f"{found}; no {mode.reference} updates to compare with")
    compared = len(out.losses) if mode.graph else 1
    diff = _max_rel(out.losses[:compared], ref.losses[:compared])
    data.update(reference=mode.reference, loss_rel_diff=diff, tolerance=mode.rtol)
    agree = diff <= mode.rtol
    what = "losses match" if mode.graph else "first loss matches"
    found += f"; {what} {mode.reference} to {diff:.1e} (tolerance {mode.rtol:.0e})"
    if mode.graph:
        # Adam moves each weight by at most lr per step; graph and eager must not differ by one.
        lr = state.cfg.agent.lr
        w_diff = max(
            float((a - b).abs().max()) for a, b in zip(out.weights, ref.weights, strict=True)
        )
        data.update(weight_diff=w_diff, weight_tolerance=lr)
        agree = agree and w_diff <= lr
        found += f", weights to {w_diff:.1e} (tolerance {lr:.0e})"
    if agree:
        return Check(name, "pass", found, data=data)
    return Check(name, "fail", found, fix, data)
