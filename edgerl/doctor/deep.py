"""``edgerl doctor --deep``: real work on the device ``perf.device=auto`` picks, with the learner
the config names.

For a replay learner (DQN), a replay is allocated there and filled from a real game, and a batch
sampled from it; a few Nature-CNN updates run on that batch in every mode that applies to the
device (eager NCHW, channels_last, each autocast dtype, CUDA graph), each from the same weights,
and each mode's losses must match its reference (a CUDA graph's weights too: the graph must
compute what eager updates compute). For a rollout learner (PQN), a rollout is filled from a
real game on the device and learned from. The learner is then exported to ONNX and checked in
ONNX Runtime against PyTorch, and where TensorRT is present an engine is built and checked, all
through the code that training and `edgerl export` run; learners are built by the factory
training uses.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgerl.doctor.core import Check, Context, guarded
from edgerl.errors import MissingDependencyError

log = logging.getLogger(__name__)

DEEP_ENV = "ALE/Pong-v5"  # the game when the configured one has no frames (Nature CNN)
REPLAY_ENVS = 4
REPLAY_STEPS = 64  # per environment: a few hundred real transitions
REPLAY_SLOTS = 1024  # per environment: a small replay (7 MB), not the configured one
UPDATES = 3
OBSERVATIONS = 32  # game frames the exports are checked on
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
NO_LEARNER = "needs a learner that learned (see the update/eager or rollout line)"
ROLLOUT_ENVS = 4  # a rollout learner's check: a small rollout of the real game
ROLLOUT_STEPS = 16


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


@dataclass
class Outcome:
    losses: list[float]
    weights: list[torch.Tensor]  # after the updates, fp32 on the CPU
    describe: str
    learner: Any


@dataclass
class DeepState:
    """What the deep checks hand on to each other."""

    device: torch.device
    spec: Any = None
    cfg: Any = None
    batches: list[Any] | None = None
    init: dict[str, torch.Tensor] | None = None
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    workdir: Path | None = None
    checkpoint: Path | None = None
    onnx: Path | None = None

    @property
    def trained(self) -> Outcome | None:
        """The learner the exports take: the eager DQN updates, or the rollout learner's."""
        return self.outcomes.get("eager") or self.outcomes.get("rollout")


def deep_checks(ctx: Context) -> Iterator[Check]:
    """Every deep check, in order; a check that cannot run says which earlier line to read."""
    from edgerl.hw.device import configure_for_training

    if not ctx.torch_ok or ctx.device is None:
        yield Check("deep", "skip", "needs a supported PyTorch and a device (see the lines above)")
        return
    from edgerl.config.learners import learner_info
    from edgerl.learners.factory import uses_replay

    state = DeepState(ctx.device)
    configure_for_training(ctx.device, ctx.cfg)  # threads, cuDNN autotuning and TF32, as training
    with tempfile.TemporaryDirectory(prefix="edgerl-doctor-") as tmp:
        state.workdir = Path(tmp)
        memory = learner_info(ctx.cfg.agent.algo).memory
        if uses_replay(ctx.cfg):
            yield from _replay_checks(ctx, state)
        elif memory == "rollout":
            yield from guarded("rollout", lambda c: check_rollout(c, state), ctx)
        else:  # the genetic algorithm's episode scores: nothing to learn from to smoke-check
            yield Check(
                "learner",
                "skip",
                f"agent.algo={ctx.cfg.agent.algo} learns from {memory}: no smoke check of its "
                "learning here (its forward passes are the export's below)",
            )
        yield from guarded("onnx export", lambda c: check_onnx_export(c, state), ctx)
        yield from guarded("onnx on the gpu", lambda c: check_onnx_gpu(c, state), ctx)
        yield from guarded("tensorrt engine", lambda c: check_tensorrt_engine(c, state), ctx)


def _replay_checks(ctx: Context, state: DeepState) -> Iterator[Check]:
    """A replay learner's checks: the replay, then the update in every mode."""
    yield from guarded("replay", lambda c: check_replay(c, state), ctx)
    if state.batches is None:
        yield Check("update", "skip", "needs a replay sample (see the replay line)")
        return
    for mode in update_modes(ctx.device):
        yield from guarded(f"update/{mode.name}", lambda c, m=mode: check_update(c, state, m), ctx)


