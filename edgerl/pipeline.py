"""How learning runs beside acting: inline (sync) or on a learner thread (async).

A pipeline is given the learner and the replay; the training loop asks it for the Q-values of
the observations (:meth:`act`), writes transitions inside :meth:`storing`, and calls
:meth:`after_step` with the env step count. Both pipelines keep the replay ratio exact: the
learner makes exactly the updates :meth:`DQN.updates_due` asks for, whatever ``env.num_envs`` is.

``SyncLearning`` (``perf.pipeline = "sync"``) makes the updates due after every vector step, on
the actor's thread: the plain loop, deterministic for a given seed.

``AsyncLearning`` (``perf.pipeline = "async"``) runs the updates on a learner thread while the actor
steps the environments (ALE's threads) and picks actions; PyTorch releases the GIL inside its
kernels, so both make progress. The actor acts with its own copy of the network, refreshed whenever
the learner is ``perf.max_policy_lag`` updates ahead of it, and it waits when it is more than
``perf.max_ahead`` updates ahead of the learner, so acting never runs away from learning. What is
not deterministic in async mode: which transitions a sample sees (the actor may have added up to
``max_ahead * train_freq`` more steps) and which weights pick each action (up to
``max_policy_lag`` updates old) depend on thread timing.

On CUDA the actor works on a CUDA stream of its own, with its observations copied through pinned
memory, so that its copies and forward passes never queue behind the learner's updates on the
default stream. Where the two meet, CUDA events order the GPU work: the actor's forward waits for
the newest published weights, the learner's sample waits for the actor's replay writes, and the
actor's next replay write waits for the learner's last sample to have been gathered.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from edgerl.config import PerfConfig
from edgerl.dqn import DQN
from edgerl.replay import Batch, ReplayBuffer

log = logging.getLogger(__name__)


class _Observations:
    """The actor's observations on the learner's device; through pinned memory on CUDA, so the
    copy is asynchronous on the actor's stream. Reused only after the actor has read back the
    previous forward pass, which waits for the previous copy too."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pinned: torch.Tensor | None = None

    def to_device(self, obs: np.ndarray) -> torch.Tensor:
        if self.device.type != "cuda":
            return torch.as_tensor(obs, device=self.device)
        if self._pinned is None or tuple(self._pinned.shape) != obs.shape:
            self._pinned = torch.empty(obs.shape, dtype=getattr(torch, obs.dtype.name)).pin_memory()
        self._pinned.numpy()[...] = obs
        return self._pinned.to(self.device, non_blocking=True)


def q_values_on_host(net: nn.Module, x: torch.Tensor) -> np.ndarray:
    """Q-values of ``x`` as a host array (one small device-to-host copy)."""
    with torch.no_grad():
        return net(x).float().cpu().numpy()


class SyncLearning:
    """Updates inline after each vector step."""

    mode = "sync"

    def __init__(self, learner: DQN, replay: ReplayBuffer) -> None:
        self.learner = learner
        self.replay = replay
        self.busy_s = 0.0  # seconds spent in updates (edgerl bench reads it)
        self._obs = _Observations(learner.device)
        self._step = 0

    def act(self, obs: np.ndarray) -> np.ndarray:
        """The Q-values of ``obs`` (host array, float32) with the learner's network."""
        return q_values_on_host(self.learner.q, self._obs.to_device(obs))

    @contextlib.contextmanager
    def storing(self) -> Iterator[ReplayBuffer]:
        """The replay, to write transitions to."""
        yield self.replay

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Learner state is consistent inside (for checkpoints)."""
        yield

    def start(self) -> None:
        pass

    def after_step(self, step: int) -> None:
        """Make the updates due at env step ``step``."""
        self._step = step
        started = time.perf_counter()
        while self.learner.updates < self.learner.updates_due(step):
            self.learner.learn(self.replay, step)
        self.busy_s += time.perf_counter() - started

    def interrupt(self) -> None:
        """Stop waiting (a stop was requested); nothing waits here."""

    def finish(self, drain: bool) -> None:
        """End learning: with ``drain``, after the updates still due."""
        if drain:
            self.after_step(self._step)
        self.learner.losses.flush()

    def check(self) -> None:
        pass


class _GuardedReplay:
    """The replay as the learner thread sees it: sampling under the replay lock, ordered after
    the actor's writes on the GPU."""

    def __init__(self, pipeline: AsyncLearning) -> None:
        self.p = pipeline

    def sample(self, batch_size: int) -> Batch:
        p = self.p
        with p.replay_lock:
            if p.cuda:
                torch.cuda.current_stream().wait_event(p.written)
            batch = p.replay.sample(batch_size)
            if p.cuda:
                p.sampled.record()
        return batch


