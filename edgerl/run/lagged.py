"""A rollout learner beside the actor: rollout r is collected while rollout r-1 is learned.

PQN learns from each rollout once it is full (:mod:`edgerl.learners.pqn`). In the plain loop
(:class:`~edgerl.run.pipeline.SyncLearning`) the environments then wait for the learning, and the
learner waits for the next rollout: on a GPU each side leaves the other idle (the H200's PQN
run had the GPU 17% busy). Here the learner works on a thread of its own, as GA3C's trainers and
IMPALA's learner do, with a policy lag of exactly one rollout:

* rollout 0 is collected with the weights theta_0 the run starts from; for r >= 1, rollout r is
  collected with theta_(r-1) (the weights after r-1 rollouts were learned) while the learner
  learns rollout r-1, starting from theta_(r-1) and ending at theta_r. The lag is the same at
  every step (one rollout of updates: ``pqn.epochs x pqn.minibatches``), whatever the timing, so
  a seeded run repeats exactly;
* the switch happens at the rollout's boundary, on the actor's thread: before the first action
  of rollout r, the actor waits until rollout r-2 is learned (usually long done) and copies the
  weights, theta_(r-1), into its own copy; only then is rollout r-1 handed to the learner, so the
  learner never changes weights the actor is copying;
* the rollout handed over is the memory's full one (:meth:`RolloutBuffer.take_full`): the actor
  goes on writing into a second set of tensors, and the learner's rollout never changes under
  it. Handing over waits until the learner has finished the rollout before (at most one is
  being learned);
* the learner's greedy values for its targets are its own (the actor's come from older weights),
  as the async pipeline computes them for DQN.

On a GPU the learner works on a CUDA stream of its own and waits for its own work at the end of
each rollout (its thread, not the actor's); the actor's weight copy is made on the actor's stream
after the learner's last rollout finished, and the learner's stream waits for that copy before
it changes the weights again.

What it measures for the balance (:mod:`edgerl.report.balance`): the actor's waits for the learner
and the learner's waits for a rollout, so the CPU/GPU ratio says which side waits for which.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from edgerl.learners import Learner
from edgerl.memories.rollout import RolloutBuffer
from edgerl.report.balance import BalanceSample
from edgerl.run.actor import Actor
from edgerl.run.pipeline_base import LearnerThread


class LaggedRollouts(LearnerThread):
    """The learner learns rollout r-1 on its own thread while rollout r is collected; see the
    module docstring."""

    mode = "async"

    def __init__(self, learner: Learner, memory: RolloutBuffer, actor: Actor) -> None:
        super().__init__(learner, memory, actor)
        self.rollout = memory
        self.vector_steps = memory.steps  # vector steps (acts) per rollout
        self.acts = 0  # vector steps acted this session
        self.adopted = 0  # the rollout the actor's weights are for (theta_(adopted - 1))
        self.weights_learned = 0  # rollouts learned into the actor's weights
        self.handed = 0  # rollouts handed to the learner this session
        self.learned = 0  # of those, the ones learned
        # The lag of every act after the first rollout, in rollouts: {1} (the tests read it).
        self.lags_seen: set[int] = set()
        self.wait_s = 0.0  # wall seconds the actor waited for the learner
        self.idle_s = 0.0  # wall seconds the learner waited for a rollout
        self._queue: list[tuple[RolloutBuffer, int, Any]] = []

    # -- the actor's side ------------------------------------------------------------------------

    def act(
        self,
        obs: np.ndarray,
        epsilon: float,
        shown: int | None = None,
        stored: bool = False,
        envs: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The policy's actions with the weights of one rollout before (the greedy values
        noted for the memory carry those weights' version, not the learner's)."""
        rollout = self.acts // self.vector_steps  # the rollout this step belongs to
        self._adopt(rollout)
        out = super().act(obs, epsilon, shown, stored, envs)
        if rollout > 0:
            self.lags_seen.add(rollout - self.weights_learned)
        self.acts += 1
        return out

    def _adopt(self, rollout: int) -> None:
        """Give the actor theta_(rollout - 1) (once per rollout): wait until rollout - 2 is
        learned, then copy the learner's weights (rollout - 1 is not handed over yet)."""
        if rollout <= self.adopted:
            return
        self._wait_until(lambda: self.learned >= rollout - 1)
        if self.learned < rollout - 1:  # stopping: the learner may still change the weights
            return
        self.weights.adopt(self.learner.updates)
        self.adopted, self.weights_learned = rollout, self.learned

    def after_step(self, step: int) -> None:
        """Hand a full rollout to the learner (after the actor has its weights)."""
        self._step = step
        if self.rollout.full:
            self._hand_over(step)
        self.check()

    def _hand_over(self, step: int) -> None:
        self._adopt(self.handed + 1)
        self._wait_until(lambda: self.learned >= self.handed)  # at most one being learned
        if self.learned < self.handed or self.adopted <= self.handed:
            # Stopping while the learner still has the rollout before: this one is not learned
            # (a resumed run starts a new rollout), and the learner's is left alone.
            self.rollout.clear()
            return
        full = self.rollout.take_full()
        copied = None
        if self.cuda:  # the learner's stream waits for the actor's writes and weight copy
            copied = torch.cuda.Event()
            copied.record()
        with self.cond:
            self._queue.append((full, step, copied))
            self.handed += 1
            self.cond.notify_all()

    def _wait_until(self, done: Any) -> None:
        started = time.perf_counter()
        with self.cond:
            while not done() and self.error is None and not self._interrupted:
                self.cond.wait(0.05)
        self.wait_s += time.perf_counter() - started
        self.check()

    # -- the learner's side ----------------------------------------------------------------------

    def _next_work(self) -> tuple[RolloutBuffer, int, Any] | None:
        started = time.perf_counter()
        with self.cond:
            while not self._queue and not self._stop:
                self.cond.wait(0.05)
            self.idle_s += time.perf_counter() - started
            return self._queue.pop(0) if self._queue else None

    def _work(self, work: tuple[RolloutBuffer, int, Any]) -> None:
        """Learn a rollout handed over (after the actor's writes and weight copy, on a GPU)."""
        full, step, copied = work
        if copied is not None:
            torch.cuda.current_stream().wait_event(copied)
        self._learn(full, step)
        with self.cond:
            self.learned += 1
            self.cond.notify_all()

    def _learn(self, full: RolloutBuffer, step: int) -> None:  # type: ignore[override]
        """Learn ``full``; the time counted runs until the device has done it (the learner's
        own wait, holding no lock)."""
        started, cpu = time.perf_counter(), time.thread_time()
        self.learner.learn(full, step, 1)
        self.host_s += time.thread_time() - cpu
        if self.cuda:
            torch.cuda.current_stream().synchronize()
        self.busy_s += time.perf_counter() - started

    def balance_sample(self) -> BalanceSample:
        """The actor's waits at rollout boundaries and the learner's time learning."""
        return BalanceSample(time.monotonic(), self.wait_s, self.busy_s)

    # -- both ------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No rollout is being learned inside (the actor's thread hands rollouts over, so none
        starts): what the caller reads of the learner is consistent."""
        self._wait_until(lambda: self.learned >= self.handed)
        yield

    def finish(self, drain: bool) -> None:
        """Stop the learner once the rollouts handed over are learned (every one: a rollout's
        learning is not cut in the middle); ``drain`` changes nothing here, as every full
        rollout was handed over at its last step."""
        with self.cond:
            while self.learned < self.handed and self.error is None:
                self.cond.wait(0.05)
        self._end()
