"""What learners share: the mean loss read without stalling the GPU, and linear schedules."""

from __future__ import annotations

import threading
from typing import Any

import torch

LOSS_READ_EVERY = 16  # updates between reads of the summed loss from the GPU


def linear_schedule(start: float, end: float, duration: int, t: int) -> float:
    """``start`` at t=0, linearly to ``end`` at t=duration, then ``end``."""
    if t >= duration:
        return end
    return start + (end - start) * (t / duration)


class LossMeter:
    """The mean loss of the updates since the last :meth:`take`, read without stalling.

    Losses add up on the learner's device. On CUDA, reading one back per update would stall the
    learner's stream, and reading from the actor thread would make it wait for queued updates;
    instead, every :data:`LOSS_READ_EVERY` updates the learner starts a non-blocking copy of the
    sum into pinned memory and collects it the next time, long after it has landed. Readers see
    host numbers only. :meth:`flush` collects everything (at the end of a run).
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
        self._collect()
        if self._device_sum is None:
            return
        if self._cuda:
            host = torch.empty((), dtype=torch.float32, pin_memory=True)
            host.copy_(self._device_sum, non_blocking=True)
            landed = torch.cuda.Event()
            landed.record()
            self._in_flight = (host, landed, self._device_n)
        else:
            with self._lock:
                self._sum += float(self._device_sum)
                self._n += self._device_n
        self._device_sum, self._device_n = None, 0

    def _collect(self) -> None:
        if self._in_flight is None:
            return
        host, landed, n = self._in_flight
        landed.synchronize()  # issued LOSS_READ_EVERY updates ago: long done
        with self._lock:
            self._sum += float(host)
            self._n += n
        self._in_flight = None

    def flush(self) -> None:
        """Collect every loss counted so far (the learner's thread, or after it stopped)."""
        self._send()
        self._collect()

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
