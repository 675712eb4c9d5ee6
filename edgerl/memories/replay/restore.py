"""Restoring a saved replay (:mod:`edgerl.memories.replay.store`'s files) only from files that prove
sound.

A manifest's SHA-256 proves it was written whole, not that what it says is sane: a bug, an edit or
a copy of another run can give a manifest with a matching hash and a missing key, positions past
the ring, or a delta that names a file outside the replay directory. So everything is checked
before anything is used: the manifest's shape and types (:func:`check_manifest`), each delta's
size and hash, and each delta's index (ranges inside the ring, blocks inside the file, sizes that
decompress to exactly what the ring holds). Any doubt is a :class:`ReplayFileError` that names the
file and the reason; the caller then resumes with an empty replay, never a wrong one.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgerl.files.regular import read_regular
from edgerl.memories.replay import ReplayBuffer

VERSION = 1
MAGIC = b"EDGERLRP"
TRAILER = struct.Struct("<Q8s")  # index length, magic
MANIFEST = re.compile(r"^manifest-step(?P<step>\d+)-[0-9a-f]+\.json$")
DELTA = re.compile(r"^delta-step\d+-[0-9a-f]+\.rpl$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_WRITES = 1 << 62


class ReplayFileError(Exception):
    """A replay file is missing, damaged or does not fit this replay; the message names it."""


class _Doubt(ValueError):
    """What is wrong with a replay file, in a few words (made into a ReplayFileError)."""


class _Mismatch(_Doubt):
    """A sound replay file of another replay size."""


@dataclass(frozen=True)
class Manifest:
    """A checked manifest: the replay's positions and the deltas that rebuild it."""

    head: list[int]
    count: list[int]
    written: list[int]
    deltas: list[dict[str, Any]]


def _int(value: Any, what: str, lo: int = 0, hi: int = MAX_WRITES) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _Doubt(f"{what} is {_shown(value)}, not a whole number from {lo:,} to {hi:,}")
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _ints(value: Any, what: str, n: int, lo: int = 0, hi: int = MAX_WRITES) -> list[int]:
    if not isinstance(value, list) or len(value) != n:
        raise _Doubt(f"{what} is not a list of {n} numbers")
    return [_int(v, f"{what}[{i}]", lo, hi) for i, v in enumerate(value)]


def read_manifest(data: bytes) -> dict[str, Any]:
    """The manifest inside a manifest file whose SHA-256 matches; raises _Doubt."""
    try:
        outer = json.loads(data)
    except (ValueError, RecursionError):
        raise _Doubt("it is not JSON") from None
    body = outer.get("manifest") if isinstance(outer, dict) else None
    digest = outer.get("sha256") if isinstance(outer, dict) else None
    if not isinstance(body, str) or not isinstance(digest, str):
        raise _Doubt("it is not a manifest file")
    if hashlib.sha256(body.encode(errors="surrogatepass")).hexdigest() != digest:
        raise _Doubt("its checksum does not match")
    try:
        inner = json.loads(body)
    except (ValueError, RecursionError):
        raise _Doubt("its manifest is not JSON") from None
    if not isinstance(inner, dict):
        raise _Doubt("its manifest is not an object")
    return inner


def check_manifest(m: dict[str, Any], replay: ReplayBuffer) -> Manifest:
    """The manifest's positions and deltas if they are sane for ``replay``; raises _Doubt
    (_Mismatch for a manifest of a replay of another size)."""
    if m.get("version") != VERSION:
        raise _Doubt(f"it is version {_shown(m.get('version'))}, not {VERSION}")
    _int(m.get("num_envs"), "num_envs", 1)
    _int(m.get("slots"), "slots", 1)
    shape, dtype = m.get("item_shape"), m.get("item_dtype")
    if not isinstance(shape, list) or not all(isinstance(v, int) for v in shape):
        raise _Doubt(f"item_shape is {_shown(shape)}, not a list of numbers")
    if not isinstance(dtype, str):
        raise _Doubt(f"item_dtype is {_shown(dtype)}, not a type's name")
    saved = tuple(m.get(k) for k in ("num_envs", "slots", "item_shape", "item_dtype"))
    if saved != _shape_of(replay):
        raise _Mismatch(shape_mismatch(saved, replay))
    actions = _saved_actions(m)
    if actions != _actions_of(replay):
        raise _Mismatch(
            f"it holds {_actions_said(*actions)}, not {_actions_said(*_actions_of(replay))} "
            "(the game's actions changed: env.id or env.make_kwargs)"
        )
    n, slots = replay.num_envs, replay.slots
    head = _ints(m.get("head"), "head", n, 0, slots - 1)
    count = _ints(m.get("count"), "count", n, 0, slots)
    written = _ints(m.get("written"), "written", n)
    for env in range(n):
        if count[env] != min(written[env], slots) or head[env] != written[env] % slots:
            raise _Doubt(
                f"environment {env}'s positions disagree (head {head[env]}, count "
                f"{count[env]}, written {written[env]})"
            )
    deltas = m.get("deltas")
    if not isinstance(deltas, list):
        raise _Doubt("its deltas are not a list")
    return Manifest(head, count, written, [_check_delta(d, n, written) for d in deltas])