def _deep_spec(ctx: Context) -> Any:
    from edgerl.config import with_values
    from edgerl.config.presets import apply_presets
    from edgerl.envs import probe

    spec = ctx.spec if ctx.spec is not None and ctx.spec.has_frames else probe(DEEP_ENV)
    cfg = (
        ctx.cfg
        if spec is ctx.spec
        else apply_presets(
            with_values(ctx.cfg, {"env.id": spec.id, "env.make_kwargs": {}}), "frames"
        )
    )
    return spec, cfg


def check_replay(ctx: Context, state: DeepState) -> Check:
    """A replay on the device, filled from the real game, and batches sampled from it."""
    from edgerl.envs import make_env
    from edgerl.hw.device import indexed
    from edgerl.memories.replay import ReplayBuffer
    from edgerl.words import fmt_bytes

    started = time.monotonic()
    state.spec, state.cfg = spec, cfg = _deep_spec(ctx)
    device = indexed(state.device)
    env_cfg = dataclasses.replace(cfg.env, num_envs=REPLAY_ENVS, threads=0)
    replay = ReplayBuffer(spec, REPLAY_ENVS * REPLAY_SLOTS, REPLAY_ENVS, device, seed=0)
    rng = np.random.default_rng(0)
    with make_env(env_cfg, spec) as env:
        replay.add_first(env.reset(seed=0))
        for _ in range(REPLAY_STEPS):
            actions = rng.integers(spec.num_actions, size=REPLAY_ENVS)
            r = env.step(actions)
            rewards = spec.learning_rewards(r.rewards)
            replay.add(actions, rewards, r.terminated, r.truncated, r.obs, r.final_obs)
    batch_size = cfg.agent.batch_size
    batches = [replay.sample(batch_size) for _ in range(UPDATES)]
    b = batches[0]
    problems = []
    if b.obs.device != device or b.actions.device != device:
        problems.append(f"the batch is on {b.obs.device}, not {device}")
    if tuple(b.obs.shape) != (batch_size, *spec.obs_shape) or b.obs.dtype != torch.uint8:
        problems.append(f"observations are {tuple(b.obs.shape)} {b.obs.dtype}")
    elif not torch.equal(b.obs[:, 1:], b.next_obs[:, :-1]):
        problems.append("next observations are not the observations one frame on")
    if not bool((b.obs[:, -1] != 0).any()):
        problems.append("the sampled frames are blank")
    found = (
        f"{replay.capacity:,} transitions ({fmt_bytes(replay.nbytes)}) on {device}, "
        f"{len(replay):,} real {spec.id} steps stored, {UPDATES} batches of {batch_size} "
        f"sampled"
    )
    data = {"device": str(device), "seconds": round(time.monotonic() - started, 2)}
    if problems:
        return Check(
            "replay",
            "fail",
            f"{found}, but {'; '.join(problems)}",
            "a bug in edgerl's replay on this device: report it with this output",
            data,
        )
    state.batches = batches
    return Check("replay", "pass", found + ": stacks and device right", data=data)


