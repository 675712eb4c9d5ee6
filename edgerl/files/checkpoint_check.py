"""What a checkpoint's payload must be for its reading to cost no more than its file.

A checkpoint's SHA-256 proves only that the file is whole: anyone who can write the file can
write a valid hash. So before ``torch.load`` builds anything, :func:`check_archive` holds the
payload to the zip that ``torch.save`` writes: a bounded number of entries, each stored (torch
never compresses, and a deflated entry of a few megabytes can inflate to gigabytes), inside the
payload, and all of them together no larger than it (entries that share bytes would build one
storage many times). Every storage torch then builds is bytes of the file, once.

After loading, :func:`payload_problem` looks at every tensor: a plain dense CPU tensor whose
elements are all in its storage. A view of stride 0 (``torch.zeros(1).expand(30000, 30000)``)
takes a few bytes in the file and gigabytes once copied into a network; a sparse, quantized,
nested or meta tensor is not what a network's weights are. What a network for the checkpoint's
game must be (names, shapes, dtype, finite values) is the policy's and the learner's to check
(:func:`edgerl.learners.nets.weights_problem`).
"""

from __future__ import annotations

import io
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Any

import psutil
import torch

from edgerl.errors import CheckpointError

# torch.save writes one entry per storage and a handful of its own; a learner's state has tens.
MAX_ENTRIES = 100_000
EOCD = struct.Struct("<4s4H2LH")  # the zip's end of central directory record, no comment
EOCD_SIG = b"PK\x05\x06"
LOCATOR = struct.Struct("<4sLQL")  # the zip64 end of central directory locator
LOCATOR_SIG = b"PK\x06\x07"
EOCD64 = struct.Struct("<4sQ2H2L4Q")  # the zip64 end of central directory record
EOCD64_SIG = b"PK\x06\x06"
# Walking a payload: nothing edgerl writes nests deeper, nor holds more values.
MAX_DEPTH = 64
MAX_VALUES = 50_000_000


def read_limit(path: Path) -> int:
    """The most bytes checkpoint ``path`` may have: reading it costs about twice its size (its
    bytes, and torch's copy of its storages), which must fit in the memory free now. Raises
    CheckpointError when the file is larger already (a sparse file of a terabyte costs no disk
    but would be read whole), and what ``os.stat`` raises."""
    free = int(psutil.virtual_memory().available)
    size = path.stat().st_size
    if size > free // 2:
        raise CheckpointError(
            f"checkpoint {path} is {size / 2**30:,.1f} GiB, and reading it needs twice that "
            f"of the {free / 2**30:,.1f} GiB of memory free here; free memory or read it elsewhere"
        )
    return free // 2


def _entry_count(stream: io.BytesIO, size: int) -> int | None:
    """The number of entries the payload's end record declares (None: no end record where
    torch.save puts it, at the very end, without a comment)."""
    if size < EOCD.size:
        return None
    stream.seek(size - EOCD.size)
    sig, _, _, _, total, _, _, comment = EOCD.unpack(stream.read(EOCD.size))
    if sig != EOCD_SIG or comment:
        return None
    if total != 0xFFFF:
        return total
    at = size - EOCD.size - LOCATOR.size  # zip64: the count is in the zip64 record
    if at < 0:
        return None
    stream.seek(at)
    sig, _, offset, _ = LOCATOR.unpack(stream.read(LOCATOR.size))
    if sig != LOCATOR_SIG or offset + EOCD64.size > at:
        return None
    stream.seek(offset)
    record = EOCD64.unpack(stream.read(EOCD64.size))
    return record[7] if record[0] == EOCD64_SIG else None


