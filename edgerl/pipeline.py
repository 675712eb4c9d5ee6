"""How learning runs beside acting: inline (sync) or on a learner thread (async).

Both keep the replay ratio exact: the learner makes exactly ``(step - start) // agent.train_freq``
updates, counted over all environments, whatever ``env.num_envs`` is.

``SyncLearning`` (``perf.pipeline = "sync"``) makes the updates due after every vector step, on the
actor's thread: the plain loop, deterministic for a given seed.

``AsyncLearning`` (``perf.pipeline = "async"``) runs the updates on a learner thread while the actor
steps the environments (ALE's threads) and picks actions; PyTorch releases the GIL inside its
kernels, so both make progress. The actor acts with its own copy of the network, refreshed whenever
the learner is ``perf.max_policy_lag`` updates ahead of it, and it waits when it is more than
``perf.max_ahead`` updates ahead of the learner, so acting never runs away from learning. What is
not deterministic in async mode: which transitions a sample sees (the actor may have added up to
``max_ahead * train_freq`` more steps) and which weights pick each action (up to
``max_policy_lag`` updates old) depend on thread timing.

Both threads use the default CUDA stream, so GPU work stays in submission order and the replay
(written by the actor, read by the learner, under one lock) needs no cross-stream events; the
overlap is on the CPU side (emulation, Python, kernel launches), which is what limits a Jetson.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from edgerl.train import Trainer

log = logging.getLogger(__name__)


class SyncLearning:
    """Updates inline after each vector step."""

    mode = "sync"

    def __init__(self, trainer: Trainer) -> None:
        self.t = trainer
        self.busy_s = 0.0  # seconds spent in updates (edgerl bench reads it)

    @contextlib.contextmanager
    def acting(self) -> Iterator[nn.Module]:
        """The network that picks actions (here, the learner's own)."""
        yield self.t.learner.q

    @contextlib.contextmanager
    def replay_access(self) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Learner state is consistent inside (for checkpoints)."""
        yield

    def start(self) -> None:
        pass

    def after_step(self) -> None:
        started = time.perf_counter()
        while self.t.learner.updates < self.t.updates_due():
            self.t.one_update()
        self.busy_s += time.perf_counter() - started

    def finish(self, drain: bool) -> None:
        if drain:
            self.after_step()

    def check(self) -> None:
        pass


class AsyncLearning:
    """A learner thread beside the actor; see the module docstring."""

    mode = "async"

    def __init__(self, trainer: Trainer) -> None:
        self.t = trainer
        perf = trainer.cfg.perf
        self.max_policy_lag = perf.max_policy_lag
        self.max_ahead = perf.max_ahead
        self.cond = threading.Condition()
        self._replay_lock = threading.Lock()
        self._weights_lock = threading.Lock()
        self._update_lock = threading.Lock()
        self.actor_net = copy.deepcopy(trainer.learner.q).eval().requires_grad_(False)
        self.actor_version = trainer.learner.updates
        self.max_lag_seen = 0
        self.max_ahead_seen = 0
        self.busy_s = 0.0  # seconds spent in updates (edgerl bench reads it)
        self.error: BaseException | None = None
        self._stop = False
        self._drain = False
        self._actor_threads = 0
        self._thread = threading.Thread(target=self._run, name="edgerl-learner", daemon=True)

    @contextlib.contextmanager
    def acting(self) -> Iterator[nn.Module]:
        with self._weights_lock:
            yield self.actor_net

    @contextlib.contextmanager
    def replay_access(self) -> Iterator[None]:
        with self._replay_lock:
            yield

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self._update_lock:
            yield

    def start(self) -> None:
        if self.t.device.type == "cpu":
            # OpenMP's thread count is per thread: the actor's small batched forward runs on one
            # thread and opens no parallel region of its own. That does not stop it slowing the
            # learner (its core is taken from the learner's team), which is why async loses to
            # sync on a CPU; see resolve_pipeline.
            self._actor_threads = torch.get_num_threads()
            torch.set_num_threads(1)
        self._thread.start()

    def _publish_weights(self) -> None:
        """Copy the learner's weights into the actor's network (in place)."""
        with self._weights_lock, torch.no_grad():
            for a, q in zip(
                self.actor_net.parameters(), self.t.learner.q.parameters(), strict=True
            ):
                a.copy_(q)
            self.actor_version = self.t.learner.updates

    def _run(self) -> None:
        learner = self.t.learner
        if self.t.device.type == "cpu":
            torch.set_num_threads(self._actor_threads)  # the learner keeps every core
        try:
            while True:
                with self.cond:
                    while learner.updates >= self.t.updates_due() and not self._stop:
                        self.cond.wait(0.05)
                    if self._stop and (not self._drain or learner.updates >= self.t.updates_due()):
                        return
                started = time.perf_counter()
                with self._update_lock:
                    self.t.one_update(self._replay_lock)
                self.busy_s += time.perf_counter() - started
                lag = learner.updates - self.actor_version
                self.max_lag_seen = max(self.max_lag_seen, lag)
                if lag >= self.max_policy_lag:
                    self._publish_weights()
                with self.cond:
                    self.cond.notify_all()
        except BaseException as e:  # handed to the actor's thread, which raises it
            self.error = e
            with self.cond:
                self.cond.notify_all()

    def after_step(self) -> None:
        """Wake the learner; wait while the actor is more than ``max_ahead`` updates ahead."""
        learner = self.t.learner
        with self.cond:
            self.cond.notify_all()
            while (
                self.t.updates_due() - learner.updates > self.max_ahead
                and self.error is None
                and not self.t.stop_requested
            ):
                self.cond.wait(0.05)
            self.max_ahead_seen = max(self.max_ahead_seen, self.t.updates_due() - learner.updates)
        self.check()

    def finish(self, drain: bool) -> None:
        """Stop the learner: after the updates still due (``drain``) or after the current one."""
        with self.cond:
            self._stop, self._drain = True, drain
            self.cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()
        if self._actor_threads:
            torch.set_num_threads(self._actor_threads)
            self._actor_threads = 0
        self._publish_weights()
        self.check()

    def check(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error


def resolve_pipeline(setting: str, device: torch.device) -> str:
    """``perf.pipeline``: auto is async with a GPU learner and sync on the CPU.

    On the CPU the learner's parallel regions already use every core; an actor thread beside it
    preempts them and every region waits for the preempted thread. Measured on 2 cores (Pong,
    batch 32): 43 ms per update with the actor beside it against 33 ms alone, so the plain loop
    was faster. With a GPU learner, acting and emulation use the CPU while the GPU learns.
    """
    if setting != "auto":
        return setting
    return "async" if device.type == "cuda" else "sync"


def make_learning(trainer: Trainer) -> Any:
    mode = resolve_pipeline(trainer.cfg.perf.pipeline, trainer.device)
    return AsyncLearning(trainer) if mode == "async" else SyncLearning(trainer)
