"""Experience replay that stores each Atari frame once and rebuilds frame stacks at sample time.

A stacked layout keeps 4 frames for ``obs`` and 4 for ``next_obs``: 56 KB per transition at 84x84
(28 KB with the usual next-obs sharing). Here each environment writes its own time-ordered stream of
*items* (the newest frame of each observation, or the whole vector for vector observations); one
slot holds an item and the transition taken from it, and the next observation is the next slot.
A transition costs one 84x84 frame plus 6 bytes: about 7 KB.

Stacks never reach across an episode start: frames older than an episode's first observation are
zeros, exactly as the environment shows them to the actor. An episode's last observation (the one
its final step led to) gets a slot of its own that starts no transition.

Slot flags:
    FIRST     the item is the first observation of an episode
    VALID     the slot's transition is complete (its next observation is in the next slot)
    TERMINAL  that transition ended the episode by termination (no bootstrapping)

Frames live on the learner's device by default (on a Jetson, memory is shared, so nothing is
copied; on a desktop GPU it saves the host-to-device copy of every batch): gathering and stacking
are tensor ops on that device. Indices, actions, rewards and flags live on the host, where the
sampler draws and checks indices without a device synchronisation; only the indices (a few hundred
bytes) travel. With ``replay.device = "cpu"`` and a GPU learner, batches go through pinned memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from edgerl.device import indexed, integrated_gpu
from edgerl.envs import EnvSpec
from edgerl.errors import DeviceError, EnvMemoryError, ReplayMemoryError

FIRST = np.uint8(1)
VALID = np.uint8(2)
TERMINAL = np.uint8(4)

# Share of the available memory the replay may take; the rest is for the process, torch and the OS.
MEMORY_SHARE = 0.8
# Host memory one environment costs. Measured as the growth of the process's RSS (psutil) around
# building N environments with envs.make_env, resetting them and taking 3 steps, on x86-64 with
# ale-py 0.12.1 and gymnasium 1.4.0: ALE's AtariVectorEnv (Pong, 84x84, 4 stacked frames) grew
# 1,551 KiB per env at 32 envs and 1,560 KiB at 128; gymnasium's SyncVectorEnv of CartPole-v1
# 4.4 KiB per env at 2,000 and 8,000. Rounded up for games and ids with more state than these.
ATARI_ENV_BYTES = 1792 << 10
VECTOR_ENV_BYTES = 16 << 10


class Batch(NamedTuple):
    """A sampled minibatch, on the learner's device."""

    obs: torch.Tensor  # (B, *obs_shape) uint8 frames or float32 vectors
    actions: torch.Tensor  # (B,) int64
    rewards: torch.Tensor  # (B,) float32, as stored (clipped for Atari)
    next_obs: torch.Tensor
    dones: torch.Tensor  # (B,) float32: 1.0 where the episode terminated


def example_batch(
    spec: EnvSpec, batch_size: int, device: torch.device, random: bool = False
) -> Batch:
    """A batch of the training shape on ``device``, to prepare or time the update before
    training: zeros, or (``random``) random frames/0-1 vectors, actions and rewards, which draw
    from torch's global RNG."""
    b = batch_size
    dtype = getattr(torch, spec.obs_dtype)
    if random:
        high = 255 if spec.has_frames else 1
        obs = torch.randint(0, high + 1, (b, *spec.obs_shape), device=device).to(dtype)
        actions = torch.randint(0, spec.num_actions, (b,), device=device)
        rewards = torch.randn(b, device=device)
    else:
        obs = torch.zeros((b, *spec.obs_shape), dtype=dtype, device=device)
        actions = torch.zeros(b, dtype=torch.int64, device=device)
        rewards = torch.zeros(b, device=device)
    return Batch(obs, actions, rewards, obs.clone(), torch.zeros(b, device=device))