def check_archive(stream: io.BytesIO, size: int, name: str) -> None:
    """Raises CheckpointError unless the ``size`` bytes of ``stream`` (a checkpoint's payload,
    named ``name``) are a zip as ``torch.save`` writes it, whose storages together cost at most
    its own size: at most :data:`MAX_ENTRIES` entries, each stored uncompressed and unencrypted
    within the payload, their sizes adding up to no more than the payload's."""
    count = _entry_count(stream, size)
    if count is None:
        raise CheckpointError(
            f"checkpoint {name} cannot be read: its payload is not a torch.save archive (a zip); "
            "was it written by edgerl?"
        )
    if count > MAX_ENTRIES:
        raise CheckpointError(
            f"checkpoint {name} cannot be read: its payload declares {count:,} entries, more "
            f"than the {MAX_ENTRIES:,} of any checkpoint; was it written by edgerl?"
        )
    stream.seek(0)
    try:
        entries = zipfile.ZipFile(stream).infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, struct.error) as e:
        raise CheckpointError(
            f"checkpoint {name} cannot be read: its payload is a damaged zip ({e}); was it "
            "written by edgerl?"
        ) from None
    total = 0
    for entry in entries:
        shown = entry.filename[:80]
        if entry.compress_type != zipfile.ZIP_STORED or entry.flag_bits & 0x1:
            raise CheckpointError(
                f"checkpoint {name} holds a compressed entry {shown!r}, which torch.save never "
                "writes (a few megabytes of it could inflate to gigabytes); was it written by "
                "edgerl?"
            )
        if entry.file_size != entry.compress_size or entry.header_offset + entry.file_size > size:
            raise CheckpointError(
                f"checkpoint {name} holds an entry {shown!r} of {entry.file_size:,} bytes that "
                f"its {size:,}-byte payload cannot hold; was it written by edgerl?"
            )
        total += entry.file_size
    if total > size:
        raise CheckpointError(
            f"checkpoint {name} holds entries of {total:,} bytes in all, more than its "
            f"{size:,}-byte payload (entries that share bytes); was it written by edgerl?"
        )
    stream.seek(0)


def load_error(e: BaseException) -> str:
    """The one line of what torch.load said about a payload it could not read (its
    weights-only refusals are paragraphs of advice for a file's author)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        if line.startswith("WeightsUnpickler error:"):
            said = line.removeprefix("WeightsUnpickler error:").strip()
            detail = said or (lines[i + 1] if i + 1 < len(lines) else "")
            detail = detail.split(". ")[0]
            return f"it holds something other than plain values and tensors ({detail[:160]})"
    return (lines[0] if lines else type(e).__name__)[:200]


def tensor_problem(t: torch.Tensor) -> str | None:
    """What keeps ``t`` from being a plain tensor read from a file (None: nothing): a device
    other than the CPU (a meta tensor has no values), a layout other than dense and strided
    (sparse, quantized, nested), or elements that are not each in its own place of its storage
    (a stride-0 or overlapping view: a few bytes of storage that cost its full size once
    copied)."""
    if t.device.type != "cpu":
        return f"a tensor on the {t.device.type} device, without values in the file"
    if t.layout != torch.strided or t.is_quantized or t.is_nested:
        kind = "quantized" if t.is_quantized else "nested" if t.is_nested else str(t.layout)
        return f"a {kind.removeprefix('torch.')} tensor where only dense tensors belong"
    if t.numel() == 0:
        return None
    dims = sorted(
        (stride, size) for size, stride in zip(t.shape, t.stride(), strict=True) if size > 1
    )
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return (
                f"a tensor of shape {list(t.shape)[:8]} whose strides {list(t.stride())[:8]} "
                "reuse its storage's elements"
            )
        expected *= size
    end = (t.storage_offset() + t.numel()) * t.element_size()
    if end > t.untyped_storage().nbytes():
        return f"a tensor of shape {list(t.shape)[:8]} larger than its storage"
    return None


def payload_problem(state: Any) -> str | None:
    """What is wrong with the tensors of a loaded payload (None: nothing): the first
    :func:`tensor_problem` of any tensor in it, or nesting deeper or values more than any
    checkpoint has."""
    stack: list[tuple[Any, int]] = [(state, 0)]
    seen = 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if depth > MAX_DEPTH or seen > MAX_VALUES:
            return "values nested deeper or more numerous than in any checkpoint"
        if isinstance(value, torch.Tensor):
            problem = tensor_problem(value)
            if problem is not None:
                return problem
        elif isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend((v, depth + 1) for v in value)
    return None


def read_payload(payload: memoryview, name: str) -> dict[str, Any]:
    """The dict in a checkpoint's payload (its hash already checked), read by ``torch.load``
    only once :func:`check_archive` found that it costs no more than the file, and checked by
    :func:`payload_problem`; raises CheckpointError with one sentence."""
    stream = io.BytesIO(payload)
    check_archive(stream, len(payload), name)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notices on what a hostile file holds
            state = torch.load(stream, map_location="cpu", weights_only=True)
    except Exception as e:  # a valid hash over an unreadable payload: written by something else
        raise CheckpointError(
            f"checkpoint {name} cannot be read: {load_error(e)}; was it written by edgerl?"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {name} does not hold an edgerl state")
    problem = payload_problem(state)
    if problem is not None:
        raise CheckpointError(f"checkpoint {name} holds {problem}; was it written by edgerl?")
    return state
