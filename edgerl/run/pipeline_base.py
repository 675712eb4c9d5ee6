"""What every learning pipeline shares (:mod:`edgerl.run.pipeline`, :mod:`edgerl.run.lagged`):
acting through the :class:`~edgerl.run.actor.Actor`, and timing the learner and the actor
(:class:`Pipeline`); and what the two with a learner thread share (:class:`LearnerThread`)."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from typing import Any

import numpy as np
import torch

from edgerl.hw.device import torch_default_threads
from edgerl.learners import Learner
from edgerl.memories import Memory
from edgerl.report.balance import BalanceSample, Knob
from edgerl.run.actor import Actor


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
        self._cpu = learner.device.type == "cpu"

    def act(
        self,
        obs: np.ndarray,
        epsilon: float,
        shown: int | None = None,
        stored: bool = False,
        envs: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The learner's policy's actions for ``obs`` (the rows of environments ``envs``; None:
        all, in order) and the per-action figures of row ``shown``. ``stored``: ``obs`` are the
        memory's newest observations (every environment, in order), whose extras (the policy's,
        such as PQN's greedy values) a memory that keeps them is given."""
        started = time.perf_counter()
        out = self.actor.act(obs, epsilon, shown, envs)
        self.act_s += time.perf_counter() - started
        extras = self.actor.extras
        if stored and extras:
            self.memory.note_extras(extras, self._acted_version())
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

    # The balance (edgerl.report.balance): each side's clock, and what may move live.

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


class LearnerThread(Pipeline):
    """What the two pipelines with a learner thread share (:class:`~edgerl.run.pipeline.
    AsyncLearning`: updates beside the actor; :class:`~edgerl.run.lagged.LaggedRollouts`: a
    rollout learned while the next is collected): the thread, on a CUDA stream of its own on a
    GPU; the CPU threads it and the actor keep; its error, raised on the actor's thread; and how
    it stops. A subclass says what the learner waits for (:meth:`_next_work`, None: stop) and
    does with it (:meth:`_work`), both on the learner's thread, under :attr:`cond`."""

    def __init__(self, learner: Learner, memory: Memory, actor: Actor) -> None:
        super().__init__(learner, memory, actor)
        self.weights = actor.weights
        self.error: BaseException | None = None
        self.cond = threading.Condition()
        self.cuda = learner.device.type == "cuda"
        self.stream = torch.cuda.Stream() if self.cuda else None
        self._stop = False
        self._interrupted = False
        self._actor_threads = 0
        self._threads_wanted = 0
        self._thread = threading.Thread(target=self._run, name="edgerl-learner", daemon=True)

    def _next_work(self) -> Any:
        """Wait for what to learn next; None once told to stop (the learner's thread)."""
        raise NotImplementedError

    def _work(self, work: Any) -> None:
        """Learn ``work`` (the learner's thread, on its stream)."""
        raise NotImplementedError

    def start(self) -> None:
        if not self.cuda:
            # OpenMP's thread count is per thread: the actor's small batched forward runs on one
            # thread and opens no parallel region of its own. That does not stop it slowing the
            # learner (its core is taken from the learner's team), which is why a learner
            # thread loses to the plain loop on a CPU (edgerl.config.learners.pipeline_mode).
            self._actor_threads = torch.get_num_threads()
            torch.set_num_threads(1)
        self._thread.start()

    def _run(self) -> None:
        if not self.cuda:
            torch.set_num_threads(self._actor_threads)  # the learner keeps every core
        stream = torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext()
        try:
            with stream:
                while (work := self._next_work()) is not None:
                    if self._threads_wanted:
                        torch.set_num_threads(self._threads_wanted)
                        self._threads_wanted = 0
                    self._work(work)
        except BaseException as e:  # handed to the actor's thread, which raises it
            self.error = e
            with self.cond:
                self.cond.notify_all()

    def _threads(self, count: int) -> None:
        self._threads_wanted = count  # the learner thread sets its own (OpenMP's is per thread)

    def interrupt(self) -> None:
        """Stop waiting for the learner (a stop was requested); safe from a signal handler."""
        self._interrupted = True

    def _end(self) -> None:
        """Stop the thread once its :meth:`_next_work` says so, and leave the process as it
        was: the actor's CPU threads back, the device's work done, the actor's weights the
        learner's, the losses counted; then raise the thread's error, if it had one."""
        with self.cond:
            self._stop = True
            self.cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()
        if self._actor_threads:
            torch.set_num_threads(self._actor_threads)
            self._actor_threads = 0
        if self.cuda:
            torch.cuda.synchronize()
        self.weights.sync(self.learner.updates)
        self.learner.losses.flush()
        self.check()

    def check(self) -> None:
        """Raise the learner thread's error, if it had one (once)."""
        if self.error is not None:
            error, self.error = self.error, None
            raise error