def _check_delta(d: Any, n: int, written: list[int]) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise _Doubt("a delta entry is not an object")
    name, digest = d.get("file"), d.get("sha256")
    if not isinstance(name, str) or not DELTA.match(name):
        raise _Doubt(f"a delta names {_shown(name)}, not a delta file of this directory")
    if not isinstance(digest, str) or not SHA256.match(digest):
        raise _Doubt(f"delta {name} has no SHA-256")
    _int(d.get("bytes"), f"delta {name}'s size", TRAILER.size, MAX_WRITES)
    w_end = d.get("w_end")
    if not isinstance(w_end, dict):
        raise _Doubt(f"delta {name} has no write positions")
    for env, end in w_end.items():
        if not (isinstance(env, str) and env.isdigit() and int(env) < n):
            raise _Doubt(f"delta {name} names environment {_shown(env)}")
        _int(end, f"delta {name}'s end", 0, written[int(env)])
    return d


def _saved_actions(m: dict[str, Any]) -> tuple[list[int], str | None]:
    """The action shape and dtype a manifest holds: ``([], None)`` for a discrete game's (its
    manifests name neither: every one written before continuous actions, too)."""
    shape = m.get("action_shape", [])
    if not isinstance(shape, list) or not all(_whole(v) for v in shape):
        raise _Doubt(f"action_shape is {_shown(shape)}, not a list of numbers")
    if not shape:
        return [], None
    dtype = m.get("action_dtype")
    if not isinstance(dtype, str):
        raise _Doubt(f"action_dtype is {_shown(dtype)}, not a type's name")
    return shape, dtype


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _actions_of(replay: ReplayBuffer) -> tuple[list[int], str | None]:
    """What :func:`_saved_actions` reads from a manifest of ``replay``."""
    shape = list(replay.actions.shape[2:])
    return shape, (str(replay.actions.dtype) if shape else None)


def _actions_said(shape: list[int], dtype: str | None) -> str:
    if not shape:
        return "a discrete game's actions"
    return f"{str(dtype)[:20]} actions of shape {_shown(shape)}"


def _shape_of(replay: ReplayBuffer) -> tuple[Any, ...]:
    shape = list(replay.items.shape[2:])
    dtype = str(replay.items.dtype).removeprefix("torch.")
    return (replay.num_envs, replay.slots, shape, dtype)


def shape_mismatch(saved: tuple[Any, ...], replay: ReplayBuffer) -> str:
    """Why a replay of another size cannot be restored into ``replay``."""
    n, slots, shape, dtype = (_shown(v) for v in saved)
    want = _shape_of(replay)
    return (
        f"it holds {n} environments x {slots} slots of {shape} {dtype}, not {want[0]} x "
        f"{want[1]:,} of {want[2]} {want[3]} (env.num_envs or replay.capacity changed)"
    )


def apply_delta(data: bytes, replay: ReplayBuffer) -> list[tuple[int, int, int]]:
    """Write a delta file's slots into ``replay``; returns the (env, start, length) ranges it
    wrote. Raises _Doubt before writing anything when its index does not fit the file or the
    ring."""
    if len(data) < TRAILER.size:
        raise _Doubt("it is shorter than its trailer")
    length, magic = TRAILER.unpack_from(data, len(data) - TRAILER.size)
    if magic != MAGIC or length > len(data) - TRAILER.size:
        raise _Doubt("it is not an edgerl replay delta")
    try:
        index = json.loads(data[len(data) - TRAILER.size - length : len(data) - TRAILER.size])
    except (ValueError, RecursionError):
        raise _Doubt("its index is not JSON") from None
    body = len(data) - TRAILER.size - length
    frame_bytes = math.prod(replay.items.shape[2:]) * replay.items.element_size()
    parts = _check_index(index, replay, body, frame_bytes)
    item_dtype = torch.empty(0, dtype=replay.items.dtype).numpy().dtype
    item_shape = tuple(replay.items.shape[2:])
    for env, start, n, meta, items in parts:
        sl = slice(start, start + n)
        arrays = (replay.actions, replay.rewards, replay.flags)
        for array, entry in zip(arrays, meta, strict=True):
            per_slot = array.shape[2:]  # a continuous game's action: its numbers
            raw = _unpack(data, entry, n * array.itemsize * math.prod(per_slot))
            array[env, sl] = np.frombuffer(raw, dtype=array.dtype).reshape(n, *per_slot)
        at = start
        for *entry, m in items:
            raw = _unpack(data, entry, m * frame_bytes)
            frames = np.frombuffer(raw, dtype=item_dtype).reshape(m, *item_shape)
            replay.items[env, at : at + m] = torch.from_numpy(frames.copy()).to(replay.items.device)
            at += m
    return [(env, start, n) for env, start, n, _, _ in parts]


