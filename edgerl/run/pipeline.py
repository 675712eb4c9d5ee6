"""How learning runs beside acting: inline (sync) or on a learner thread (async; a rollout
learner's own lagged form is in :mod:`edgerl.run.lagged`).

A pipeline is given the learner, its memory (a replay, a rollout) and the
:class:`~edgerl.run.actor.Actor`; the training loop asks it for actions (:meth:`act`), writes
transitions to the memory itself, and calls :meth:`after_step` with the env step count. Both
pipelines make exactly the learning :meth:`Learner.owed` asks for (DQN: the replay ratio's
updates, whatever ``env.num_envs`` is), in groups of ``learner.per_launch`` (DQN:
``perf.updates_per_launch`` updates, one CUDA graph launch each), the remainder at the end (a
learner whose graph makes ``per_launch`` updates a launch makes it one whole launch).

``SyncLearning`` (``perf.pipeline = "sync"``) makes the updates due after every vector step, on
the actor's thread: the plain loop, deterministic for a given seed on the CPU.

``AsyncLearning`` (``perf.pipeline = "async"``) runs the updates on a learner thread while the actor
steps the environments (ALE's threads) and picks actions; PyTorch releases the GIL inside its
kernels, so both make progress. Nothing the actor does waits for the learner's GPU work:

* the learner samples the replay on the GPU while the actor writes it, without a lock or an event:
  it leaves the slots next to the actor's writes alone (a guard gap, :mod:`edgerl.memories.replay`,
  set before the learner's graph is captured: the graph keeps the sampler of its capture);
* the actor acts with a copy of the weights the learner refreshes once it is
  ``perf.max_policy_lag`` updates behind, double-buffered
  (:class:`~edgerl.run.actor.ActorWeights`):
  the learner never writes the copy in use and the actor switches to a new copy at its next step
  once the copy is done (an event query), so the weights that pick an action are at most
  ``max_policy_lag + max_ahead`` updates old;
* the actor works on a CUDA stream of its own, at higher priority than the learner's;
* the learner's draws are independent of one launch to the next: its sampling graph is the only
  graph that draws from the default CUDA generator, and only the learner's thread replays it, so
  each launch moves the generator's offset on once, in order. The actor draws its exploration on
  the host from its own numpy generator (:mod:`edgerl.run.actor` says why not on the GPU).

The only wait is flow control: acting pauses when it is more than ``perf.max_ahead`` updates
ahead of learning (at least one launch: the learner waits for a whole launch to be owed), so
acting never runs away from learning; the learner keeps at most
:data:`MAX_QUEUED_LAUNCHES` launches queued on the GPU (it waits for its own work, holding no
lock), so the updates it has counted are the ones the GPU is doing. What is not deterministic in
async mode: which transitions a sample sees and which weights pick each action depend on timing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from edgerl.config import Config, PerfConfig
from edgerl.config.learners import Schedule, choose_pipeline, learner_info, pipeline_mode
from edgerl.envs import EnvSpec
from edgerl.learners import Learner
from edgerl.learners.factory import prepare_learner
from edgerl.learners.fast_update import Decisions
from edgerl.memories import Memory
from edgerl.report.balance import BalanceSample, Knob
from edgerl.run.actor import Actor, ActorWeights
from edgerl.run.lagged import LaggedRollouts
from edgerl.run.pipeline_base import LearnerThread, Pipeline

log = logging.getLogger(__name__)

MAX_QUEUED_LAUNCHES = 3


class SyncLearning(Pipeline):
    """Updates inline after each vector step."""

    mode = "sync"

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Learner state is consistent inside (for checkpoints)."""
        yield

    def start(self) -> None:
        pass

    def after_step(self, step: int) -> None:
        """Make the updates due at env step ``step`` (whole launches; the rest waits)."""
        self._step = step
        owed = self._owed(step)
        n = owed - owed % self.learner.per_launch
        if n > 0:
            self._learn(step, n)

    def interrupt(self) -> None:
        """Stop waiting (a stop was requested); nothing waits here."""

    def finish(self, drain: bool) -> None:
        """End learning: with ``drain``, after every update still due."""
        owed = self._owed(self._step)
        if drain and owed > 0:
            self._learn(self._step, owed)
        self.learner.losses.flush()

    def check(self) -> None:
        pass


