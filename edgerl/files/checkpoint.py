"""Checkpoints: one typed record (:class:`Checkpoint`), its file format, atomic writes,
keep-last-K, newest-valid lookup.

A checkpoint is a :class:`Checkpoint`: a training run's state to resume, or a policy snapshot
(the online network's weights with what rebuilds it, for evaluations, ``best.ckpt``, ``play`` and
``export``). :meth:`Checkpoint.to_bytes` and :meth:`Checkpoint.from_bytes` are the one writer and
the one reader of its file; nothing else reads the payload.

File format (``ckpt-<seq>-step<step>.ckpt`` under ``<run_dir>/checkpoints/``, and ``best.ckpt``)::

    8 bytes   magic b"EDGERLCK"
    4 bytes   container version (little-endian uint32), 1
    4 bytes   reserved (zero)
    8 bytes   payload length (little-endian uint64)
    32 bytes  SHA-256 of the payload
    payload   torch.save() of a dict of plain types and tensors: the Checkpoint's fields

Two versions, for two things. The *container version* is the layout of the bytes above: header,
hash and a ``torch.save`` payload; it changes only if that layout does. The *payload format*
(``payload_version`` in the payload, :data:`~edgerl.files.checkpoint_migrate.PAYLOAD_VERSION`) is
what the dict holds: payloads of older formats are brought up to date on reading, one step per
format (:mod:`edgerl.files.checkpoint_migrate`), and a payload of a newer format is refused with a
sentence that says to upgrade edgerl.

A truncated or bit-flipped file is detected by its length and hash, reported by name, and never
used or deleted: the previous valid checkpoint is used instead. Writing goes to a temporary file in
the same directory, which is fsync'ed and renamed over, so a crash or power cut leaves either the
old set of files or the new one. The sequence number orders checkpoints (a resumed run continues the
sequence even when it resumed from an older step).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import logging
import math
import struct
from collections.abc import Iterator
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from edgerl import __version__
from edgerl.errors import CheckpointError
from edgerl.files.atomic import write_atomic
from edgerl.files.checkpoint_check import read_limit, read_payload
from edgerl.files.checkpoint_migrate import PAYLOAD_VERSION, CheckpointTooNewError, migrate
from edgerl.files.checkpoint_name import NAME
from edgerl.files.private import ensure_own_dir
from edgerl.files.regular import read_regular

log = logging.getLogger(__name__)

MAGIC = b"EDGERLCK"
CONTAINER_VERSION = 1  # the header's version: the file's layout, not the payload's
HEADER = struct.Struct("<8sII Q 32s")
# The one entry of a learner's state that is part of the file's interface: the acting network's
# weights (a state_dict of the network edgerl.learners.nets builds for the checkpoint's game and
# learner). `edgerl play`, `export`, evaluations and policy snapshots read this entry alone;
# everything else in Learner.state_dict() is the learner's own, read back only by it.
POLICY_KEY = "q"


@dataclass(frozen=True)
class CheckpointFile:
    path: Path
    seq: int
    step: int


@dataclass
class Checkpoint:
    """A training run's state, or a policy snapshot: the same record with only the weights.

    A snapshot has ``learner == {POLICY_KEY: weights}`` and no ``rng``; it plays and exports,
    but does not resume (:meth:`require_training_state`).
    """

    kind: str  # the learner: "dqn", "pqn" (edgerl.learners.Learner.kind)
    step: int  # env steps trained
    env: dict[str, Any]  # EnvSpec.to_dict() of the game
    config: dict[str, Any]  # Config.to_dict() of the run
    learner: dict[str, Any]  # Learner.state_dict(); POLICY_KEY holds the acting network's weights
    episodes: int = 0
    wall_s: float = 0.0  # training time across sessions
    recent_returns: list[float] = field(default_factory=list)  # the last 100 episodes'
    rng: dict[str, Any] | None = None  # actor, replay, torch, cuda; None in a policy snapshot
    replay: dict[str, Any] | None = None  # the replay files it resumes with (replay.persist)
    best: dict[str, Any] | None = None  # best.ckpt: the evaluation that kept these weights
    edgerl_version: str = __version__  # of the edgerl that wrote it
    saved_at: str = ""  # local time, ISO 8601
    # The payload format: always the newest once read (older ones are migrated on reading).
    payload_version: int = field(default=PAYLOAD_VERSION, init=False)

    @property
    def is_snapshot(self) -> bool:
        """Only the policy's weights: plays and exports, does not resume."""
        return self.rng is None

    def require_training_state(self, name: str) -> None:
        """Raises CheckpointError when this is a policy snapshot, which cannot resume training."""
        if self.is_snapshot:
            raise CheckpointError(
                f"checkpoint {name} is a policy snapshot (weights only) and cannot resume "
                "training; play or export it, or move it out of the run's checkpoints"
            )

    def to_bytes(self) -> bytes:
        """The bytes of a checkpoint file holding this record."""
        payload = {f.name: getattr(self, f.name) for f in fields(self)}
        buf = io.BytesIO()
        torch.save(payload, buf)
        data = buf.getvalue()
        digest = hashlib.sha256(data).digest()
        return HEADER.pack(MAGIC, CONTAINER_VERSION, 0, len(data), digest) + data

    @classmethod
    def from_bytes(cls, data: bytes, name: str) -> Checkpoint:
        """The record in a checkpoint file's bytes, of any payload format up to this edgerl's;
        raises CheckpointError saying what is wrong (CheckpointTooNewError for a newer format)."""
        return cls._from_payload(migrate(_payload(data, name), name), name)

    @classmethod
    def _from_payload(cls, payload: dict[str, Any], name: str) -> Checkpoint:
        values = {}
        for f in fields(cls):
            if not f.init:
                continue
            if f.name not in payload:
                if f.default is MISSING and f.default_factory is MISSING:
                    raise CheckpointError(
                        f"checkpoint {name} lacks its {f.name!r}; was it written by edgerl?"
                    )
                continue
            value = payload[f.name]
            if not isinstance(value, FIELD_TYPES[f.name]):
                raise CheckpointError(
                    f"checkpoint {name} has a damaged {f.name!r} (a {type(value).__name__}); was "
                    "it written by edgerl?"
                )
            values[f.name] = value
        problem = _value_problem(values)
        if problem is not None:
            raise CheckpointError(f"checkpoint {name} has {problem}; was it written by edgerl?")
        if not isinstance(values["learner"].get(POLICY_KEY), dict):
            raise CheckpointError(
                f"checkpoint {name} lacks the policy network's weights; was it written by edgerl?"
            )
        return cls(**values)