def _check_index(
    index: Any, replay: ReplayBuffer, body: int, frame_bytes: int
) -> list[tuple[int, int, int, list[list[int]], list[list[int]]]]:
    if not isinstance(index, list):
        raise _Doubt("its index is not a list")
    parts = []
    for part in index:
        if not isinstance(part, dict):
            raise _Doubt("an index entry is not an object")
        env = _int(part.get("env"), "an entry's environment", 0, replay.num_envs - 1)
        start = _int(part.get("start"), "an entry's start", 0, replay.slots - 1)
        n = _int(part.get("n"), "an entry's length", 1, replay.slots - start)
        meta, items = part.get("meta"), part.get("items")
        if not isinstance(meta, list) or len(meta) != 3 or not isinstance(items, list):
            raise _Doubt("an index entry has no blocks")
        for entry in meta:
            _block(entry, body, 3)
        if sum(_block(entry, body, 4)[3] for entry in items) != n:
            raise _Doubt("an index entry's frames do not add up to its length")
        parts.append((env, start, n, meta, items))
    return parts


def _block(entry: Any, body: int, size: int) -> list[int]:
    """A block ``[offset, length, compressed(, frames)]`` that lies inside the file's body."""
    if not isinstance(entry, list) or len(entry) != size:
        raise _Doubt("a block entry is not a list of numbers")
    offset = _int(entry[0], "a block's offset", 0, body)
    _int(entry[1], "a block's length", 0, body - offset)
    _int(entry[2], "a block's kind", 0, 1)
    if size == 4:
        _int(entry[3], "a block's frames", 1, MAX_WRITES)
    return entry


def _unpack(data: bytes, entry: list[int], expected: int) -> bytes:
    """A block's bytes, decompressed to exactly ``expected`` bytes (never more: a block that
    would inflate beyond it is damage, not a reason to run out of memory)."""
    raw = data[entry[0] : entry[0] + entry[1]]
    if entry[2]:
        inflate = zlib.decompressobj()
        try:
            out = inflate.decompress(raw, expected + 1)
        except zlib.error:
            raise _Doubt("a block does not decompress") from None
    else:
        out = raw
    if len(out) != expected:
        raise _Doubt(f"a block holds {len(out):,} bytes, not the {expected:,} its slots need")
    return out


def restore(directory: Path, name: str, replay: ReplayBuffer) -> list[dict[str, Any]]:
    """Fill ``replay`` (empty) from manifest ``name`` in ``directory``; returns its deltas.

    Raises ReplayFileError naming the file that is missing, damaged or does not fit; the replay
    may then hold part of the deltas (the caller clears it).
    """
    if not isinstance(name, str) or not MANIFEST.match(name):
        raise ReplayFileError(f"the checkpoint names {_shown(name)}, not a replay manifest")
    path = directory / name
    try:
        m = check_manifest(read_manifest(_read(path)), replay)
    except _Mismatch as e:
        raise ReplayFileError(f"replay file {path}: {e}") from None
    except _Doubt as e:
        raise ReplayFileError(f"replay file {path} is damaged ({e})") from None
    covered = np.zeros((replay.num_envs, replay.slots), dtype=bool)
    for d in m.deltas:
        delta = directory / d["file"]
        data = _read(delta)
        if len(data) != d["bytes"] or hashlib.sha256(data).hexdigest() != d["sha256"]:
            raise ReplayFileError(
                f"replay file {delta} is damaged ({len(data):,} bytes, "
                f"expected {d['bytes']:,} with a matching SHA-256)"
            )
        try:
            for env, start, n in apply_delta(data, replay):
                covered[env, start : start + n] = True
        except (_Doubt, struct.error) as e:
            raise ReplayFileError(f"replay file {delta} cannot be read ({e})") from None
    for env, count in enumerate(m.count):
        # Fewer than `slots` writes fill the ring from slot 0; a full ring is all of it.
        if not covered[env, :count].all():
            missing = int(count - covered[env, :count].sum())
            raise ReplayFileError(
                f"replay file {path} is damaged (its deltas leave {missing:,} of environment "
                f"{env}'s {count:,} transitions unwritten)"
            )
    replay.head[:] = m.head
    replay.count[:] = m.count
    replay.written[:] = m.written
    return m.deltas


def _read(path: Path) -> bytes:
    try:
        return read_regular(path, follow=False)
    except FileNotFoundError:
        raise ReplayFileError(f"replay file {path} is missing") from None
    except OSError as e:
        raise ReplayFileError(f"cannot read replay file {path}: {e.strerror or e}") from None
