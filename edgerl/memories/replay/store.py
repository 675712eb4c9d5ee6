"""The replay on disk: saved with every checkpoint, incrementally, and restored on resume.

A restart that threw the replay away would cost the experience of the whole buffer and a pause of
``agent.learning_starts`` steps while it refilled. So each checkpoint names a replay *manifest*,
and a resumed run starts with the transitions, write positions and sampling distribution it had
when that checkpoint was taken.

Layout under ``<run_dir>/replay/``::

    delta-step<step>-<token>.rpl      the slots each environment wrote since the previous save
    manifest-step<step>-<token>.json  the deltas, oldest first, that rebuild the replay at <step>,
                                      with every environment's write position and each delta's
                                      SHA-256 (and a continuous game's action shape and dtype)

Only what changed is written: the replay is a ring per environment, and a save writes the range
each environment wrote since the previous one (plus the slot before it, whose transition was
completed since). A delta stays on disk while a kept manifest needs one of its slots.

A save has two parts. :meth:`ReplayStore.snapshot` runs between two actor steps and copies only
what the actor changes in place (actions, rewards and flags of the changed range: 6 bytes a slot;
on CUDA it also records an event). The frames are copied later, on a background thread (a
:class:`~edgerl.memories.replay.saving.SaveJob`), in pieces of :data:`PIECE_SLOTS` slots, oldest
first: the actor only ever overwrites the oldest slot of its ring, so a changed slot stays as it
was at the snapshot until the actor has come all the way round, which the copy checks after every
piece (a save the actor overtakes is abandoned, and the previous checkpoint stays the newest).
Only the changed range crosses from the GPU to the host.

A checkpoint and its replay are one unit: the trainer writes the checkpoint file only once the
deltas and the manifest it names are on disk (each written to a temporary file, fsync'ed and
renamed), so a kill at any moment leaves the previous checkpoint with its complete replay. A
missing or damaged replay file is reported by name and the run resumes with an empty replay,
never with a wrong one.

Frames are compressed with zlib at level 1 (stdlib; it releases the GIL while it works): Pong
frames shrink about 70x at about 440 MB/s of one core; the stronger stdlib codecs cost 2.5-4.5x
the CPU, which on a Jetson is what limits training (README "Replay on disk"; ``edgerl bench``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import secrets
import shutil
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgerl.errors import EdgerlError
from edgerl.files.atomic import fsync_dir, open_temp, temp_path, write_atomic
from edgerl.files.private import ensure_own_dir
from edgerl.files.regular import read_regular
from edgerl.memories.replay import ReplayBuffer
from edgerl.memories.replay.restore import (
    DELTA,
    MAGIC,
    MANIFEST,
    TRAILER,
    VERSION,
    ReplayFileError,
    restore,
)
from edgerl.memories.replay.sampling import VALID
from edgerl.memories.replay.saving import Part, SaveAbandoned, SaveJob, SaveResult
from edgerl.words import fmt_bytes

log = logging.getLogger(__name__)

PIECE_SLOTS = 1024  # slots copied and compressed at a time: about 7 MB of Atari frames
# Changed slots the actor would overwrite within this many writes are copied in the snapshot
# itself (at most 1.8 MB of Atari frames per env), so the background copy has a head start.
HEAD_START_SLOTS = 256
ZLIB_LEVEL = 1  # level 6 halves the bytes again at 2.5x the CPU (README "Replay on disk")


class ReplayPersistError(EdgerlError):
    """The replay cannot be persisted as configured (the disk cannot hold it)."""


def _ranges(start: int, n: int, slots: int) -> list[tuple[int, int]]:
    """The ring range of ``n`` slots from ``start`` as at most two contiguous (start, n)."""
    first = min(n, slots - start)
    return [(start, first)] + ([(0, n - first)] if n > first else [])


class ReplayStore:
    """The saved replay of one run directory, for one :class:`ReplayBuffer`."""

    def __init__(self, directory: Path, replay: ReplayBuffer) -> None:
        self.directory = directory
        self.replay = replay
        self._chain: list[dict[str, Any]] = []  # the deltas of the newest durable manifest
        self._saved_written: np.ndarray | None = None  # writes per env at that manifest
        self._copy_stream: Any = None
        self._pinned: torch.Tensor | None = None
        self.head_start = HEAD_START_SLOTS

    # ------------------------------------------------------------------------------ checks

    def disk_needed(self) -> int:
        """Bytes the replay files may take at most: the whole replay uncompressed (frames of
        real games compress far below this) and one checkpoint's changed range on top."""
        return 2 * self.replay.nbytes

    def check_disk(self, explicit: bool) -> bool:
        """True if the disk can hold the replay files. When it cannot: ReplayPersistError if
        ``replay.persist`` was set explicitly, else False (persistence is off, logged)."""
        self.directory.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.directory.parent).free + self._bytes_on_disk()
        need = self.disk_needed()
        if free >= need:
            return True
        message = (
            f"replay.persist needs up to {fmt_bytes(need)} of disk for the replay files in "
            f"{self.directory} (replay.capacity={self.replay.capacity:,}) but only "
            f"{fmt_bytes(free)} is free; free some space, lower replay.capacity, or set "
            "replay.persist=false"
        )
        if explicit:
            raise ReplayPersistError(message)
        log.warning("%s; training without saving the replay", message)
        return False

    def _bytes_on_disk(self) -> int:
        if not self.directory.is_dir():
            return 0
        return sum(p.stat().st_size for p in self.directory.iterdir() if p.is_file())

    # ------------------------------------------------------------------------------ save

    def snapshot(self, step: int) -> SaveJob:
        """Take the replay as it is now, between two actor steps: the part the actor changes in
        place is copied here (6 bytes a changed slot), the frames later by the job."""
        started = time.perf_counter()
        r = self.replay
        written, count, head = r.written.copy(), r.count.copy(), r.head.copy()
        parts: list[Part] = []
        for env in range(r.num_envs):
            new = int(written[env]) - (
                -1 if self._saved_written is None else int(self._saved_written[env])
            )
            # The slot before the previous save's head had no transition yet: save it again.
            n = int(count[env]) if self._saved_written is None else min(int(count[env]), new + 1)
            if new == 0:
                n = 0
            w_first = int(written[env]) - n
            # Write numbers below this are overwritten within head_start actor writes.
            at_risk = int(written[env]) - r.slots + self.head_start
            for start, m in _ranges(int(head[env] - n) % r.slots, n, r.slots):
                idx = slice(start, start + m)
                early = min(m, max(0, at_risk - w_first))
                part = Part(
                    env,
                    start,
                    m,
                    w_first,
                    r.actions[env, idx].copy(),
                    r.rewards[env, idx].copy(),
                    r.flags[env, idx].copy(),
                )
                if early:
                    part.early = r.items[env, start : start + early].cpu().numpy().copy()
                parts.append(part)
                w_first += m
        event = None
        if r.items.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()  # after the actor's writes so far, on the actor's stream
        token = secrets.token_hex(4)
        name = f"manifest-step{step:010d}-{token}.json"
        delta = f"delta-step{step:010d}-{token}.rpl" if parts else None
        result = SaveResult(name, time.perf_counter() - started)
        return SaveJob(self._write, step, parts, head, count, written, event, result, delta)

    def _write(self, job: SaveJob) -> None:
        try:
            ensure_own_dir(self.directory)  # never into a link, or another's folder
        except OSError as e:
            raise SaveAbandoned(self._os_reason(job.result.manifest, e)) from None
        chain = [dict(d) for d in self._chain]
        if job.delta_name is not None:
            chain.append(self._write_delta(job))
        # Keep a delta while any of its slots is live: written after the oldest slot kept.
        oldest = job.written - job.count
        job.chain = [
            d for d in chain if any(w_end > oldest[int(e)] for e, w_end in d["w_end"].items())
        ]
        manifest = {
            "version": VERSION,
            "step": job.step,
            "num_envs": self.replay.num_envs,
            "slots": self.replay.slots,
            "item_shape": list(self.replay.items.shape[2:]),
            "item_dtype": str(self.replay.items.dtype).removeprefix("torch."),
            "head": job.head.tolist(),
            "count": job.count.tolist(),
            "written": job.written.tolist(),
            "deltas": job.chain,
        }
        if self.replay.spec.continuous:  # a discrete game's manifest is as it always was
            manifest["action_shape"] = list(self.replay.actions.shape[2:])
            manifest["action_dtype"] = str(self.replay.actions.dtype)
        body = json.dumps(manifest, sort_keys=True)
        text = json.dumps({"sha256": hashlib.sha256(body.encode()).hexdigest(), "manifest": body})
        try:
            write_atomic(self.directory / job.result.manifest, text.encode())
        except OSError as e:
            raise SaveAbandoned(self._os_reason(job.result.manifest, e)) from None
        job.result.bytes += len(text)

    def _os_reason(self, name: str, e: OSError) -> str:
        full = " (the disk is full)" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        return f"cannot write replay file {self.directory / name}: {e.strerror or e}{full}"

    def _write_delta(self, job: SaveJob) -> dict[str, Any]:
        assert job.delta_name is not None
        path = self.directory / job.delta_name
        tmp = temp_path(path)
        digest = hashlib.sha256()
        index: list[dict[str, Any]] = []
        w_end: dict[str, int] = {}
        offset = 0
        try:
            with open_temp(path) as f:

                def block(data: bytes | memoryview, compress: bool = True) -> list[int]:
                    nonlocal offset
                    packed = zlib.compress(data, ZLIB_LEVEL) if compress else bytes(data)
                    raw = len(packed) >= len(data)
                    if raw:
                        packed = bytes(data)
                    f.write(packed)
                    digest.update(packed)
                    job.result.raw_bytes += len(data)
                    job.result.bytes += len(packed)
                    entry = [offset, len(packed), 0 if raw else 1]
                    offset += len(packed)
                    return entry

                pieces = []
                for k, part in enumerate(job.parts):
                    meta = [block(a.tobytes()) for a in (part.actions, part.rewards, part.flags)]
                    index.append(
                        {"env": part.env, "start": part.start, "n": part.n, "meta": meta}
                        | {"items": []}
                    )
                    w_end[str(part.env)] = part.w_first + part.n
                    job.result.slots += part.n
                    early = 0 if part.early is None else len(part.early)
                    for lo, hi in ((0, early), (early, part.n)):
                        for i in range(lo, hi, PIECE_SLOTS):
                            # How soon the actor overwrites the piece: all environments advance
                            # together, so the copy goes round them, the soonest first.
                            soon = part.w_first + i - int(job.written[part.env])
                            pieces.append((soon, k, i, min(PIECE_SLOTS, hi - i)))
                for _, k, i, m in sorted(pieces):
                    part = job.parts[k]
                    if part.early is not None and i < len(part.early):
                        frames = np.ascontiguousarray(part.early[i : i + m])
                    else:
                        frames = self._copy(job, part, i, m)
                    index[k]["items"].append([*block(memoryview(frames).cast("B")), m])
                tail = json.dumps(index).encode()
                trailer = tail + TRAILER.pack(len(tail), MAGIC)
                f.write(trailer)
                digest.update(trailer)
                job.result.bytes += len(trailer)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fsync_dir(self.directory)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise SaveAbandoned(self._os_reason(path.name, e)) from None
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        return {
            "file": path.name,
            "sha256": digest.hexdigest(),
            "bytes": offset + len(trailer),
            "w_end": w_end,
        }

    def _copy(self, job: SaveJob, part: Part, i: int, m: int) -> np.ndarray:
        """Frames ``i:i+m`` of ``part`` on the host, as they were at the snapshot; raises
        SaveAbandoned if the actor has come round to them since."""
        r = self.replay
        src = r.items[part.env, part.start + i : part.start + i + m]
        if src.device.type == "cuda":
            if self._copy_stream is None:
                self._copy_stream = torch.cuda.Stream(src.device)
            if self._pinned is None:
                shape = (PIECE_SLOTS, *src.shape[1:])
                self._pinned = torch.empty(shape, dtype=src.dtype, pin_memory=True)
            with torch.cuda.stream(self._copy_stream):
                self._copy_stream.wait_event(job.event)
                self._pinned[:m].copy_(src, non_blocking=True)
            self._copy_stream.synchronize()
            host = self._pinned[:m].numpy().copy()
        else:
            host = src.numpy().copy()
        # Write number w goes to slot w % slots: the piece's oldest slot is overwritten by
        # write w_first + i + slots, counted before it lands (see ReplayBuffer._write).
        if int(r.written[part.env]) > part.w_first + i + r.slots:
            raise SaveAbandoned(
                "the actor came round to the replay slots this save was still copying "
                "(the disk or CPU is too slow for this replay.capacity); the previous "
                "checkpoint stays the newest"
            )
        return host

    def commit(self, job: SaveJob) -> None:
        """Make a succeeded ``job`` the base of the next save (after its checkpoint is written)."""
        self._chain = job.chain
        self._saved_written = job.written

    # ------------------------------------------------------------------------------ restore

    def restore(self, manifest: str) -> int:
        """Fill the (empty) replay from ``manifest``; returns the transitions restored.

        Raises ReplayFileError naming the file that is missing, damaged or does not fit this
        replay (every file is checked first, see :mod:`edgerl.memories.replay.restore`); the
        replay is then left empty.
        """
        r = self.replay
        r.committed()
        try:
            chain = restore(self.directory, manifest, r)
        except ReplayFileError:
            r.clear()
            self._chain, self._saved_written = [], None
            raise
        r.valid = int(np.count_nonzero(r.flags & VALID))  # counted over written slots only
        r.refresh_device()
        self._chain = chain
        self._saved_written = r.written.copy()
        return r.valid

    # ------------------------------------------------------------------------------ cleanup

    def collect(self, checkpoint_steps: set[int]) -> None:
        """Delete manifests no checkpoint names (by step), deltas no kept manifest needs, and
        temporary files of killed saves. Call only while no save runs."""
        if not self.directory.is_dir():
            return
        keep: set[str] = {d["file"] for d in self._chain}
        unread = []  # kept manifests that cannot be read now: their deltas are not known
        for p in self.directory.iterdir():
            m = MANIFEST.match(p.name)
            if not m:
                continue
            if int(m["step"]) not in checkpoint_steps:
                with contextlib.suppress(OSError):
                    p.unlink()
                continue
            try:
                body = json.loads(json.loads(read_regular(p, follow=False))["manifest"])
                keep |= {d["file"] for d in body["deltas"]}
            except (OSError, ValueError, KeyError, TypeError) as e:
                unread.append(f"{p.name} ({getattr(e, 'strerror', None) or e})")
        if unread:  # damage, or an error that may pass (EIO, EMFILE): delete no delta now
            log.warning(
                "cannot read the replay manifest %s of a kept checkpoint; keeping every replay "
                "file until it can be read (a damaged one is reported when a resume uses it)",
                ", ".join(unread),
            )
        for p in self.directory.iterdir():
            stale_tmp = p.name.startswith(".") and ".tmp-" in p.name
            if (DELTA.match(p.name) and p.name not in keep and not unread) or stale_tmp:
                with contextlib.suppress(OSError):
                    p.unlink()
