"""Experience replay that stores each Atari frame once and samples on the learner's device.

A stacked layout keeps 4 frames for ``obs`` and 4 for ``next_obs``: 56 KB per transition at 84x84
(28 KB with the usual next-obs sharing). Here each environment writes its own time-ordered ring of
*items* (the newest frame of each observation, or the whole vector for vector observations); one
slot holds an item and the transition taken from it, and the next observation is the next slot.
A transition costs one 84x84 frame plus 6 bytes: about 7 KB. A discrete game's action is stored
in the smallest integer that holds it; a continuous game's as its float32 numbers
(:func:`~edgerl.memories.budget.stored_action`), exactly as the learner chose them.

Stacks never reach across an episode start: frames older than an episode's first observation are
zeros, exactly as the environment shows them to the actor. An episode's last observation (the one
its final step led to) gets a slot of its own that starts no transition. Slot flags (FIRST, VALID,
TERMINAL) and the sampler, with its n-step returns, are in :mod:`edgerl.memories.replay.sampling`.

Where things live: everything the sampler reads (frames, actions, rewards, flags and the write
positions) is on the replay's device, by default the learner's (on a Jetson memory is shared; on a
desktop GPU nothing crosses per batch), so sampling needs no host synchronisation and is captured
in the learner's CUDA graph. The actor, the only writer, keeps the small per-slot arrays on the
host as well (6 bytes a slot for a discrete game), where it computes each write with a few
vectorised numpy operations; the replay store saves from them. On the CPU the sampler's tensors
*are* those host arrays. On CUDA one vector step is one packed copy: its frames and a few int32
of slot updates (a continuous action's numbers as the bits of their float32) go through a ring
of pinned staging buffers (a buffer is reused once its copy has landed, checked
with an event query) and are scattered on the device. Writes are the environments' env ids, so a
subset of environments (ALE's async batches) can be written.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Any

import numpy as np
import torch

from edgerl.envs import EnvSpec
from edgerl.hw.device import host_event, indexed
from edgerl.memories.budget import (
    available_memory,
    continuous_actions,
    plan_memory,
    stored_action,
)
from edgerl.memories.replay.sampling import (
    FIRST,
    TERMINAL,
    VALID,
    Batch,
    SampleSpec,
    Storage,
    sample,
)

log = logging.getLogger(__name__)

STAGING_DEPTH = 4  # pinned staging buffers on CUDA: a copy lands long before its buffer comes round
# Slots the asynchronous learner leaves alone on each side of an environment's head. The actor
# writes one or two slots per environment per step; the learner's reads of one launch take a few
# milliseconds on the GPU, a handful of actor steps at most.
ASYNC_GUARD = 64


def staging_bytes(num_envs: int, item_bytes: int, action_words: int = 1) -> int:
    """The size of one staging buffer: the frames of up to two slots per environment (an ended
    episode writes its final observation and the next first one), 8 bytes to align what
    follows, then up to 9 + ``action_words`` int32 of slot updates per environment (an action
    is one int32, or one per number of a continuous action)."""
    return 2 * num_envs * item_bytes + 8 + 4 * (9 + action_words) * num_envs


class _Staging:
    """Pinned host buffers for the actor's packed copies, used round-robin (``pin`` False: plain
    buffers and no events, for a CPU test of the packing)."""

    def __init__(self, nbytes: int, depth: int = STAGING_DEPTH, pin: bool = True) -> None:
        self.buffers = [
            torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin) for _ in range(depth)
        ]
        self.events = [host_event() if pin else None for _ in range(depth)]
        self.used = [False] * depth
        self.next = 0
        self.waits = 0  # times a buffer's previous copy had not landed yet (the actor waited)

    def take(self) -> tuple[torch.Tensor, int]:
        i = self.next
        self.next = (i + 1) % len(self.buffers)
        event = self.events[i]
        if self.used[i] and event is not None and not event.query():
            self.waits += 1
            event.synchronize()
        return self.buffers[i], i

    def sent(self, i: int) -> None:
        event = self.events[i]
        if event is not None:
            event.record()  # on the current stream, after the copy that reads buffer i
        self.used[i] = True


FILL_CHUNK_BYTES = 64 << 20


def fill_in_chunks(items: torch.Tensor) -> None:
    """Zero ``items`` (committing its memory) a chunk at a time, on a thread of its own that
    the interpreter waits for at exit: it gives up between chunks once the main thread has
    ended (a stop during set-up), so the process never exits with PyTorch's threads still
    inside a fill (which aborted it: "terminate called without an active exception")."""
    flat = items.view(-1)
    step = max(1, FILL_CHUNK_BYTES // max(1, items.element_size()))
    main = threading.main_thread()
    for start in range(0, flat.numel(), step):
        if not main.is_alive():
            return
        flat[start : start + step].fill_(0)


class ReplayBuffer:
    """Frame-deduplicated circular replay for ``num_envs`` interleaved environments.

    Call :meth:`add_first` with the observations after a reset, then :meth:`add` after every
    vector step. ``n_step`` and ``gamma`` shape the returns :meth:`sample` computes. Raises
    ReplayMemoryError at construction if it would not fit in memory.
    """

    keeps_steps = True  # sampled again and again; saved beside a checkpoint where asked

    def __init__(
        self,
        spec: EnvSpec,
        capacity: int,
        num_envs: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
        available_bytes: int | None = None,
        out_device: torch.device | str | None = None,
        n_step: int = 1,
        gamma: float = 0.99,
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
        self.n_step = n_step
        self.gamma = gamma
        self.guard = 0  # see set_guard
        # Filled at start so the memory is committed now, not hours into a run; on the CPU in a
        # thread of its own (fill_ releases the GIL), so start-up goes on meanwhile. Every
        # method that touches the frames first waits for it (committed()).
        shape = (num_envs, self.slots, *item_shape)
        self.items = torch.empty(shape, dtype=item_dtype, device=self.device)
        self._filling: threading.Thread | None = None
        if self.device.type == "cpu":
            self._filling = threading.Thread(target=fill_in_chunks, args=(self.items,))
            self._filling.start()
        else:
            self.items.fill_(0)
        # The actor's host arrays (see the module docstring).
        action_dtype, action_shape = stored_action(spec)
        self.actions = np.zeros((num_envs, self.slots, *action_shape), dtype=action_dtype)
        self._action_shape = action_shape  # () for a discrete game
        self._action_words = int(np.prod(action_shape))  # int32 words of one in a packed copy
        self.rewards = np.zeros((num_envs, self.slots), dtype=np.float32)
        self.flags = np.zeros((num_envs, self.slots), dtype=np.uint8)
        self.head = np.zeros(num_envs, dtype=np.int64)  # next slot to write, per env
        self.count = np.zeros(num_envs, dtype=np.int64)  # slots written, per env (<= slots)
        # Writes ever made, per env: a save tells from it what changed and whether the actor has
        # come round to a slot it is still copying (see replay_store.py).
        self.written = np.zeros(num_envs, dtype=np.int64)
        self.valid = 0  # complete transitions stored
        self._all = np.arange(num_envs)
        self._base = self._all * self.slots  # flat index of each environment's slot 0
        self._flags_flat = self.flags.reshape(-1)  # views of the same memory
        self._actions_flat = self.actions.reshape(-1, *action_shape)
        self._rewards_flat = self.rewards.reshape(-1)
        self._items_flat = (
            self.items.numpy().reshape(-1, *item_shape) if self.device.type == "cpu" else None
        )
        self._cuda = False
        self.storage = self._make_storage()
        self._staging: _Staging | None = None
        if self.device.type == "cuda":
            self._packed_writes(pin=True)
        self._item_np_dtype = np.dtype(spec.obs_dtype)
        # Sampling draws from a generator of its own on the CPU (a sync run is deterministic);
        # on CUDA from the default generator, the one a CUDA graph can capture.
        self.generator: torch.Generator | None = None
        if self.device.type != "cuda":
            self.generator = torch.Generator().manual_seed(seed)
        self._sample_spec = SampleSpec(1, stack, n_step, gamma)

    def _packed_writes(self, pin: bool) -> None:
        """Write as on CUDA: the sampler reads copies of the host's small arrays, and each write
        is one packed copy through the staging ring, scattered where the sampler reads
        (``pin`` False: on CPU tensors, the packing alone, for a test)."""
        self._cuda = True
        self._items_flat = None
        self.storage = self._make_storage()
        self._item_bytes = int(np.prod(self.items.shape[2:])) * self.items.element_size()
        nbytes = staging_bytes(self.num_envs, self._item_bytes, self._action_words)
        self._staging = _Staging(nbytes, pin=pin)

    def _make_storage(self) -> Storage:
        if not self._cuda:
            return Storage(
                self.items,
                torch.from_numpy(self.actions),
                torch.from_numpy(self.rewards),
                torch.from_numpy(self.flags),
                torch.from_numpy(self.head),
                torch.from_numpy(self.count),
            )
        d = self.device  # copies, never views of the host arrays
        return Storage(
            self.items,
            torch.tensor(self.actions, device=d),
            torch.tensor(self.rewards, device=d),
            torch.tensor(self.flags, device=d),
            torch.tensor(self.head, device=d),
            torch.tensor(self.count, device=d),
        )

    def __len__(self) -> int:
        """The number of complete transitions stored (about)."""
        return self.valid

    @property
    def nbytes(self) -> int:
        return self.plan.total_bytes

    @property
    def host_waits(self) -> int:
        """Times a write waited for an earlier copy to land (CUDA; 0 elsewhere)."""
        return self._staging.waits if self._staging is not None else 0

    def set_guard(self, on: bool) -> None:
        """Leave the slots next to the actor's writes alone when sampling (a learner that reads
        while the actor writes, without locks); at most an eighth of a ring."""
        self.guard = min(ASYNC_GUARD, self.slots // 8) if on else 0

    def note_extras(self, extras: dict[str, np.ndarray], version: int) -> None:
        """Keeps none: a replay's transitions are learned from long after the weights that
        acted on them changed."""

    def _item(self, obs: np.ndarray) -> np.ndarray:
        return obs[:, -1] if self.stack > 1 else obs

    # ---------------------------------------------------------------------------------- writes

    def committed(self) -> None:
        """Wait until the frames' memory is committed (the fill started at construction)."""
        if self._filling is not None:
            self._filling.join()
            self._filling = None

    def add_first(self, obs: np.ndarray, envs: np.ndarray | None = None) -> None:
        """Record the first observation of every environment (or of ``envs``) after a reset."""
        self.committed()
        envs = self._all if envs is None else np.asarray(envs)
        self._store(self._advance(envs, FIRST), (self._item(obs),), None)

    def add(
        self,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        next_obs: np.ndarray,
        final_obs: np.ndarray | None,
        envs: np.ndarray | None = None,
    ) -> None:
        """Record one vector step: the action taken in every environment (or in ``envs``, the
        env ids the rows belong to) and what followed. ``actions`` are one integer per row, or
        for a continuous game float32 ``(rows, *spec.action_shape)`` (ValueError otherwise).

        ``next_obs`` is what the environments returned: for an environment whose episode ended it is
        already the next episode's first observation, and ``final_obs`` holds the last one.
        """
        rows = slice(None) if envs is None else envs  # all environments: no gather needed
        envs = self._all if envs is None else np.asarray(envs)
        if self._action_shape:
            actions = continuous_actions(self.spec, actions, len(envs))
        # Slots are addressed flat (env * slots + slot): one index array per write.
        cur = self.head[rows] - 1
        cur[cur < 0] = self.slots - 1
        cur += self._base[rows]  # each env's newest slot
        flags = self._flags_flat
        cur_flags = flags[cur] | VALID
        cur_flags[np.asarray(terminated, dtype=bool)] |= TERMINAL
        flags[cur] = cur_flags
        self._actions_flat[cur] = actions
        self._rewards_flat[cur] = rewards
        self.valid += len(envs)
        updates = (cur, cur_flags, actions, rewards)
        item = self._item(next_obs)
        new = self._advance(envs, 0, rows)
        done = np.logical_or(terminated, truncated)
        if not done.any():
            self._store(new, (item,), updates)
            return
        if final_obs is None:
            raise ValueError("final_obs is required when an episode ends")
        # An ended environment writes two slots: the final observation of its episode (which
        # starts no transition), then the first of the next episode.
        ended = np.flatnonzero(done)
        again = self._advance(envs[ended], FIRST)
        last = (ended, self._item(final_obs)[ended])
        self._store(np.concatenate([new, again]), (item, item[ended]), updates, last)

    def _advance(
        self, envs: np.ndarray, flags: int, rows: np.ndarray | slice | None = None
    ) -> np.ndarray:
        """Host bookkeeping of writing one slot at the head of each environment of ``envs``
        (``rows``: the same as an index, a slice for all) with ``flags``: the transitions
        overwritten, write counts, heads and counts. Returns the flat slots written."""
        rows = envs if rows is None else rows
        head = self.head[rows]
        flat = self._base[rows] + head
        self.valid -= int(np.count_nonzero(self._flags_flat[flat] & VALID))
        self.written[rows] += 1  # before the write: a concurrent copy sees it coming
        self._flags_flat[flat] = flags
        head += 1
        head[head == self.slots] = 0
        self.head[rows] = head
        count = self.count[rows]
        if count.min() < self.slots:  # a ring not yet full
            self.count[rows] = np.minimum(count + 1, self.slots)
        return flat

    def _store(
        self,
        flat: np.ndarray,
        sources: tuple[np.ndarray, ...],
        updates: tuple[np.ndarray, ...] | None,
        last: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """The items of one write on the storage device: ``sources`` stacked in order fill the
        flat slots ``flat``; ``last`` replaces some rows of the first source. On CUDA this also
        carries the slot updates the host made (``updates``, and the new slots' flags)."""
        if self._cuda:
            self._store_cuda(flat, sources, last, updates)
            return
        items = self._items_flat
        at = 0
        for src in sources:
            items[flat[at : at + len(src)]] = src
            at += len(src)
        if last is not None:
            rows, frames = last
            items[flat[rows]] = frames

    def _store_cuda(
        self,
        flat: np.ndarray,
        sources: tuple[np.ndarray, ...],
        last: tuple[np.ndarray, np.ndarray] | None,
        updates: tuple[np.ndarray, ...] | None,
    ) -> None:
        """One packed host-to-device copy (frames, then int32 slot updates), then scatters on
        the current stream; the staging buffer is reused once the copy has landed."""
        assert self._staging is not None
        k = len(flat)
        b = 0 if updates is None else len(updates[0])
        buf, i = self._staging.take()
        host = buf.numpy()
        item_shape = self.items.shape[2:]
        fb = k * self._item_bytes
        frames = host[:fb].view(self._item_np_dtype).reshape(k, *item_shape)
        at = 0
        for src in sources:
            frames[at : at + len(src)] = src
            at += len(src)
        if last is not None:
            frames[last[0]] = last[1]
        e = self.num_envs
        w = self._action_words
        ae = b + w * b  # where the actions' words end
        meta_n = ae + 2 * b + 2 * k + 2 * e
        mo = -(-fb // 8) * 8  # the int32 part starts aligned
        meta = host[mo : mo + 4 * meta_n].view(np.int32)
        if updates is not None:
            cur, cur_flags, actions, rewards = updates
            meta[0:b] = cur
            if self._action_shape:  # the float32 numbers' bits
                meta[b:ae] = actions.reshape(-1).view(np.int32)
            else:
                meta[b:ae] = actions
            meta[ae : ae + b] = np.asarray(rewards, np.float32).view(np.int32)
            meta[ae + b : ae + 2 * b] = cur_flags
        o = ae + 2 * b
        meta[o : o + k] = flat
        meta[o + k : o + 2 * k] = self._flags_flat[flat]
        meta[o + 2 * k : o + 2 * k + e] = self.head
        meta[o + 2 * k + e : o + 2 * k + 2 * e] = self.count
        dev = buf[: mo + 4 * meta_n].to(self.device, non_blocking=True)
        self._staging.sent(i)
        st = self.storage
        m = dev[mo:].view(torch.int32)
        if b:
            at_cur = m[0:b].long()
            if self._action_shape:
                numbers = m[b:ae].view(torch.float32).view(b, *self._action_shape)
                st.actions.view(-1, *self._action_shape)[at_cur] = numbers
            else:
                st.actions.view(-1)[at_cur] = m[b:ae].to(st.actions.dtype)
            st.rewards.view(-1)[at_cur] = m[ae : ae + b].view(torch.float32)
            st.flags.view(-1)[at_cur] = m[ae + b : ae + 2 * b].to(torch.uint8)
        at_new = m[o : o + k].long()
        self.items.view(-1, *item_shape)[at_new] = (
            dev[:fb].view(self.items.dtype).view(k, *item_shape)
        )
        st.flags.view(-1)[at_new] = m[o + k : o + 2 * k].to(torch.uint8)
        st.head.copy_(m[o + 2 * k : o + 2 * k + e])
        st.count.copy_(m[o + 2 * k + e : o + 2 * k + 2 * e])

    def refresh_device(self) -> None:
        """Copy the host arrays to the device (after a restore wrote them); a no-op on the CPU,
        where they are the same memory."""
        if not self._cuda:
            return
        st = self.storage
        for dst, src in zip(
            st[1:], (self.actions, self.rewards, self.flags, self.head, self.count), strict=True
        ):
            dst.copy_(torch.from_numpy(src))

    # ---------------------------------------------------------------------------------- sampling

    def sample(self, batch_size: int) -> Batch:
        """A uniform minibatch of valid transitions with their n-step returns (see
        :mod:`edgerl.memories.replay.sampling`), on the learner's device; raises ValueError if no
        complete
        transition is stored yet."""
        if self.valid == 0:
            raise ValueError("the replay buffer holds no complete transition yet")
        return self.to_learner(self.sample_on_device(batch_size))

    def sample_on_device(self, batch_size: int) -> Batch:
        """Like :meth:`sample`, on the replay's own device and without checks: this is what a
        CUDA graph captures (fixed shapes, no host synchronisation)."""
        spec = self._sample_spec
        if spec.batch_size != batch_size or spec.guard != self.guard:
            spec = SampleSpec(batch_size, self.stack, self.n_step, self.gamma, self.guard)
            self._sample_spec = spec
        return sample(self.storage, spec, self.generator)

    def to_learner(self, batch: Batch) -> Batch:
        """``batch`` on the learner's device."""
        if self.out_device == self.device:
            return batch
        if self._pin:  # host storage feeding a GPU: an asynchronous copy from pinned memory
            batch = Batch(*(t.pin_memory() for t in batch))
            return Batch(*(t.to(self.out_device, non_blocking=True) for t in batch))
        # Any other pair, GPU storage for a CPU learner above all, copies synchronously: a
        # non-blocking device-to-host copy can be read before it has landed.
        return Batch(*(t.to(self.out_device) for t in batch))

    # ---------------------------------------------------------------------------------- state

    def clear(self) -> None:
        """Forget every transition (a restore that failed half-way must leave no trace)."""
        self.committed()
        self.items.fill_(0)
        for a in (self.actions, self.rewards, self.flags, self.head, self.count, self.written):
            a.fill(0)
        self.valid = 0
        self.refresh_device()

    def rng_state(self) -> Any:
        """The sampler's generator state (None on CUDA: the CUDA generator is saved by the
        trainer with torch's other states)."""
        return None if self.generator is None else self.generator.get_state()

    def set_rng_state(self, state: Any) -> None:
        """Restore :meth:`rng_state`. A state of another kind (a checkpoint of an edgerl that
        sampled with numpy, or of a CUDA run resumed on the CPU) reseeds from it instead."""
        if self.generator is None:
            return
        if isinstance(state, torch.Tensor) and state.dtype == torch.uint8:
            self.generator.set_state(state)
            return
        digest = hashlib.sha256(repr(state).encode()).digest()
        self.generator.manual_seed(int.from_bytes(digest[:8], "little") >> 1)