class AsyncLearning:
    """A learner thread beside the actor; see the module docstring."""

    mode = "async"

    def __init__(self, learner: DQN, replay: ReplayBuffer, perf: PerfConfig) -> None:
        self.learner = learner
        self.replay = replay
        self.max_policy_lag = perf.max_policy_lag
        self.max_ahead = perf.max_ahead
        self.cond = threading.Condition()
        self.replay_lock = threading.Lock()
        self._weights_lock = threading.Lock()
        self._update_lock = threading.Lock()
        self.actor_net = copy.deepcopy(learner.q).eval().requires_grad_(False)
        self.actor_version = learner.updates
        self.max_lag_seen = 0
        self.max_ahead_seen = 0
        self.busy_s = 0.0  # seconds spent in updates (edgerl bench reads it)
        self.error: BaseException | None = None
        self.cuda = learner.device.type == "cuda"
        if self.cuda:
            self.actor_stream = torch.cuda.Stream()
            self.published = torch.cuda.Event()  # the actor's weights were last copied
            self.written = torch.cuda.Event()  # the actor's last replay write
            self.sampled = torch.cuda.Event()  # the learner's last sample was gathered
        self._obs = _Observations(learner.device)
        self._sampler = _GuardedReplay(self)
        self._step = 0
        self._stop = False
        self._drain = False
        self._interrupted = False
        self._actor_threads = 0
        self._thread = threading.Thread(target=self._run, name="edgerl-learner", daemon=True)

    def _actor_stream(self) -> Any:
        return torch.cuda.stream(self.actor_stream) if self.cuda else contextlib.nullcontext()

    def act(self, obs: np.ndarray) -> np.ndarray:
        """The Q-values of ``obs`` (host array) with the actor's copy of the network."""
        with self._weights_lock, self._actor_stream():
            if self.cuda:
                self.actor_stream.wait_event(self.published)
            return q_values_on_host(self.actor_net, self._obs.to_device(obs))

    @contextlib.contextmanager
    def storing(self) -> Iterator[ReplayBuffer]:
        """The replay, to write transitions to, under the replay lock (on the actor's stream)."""
        with self.replay_lock, self._actor_stream():
            if self.cuda:
                self.actor_stream.wait_event(self.sampled)
            yield self.replay
            if self.cuda:
                self.written.record(self.actor_stream)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self._update_lock:
            yield

    def start(self) -> None:
        if self.learner.device.type == "cpu":
            # OpenMP's thread count is per thread: the actor's small batched forward runs on one
            # thread and opens no parallel region of its own. That does not stop it slowing the
            # learner (its core is taken from the learner's team), which is why async loses to
            # sync on a CPU; see resolve_pipeline.
            self._actor_threads = torch.get_num_threads()
            torch.set_num_threads(1)
        self._thread.start()

    def _publish_weights(self) -> None:
        """Copy the learner's weights into the actor's network (in place, on the learner's
        stream; the actor's next forward waits for the copy through ``published``)."""
        with self._weights_lock, torch.no_grad():
            for a, q in zip(self.actor_net.parameters(), self.learner.q.parameters(), strict=True):
                a.copy_(q)
            if self.cuda:
                self.published.record()
            self.actor_version = self.learner.updates

    def _due(self) -> int:
        return self.learner.updates_due(self._step)

    def _run(self) -> None:
        learner = self.learner
        if self.learner.device.type == "cpu":
            torch.set_num_threads(self._actor_threads)  # the learner keeps every core
        try:
            while True:
                with self.cond:
                    while learner.updates >= self._due() and not self._stop:
                        self.cond.wait(0.05)
                    if self._stop and (not self._drain or learner.updates >= self._due()):
                        return
                    step = self._step
                started = time.perf_counter()
                with self._update_lock:
                    learner.learn(self._sampler, step)
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

    def after_step(self, step: int) -> None:
        """Wake the learner; wait while the actor is more than ``max_ahead`` updates ahead."""
        learner = self.learner
        with self.cond:
            self._step = step
            self.cond.notify_all()
            while (
                self._due() - learner.updates > self.max_ahead
                and self.error is None
                and not self._interrupted
            ):
                self.cond.wait(0.05)
            self.max_ahead_seen = max(self.max_ahead_seen, self._due() - learner.updates)
        self.check()

    def interrupt(self) -> None:
        """Stop waiting for the learner (a stop was requested); safe from a signal handler."""
        self._interrupted = True

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
        self.learner.losses.flush()
        if self.cuda:
            torch.cuda.synchronize()
        self.check()

    def check(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error


Learning = SyncLearning | AsyncLearning


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


def make_learning(perf: PerfConfig, learner: DQN, replay: ReplayBuffer) -> Learning:
    """The pipeline ``perf.pipeline`` asks for on the learner's device."""
    if resolve_pipeline(perf.pipeline, learner.device) == "async":
        return AsyncLearning(learner, replay, perf)
    return SyncLearning(learner, replay)
