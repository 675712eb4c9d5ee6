"""What the learners share: the mean loss read without stalling the GPU, linear schedules (the
exploration rate, the learning rate), the mixed-precision region of an update and optimizer
state loadable across devices."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import numpy as np
import torch

from edgerl.config import AgentConfig
from edgerl.hw.device import host_event

FORWARD_EQUIVALENTS_OF_A_GRADIENT_STEP = 3.0  # forward + backward (twice the forward)
LOSS_READ_EVERY = 16  # updates between reads of the summed loss from the GPU


def linear_schedule(start: float, end: float, duration: int, t: int) -> float:
    """``start`` at t=0, linearly to ``end`` at t=duration, then ``end``."""
    if t >= duration:
        return end
    return start + (end - start) * (t / duration)


def epsilon_at(cfg: AgentConfig, step: int, learning_from: int) -> float:
    """The exploration rate at env step ``step``, for every learner and the remote actors alike:
    1 (uniformly random actions, no forward pass) until learning starts at ``learning_from``, as
    in DQN's replay start and Stable-Baselines3; then linear from ``eps_start`` at step 0 to
    ``eps_end`` at ``eps_decay_steps``."""
    if step < learning_from:
        return 1.0
    return linear_schedule(cfg.eps_start, cfg.eps_end, cfg.eps_decay_steps, step)


def epsilons_at(
    cfg: AgentConfig, step: int, learning_from: int, n: int, apex: np.ndarray | None = None
) -> np.ndarray:
    """Each of ``n`` environments' exploration rate: :func:`epsilon_at` for all, or once learning
    has started the fixed per-environment rates ``apex`` (Ape-X's, for a fleet that asks)."""
    if apex is not None and step >= learning_from:
        return np.asarray(apex, dtype=np.float64)
    return np.full(n, epsilon_at(cfg, step, learning_from))


def rollouts_owed(
    learn_from: tuple[int, int], rollouts: int, step: int, steps_per_unit: int
) -> int:
    """A rollout learner's whole rollouts complete at env step ``step`` and not learned from yet
    (every environment steps together: the step alone says), counted from ``learn_from`` (the
    session's first step and the rollouts done then), ``rollouts`` learned so far."""
    start_step, start_rollouts = learn_from
    return start_rollouts + max(0, step - start_step) // steps_per_unit - rollouts


def anneal_lr(
    optimizer: torch.optim.Optimizer, cfg: AgentConfig, total_steps: int, step: int
) -> None:
    """Set the learning rate of env step ``step``: linear from ``agent.lr`` to ``agent.lr_end``
    over ``total_steps`` (``train.steps``), or left alone where ``agent.lr_end`` is -1."""
    if cfg.lr_end < 0:
        return
    lr = linear_schedule(cfg.lr, cfg.lr_end, total_steps, step)
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)  # a capturable optimizer reads it inside the CUDA graph
        else:
            group["lr"] = lr


def loadable_optimizer_state(
    saved: dict[str, Any], optimizer: torch.optim.Optimizer, device: torch.device
) -> dict[str, Any]:
    """Saved optimizer state made loadable into ``optimizer``: the checkpoint may come from a
    machine whose optimizer was fused (CPU) or capturable (CUDA graphs, learning rate a tensor),
    and this one keeps its own implementation flags and kind of learning rate."""
    _check_moments(saved["state"], [p for g in optimizer.param_groups for p in g["params"]])
    groups = []
    for group, current in zip(saved["param_groups"], optimizer.param_groups, strict=True):
        out = dict(group)
        for key in ("capturable", "fused", "foreach", "differentiable"):
            if key in current:
                out[key] = current[key]
        lr = float(out["lr"])
        out["lr"] = torch.tensor(lr, device=device) if torch.is_tensor(current["lr"]) else lr
        groups.append(out)
    return {"state": saved["state"], "param_groups": groups}


def _check_moments(state: object, params: list[torch.Tensor]) -> None:
    """Raises ValueError when saved optimizer state (per parameter index: its step and moments)
    is not for ``params``: torch loads moments of any shape, and the first update fails."""
    if not isinstance(state, dict):
        raise ValueError("the optimizer's state is not a table")
    for index, entry in state.items():
        if type(index) is not int or not 0 <= index < len(params) or not isinstance(entry, dict):
            raise ValueError(f"optimizer state for a parameter {str(index)[:20]} it does not have")
        for key, value in entry.items():
            if not isinstance(value, torch.Tensor):
                continue
            want = params[index].shape
            if value.dim() and value.shape != want:
                raise ValueError(
                    f"optimizer state {str(key)[:40]!r} of parameter {index} has shape "
                    f"{list(value.shape)[:8]}, not {list(want)}"
                )