# The newest checkpoint this process wrote (empty: none): what a Ctrl-C that cut the command short
# says it left (edgerl.cli.app.interrupted).
WRITTEN: list[Path] = []

# No run trains more steps than this (train.steps' own bound), nor keeps more recent returns.
MAX_STEP = 10**12
MAX_RECENT = 10_000


def _value_problem(values: dict[str, Any]) -> str | None:
    """What is wrong with the counts of a payload whose types are right (None: nothing): a
    checkpoint at step 10**30 would leave its run with nothing left to do, forever."""
    step, episodes = values["step"], values.get("episodes", 0)
    if not 0 <= step <= MAX_STEP:
        return f"a step of {step}, outside 0 to {MAX_STEP:,}"
    if not 0 <= episodes <= MAX_STEP:
        return f"an episode count of {episodes}"
    wall = values.get("wall_s", 0.0)
    if not (math.isfinite(wall) and wall >= 0):
        return f"a training time of {wall}"
    recent = values.get("recent_returns", [])
    numbers = all(
        isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r) for r in recent
    )
    if len(recent) > MAX_RECENT or not numbers:
        return "damaged recent returns (not a list of finite numbers)"
    return None


# What each field of a payload must be (after migration).
FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "kind": str,
    "step": int,
    "env": dict,
    "config": dict,
    "learner": dict,
    "episodes": int,
    "wall_s": (int, float),
    "recent_returns": list,
    "rng": (dict, type(None)),
    "replay": (dict, type(None)),
    "best": (dict, type(None)),
    "edgerl_version": str,
    "saved_at": str,
}


def list_checkpoints(directory: Path) -> list[CheckpointFile]:
    """Checkpoint files in ``directory``, oldest first (by sequence number)."""
    if not directory.is_dir():
        return []
    found = []
    for p in directory.iterdir():
        m = NAME.match(p.name)
        if m and not p.is_symlink() and p.is_file():  # a link is no checkpoint of the run
            found.append(CheckpointFile(p, int(m["seq"]), int(m["step"])))
    return sorted(found, key=lambda c: c.seq)