def check_rollout(ctx: Context, state: DeepState) -> Check:
    """A rollout learner (PQN) as training builds it: a rollout on the device filled from the
    real game, then one rollout's learning: finite losses and weights that move."""
    from edgerl.config import with_values
    from edgerl.config.learners import learner_info
    from edgerl.envs import make_env
    from edgerl.hw.device import indexed
    from edgerl.learners.factory import build_learner, build_memory

    started = time.monotonic()
    spec, cfg = _deep_spec(ctx)
    cfg = dataclasses.replace(
        cfg,
        env=dataclasses.replace(cfg.env, num_envs=ROLLOUT_ENVS, threads=0),
        pqn=dataclasses.replace(cfg.pqn, rollout_steps=ROLLOUT_STEPS, minibatches=4, epochs=1),
        perf=dataclasses.replace(cfg.perf, compile="off"),
    )
    # The rollout's length is its learner's key (PPO has its own), not always PQN's.
    cfg = with_values(cfg, {learner_info(cfg.agent.algo).rollout_key: ROLLOUT_STEPS})
    state.spec, state.cfg = spec, cfg
    device = indexed(state.device)
    torch.manual_seed(0)
    learner = build_learner(cfg, spec, device)
    memory = build_memory(cfg, spec, device)
    before = [p.detach().float().cpu().clone() for p in learner.q.parameters()]
    rng = np.random.default_rng(0)
    with make_env(cfg.env, spec) as env:
        memory.add_first(env.reset(seed=0))
        while not memory.full:
            actions = rng.integers(spec.num_actions, size=ROLLOUT_ENVS)
            r = env.step(actions)
            rewards = spec.learning_rewards(r.rewards)
            memory.add(actions, rewards, r.terminated, r.truncated, r.obs, r.final_obs)
    learner.learn(memory, ROLLOUT_ENVS * ROLLOUT_STEPS, 1)
    learner.losses.flush()
    loss = learner.losses.take()
    moved = max(
        float((p.detach().float().cpu() - b).abs().max())
        for p, b in zip(learner.q.parameters(), before, strict=True)
    )
    found = (
        f"{ROLLOUT_STEPS} steps x {ROLLOUT_ENVS} real {spec.id} environments on {device}, one "
        f"rollout learned from ({learner.describe()}, {learner.updates} updates): mean loss "
        f"{loss:.4f}"
    )
    data = {"loss": loss, "moved": moved, "seconds": round(time.monotonic() - started, 2)}
    if not math.isfinite(loss) or not moved > 0:
        how = "the weights did not move" if moved == 0 else "the loss is not finite"
        return Check(
            "rollout",
            "fail",
            f"{found}; {how}",
            "a bug in edgerl or this PyTorch build: report it with this output",
            data,
        )
    weights = [p.detach().float().cpu() for p in learner.q.parameters()]
    state.outcomes["rollout"] = Outcome([loss], weights, learner.describe(), learner)
    return Check("rollout", "pass", f"{found}; the weights moved", data=data)


def run_mode(state: DeepState, mode: Mode) -> Outcome:
    """The updates of one mode, from the shared initial weights, on the shared batches."""
    from edgerl.learners.factory import build_learner, policy_network

    spec, cfg = state.spec, state.cfg
    if state.init is None:
        torch.manual_seed(0)
        state.init = policy_network(cfg, spec).state_dict()
    perf = dataclasses.replace(cfg.perf, amp=mode.amp, cuda_graphs=mode.cuda_graphs, compile="off")
    agent = dataclasses.replace(cfg.agent, algo="dqn")  # the modes are DQN's update's
    learner = build_learner(dataclasses.replace(cfg, agent=agent, perf=perf), spec, state.device)
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


def _checkpoint(state: DeepState) -> Path:
    """A real checkpoint of the learner after its learning, as training writes one."""
    from edgerl.files.checkpoint import Checkpoint, CheckpointStore

    if state.checkpoint is not None:
        return state.checkpoint
    assert state.workdir is not None
    trained = state.trained
    if trained is None:
        raise RuntimeError("no learner to export: the update/eager or rollout check did not run")
    checkpoint = Checkpoint(
        kind=trained.learner.kind,
        step=UPDATES,
        env=state.spec.to_dict(),
        config=state.cfg.to_dict(),
        learner=trained.learner.state_dict(),
    )
    state.checkpoint = CheckpointStore(state.workdir / "checkpoints", keep=1).save(checkpoint)
    return state.checkpoint