def rows_of(tensors: tuple[torch.Tensor, ...], rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The rows ``rows`` of each tensor (a minibatch of a rollout), by ``index_select``: the
    same rows as ``tensor[rows]``, which on a CPU copied 128 Pong frame stacks 9x slower (1.33 ms
    against 0.14 on a 2-core Xeon: the indexing path copies a byte at a time)."""
    return tuple(t.index_select(0, rows) for t in tensors)


def autocast(device: torch.device, dtype: torch.dtype | None) -> Any:
    """The mixed-precision region of an update (a no-op at full precision, ``dtype`` None).

    The weight cache is off: with it, the online network's low-precision weights are cast once
    per region, and a cast made in the ``no_grad`` pass over ``next_obs`` has no gradient
    history, so on torch before the upstream fix (pytorch#112583; JetPack's 2.3-2.9 builds) the
    loss loses its ``grad_fn`` and ``backward()`` raises. CUDA graph capture needs the cache off
    as well. The cost is one extra cast of the weights per update.
    """
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype, cache_enabled=False)


class LossMeter:
    """The mean loss of the updates since the last :meth:`take`, read without stalling.

    Losses add up on the learner's device. On CUDA, reading one back per update would stall the
    learner's stream, and reading from the actor thread would make it wait for queued updates;
    instead, every :data:`LOSS_READ_EVERY` updates the learner starts a non-blocking copy of the
    sum into pinned memory and collects it the next time, once its event says it has landed
    (a query, never a wait: the learner may hold a lock the actor needs). Until then the sums
    keep adding up on the device. Readers see host numbers only. :meth:`flush` waits for and
    collects everything (at the end of a run).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._cuda = device.type == "cuda"
        self._device_sum: torch.Tensor | None = None
        self._device_n = 0
        self._in_flight: tuple[torch.Tensor, Any, int] | None = None  # (host sum, event, n)
        self._lock = threading.Lock()
        self._sum = 0.0
        self._n = 0

    def __deepcopy__(self, memo: dict[int, Any]) -> LossMeter:
        """A copied learner starts counting afresh (a lock cannot be copied)."""
        return LossMeter(self.device)

    def add(self, loss: torch.Tensor, n: int = 1) -> None:
        """Count the summed loss of ``n`` updates (the learner's thread)."""
        loss = loss.float()
        self._device_sum = loss if self._device_sum is None else self._device_sum + loss
        self._device_n += n
        if not self._cuda or self._device_n >= LOSS_READ_EVERY:
            self._send()

    def _send(self) -> None:
        if not self._collect(wait=False):
            return  # the last copy is still on its way: this sum goes with the next one
        if self._device_sum is None:
            return
        if self._cuda:
            host, landed = self._start_copy(self._device_sum)
            self._in_flight = (host, landed, self._device_n)
        else:
            with self._lock:
                self._sum += float(self._device_sum)
                self._n += self._device_n
        self._device_sum, self._device_n = None, 0

    @staticmethod
    def _start_copy(device_sum: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """A non-blocking copy of the sum into pinned memory, and the event that says it landed."""
        host = torch.empty((), dtype=torch.float32, pin_memory=True)
        host.copy_(device_sum, non_blocking=True)
        landed = host_event(device_sum.device)
        landed.record()
        return host, landed

    def _collect(self, wait: bool) -> bool:
        """Take in the copy in flight if it has landed (``wait``: wait for it); True when none
        is in flight any more."""
        if self._in_flight is None:
            return True
        host, landed, n = self._in_flight
        if wait:
            landed.synchronize()
        elif not landed.query():
            return False
        with self._lock:
            self._sum += float(host)
            self._n += n
        self._in_flight = None
        return True

    def flush(self) -> None:
        """Collect every loss counted so far, waiting for the GPU (the learner's thread, or
        after it stopped)."""
        self._collect(wait=True)
        self._send()
        self._collect(wait=True)

    def take(self) -> float:
        """The mean of the losses collected since the last call (NaN if none); any thread."""
        with self._lock:
            mean = self._sum / self._n if self._n else float("nan")
            self._sum, self._n = 0.0, 0
        return mean

    def peek(self) -> float:
        """Like :meth:`take`, without starting a new interval."""
        with self._lock:
            return self._sum / self._n if self._n else float("nan")