class AsyncLearning(LearnerThread):
    """A learner thread beside the actor; see the module docstring."""

    mode = "async"

    def __init__(self, learner: Learner, memory: Memory, actor: Actor, perf: PerfConfig) -> None:
        super().__init__(learner, memory, actor)
        # Set already where the learner's graph samples (build_learning sets it before the
        # capture, which keeps it); here for a learner that samples eagerly.
        memory.set_guard(True)
        self.max_policy_lag = perf.max_policy_lag
        # The learner waits until a whole launch is owed: an actor that stopped with fewer owed
        # would wait for it for ever. Acting may run at least one launch ahead.
        self.max_ahead = max(perf.max_ahead, learner.per_launch)
        if self.max_ahead > perf.max_ahead:
            log.info(
                "perf.max_ahead=%d is below the %d updates of one launch of the learner's graph "
                "(perf.updates_per_launch): acting may run %d updates ahead",
                perf.max_ahead,
                learner.per_launch,
                self.max_ahead,
            )
        self._update_lock = threading.Lock()  # held while launching updates, never across a wait
        self.max_lag_seen = 0
        self.max_ahead_seen = 0
        self._launched: deque[Any] = deque()
        self._drain = False
        self._max_ahead_set = perf.max_ahead
        self.idle_s = 0.0  # wall seconds the learner thread waited for work
        self._started = 0.0

    def act(
        self,
        obs: np.ndarray,
        epsilon: float,
        shown: int | None = None,
        stored: bool = False,
        envs: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The policy's actions with the actor's weights; records how many updates old they
        were (:attr:`max_lag_seen`). ``stored`` is ignored: the actor's copy of the weights lags
        the learner's, so its values are not the learner's."""
        out = super().act(obs, epsilon, shown, stored, envs)
        self.max_lag_seen = max(self.max_lag_seen, self.learner.updates - self.weights.version)
        return out

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No update is launched inside, and the caller's stream runs after every one launched
        (a wait on the GPU): what the caller reads of the learner is consistent."""
        with self._update_lock:
            if self.stream is not None:
                torch.cuda.current_stream().wait_stream(self.stream)
            yield

    def start(self) -> None:
        self._started = time.monotonic()
        super().start()

    def _next_work(self) -> tuple[int, int] | None:
        """(step, updates to make) once a launch is due, or None when told to stop."""
        k = self.learner.per_launch
        started = time.perf_counter()
        with self.cond:
            while self._owed(self._step) < k and not self._stop:
                self.cond.wait(0.05)
            self.idle_s += time.perf_counter() - started
            owed = self._owed(self._step)
            if self._stop and (not self._drain or owed <= 0):
                return None
            return self._step, min(k, owed)  # a remainder only when draining

    def _work(self, work: tuple[int, int]) -> None:
        """One launch of ``n`` updates at env step ``step``, then the actor's weights where they
        are ``perf.max_policy_lag`` behind."""
        step, n = work
        with self._update_lock:
            self._learn(step, n)
            if self.cuda:
                launched = torch.cuda.Event()
                launched.record()
                self._launched.append(launched)
        while len(self._launched) > MAX_QUEUED_LAUNCHES:
            self._launched.popleft().synchronize()  # our own work, no lock held
        if self.learner.updates - self.weights.version >= self.max_policy_lag:
            self.weights.publish(self.learner.updates)
        with self.cond:
            self.cond.notify_all()

    def after_step(self, step: int) -> None:
        """Wake the learner; wait while the actor is more than ``max_ahead`` updates ahead."""
        with self.cond:
            self._step = step
            self.cond.notify_all()
            if self._owed(step) > self.max_ahead:
                started = time.perf_counter()
                while (
                    self._owed(step) > self.max_ahead
                    and self.error is None
                    and not self._interrupted
                ):
                    self.cond.wait(0.05)
                self.actor_wait_s += time.perf_counter() - started
            self.max_ahead_seen = max(self.max_ahead_seen, self._owed(step))
        self.check()

    def balance_sample(self) -> BalanceSample:
        """The actor's waits (flow control) and the learner thread's time not spent waiting
        for work: launching, and on a GPU waiting for its own launches (its device's time)."""
        now = time.monotonic()
        busy = now - self._started - self.idle_s if self._started else 0.0
        return BalanceSample(now, self.actor_wait_s, max(0.0, busy))

    def knobs(self) -> list[Knob]:
        """The actor's lead (doubled or halved, from one launch to 8 times the setting) and,
        with the learner on the CPU, its thread's PyTorch threads."""
        lead = Knob(
            "max_ahead",
            self.max_ahead,
            self.learner.per_launch,
            max(self.max_ahead, 8 * self._max_ahead_set),
            self._lead,
            doubling=True,
        )
        return [*super().knobs(), lead]

    def _lead(self, updates: int) -> None:
        self.max_ahead = updates

    def finish(self, drain: bool) -> None:
        """Stop the learner: after the updates still due (``drain``) or after the current one."""
        with self.cond:
            self._drain = drain  # before the stop: the learner reads both under the lock
        self._end()


def resolve_pipeline(setting: str, device: torch.device, *, concurrent: bool = True) -> str:
    """``perf.pipeline`` on ``device``: auto is async with a GPU learner and sync on the CPU; a
    learner that may not learn beside the actor (not ``concurrent``) is always sync
    (:func:`edgerl.config.learners.pipeline_mode` says why)."""
    return choose_pipeline(setting, device.type, concurrent)


def make_learning(perf: PerfConfig, learner: Learner, memory: Memory, actor: Actor) -> Pipeline:
    """The pipeline ``perf.pipeline`` asks for on the learner's device (``actor`` made with
    double-buffered weights for async, see :func:`wants_double_weights`): for async, the one
    the learner's registry entry's :class:`~edgerl.config.learners.Schedule` maps to."""
    if not wants_double_weights(perf, learner.device, learner.kind):
        return SyncLearning(learner, memory, actor)
    schedule = learner_info(learner.kind).schedule
    if schedule is Schedule.ROLLOUT_LAG:  # the learner's rollouts, one behind the actor's
        return LaggedRollouts(learner, memory, actor)  # type: ignore[arg-type]
    return AsyncLearning(learner, memory, actor, perf)


def wants_double_weights(perf: PerfConfig, device: torch.device, algo: str) -> bool:
    """Whether the actor needs weights of its own: the async pipeline, for learner ``algo``."""
    return pipeline_mode(perf.pipeline, device.type, algo) == "async"


def build_learning(
    cfg: Config,
    spec: EnvSpec,
    learner: Learner,
    memory: Memory,
    actor_rng: np.random.Generator,
    remaining_updates: int,
    decisions: Decisions | None = None,
) -> Pipeline:
    """Make the learner fast (:func:`edgerl.learners.factory.prepare_learner`) and wrap it, its
    memory and an actor in the pipeline ``perf.pipeline`` asks for.

    The pipeline is decided first: an async learner samples while the actor writes, so its
    replay leaves a guard gap by the actor's writes, and a CUDA graph that samples keeps the
    guard it was captured with."""
    device = learner.device
    concurrent = wants_double_weights(cfg.perf, device, learner.kind)
    if concurrent:
        memory.set_guard(True)
    prepare_learner(cfg, spec, learner, memory, remaining_updates, decisions)
    policy = learner.policy
    actor = Actor(
        ActorWeights(policy.net, concurrent),
        policy,
        cfg.env.batch_size or cfg.env.num_envs,  # the rows of one step
        actor_rng,
        spec.obs_shape,
        spec.obs_dtype,
        use_graph=learner.cuda_graphs,
    )
    return make_learning(cfg.perf, learner, memory, actor)
