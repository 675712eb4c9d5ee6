"""What every learning pipeline shares (:mod:`edgerl.run.pipeline`, :mod:`edgerl.run.lagged`):
acting through the :class:`~edgerl.run.actor.Actor`, and timing the learner and the actor."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from edgerl.hw.device import torch_default_threads
from edgerl.learners import Learner
from edgerl.memories import Memory
from edgerl.run.actor import Actor
from edgerl.run.balance import BalanceSample, Knob


class Pipeline:
    """What every pipeline shares: acting, timing the learner, the pending step."""

    mode = ""

    def __init__(self, learner: Learner, memory: Memory, actor: Actor) -> None:
        self.learner = learner
        self.memory = memory
        self.actor = actor
        self.busy_s = 0.0  # wall seconds in the learner's calls (edgerl bench reads it)
        self.host_s = 0.0  # CPU seconds of the thread making those calls
        self.act_s = 0.0  # wall seconds in the actor's calls (edgerl bench reads it)
        self.actor_wait_s = 0.0  # wall seconds the actor waited for the learner
        self._step = 0
        self._note_values = getattr(memory, "note_values", None)
        self._cpu = learner.device.type == "cpu"

    def act(
        self,
        obs: np.ndarray,
        epsilon: float,
        shown: int | None = None,
        stored: bool = False,
        envs: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Epsilon-greedy actions for ``obs`` (the rows of environments ``envs``; None: all, in
        order) and the Q-values of row ``shown``. ``stored``: ``obs`` are the memory's newest
        observations (every environment, in order), whose greedy values a memory that keeps
        them (PQN's rollout) is given."""
        started = time.perf_counter()
        out = self.actor.act(obs, epsilon, shown, envs)
        self.act_s += time.perf_counter() - started
        values = self.actor.greedy_values
        if stored and values is not None and self._note_values is not None:
            self._note_values(values, self._acted_version())
        return out

    def _acted_version(self) -> int:
        """The learner's update count the weights the actor just acted with come from: the
        learner's own network in one loop; the actor's copy, as old as the pipeline made it,
        where it has one (the learner may have learned on since: values of older weights are
        tagged as theirs, and the learner reuses none of them as its own)."""
        weights = self.actor.weights
        return weights.version if weights.double else self.learner.updates

    def context(self) -> Any:
        """Where the training loop's GPU work goes (the actor's stream)."""
        return self.actor.context()

    def _learn(self, step: int, n: int) -> None:
        started, cpu = time.perf_counter(), time.thread_time()
        self.learner.learn(self.memory, step, n)
        self.busy_s += time.perf_counter() - started
        self.host_s += time.thread_time() - cpu

    def _owed(self, step: int) -> int:
        return self.learner.owed(step, self.memory)

    # The balance (edgerl.run.balance): each side's clock, and what may move live.

    def balance_sample(self) -> BalanceSample:
        """The actor's waits for the learner and the learner's busy time so far. Here (one
        loop): the actor waits exactly while the learner learns; on a GPU the update's device
        time is not the launch's, and it shows up in the next act's wait instead, so the
        learner's time is not known (NaN: no ratio)."""
        busy = self.busy_s if self._cpu else math.nan
        return BalanceSample(time.monotonic(), self.busy_s, busy)

    def knobs(self) -> list[Knob]:
        """What the balancer may move: PyTorch's CPU threads where the learner runs on the CPU
        (in this thread, here)."""
        if not self._cpu:
            return []
        return [Knob("threads", torch.get_num_threads(), 1, torch_default_threads(), self._threads)]

    def _threads(self, count: int) -> None:
        torch.set_num_threads(count)

    # What the training loop calls, in this order; each pipeline says how.

    def start(self) -> None:
        """Start learning (a learner thread where there is one)."""
        raise NotImplementedError

    def after_step(self, step: int) -> None:
        """The loop has stored the vector step that brought it to env step ``step``."""
        raise NotImplementedError

    def paused(self) -> Any:
        """A context inside which the learner's state is consistent (checkpoints)."""
        raise NotImplementedError

    def interrupt(self) -> None:
        """Stop waiting for the learner (a stop was requested); safe from a signal handler."""
        raise NotImplementedError

    def finish(self, drain: bool) -> None:
        """End learning: with ``drain``, after the learning still due."""
        raise NotImplementedError

    def check(self) -> None:
        """Raise the learner thread's error, if it had one."""
        raise NotImplementedError