def check_onnx_export(ctx: Context, state: DeepState) -> Check:
    """`edgerl export --onnx` of the updated learner: onnx.checker, then ONNX Runtime against
    PyTorch on real game frames."""
    from edgerl.export.run import ExportRequest, run_export

    if state.trained is None:
        return Check("onnx export", "skip", NO_LEARNER)
    started = time.monotonic()
    request = ExportRequest(
        checkpoint=_checkpoint(state), out=state.workdir / "onnx", observations=OBSERVATIONS
    )
    try:
        row = run_export(request)[0]
    except MissingDependencyError as e:
        return Check("onnx export", "skip", str(e), "pip install 'edgerl[export]'")
    state.onnx = row.file
    found = (
        f"{row.backend} matches PyTorch on {OBSERVATIONS} {state.spec.id} "
        f"frames: {row.agreement.describe()}; p50 latency {row.latency['p50']:.0f} us"
    )
    data = {
        "agreement": row.agreement.to_dict(),
        "latency_us": row.latency,
        "seconds": round(time.monotonic() - started, 2),
    }
    return Check("onnx export", "pass", found, data=data)


def check_onnx_gpu(ctx: Context, state: DeepState) -> Check:
    """The exported ONNX file opened as `edgerl play --model x.onnx` opens it, on ONNX Runtime's
    GPU providers (the TensorRT provider with its engine cache), against PyTorch."""
    from edgerl.doctor.software import GPU_PROVIDERS

    name = "onnx on the gpu"
    if state.device.type != "cuda":
        return Check(name, "skip", "no CUDA GPU: ONNX policies play on the CPU")
    if state.onnx is None or state.checkpoint is None:
        return Check(name, "skip", "needs the ONNX export (see the onnx export line)")
    import onnxruntime as ort

    if not any(p in ort.get_available_providers() for p in GPU_PROVIDERS):
        return Check(name, "skip", "this ONNX Runtime has no GPU provider (see onnxruntime)")
    from edgerl.export.common import check_agreement, collect_observations
    from edgerl.policies import load_policy
    from edgerl.policies.torch import TorchPolicy

    started = time.monotonic()
    policy = load_policy(model=state.onnx)
    torch_policy = TorchPolicy.from_file(state.checkpoint)
    obs = collect_observations(torch_policy.env_config, OBSERVATIONS)
    reference = torch_policy.q_values(obs).astype(np.float64)
    # The CUDA provider computes in TF32 and the TensorRT provider may pick FP16 tactics.
    agreement = check_agreement(policy, obs, reference, "fp16")
    provider = getattr(policy, "providers", ["?"])[0]
    found = f"{provider} matches PyTorch: {agreement.describe()}"
    data = {
        "provider": provider,
        "agreement": agreement.to_dict(),
        "seconds": round(time.monotonic() - started, 2),
    }
    if agreement.ok:
        return Check(name, "pass", found, data=data)
    return Check(
        name,
        "fail",
        found,
        f"play ONNX policies on the CPU or export a TensorRT engine (edgerl export --trt); "
        f"report it with ONNX Runtime {ort.__version__}",
        data,
    )


def check_tensorrt_engine(ctx: Context, state: DeepState) -> Check:
    """`edgerl export --trt` where TensorRT and a GPU are here: build, run, agree."""
    import importlib.util

    from edgerl.export.run import ExportRequest, run_export

    if importlib.util.find_spec("tensorrt") is None:
        return Check("tensorrt engine", "skip", "TensorRT is not installed (see the tensorrt line)")
    if state.device.type != "cuda":
        return Check("tensorrt engine", "skip", "TensorRT needs a CUDA GPU (see the cuda line)")
    if state.trained is None:
        return Check("tensorrt engine", "skip", NO_LEARNER)
    started = time.monotonic()
    request = ExportRequest(
        checkpoint=_checkpoint(state),
        out=state.workdir / "trt",
        trt=True,
        observations=OBSERVATIONS,
    )
    row = run_export(request)[1]  # ExportError (no build, or no agreement) is a fail line
    found = (
        f"{row.precision} engine built in {row.extra.get('build_s', '?')} s ({row.backend}), "
        f"matches PyTorch: {row.agreement.describe()}; p50 latency {row.latency['p50']:.0f} us"
    )
    data = {
        "precision": row.precision,
        "agreement": row.agreement.to_dict(),
        "latency_us": row.latency,
        "seconds": round(time.monotonic() - started, 2),
    }
    return Check("tensorrt engine", "pass", found, data=data)
