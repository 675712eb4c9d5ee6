"""The learner alone, as the training loops run it: the learner-bound limit of ``edgerl bench``.

A replay learner samples a filled replay (written by the real write path from random
observations) and updates; a rollout learner learns whole rollouts. On a GPU a launch returns
before its work is done (a CUDA graph's replay), so the time runs until the device has finished
the last launch (:func:`time_launches`): an earlier version waited for each launch outside the
timed window, and reported the launch rate (28,695 updates/s on an H200) as the limit (the
learner made 1,335 on an H100 with the GPU's time counted).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from edgerl.config import Config
from edgerl.envs import EnvSpec
from edgerl.learners.factory import build_learner, build_memory, prepare_learner
from edgerl.learners.kinds import learner_kind
from edgerl.memories import Memory


class RandomSteps:
    """Writes steps of random observations into a learner's memory by its real write path (the
    learner's speed depends on the sampling and updates, not on the pixels)."""

    def __init__(self, spec: EnvSpec, num_envs: int, memory: Memory) -> None:
        self.rng = np.random.default_rng(0)
        self.spec, self.num_envs, self.memory = spec, num_envs, memory
        high = 256 if spec.has_frames else 1
        size = (64, num_envs, *spec.obs_shape)
        self.obs = self.rng.integers(0, high, size=size).astype(spec.obs_dtype)
        self.i = 0
        memory.add_first(self.obs[0])

    def write(self, steps: int) -> None:
        none = np.zeros(self.num_envs, dtype=bool)
        for _ in range(steps):
            self.i += 1
            ended = self.rng.random(self.num_envs) < 0.002
            actions = self.rng.integers(self.spec.num_actions, size=self.num_envs)
            rewards = self.rng.normal(size=self.num_envs).astype(np.float32)
            final = self.obs[(self.i + 7) % 64] if ended.any() else None
            self.memory.add(actions, rewards, ended, none, self.obs[self.i % 64], final)


QUEUE_BOUND = 64  # launches queued ahead of the device at most while timing, as in training


def _nothing() -> None:
    """Waits for nothing: a CPU learner's work is done when its call returns."""


def time_launches(
    launch: Callable[[], None], launches: int, wait: Callable[[], None]
) -> tuple[float, float]:
    """(wall seconds, host CPU seconds) of ``launches`` calls of ``launch``, where ``wait``
    returns once all work launched so far has finished (``torch.cuda.synchronize``).

    The wall time runs from the first launch until ``wait`` returns after the last, so work a
    launch leaves running on the device (a CUDA graph's replay returns at once) is counted;
    the queue is drained every :data:`QUEUE_BOUND` launches inside the timed region. Host time
    is the calling thread's CPU time inside the launches only (no spinning in ``wait``)."""
    wait()  # nothing from before is counted
    host = 0.0
    started = time.perf_counter()
    for i in range(1, launches + 1):
        cpu = time.thread_time()
        launch()
        host += time.thread_time() - cpu
        if i % QUEUE_BOUND == 0:
            wait()
    wait()
    return time.perf_counter() - started, host


def learner_limit(
    cfg: Config, spec: EnvSpec, device: torch.device, seconds: float
) -> dict[str, Any]:
    """The learner alone as the loops run it, from a memory written by the real write path:
    DQN samples a filled replay on its device and updates (``perf.*`` as configured, updates
    per launch included), PQN learns from full rollouts (their writing is not timed). Returns
    updates/s, the env steps/s that much learning stands for (the learner-bound limit) and the
    host CPU time per update. A learner whose work is not units made from a memory measures
    itself: its kind's ``measure_alone(cfg, spec, device, seconds)`` (the genetic algorithm's
    members handed out and their forward passes)."""
    alone = learner_kind(cfg.agent.algo).measure_alone(cfg, spec, device, seconds)
    if alone is not None:
        return alone
    learner = build_learner(cfg, spec, device)
    memory = build_memory(cfg, spec, device)
    writer = RandomSteps(spec, cfg.env.num_envs, memory)
    kept = memory.keeps_steps
    if kept:  # a replay learner samples a filled replay; a unit is an update
        writer.write(min(cfg.replay.capacity // cfg.env.num_envs, 2_000))
    prepare_learner(cfg, spec, learner, memory, 10**6)
    k = learner.per_launch
    wait = torch.cuda.synchronize if device.type == "cuda" else _nothing

    def timed(units: int) -> tuple[float, float, int]:
        """(seconds, host CPU seconds, updates) of ``units`` units of learning."""
        before = learner.updates
        launches = range(0, units, k)
        if kept:
            seconds, host = time_launches(lambda: learner.learn(memory, 0, k), len(launches), wait)
        else:  # each rollout is written untimed, then learned with its device work timed
            seconds = host = 0.0
            for _ in launches:
                writer.write(memory.steps)
                s, h = time_launches(lambda: learner.learn(memory, 0, k), 1, wait)
                seconds, host = seconds + s, host + h
        return seconds, host, learner.updates - before

    timed(2 * k)  # warm-up: allocations, autotuning
    launch_s = timed(k)[0]  # how long one launch (k units) takes, to size the measurement
    units = k * max(3, math.ceil(seconds / max(launch_s, 1e-6)))
    elapsed, host_s, updates = timed(units)
    return {
        "updates_per_s": updates / elapsed,
        "steps_per_s": units * learner.steps_per_unit / elapsed,
        "updates_per_launch": learner.per_launch,
        "host_us_per_update": 1e6 * host_s / max(1, updates),
        "describe": learner.describe(),
    }
