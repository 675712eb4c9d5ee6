"""What a replay and the environments cost in memory, and whether they fit, before allocating.

A transition stores one item (the newest 84x84 frame, or the whole vector), its action (a byte
for a discrete game, 4 bytes a number for a continuous one), reward and flags: about 7 KB for
Atari. The replay refuses a ``replay.capacity`` that does not fit with the largest that does,
and the trainer refuses more ``env.num_envs`` than host memory holds, before building any (too
many would swap the board or get the trainer killed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from edgerl.envs import EnvSpec
from edgerl.errors import DeviceError, EnvMemoryError, ReplayMemoryError
from edgerl.hw.device import integrated_gpu
from edgerl.words import fmt_bytes

# Share of the available memory the replay may take; the rest is for the process, torch and the OS.
MEMORY_SHARE = 0.8
# Host memory one environment costs. Measured as the growth of the process's RSS (psutil) around
# building N environments with envs.make_env, resetting them and taking 3 steps, on x86-64 with
# ale-py 0.12.1 and gymnasium 1.4.0: ALE's AtariVectorEnv (Pong, 84x84, 4 stacked frames) grew
# 1,551 KiB per env at 32 envs and 1,560 KiB at 128; gymnasium's SyncVectorEnv of CartPole-v1
# 4.4 KiB per env at 2,000 and 8,000. Rounded up for games and ids with more state than these.
ATARI_ENV_BYTES = 1792 << 10
VECTOR_ENV_BYTES = 16 << 10


@dataclass(frozen=True)
class MemoryPlan:
    """What a replay of ``capacity`` transitions costs and whether it fits."""

    capacity: int
    bytes_per_transition: int
    total_bytes: int
    available_bytes: int
    where: str

    @property
    def usable_bytes(self) -> int:
        return int(self.available_bytes * MEMORY_SHARE)

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.usable_bytes

    @property
    def max_capacity(self) -> int:
        return self.usable_bytes // self.bytes_per_transition

    def check(self) -> None:
        """Raise ReplayMemoryError with what to change if the replay does not fit."""
        if self.fits:
            return
        raise ReplayMemoryError(
            f"replay.capacity={self.capacity:,} needs {fmt_bytes(self.total_bytes)} "
            f"({self.bytes_per_transition:,} bytes per transition) but only "
            f"{fmt_bytes(self.available_bytes)} of {self.where} memory is available, of which "
            f"edgerl uses at most {MEMORY_SHARE:.0%}; set replay.capacity to at most "
            f"{self.max_capacity:,}"
        )


def bytes_per_env(spec: EnvSpec) -> int:
    """Host memory one environment of ``spec`` costs (see :data:`ATARI_ENV_BYTES`)."""
    return ATARI_ENV_BYTES if spec.has_frames else VECTOR_ENV_BYTES


@dataclass(frozen=True)
class EnvMemoryPlan:
    """What ``num_envs`` environments cost in host memory, beside the replay if it is there."""

    num_envs: int
    bytes_per_env: int
    available_bytes: int  # host memory available
    replay_bytes: int  # the learner memory's share of it (0 when it lives on a GPU)
    memory: str = "the replay"  # what the learner's memory is called
    memory_key: str = "replay.capacity"  # the key that makes it smaller

    @property
    def total_bytes(self) -> int:
        return self.num_envs * self.bytes_per_env

    @property
    def usable_bytes(self) -> int:
        return int(self.available_bytes * MEMORY_SHARE) - self.replay_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.usable_bytes

    @property
    def max_num_envs(self) -> int:
        return max(0, self.usable_bytes // self.bytes_per_env)

    def check(self) -> None:
        """Raise EnvMemoryError with the largest env.num_envs that fits, if these do not."""
        if self.fits:
            return
        replay = fmt_bytes(self.replay_bytes)
        beside = f" beside {self.memory}'s {replay}" if self.replay_bytes else ""
        fix = (
            f"set env.num_envs to at most {self.max_num_envs:,}"
            if self.max_num_envs
            else f"lower {self.memory_key} first"
        )
        raise EnvMemoryError(
            f"env.num_envs={self.num_envs:,} needs about {fmt_bytes(self.total_bytes)} of host "
            f"memory for the environments ({fmt_bytes(self.bytes_per_env)} each){beside}, but "
            f"only {fmt_bytes(self.available_bytes)} is available, of which edgerl uses at most "
            f"{MEMORY_SHARE:.0%}; {fix}"
        )


def plan_env_memory(
    spec: EnvSpec,
    num_envs: int,
    available_host_bytes: int,
    replay_host_bytes: int = 0,
    named: tuple[str, str] = ("the replay", "replay.capacity"),
) -> EnvMemoryPlan:
    """The host-memory plan for ``num_envs`` environments of ``spec`` (``named``: what the
    learner's memory is called and the key that makes it smaller)."""
    per_env = bytes_per_env(spec)
    return EnvMemoryPlan(num_envs, per_env, available_host_bytes, replay_host_bytes, *named)


def check_env_memory(
    spec: EnvSpec,
    num_envs: int,
    replay_plan: MemoryPlan,
    replay_device: torch.device,
    named: tuple[str, str] = ("the replay", "replay.capacity"),
) -> None:
    """Refuse more environments than host memory holds (beside a host replay), before
    building any: too many would swap the board or get the trainer killed."""
    host = replay_device.type == "cpu"
    available = replay_plan.available_bytes if host else available_memory(torch.device("cpu"))[0]
    # A Jetson's GPU memory is the host's: a replay "on the GPU" takes from the same pool.
    shared = host or integrated_gpu(replay_device)
    replay_bytes = replay_plan.total_bytes if shared else 0
    plan_env_memory(spec, num_envs, available, replay_bytes, named).check()


def action_dtype(num_actions: int) -> np.dtype[Any]:
    """The smallest integer a replay stores one of ``num_actions`` discrete actions in."""
    return np.dtype(np.uint8) if num_actions <= 256 else np.dtype(np.int32)


def stored_action(spec: EnvSpec) -> tuple[np.dtype[Any], tuple[int, ...]]:
    """The dtype and shape of one action as a replay stores it: a discrete game's in the
    smallest integer that holds it (:func:`action_dtype`), shape (); a continuous game's as
    float32 numbers of ``spec.action_shape``."""
    if spec.continuous:
        return np.dtype(np.float32), spec.action_shape
    return action_dtype(spec.num_actions), ()


def continuous_actions(spec: EnvSpec, actions: np.ndarray, rows: int) -> np.ndarray:
    """A continuous game's ``actions`` for ``rows`` rows as a memory stores them, float32;
    raises ValueError when they are not one action of ``spec.action_shape`` a row (numpy would
    broadcast some: one number for every environment)."""
    numbers = np.asarray(actions, dtype=np.float32)
    if numbers.shape != (rows, *spec.action_shape):
        raise ValueError(
            f"a memory of {spec.id} stores actions of shape {spec.action_shape}, one a row; "
            f"{rows} rows came with actions of shape {numbers.shape}"
        )
    return numbers


def bytes_per_transition(spec: EnvSpec) -> int:
    """Bytes one stored transition costs: one item, its action, reward and flags."""
    item = int(np.prod(spec.item_shape)) * np.dtype(spec.obs_dtype).itemsize
    dtype, shape = stored_action(spec)
    return item + dtype.itemsize * math.prod(shape) + 4 + 1


def available_memory(device: torch.device) -> tuple[int, str]:
    """Free memory on ``device`` in bytes and a word for it ("host" or "GPU").

    Raises DeviceError (one sentence) when the GPU cannot be queried.
    """
    if device.type == "cuda":
        # An explicit index: torch before 2.5 raises ValueError for a device without one.
        try:
            index = device.index if device.index is not None else torch.cuda.current_device()
            free, _ = torch.cuda.mem_get_info(index)
        except Exception as e:  # a driver problem must be a sentence, not a traceback
            raise DeviceError(
                f"cannot read the free memory of the CUDA GPU ({type(e).__name__}: {e}); "
                "check it with edgerl doctor, or use perf.device=cpu"
            ) from None
        return int(free), "GPU"
    import psutil

    return int(psutil.virtual_memory().available), "host"


def plan_memory(spec: EnvSpec, capacity: int, available_bytes: int, where: str) -> MemoryPlan:
    """The memory plan for ``capacity`` transitions of ``spec`` against ``available_bytes``."""
    per = bytes_per_transition(spec)
    return MemoryPlan(capacity, per, per * capacity, available_bytes, where)