def _payload(data: bytes, name: str) -> dict[str, Any]:
    """The payload dict in a checkpoint file's bytes, as written (checked against the header)."""
    if len(data) < HEADER.size:
        raise CheckpointError(f"checkpoint {name} is truncated ({len(data)} bytes, no header)")
    magic, version, _, length, digest = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CheckpointError(f"checkpoint {name} is not an edgerl checkpoint (bad magic)")
    if version != CONTAINER_VERSION:
        raise CheckpointError(
            f"checkpoint {name} has container version {version}; this edgerl reads version "
            f"{CONTAINER_VERSION}"
        )
    payload = memoryview(data)[HEADER.size :]
    if len(payload) != length:
        raise CheckpointError(
            f"checkpoint {name} is truncated ({len(payload)} of {length} payload bytes)"
        )
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"checkpoint {name} is corrupt (SHA-256 mismatch)")
    # A valid hash proves only that the file is whole: its author may be anyone who can write it.
    return read_payload(payload, name)


def load(path: str | Path) -> Checkpoint:
    """Read and verify one checkpoint file; raises CheckpointError if missing or corrupt, and
    CheckpointTooNewError if a newer edgerl wrote it."""
    path = Path(path)
    try:
        data = read_regular(path, read_limit(path))
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except IsADirectoryError:
        raise CheckpointError(f"checkpoint {path} is a directory, not a file") from None
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e.strerror}") from None
    return Checkpoint.from_bytes(data, str(path))


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a whole file (for export sidecars)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written; the previous ones are untouched."""

    def __init__(self, message: str, err: int | None) -> None:
        super().__init__(message)
        self.errno = err

    @property
    def disk_full(self) -> bool:
        return self.errno in (errno.ENOSPC, errno.EDQUOT)


class CheckpointLostError(CheckpointError):
    """The last checkpoint of a session could not be written: steps since the previous are lost."""


class CheckpointStore:
    """The checkpoints of one run: save (atomic, keep-last-K) and find the newest valid one."""

    def __init__(self, directory: Path, keep: int) -> None:
        self.directory = directory
        self.keep = keep
        self._reported: set[Path] = set()

    def files(self) -> list[CheckpointFile]:
        return list_checkpoints(self.directory)

    def save(self, checkpoint: Checkpoint) -> Path:
        """Write a new checkpoint and prune old ones; raises CheckpointWriteError on failure."""
        return self.save_encoded(checkpoint.to_bytes(), checkpoint.step)

    def save_encoded(self, data: bytes, step: int) -> Path:
        """Like :meth:`save`, for bytes from :meth:`Checkpoint.to_bytes` (made while the learner
        was paused)."""
        existing = self.files()
        seq = existing[-1].seq + 1 if existing else 1
        path = self.directory / f"ckpt-{seq:06d}-step{step:010d}.ckpt"
        try:
            ensure_own_dir(self.directory)  # never into a link, or another's folder
            write_atomic(path, data)
        except OSError as e:
            previous = f"; {existing[-1].path.name} is still the newest" if existing else ""
            raise CheckpointWriteError(
                f"cannot write checkpoint {path}: {e.strerror or e}{previous}", e.errno
            ) from None
        self._prune()
        WRITTEN[:] = [path]  # the newest only: a service writes checkpoints for weeks
        return path

    def _prune(self) -> None:
        """Delete all but the newest ``keep`` checkpoints, never one that fails verification."""
        files = self.files()
        for old in files[: max(0, len(files) - self.keep)]:
            try:
                load(old.path)
            except CheckpointError as e:
                if old.path not in self._reported:
                    log.warning("%s; keeping it for inspection instead of deleting it", e)
                    self._reported.add(old.path)
                continue
            with contextlib.suppress(FileNotFoundError):
                old.path.unlink()

    def newest_valid(
        self, fix: str = "move them away to start over, or use --fresh"
    ) -> tuple[CheckpointFile, Checkpoint] | None:
        """The newest checkpoint that verifies, with its record; None if there is none at all.

        Corrupt ones are logged by name and left in place. Raises CheckpointError, ending in
        ``fix`` (what the command that asked can do: training's by default), if checkpoints
        exist but none is valid, and CheckpointTooNewError for one written by a newer edgerl (an
        older one must not be taken in its place: the newer run would go on from behind it).
        """
        files = self.files()
        problems = []
        for ck in reversed(files):
            try:
                state = load(ck.path)
            except CheckpointTooNewError:
                raise
            except CheckpointError as e:
                log.warning("%s; leaving it in place and trying the previous one", e)
                self._reported.add(ck.path)
                problems.append(ck.path.name)
                continue
            return ck, state
        if problems:
            raise CheckpointError(
                f"no valid checkpoint in {self.directory} ({', '.join(problems)} failed their "
                f"checks); {fix}"
            )
        return None

    def __iter__(self) -> Iterator[CheckpointFile]:
        return iter(self.files())