def fmt_bytes(n: float) -> str:
    """``1.3 GiB``: a size the way a user reads it (errors, `edgerl doctor`)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")


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
    replay_bytes: int  # the replay's share of that host memory (0 when it lives on a GPU)

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
        beside = f" beside the replay's {replay}" if self.replay_bytes else ""
        fix = (
            f"set env.num_envs to at most {self.max_num_envs:,}"
            if self.max_num_envs
            else "lower replay.capacity first"
        )
        raise EnvMemoryError(
            f"env.num_envs={self.num_envs:,} needs about {fmt_bytes(self.total_bytes)} of host "
            f"memory for the environments ({fmt_bytes(self.bytes_per_env)} each){beside}, but "
            f"only {fmt_bytes(self.available_bytes)} is available, of which edgerl uses at most "
            f"{MEMORY_SHARE:.0%}; {fix}"
        )


def plan_env_memory(
    spec: EnvSpec, num_envs: int, available_host_bytes: int, replay_host_bytes: int = 0
) -> EnvMemoryPlan:
    """The host-memory plan for ``num_envs`` environments of ``spec``."""
    return EnvMemoryPlan(num_envs, bytes_per_env(spec), available_host_bytes, replay_host_bytes)


def check_env_memory(
    spec: EnvSpec, num_envs: int, replay_plan: MemoryPlan, replay_device: torch.device
) -> None:
    """Refuse more environments than host memory holds (beside a host replay), before
    building any: too many would swap the board or get the trainer killed."""
    host = replay_device.type == "cpu"
    available = replay_plan.available_bytes if host else available_memory(torch.device("cpu"))[0]
    # A Jetson's GPU memory is the host's: a replay "on the GPU" takes from the same pool.
    shared = host or integrated_gpu(replay_device)
    replay_bytes = replay_plan.total_bytes if shared else 0
    plan_env_memory(spec, num_envs, available, replay_bytes).check()


def _action_dtype(num_actions: int) -> np.dtype[Any]:
    return np.dtype(np.uint8) if num_actions <= 256 else np.dtype(np.int32)


def bytes_per_transition(spec: EnvSpec) -> int:
    """Bytes one stored transition costs: one item, its action, reward and flags."""
    item = int(np.prod(spec.item_shape)) * np.dtype(spec.obs_dtype).itemsize
    return item + _action_dtype(spec.num_actions).itemsize + 4 + 1


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


class ReplayBuffer:
    """Frame-deduplicated circular replay for ``num_envs`` interleaved environments.

    Call :meth:`add_first` with the observations after a reset, then :meth:`add` after every
    vector step. Raises ReplayMemoryError at construction if it would not fit in memory.
    """

    def __init__(
        self,
        spec: EnvSpec,
        capacity: int,
        num_envs: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
        available_bytes: int | None = None,
        out_device: torch.device | str | None = None,
    ) -> None:
        self.device = indexed(device)
        # Where batches go: the learner's device. Host storage feeding a GPU goes through pinned
        # memory so the copy is asynchronous.
        self.out_device = indexed(out_device) if out_device is not None else self.device
        self._pin = self.device.type == "cpu" and self.out_device.type == "cuda"
        if available_bytes is None:
            available_bytes, where = available_memory(self.device)
        else:
            where = "host" if self.device.type == "cpu" else "GPU"
        self.plan = plan_memory(spec, capacity, available_bytes, where)
        self.plan.check()

        item_shape, item_dtype, stack = spec.item_shape, getattr(torch, spec.obs_dtype), spec.stack
        self.spec = spec
        self.stack = stack
        self.num_envs = num_envs
        self.slots = capacity // num_envs
        self.capacity = self.slots * num_envs
        # Filled now so the memory is committed at start, not hours into a run.
        self.items = torch.empty(
            (num_envs, self.slots, *item_shape), dtype=item_dtype, device=self.device
        )
        self.items.fill_(0)
        self.actions = np.zeros((num_envs, self.slots), dtype=_action_dtype(spec.num_actions))
        self.rewards = np.zeros((num_envs, self.slots), dtype=np.float32)
        self.flags = np.zeros((num_envs, self.slots), dtype=np.uint8)
        self.head = np.zeros(num_envs, dtype=np.int64)  # next slot to write, per env
        self.count = np.zeros(num_envs, dtype=np.int64)  # slots written, per env (<= slots)
        # Writes ever made, per env: a save tells from it what changed and whether the actor has
        # come round to a slot it is still copying (see replay_store.py).
        self.written = np.zeros(num_envs, dtype=np.int64)
        self.valid = 0  # complete transitions stored
        self.rng = np.random.default_rng(seed)
        self._envs = np.arange(num_envs)
        self._staging: torch.Tensor | None = None
        self._staged: Any = None  # the CUDA event of the staging buffer's last copy
        if self.device.type == "cuda":
            self._staging = torch.empty((num_envs, *item_shape), dtype=item_dtype, pin_memory=True)
        self._offsets = np.arange(stack - 1, -1, -1)  # oldest frame first

    def __len__(self) -> int:
        """The number of complete transitions that can be sampled (about)."""
        return self.valid

    @property
    def nbytes(self) -> int:
        return self.plan.total_bytes

    def _item(self, obs: np.ndarray) -> np.ndarray:
        return obs[:, -1] if self.stack > 1 else obs

    def _on_device(self, items: np.ndarray) -> torch.Tensor:
        """``items`` on the storage device. On CUDA through a pinned staging buffer: the copy is
        asynchronous on the current stream (the actor's, in the async pipeline) instead of a
        pageable copy; the buffer is reused only once its previous copy has landed."""
        if self._staging is None:
            return torch.as_tensor(items, device=self.device)
        if self._staged is not None:
            self._staged.synchronize()
        staging = self._staging[: len(items)]
        staging.numpy()[...] = items
        on_device = staging.to(self.device, non_blocking=True)
        self._staged = torch.cuda.Event()
        self._staged.record()
        return on_device

    def _host_to_device(self, *arrays: np.ndarray) -> list[torch.Tensor]:
        """Small host arrays (indices, masks, per-transition values) on the storage device.

        On CUDA through pinned memory and asynchronous copies: PyTorch synchronises the stream for
        a copy from pageable memory (and for CPU indices into a CUDA tensor), so every sample
        would wait for all the updates queued before it and the learner could never run ahead of
        the GPU. Pinned blocks come from PyTorch's caching host allocator, which reuses a block
        only once the copy that read it has completed.
        """
        tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
        if self.device.type != "cuda":
            return tensors
        return [t.pin_memory().to(self.device, non_blocking=True) for t in tensors]

    def _write(self, envs: np.ndarray, items: np.ndarray, flags: np.uint8) -> None:
        slot = self.head[envs]
        self.written[envs] += 1  # before the write: a concurrent copy sees it coming
        self.valid -= int(np.count_nonzero(self.flags[envs, slot] & VALID))
        env_t, slot_t = self._host_to_device(envs, slot)
        self.items[env_t, slot_t] = self._on_device(items)
        self.flags[envs, slot] = flags
        self.head[envs] = (slot + 1) % self.slots
        self.count[envs] = np.minimum(self.count[envs] + 1, self.slots)

    def add_first(self, obs: np.ndarray) -> None:
        """Record the first observation of every environment (after a reset)."""
        self._write(self._envs, self._item(obs), FIRST)

    def add(
        self,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        next_obs: np.ndarray,
        final_obs: np.ndarray | None,
    ) -> None:
        """Record one vector step: the action taken in every environment and what followed.

        ``next_obs`` is what the environments returned: for an environment whose episode ended it is
        already the next episode's first observation, and ``final_obs`` holds the last one.
        """
        envs = self._envs
        cur = (self.head - 1) % self.slots
        self.actions[envs, cur] = actions
        self.rewards[envs, cur] = rewards
        self.flags[envs, cur] |= VALID | np.where(terminated, TERMINAL, 0).astype(np.uint8)
        self.valid += self.num_envs
        done = np.asarray(terminated) | np.asarray(truncated)
        if not done.any():
            self._write(envs, self._item(next_obs), np.uint8(0))
            return
        if final_obs is None:
            raise ValueError("final_obs is required when an episode ends")
        last = np.where(done.reshape((-1,) + (1,) * (next_obs.ndim - 1)), final_obs, next_obs)
        self._write(envs, self._item(last), np.uint8(0))
        ended = np.flatnonzero(done)
        self._write(ended, self._item(next_obs[ended]), FIRST)

    def _stack(self, env: np.ndarray, slot: np.ndarray) -> torch.Tensor:
        """Observations ending at ``slot``, zero before an episode's first frame."""
        if self.stack == 1:
            env_t, slot_t = self._host_to_device(env, slot)
            return self.items[env_t, slot_t]
        idx = (slot[:, None] - self._offsets) % self.slots  # (B, stack), oldest first
        first = (self.flags[env[:, None], idx] & FIRST) != 0
        # A frame is padding if any newer frame in the stack starts an episode.
        newer_firsts = np.cumsum(first[:, ::-1], axis=1)[:, ::-1] - first
        pad_np = newer_firsts > 0
        env_t, idx_t = self._host_to_device(env, idx)
        frames = self.items[env_t[:, None], idx_t]
        if not pad_np.any():  # most stacks lie inside one episode
            return frames
        (pad,) = self._host_to_device(pad_np)
        return frames.masked_fill_(pad[:, :, None, None], 0)

    def _draw(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` (env, slot) pairs of sampleable transitions, uniformly."""
        ends = np.cumsum(self.count)
        total = int(ends[-1])
        envs, slots = [], []
        have = 0
        while have < n:
            flat = self.rng.integers(total, size=2 * (n - have) + 8)
            env = np.searchsorted(ends, flat, side="right")
            slot = flat - (ends[env] - self.count[env])
            ok = (self.flags[env, slot] & VALID) != 0
            if self.stack > 1:
                # Once wrapped, the oldest slots' earlier frames were overwritten by new ones.
                full = self.count[env] == self.slots
                ok &= ~(full & (((slot - self.head[env]) % self.slots) < self.stack - 1))
            envs.append(env[ok])
            slots.append(slot[ok])
            have += int(ok.sum())
        return np.concatenate(envs)[:n], np.concatenate(slots)[:n]

    def sample(self, batch_size: int) -> Batch:
        """A uniform minibatch of transitions; raises ValueError if none is stored yet."""
        if self.valid == 0:
            raise ValueError("the replay buffer holds no complete transition yet")
        env, slot = self._draw(batch_size)
        obs = self._stack(env, slot)
        next_obs = self._stack(env, (slot + 1) % self.slots)
        dev = self.device
        actions, rewards, dones = self._host_to_device(
            self.actions[env, slot].astype(np.int64),
            self.rewards[env, slot],
            ((self.flags[env, slot] & TERMINAL) != 0).astype(np.float32),
        )
        batch = Batch(obs=obs, actions=actions, rewards=rewards, next_obs=next_obs, dones=dones)
        if self.out_device == dev:
            return batch
        if self._pin:  # host storage feeding a GPU: an asynchronous copy from pinned memory
            batch = Batch(*(t.pin_memory() for t in batch))
            return Batch(*(t.to(self.out_device, non_blocking=True) for t in batch))
        # Any other pair, GPU storage for a CPU learner above all, copies synchronously: a
        # non-blocking device-to-host copy can be read before it has landed.
        return Batch(*(t.to(self.out_device) for t in batch))

    def clear(self) -> None:
        """Forget every transition (a restore that failed half-way must leave no trace)."""
        self.items.fill_(0)
        for a in (self.actions, self.rewards, self.flags, self.head, self.count, self.written):
            a.fill(0)
        self.valid = 0

    def rng_state(self) -> dict[str, Any]:
        return self.rng.bit_generator.state

    def set_rng_state(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state
