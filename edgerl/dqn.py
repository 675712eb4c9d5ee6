"""The DQN learner: Double DQN targets, Huber loss, Adam, gradient clipping, hard target syncs.

The update is one fixed-shape function (:meth:`DQN.update_step`) over a batch of static shape, so
that on CUDA it can be captured once as a CUDA graph and replayed: a small network's update is
bound by kernel launches, more so on a Jetson's ARM cores. Around it, per device:

* CUDA: cuDNN autotuning (the TX1 experiment behind this project went from 46 s to 37 s per 1000
  steps with it), TF32, channels_last, mixed precision (``perf.amp``: bf16 on Ampere and newer,
  fp16 with a grad scaler on older fast-FP16 GPUs such as Xavier and Nano) and CUDA graphs
  (``perf.cuda_graphs``; not with the fp16 grad scaler, which syncs with the CPU every step).
* CPU: channels_last (1.1x for the Nature CNN here), fused Adam, and ``torch.compile`` only when
  the run is long enough to repay the compilation (``perf.compile``).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edgerl.config import AgentConfig, PerfConfig
from edgerl.errors import ConfigError, DeviceError
from edgerl.nets import NatureCNN
from edgerl.replay import Batch
from edgerl.versions import check_torch

log = logging.getLogger(__name__)

# torch.compile of the CPU update took ~23 s and saved 0-3% on the 2-core x86 machine measured:
# "auto" only tries it for runs this long, then keeps it only if it measurably pays.
COMPILE_MIN_UPDATES = 125_000
CUDA_GRAPH_WARMUP = 3
COMPILE_TIMING_UPDATES = 20


def resolve_device(name: str) -> torch.device:
    """The torch device for ``perf.device``; raises DeviceError if CUDA is asked but unusable.

    A CUDA device is returned with its index (``cuda:0``): several torch calls (memory queries,
    RNG state) refuse a device without one on the torch releases JetPack ships. Raises
    PlatformError first if torch is older than edgerl supports.
    """
    check_torch(torch.__version__)
    if name == "cpu":
        return torch.device("cpu")
    try:
        usable = torch.cuda.is_available()
        device = torch.device("cuda", torch.cuda.current_device()) if usable else None
    except Exception as e:  # a broken driver or CUDA install raises here, not in is_available()
        raise DeviceError(
            f"cannot use the CUDA GPU ({type(e).__name__}: {e}); check the driver with "
            "edgerl doctor, or use perf.device=cpu"
        ) from None
    if name == "cuda" and not usable:
        raise DeviceError(
            "perf.device=cuda but no usable CUDA GPU was found (torch.cuda.is_available() is "
            f"False for torch {torch.__version__}); use perf.device=auto or cpu"
        )
    return device if device is not None else torch.device("cpu")


def configure_backends(device: torch.device, threads: int = 0) -> None:
    """Process-wide speed settings for ``device``: cuDNN autotuning, TF32, CPU threads."""
    if threads > 0:
        torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def resolve_amp(
    setting: str,
    device: torch.device,
    capability: tuple[int, int] | None = None,
    frames: bool = True,
) -> torch.dtype | None:
    """The autocast dtype for ``perf.amp`` on ``device`` (None: full precision).

    ``auto`` keeps networks for vector observations (``frames`` False) in fp32: their inputs
    lose precision in bf16 and a small MLP's update gains nothing. Raises ConfigError for a
    precision the device cannot do.
    """
    if setting == "off" or (setting == "auto" and not frames):
        return None
    if device.type != "cuda":
        if setting == "auto":
            return None  # CPUs without native bf16 run autocast slower than fp32
        raise ConfigError(f"perf.amp={setting} needs a CUDA GPU; use perf.amp=auto or off")
    cap = capability or torch.cuda.get_device_capability(device)
    bf16_ok = cap >= (8, 0)
    fp16_fast = cap == (5, 3) or cap in ((6, 0), (6, 2)) or cap >= (7, 0)
    if setting == "bf16":
        if not bf16_ok:
            raise ConfigError(
                f"perf.amp=bf16 needs compute capability 8.0 or newer (this GPU is "
                f"{cap[0]}.{cap[1]}); use perf.amp=fp16 or auto"
            )
        return torch.bfloat16
    if setting == "fp16":
        return torch.float16
    if bf16_ok:
        return torch.bfloat16
    return torch.float16 if fp16_fast else None


def resolve_cuda_graphs(setting: str, device: torch.device, amp: torch.dtype | None) -> bool:
    """Whether to capture the update as a CUDA graph; raises ConfigError for impossible asks."""
    if setting == "off" or device.type != "cuda":
        if setting == "on" and device.type != "cuda":
            raise ConfigError("perf.cuda_graphs=on needs a CUDA GPU; use auto or off")
        return False
    if amp is torch.float16:
        if setting == "on":
            raise ConfigError(
                "perf.cuda_graphs=on cannot capture the fp16 grad scaler (it syncs with the CPU "
                "every step); use perf.amp=bf16 or off, or perf.cuda_graphs=auto"
            )
        return False
    return True


def linear_schedule(start: float, end: float, duration: int, t: int) -> float:
    """``start`` at t=0, linearly to ``end`` at t=duration, then ``end``."""
    if t >= duration:
        return end
    return start + (end - start) * (t / duration)


def make_grad_scaler() -> Any:
    """A CUDA grad scaler for fp16 training.

    ``torch.amp.GradScaler`` is the current name; NVIDIA's JetPack 6.0 builds (torch 2.3
    pre-releases) may predate it and only have ``torch.cuda.amp.GradScaler``.
    """
    scaler = getattr(torch.amp, "GradScaler", None)
    if scaler is not None:
        return scaler("cuda")
    return torch.cuda.amp.GradScaler()


def make_adam(net: nn.Module, lr: float, capturable: bool = False) -> torch.optim.Adam:
    """Adam, fused into one kernel where this torch build supports it on the net's device.

    The fused step was 3x faster than the default for the CartPole MLP on this CPU. For CUDA graph
    capture the optimizer must be capturable, with its learning rate a tensor.
    """
    params = list(net.parameters())
    if capturable:
        lr_tensor = torch.tensor(lr, device=params[0].device)
        return torch.optim.Adam(params, lr=lr_tensor, capturable=True, foreach=True)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):  # older torch, or a device without fused Adam
        return torch.optim.Adam(params, lr=lr)


class DQN:
    """Online and target Q-networks with their optimizer; :meth:`update` is one gradient step."""

    def __init__(
        self,
        q_net: nn.Module,
        cfg: AgentConfig,
        device: torch.device,
        perf: PerfConfig | None = None,
    ) -> None:
        perf = perf or PerfConfig(amp="off", cuda_graphs="off", compile="off")
        self.cfg = cfg
        self.device = device
        if isinstance(q_net, NatureCNN):
            q_net.use_channels_last()
        self.q = q_net.to(device)
        self.target = copy.deepcopy(self.q).eval()
        self.target.requires_grad_(False)
        self.amp = resolve_amp(perf.amp, device, frames=isinstance(q_net, NatureCNN))
        self.cuda_graphs = resolve_cuda_graphs(perf.cuda_graphs, device, self.amp)
        self.optimizer = make_adam(self.q, cfg.lr, capturable=self.cuda_graphs)
        fp16_scaled = self.amp is torch.float16 and not self.cuda_graphs
        self.scaler = make_grad_scaler() if fp16_scaled else None
        self.compile_setting = perf.compile
        self.updates = 0
        self._static: Batch | None = None  # the fixed-shape input buffers of the update
        self._graph: Any = None
        self._graph_loss: torch.Tensor | None = None
        self._step_fn = self.update_step
        self.compiled = False

    def describe(self) -> str:
        parts = [self.device.type, "channels_last" if isinstance(self.q, NatureCNN) else "mlp"]
        if self.amp is not None:
            parts.append(f"amp {str(self.amp).removeprefix('torch.')}")
        if self.cuda_graphs:
            parts.append("CUDA graph")
        if self.compiled:
            parts.append("torch.compile")
        return ", ".join(parts)

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)  # a capturable optimizer reads it inside the graph
            else:
                group["lr"] = lr

    # -- the update -----------------------------------------------------------------------------

    def _autocast(self) -> Any:
        """The mixed-precision region of the update (a no-op at full precision).

        The weight cache is off: with it, the online network's low-precision weights are cast
        once per region, and a cast made in the ``no_grad`` pass over ``next_obs`` has no
        gradient history, so on torch before the upstream fix (pytorch#112583; JetPack's 2.3-2.9
        builds) the loss loses its ``grad_fn`` and ``backward()`` raises. CUDA graph capture
        needs the cache off as well. The cost is one extra cast of the weights per update.
        """
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp, cache_enabled=False)

    def loss(self, b: Batch) -> torch.Tensor:
        """Huber loss of Q(s, a) against r + gamma * (1 - done) * Q_target(s', a*).

        Under mixed precision the convolutions run in bf16/fp16; the networks' output layers,
        and so the Q-values and the TD target, stay in fp32 (see :mod:`edgerl.nets`).
        """
        with self._autocast():
            with torch.no_grad():
                next_q_target = self.target(b.next_obs).float()
                if self.cfg.double:
                    next_actions = self.q(b.next_obs).argmax(dim=1, keepdim=True)
                    next_value = next_q_target.gather(1, next_actions).squeeze(1)
                else:
                    next_value = next_q_target.max(dim=1).values
                td_target = b.rewards + self.cfg.gamma * (1.0 - b.dones) * next_value
            q_values = self.q(b.obs).float()
            q_taken = q_values.gather(1, b.actions.unsqueeze(1)).squeeze(1)
            return F.smooth_l1_loss(q_taken, td_target)

    def update_step(self, b: Batch, zero_grad: bool = True) -> torch.Tensor:
        """One gradient step on a batch of fixed shape; returns the detached loss.

        This is the function a CUDA graph captures (with ``zero_grad=False``: the graph's backward
        writes fresh gradients on every replay).
        """
        if zero_grad:
            self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(b)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        else:
            loss.backward()
        if self.cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.q.parameters(), self.cfg.grad_clip, foreach=True)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        return loss.detach()

    def update(self, batch: Batch) -> torch.Tensor:
        """One gradient step on ``batch``; returns the (detached) Huber loss."""
        loss = self._graph_update(batch) if self.cuda_graphs else self._step_fn(batch)
        self.updates += 1
        return loss

    def _graph_update(self, batch: Batch) -> torch.Tensor:
        if self._static is None:
            self._static = Batch(*(torch.empty_like(t) for t in batch))
        for static, fresh in zip(self._static, batch, strict=True):
            static.copy_(fresh, non_blocking=True)
        if self._graph is None:
            return self._capture()
        self._graph.replay()
        assert self._graph_loss is not None
        return self._graph_loss.clone()

    def prepare(self, example: Batch, remaining_updates: int) -> None:
        """Make the update fast before training starts, changing nothing else.

        CUDA: capture the graph now, on ``example`` (a batch of the training shape), with weights
        and optimizer state restored in place afterwards: capturing later, on the learner thread,
        would collide with the actor thread's CUDA calls. CPU: maybe ``torch.compile``.
        """
        if not self.cuda_graphs:
            self.maybe_compile(remaining_updates, example)
            return
        snapshot = self._snapshot()
        updates = self.updates
        self._static = Batch(*(t.clone() for t in example))
        self._capture()
        self._restore_in_place(*snapshot, clear_grads=False)  # the graph owns its gradients
        self.updates = updates
        torch.cuda.synchronize()

    def _capture(self) -> torch.Tensor:
        """Warm up on a side stream (real updates on the static batch), then capture."""
        assert self._static is not None
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(CUDA_GRAPH_WARMUP):
                loss = self.update_step(self._static)
        torch.cuda.current_stream().wait_stream(side)
        self.updates += CUDA_GRAPH_WARMUP - 1  # update() counts the last one
        self.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._graph_loss = self.update_step(self._static, zero_grad=False)
        self._graph = graph
        log.info("update captured as a CUDA graph")
        return loss

    def maybe_compile(self, remaining_updates: int, example: Batch) -> bool:
        """``torch.compile`` the CPU update when asked, or when the run is long enough (auto).

        Compiling happens here, before training, on ``example`` (a batch of the training shape);
        weights and optimizer state are restored afterwards, so it changes nothing but speed.
        On failure the eager update stays, with a warning. Returns whether it compiled.
        """
        setting = self.compile_setting
        if self.device.type != "cpu" or setting == "off":
            return False
        if setting == "auto" and remaining_updates < COMPILE_MIN_UPDATES:
            log.debug("not compiling: %d updates left < %d", remaining_updates, COMPILE_MIN_UPDATES)
            return False
        log.info(
            "compiling the update with torch.compile (once, about 20 s; perf.compile=off skips it)"
        )
        snapshot = self._snapshot()
        started = time.monotonic()
        try:
            compiled = torch.compile(self.update_step)
            compiled(example)
        except Exception as e:  # a compiler problem must not stop training
            log.warning(
                "torch.compile failed (%s: %s); using the eager update", type(e).__name__, e
            )
            return False
        finally:
            self._restore_in_place(*snapshot)
        compile_s = time.monotonic() - started
        if setting == "auto" and not self._compile_pays(
            compiled, example, remaining_updates, compile_s
        ):
            return False
        self._step_fn = compiled
        self.compiled = True
        log.info("update compiled in %.0f s", compile_s)
        return True

    def _compile_pays(
        self, compiled: Any, example: Batch, remaining: int, compile_s: float
    ) -> bool:
        """Time both updates on ``example`` (weights restored after); keep the compiled one only
        if its gain over the remaining updates repays the compilation."""
        snapshot = self._snapshot()

        def per_update(fn: Any) -> float:
            for _ in range(3):
                fn(example)
            started = time.perf_counter()
            for _ in range(COMPILE_TIMING_UPDATES):
                fn(example)
            return (time.perf_counter() - started) / COMPILE_TIMING_UPDATES

        try:
            eager_s, compiled_s = per_update(self.update_step), per_update(compiled)
        finally:
            self._restore_in_place(*snapshot)
        saved = (eager_s - compiled_s) * remaining
        log.info(
            "torch.compile: %.1f ms per update against %.1f ms eager; over %s updates that "
            "saves %.0f s for %.0f s of compiling: %s",
            compiled_s * 1e3,
            eager_s * 1e3,
            f"{remaining:,}",
            saved,
            compile_s,
            "keeping it" if saved > compile_s else "using the eager update",
        )
        return saved > compile_s

    def _snapshot(self) -> tuple[list[torch.Tensor], list[torch.Tensor], dict[Any, Any]]:
        """Copies of the weights and Adam state, for :meth:`_restore_in_place`."""
        params = list(self.q.parameters())
        saved_params = [p.detach().clone() for p in params]
        saved_state = {
            p: {k: v.clone() for k, v in self.optimizer.state[p].items() if torch.is_tensor(v)}
            for p in params
            if p in self.optimizer.state
        }
        return params, saved_params, saved_state

    def _restore_in_place(
        self,
        params: list[torch.Tensor],
        saved_params: list[torch.Tensor],
        saved_state: dict[Any, dict[str, torch.Tensor]],
        clear_grads: bool = True,
    ) -> None:
        """Put weights and Adam state back without replacing tensors (compiled code keeps its
        references; zeroed moments with step 0 are exactly a fresh Adam)."""
        with torch.no_grad():
            for p, value in zip(params, saved_params, strict=True):
                p.copy_(value)
                if clear_grads:
                    p.grad = None
                for key, tensor in self.optimizer.state.get(p, {}).items():
                    if not torch.is_tensor(tensor):
                        continue
                    previous = saved_state.get(p, {}).get(key)
                    if previous is not None:
                        tensor.copy_(previous)
                    else:
                        tensor.zero_()

    def sync_target(self) -> None:
        with torch.no_grad():
            for t, q in zip(self.target.parameters(), self.q.parameters(), strict=True):
                t.copy_(q)  # in place: a captured graph keeps reading the same tensors

    def _adapt_optimizer_state(self, saved: dict[str, Any]) -> dict[str, Any]:
        """Saved optimizer state made loadable here: the checkpoint may come from a machine whose
        Adam was fused (CPU) or capturable (CUDA graphs)."""
        groups = [
            _adapt(g, cur, self.device)
            for g, cur in zip(saved["param_groups"], self.optimizer.param_groups, strict=True)
        ]
        return {"state": saved["state"], "param_groups": groups}

    def state_dict(self) -> dict[str, Any]:
        return {
            "q": self.q.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q.load_state_dict(state["q"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(self._adapt_optimizer_state(state["optimizer"]))
        self.updates = int(state["updates"])


def _adapt(group: dict[str, Any], current: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """A saved param group with this optimizer's implementation flags and lr type."""
    out = dict(group)
    for key in ("capturable", "fused", "foreach", "differentiable"):
        if key in current:
            out[key] = current[key]
    lr = float(out["lr"])
    out["lr"] = torch.tensor(lr, device=device) if isinstance(current["lr"], torch.Tensor) else lr
    return out


def epsilon_greedy(
    q_values: torch.Tensor | None,
    epsilon: float,
    num_actions: int,
    n: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Greedy actions from ``q_values`` (None: all random), each random with probability eps."""
    randoms = rng.integers(num_actions, size=n)
    if q_values is None:
        return randoms
    greedy = q_values.argmax(dim=1).cpu().numpy()
    explore = rng.random(n) < epsilon
    return np.where(explore, randoms, greedy)
