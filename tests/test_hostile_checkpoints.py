"""Checkpoints written by someone else with a valid SHA-256 (issue 69): the hash proves only that
the file is whole. A small file must cost no more than its size to `play`, `export --onnx` and
resume (a deflated gigabyte, storages that share bytes, stride-0 weights of a wide network, a
sparse terabyte, a network wider than the memory), and every other damage is one sentence and
exit code 2: weights of another dtype or layout, NaN, a pickle, damaged random states and replay
entries, a NUL in a path, a GA generation no search has.

The hostile files are made with the project's own writer (:meth:`Checkpoint.to_bytes`), or, for
the archive's own damage, a zip written here entry by entry around a real ``torch.save`` payload.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import struct
import subprocess
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from edgerl.files.checkpoint import (
    CONTAINER_VERSION,
    HEADER,
    MAGIC,
    Checkpoint,
    list_checkpoints,
    load,
)

from .conftest import edgerl_cmd

MIB = 1 << 20
CARTPOLE = ["--env", "CartPole-v1", "--set", "agent.hidden=[16,16]"]
SHAPES = {  # the [16, 16] MLP of CartPole (4 observations, 2 actions), for hidden width H
    "net.0.weight": lambda h: (h, 4),
    "net.0.bias": lambda h: (h,),
    "net.2.weight": lambda h: (h, h),
    "net.2.bias": lambda h: (h,),
    "net.4.weight": lambda h: (2, h),
    "net.4.bias": lambda h: (2,),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CartPole DQN run that has learned (its optimizer holds moments): one checkpoint."""
    from edgerl.cli import main

    run = tmp_path_factory.mktemp("hostile") / "run"
    args = ["train", *CARTPOLE, "--set", "agent.learning_starts=100", "--steps", "400"]
    assert main([*args, "--run-dir", str(run), "--quiet"]) == 0
    return run


def newest(run: Path) -> Path:
    return list_checkpoints(run / "checkpoints")[-1].path


def written(path: Path, ck: Checkpoint) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(ck.to_bytes())
    return path


def with_newest(trained: Path, tmp_path: Path, data: bytes) -> Path:
    """A copy of the trained run whose newest checkpoint (step 500) is ``data``."""
    run = tmp_path / "resumed"
    shutil.copytree(trained, run)
    (run / "checkpoints" / "ckpt-000002-step0000000500.ckpt").write_bytes(data)
    return run


def one_sentence(r) -> str:  # type: ignore[no-untyped-def]
    """The error line of a command that refused with exit code 2, checked to be one line."""
    assert r.code == 2, (r.code, r.out, r.err)
    assert "Traceback" not in r.err and "internal error" not in r.err, r.err
    lines = r.err.strip().splitlines()
    assert lines and lines[-1].startswith("edgerl: error: "), r.err
    assert sum(line.startswith("edgerl: error") for line in lines) == 1
    return lines[-1]


def measured(*args: object, cwd: Path) -> tuple[int, str, int]:
    """Run ``edgerl ARGS`` as a process: its exit code, its output and its peak memory (bytes)."""
    with (cwd / "output.txt").open("w+") as out:
        proc = subprocess.Popen(edgerl_cmd(*args), stdout=out, stderr=out, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        return proc.returncode, out.read(), usage.ru_maxrss * 1024


# ---------------------------------------------------------------------- the archive itself

MARK = 987_653  # a storage size nothing else in the payload has, found in its pickle


def zip_payload(
    entries: list[tuple[str, bytes]],
    deflate: dict[str, int] | None = None,
    alias: dict[str, str] | None = None,
) -> bytes:
    """A zip of ``entries`` as torch reads it, with ``deflate`` (name: bytes of zeros) deflated
    instead, and each of ``alias`` (name: other name) pointing at the other's bytes."""
    deflate, alias = deflate or {}, alias or {}
    out, central, where = bytearray(), bytearray(), {}
    for name, data in entries:
        if name in alias:
            continue
        size, method, crc = len(data), 0, zlib.crc32(data)
        if name in deflate:
            size, method, crc = deflate[name], 8, 0
            packer, parts, chunk = zlib.compressobj(9, zlib.DEFLATED, -15), [], bytes(MIB)
            for _ in range(size // MIB):
                parts.append(packer.compress(chunk))
                crc = zlib.crc32(chunk, crc)
            data = b"".join(parts) + packer.flush()
        where[name] = (len(out), method, crc, len(data), size)
        raw = name.encode()
        local = (b"PK\x03\x04", 20, 0, method, 0, 0, crc, len(data), size, len(raw), 0)
        out += struct.pack("<4s5H3L2H", *local) + raw + data
    for name, _ in entries:
        offset, method, crc, stored, size = where[alias.get(name, name)]
        raw = name.encode()
        record = (b"PK\x01\x02", 20, 20, 0, method, 0, 0, crc, stored, size, len(raw), 0, 0)
        central += struct.pack("<4s6H3L5H2L", *record, 0, 0, 0, offset) + raw
    n = len(entries)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, n, n, len(central), len(out), 0)
    return bytes(out + central + end)


def forged(ck: Checkpoint, count: int, nbytes: int, deflate: bool) -> bytes:
    """``ck`` with ``count`` extra storages of ``nbytes`` in its learner's state, in a file of
    a valid hash that holds them deflated (one), or once, the others sharing its bytes."""
    ck.learner["extra"] = [torch.ones(MARK, dtype=torch.uint8) for _ in range(count)]
    buf = io.BytesIO()
    torch.save({f.name: getattr(ck, f.name) for f in fields(ck)}, buf)
    source = zipfile.ZipFile(buf)
    mark, size = b"J" + struct.pack("<i", MARK), b"J" + struct.pack("<i", nbytes)
    entries, extra = [], []
    for info in source.infolist():
        data = source.read(info)
        if info.filename.endswith("data.pkl"):
            assert data.count(mark) == 2 * count  # each storage's size and its tensor's shape
            data = data.replace(mark, size)
        elif info.file_size == MARK:
            extra.append(info.filename)
            data = b"" if deflate else bytes(nbytes)
        entries.append((info.filename, data))
    if deflate:
        payload = zip_payload(entries, deflate={extra[0]: nbytes})
    else:
        payload = zip_payload(entries, alias={name: extra[0] for name in extra[1:]})
    digest = hashlib.sha256(payload).digest()
    return HEADER.pack(MAGIC, CONTAINER_VERSION, 0, len(payload), digest) + payload


def test_a_deflated_gigabyte_in_a_megabyte_file_is_refused_before_it_inflates(trained, tmp_path):
    """A 1 GiB tensor deflated into a 1 MB file made `play` peak at 1,265 MiB (254 MiB normal)
    and resumed: now it is refused before torch reads it, and resuming takes the one before."""
    ck = load(newest(trained))
    ck.step = 500
    data = forged(ck, 1, 1 << 30, deflate=True)
    assert len(data) < 2 * MIB
    bad = tmp_path / "deflated.ckpt"
    bad.write_bytes(data)
    code, _, normal = measured("play", "--checkpoint", newest(trained), cwd=tmp_path)
    assert code == 0
    code, out, peak = measured("play", "--checkpoint", bad, cwd=tmp_path)
    assert code == 2 and out.strip().count("\n") == 0, out
    assert f"checkpoint {bad} holds a compressed entry 'archive/data/" in out
    assert peak < normal + 200 * MIB, (peak, normal)

    run = with_newest(trained, tmp_path, data)
    code, out, peak = measured("train", *CARTPOLE, "--steps", "600", "--run-dir", run, cwd=tmp_path)
    assert code == 0, out
    assert "holds a compressed entry" in out and "resuming from step 400" in out
    assert peak < normal + 400 * MIB, (peak, normal)  # training's own memory beside playing's


def test_storages_that_share_the_file_s_bytes_are_refused(trained, tmp_path):
    """64 storages of 8 MiB whose zip entries all point at the same 8 MiB: 512 MiB from a file
    of 8 MB (entries may add up to no more than the payload)."""
    bad = tmp_path / "shared.ckpt"
    bad.write_bytes(forged(load(newest(trained)), 64, 8 * MIB, deflate=False))
    assert bad.stat().st_size < 9 * MIB
    code, _, normal = measured("play", "--checkpoint", newest(trained), cwd=tmp_path)
    code, out, peak = measured("play", "--checkpoint", bad, cwd=tmp_path)
    assert code == 2 and out.strip().count("\n") == 0, out
    assert "bytes in all, more than its" in out and "(entries that share bytes)" in out
    assert peak < normal + 200 * MIB, (peak, normal)


def stride_0(ck: Checkpoint, width: int) -> Checkpoint:
    """``ck`` for hidden layers ``width`` wide, every weight one zero seen through stride 0."""
    ck.config["agent"]["hidden"] = [width, width]
    ck.learner["q"] = {k: torch.zeros(1).expand(shape(width)) for k, shape in SHAPES.items()}
    return ck


def test_stride_0_weights_of_a_wide_network_are_refused_before_any_is_copied(trained, tmp_path):
    """Weights of `hidden=[30000, 30000]` in 6.5 KB (one zero each, stride 0) made `play` peak
    at 3,689 MiB and `export --onnx` die at 7,185 MiB leaving a 3.6 GB temporary file."""
    bad = written(tmp_path / "wide.ckpt", stride_0(load(newest(trained)), 16_384))
    assert bad.stat().st_size < 64 * 1024
    code, _, normal = measured("play", "--checkpoint", newest(trained), cwd=tmp_path)
    code, out, peak = measured("play", "--checkpoint", bad, "--episodes", "1", cwd=tmp_path)
    assert code == 2 and out.strip().count("\n") == 0, out
    assert "whose strides [0" in out and "reuse its storage's elements" in out
    assert peak < normal + 200 * MIB, (peak, normal)

    narrower = written(tmp_path / "narrower.ckpt", stride_0(load(newest(trained)), 4096))
    out_dir = tmp_path / "export"
    code, out, _ = measured(
        "export", "--onnx", "--checkpoint", narrower, "-o", out_dir, cwd=tmp_path
    )
    assert code == 2 and "reuse its storage's elements" in out, out
    assert not out_dir.exists() or not any(out_dir.iterdir())  # no temporary file left


def test_stride_0_weights_of_the_run_s_own_shapes_do_not_resume(cli, trained, tmp_path):
    ck = load(newest(trained))
    ck.step = 500
    ck.learner["q"] = {k: torch.zeros(1).expand(v.shape) for k, v in ck.learner["q"].items()}
    run = with_newest(trained, tmp_path, ck.to_bytes())
    r = cli("train", *CARTPOLE, "--steps", "600", "--run-dir", run)
    assert r.code == 0, r.err
    assert "ckpt-000002-step0000000500.ckpt holds a tensor of shape" in r.err
    assert "resuming from step 400" in r.err


def test_a_network_wider_than_the_memory_is_refused_before_it_is_built(cli, trained, tmp_path):
    """Sixteen layers of 65,536 (the config's bounds) are 256 GiB of weights: said from the
    settings, before a layer of it exists."""
    ck = load(newest(trained))
    ck.config["agent"]["hidden"] = [65_536] * 16
    bad = written(tmp_path / "widest.ckpt", ck)
    said = one_sentence(cli("play", "--checkpoint", bad))
    assert f"checkpoint {bad}'s policy network has 240.0 GiB of weights" in said
    assert "GiB of host memory free here" in said
    said = one_sentence(cli("export", "--onnx", "--checkpoint", bad, "-o", tmp_path / "out"))
    assert "240.0 GiB of weights" in said


def test_a_sparse_terabyte_file_is_not_read(cli, tmp_path):
    """A file of a terabyte costs nothing on disk when it is sparse; reading it whole would."""
    bad = tmp_path / "terabyte.ckpt"
    with bad.open("wb") as f:
        f.write(HEADER.pack(MAGIC, CONTAINER_VERSION, 0, (1 << 40) - HEADER.size, bytes(32)))
        f.truncate(1 << 40)
    said = one_sentence(cli("play", "--checkpoint", bad))
    assert f"checkpoint {bad} is 1,024.0 GiB, and reading it needs twice that" in said


# ------------------------------------------------------------------------ one sentence each


def weights(change: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[Checkpoint], None]:
    def apply(ck: Checkpoint) -> None:
        ck.learner["q"] = {k: change(v) for k, v in ck.learner["q"].items()}

    return apply


def poisoned(value: float, key: str = "net.0.weight") -> Callable[[Checkpoint], None]:
    def apply(ck: Checkpoint) -> None:
        w = ck.learner["q"][key].clone()
        w.view(-1)[0] = value
        ck.learner["q"][key] = w

    return apply


WEIGHTS = {
    "float16": (weights(lambda v: v.half()), "weight 'net.0.weight' is float16, not float32"),
    "float64": (weights(lambda v: v.double()), "weight 'net.0.weight' is float64, not float32"),
    "complex": (
        weights(lambda v: v.to(torch.complex64)),
        "weight 'net.0.weight' is complex64, not float32",
    ),
    "int8": (weights(lambda v: v.to(torch.int8)), "weight 'net.0.weight' is int8, not float32"),
    "uint8": (weights(lambda v: v.to(torch.uint8)), "weight 'net.0.weight' is uint8, not float32"),
    "bool": (weights(lambda v: v.bool()), "weight 'net.0.weight' is bool, not float32"),
    "NaN": (poisoned(float("nan")), "weight 'net.0.weight' holds NaN or infinite values"),
    "inf": (poisoned(float("-inf"), "net.4.bias"), "weight 'net.4.bias' holds NaN or infinite"),
    "quantized": (
        weights(lambda v: torch.quantize_per_tensor(v, 0.1, 0, torch.qint8)),
        "holds a quantized tensor where only dense tensors belong",
    ),
    "sparse": (weights(lambda v: v.to_sparse()), "holds a sparse_coo tensor where only dense"),
    "meta": (
        weights(lambda v: torch.empty(v.shape, device="meta")),
        "holds a tensor on the meta device, without values in the file",
    ),
}


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch's on making quantized tensors
@pytest.mark.parametrize("case", sorted(WEIGHTS))
def test_weights_no_network_of_the_game_has_do_not_play(cli, trained, tmp_path, case):
    """float16/float64/complex weights said `mat1 and mat2 must have the same dtype`,
    int8/uint8/bool/quantized ones a six-line load_state_dict dump, sparse and meta ones
    internal errors, and NaN or infinite ones played silently."""
    change, says = WEIGHTS[case]
    ck = load(newest(trained))
    change(ck)
    bad = written(tmp_path / f"{case}.ckpt", ck)
    said = one_sentence(cli("play", "--checkpoint", bad, "--episodes", "1"))
    assert says in said and str(bad) in said


def learner_moment(value: torch.Tensor) -> Callable[[Checkpoint], None]:
    def apply(ck: Checkpoint) -> None:
        ck.learner["optimizer"]["state"][0]["exp_avg"] = value

    return apply


RESUMES = {
    "float16 weights": (WEIGHTS["float16"][0], "weight 'net.0.weight' is float16, not float32"),
    "int8 weights": (WEIGHTS["int8"][0], "weight 'net.0.weight' is int8, not float32"),
    "NaN weights": (WEIGHTS["NaN"][0], "weight 'net.0.weight' holds NaN or infinite values"),
    "an infinite target": (
        lambda ck: ck.learner["target"]["net.2.bias"].fill_(float("inf")),
        "learner.target.net.2.bias holds NaN or infinite values",
    ),
    "an infinite moment": (
        learner_moment(torch.full((16, 4), float("inf"))),
        "learner.optimizer.state.0.exp_avg holds NaN or infinite values",
    ),
    "a moment of another shape": (
        learner_moment(torch.zeros(3, 3)),
        "optimizer state 'exp_avg' of parameter 0 has shape [3, 3], not [16, 4]",
    ),
    'rng.actor = "x"': (
        lambda ck: ck.rng.update(actor="x"),
        "has a damaged rng.actor (state must be a dict)",
    ),
    "rng = {}": (lambda ck: setattr(ck, "rng", {}), "has a damaged rng.actor (missing)"),
    "rng.torch of another size": (
        lambda ck: ck.rng.update(torch=torch.zeros(100, dtype=torch.uint8)),
        "has a damaged rng.torch (",
    ),
    'replay.learn_from = "ab"': (
        lambda ck: ck.replay.update(learn_from="ab"),
        "has a damaged replay.learn_from (not a step and an update count)",
    ),
    "replay.manifest = 3": (
        lambda ck: ck.replay.update(manifest=3),
        "has a damaged replay.manifest (not a file name)",
    ),
}


@pytest.mark.parametrize("case", sorted(RESUMES))
def test_a_damaged_training_state_does_not_resume(cli, trained, tmp_path, case):
    """Resuming from weights of another dtype or with NaN went on silently; damaged random
    states and replay entries were internal errors halfway through resuming."""
    change, says = RESUMES[case]
    ck = load(newest(trained))
    ck.step = 500
    change(ck)
    run = with_newest(trained, tmp_path, ck.to_bytes())
    said = one_sentence(cli("train", *CARTPOLE, "--steps", "600", "--run-dir", run, "--quiet"))
    assert f"checkpoint {run / 'checkpoints' / 'ckpt-000002-step0000000500.ckpt'}" in said
    assert says in said and "Move it aside to resume from the one before" in said


def test_payloads_torch_save_does_not_write_are_one_sentence(cli, trained, tmp_path):
    """A pickle payload answered with torch's multi-paragraph advice to its author."""
    import pickle

    ck = load(newest(trained))
    payload = pickle.dumps({f.name: getattr(ck, f.name) for f in fields(ck)})
    digest = hashlib.sha256(payload).digest()
    bad = tmp_path / "pickle.ckpt"
    bad.write_bytes(HEADER.pack(MAGIC, CONTAINER_VERSION, 0, len(payload), digest) + payload)
    said = one_sentence(cli("play", "--checkpoint", bad))
    assert "its payload is not a torch.save archive (a zip)" in said

    ck.best = {"path": Path("/etc")}  # a class torch's weights-only reader refuses
    bad = written(tmp_path / "global.ckpt", ck)
    said = one_sentence(cli("play", "--checkpoint", bad))
    assert "cannot be read: it holds something other than plain values and tensors" in said
    assert "Unsupported global: GLOBAL pathlib.PosixPath" in said


def test_a_nul_in_the_run_directory_is_one_sentence(cli, tmp_path):
    config = tmp_path / "nul.toml"
    config.write_text('[train]\nrun_dir = "runs/a\\u0000b"\n')
    said = one_sentence(cli("train", "--config", config, *CARTPOLE, "--steps", "10"))
    assert "train.run_dir must be text without NUL characters" in said


# ------------------------------------------------------------------------------------ the GA


@pytest.fixture(scope="module")
def ga_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgerl.cli import main

    run = tmp_path_factory.mktemp("hostile") / "ga"
    small = ["ga.population=4", "ga.truncation=2", "ga.elite_candidates=1", "ga.elite_episodes=1"]
    sets = [arg for key in small for arg in ("--set", key)]
    args = ["train", "--env", "CartPole-v1", "--set", "agent.algo=ga", *sets, "--steps", "400"]
    assert main([*args, "--run-dir", str(run), "--quiet"]) == 0
    return run


def test_a_generation_no_search_has_does_not_resume(cli, ga_run, tmp_path, monkeypatch):
    """A GA checkpoint names its members by seeds: a few bytes each can ask for any number of
    parents to rebuild (each a whole network), or genomes longer than the search is old."""
    import psutil

    ck = load(newest(ga_run))
    ck.step = 500
    ck.learner["ga"]["members"][1] = [1, 2, 3]  # three seeds in generation 0
    run = with_newest(ga_run, tmp_path, ck.to_bytes())
    said = one_sentence(cli("train", "--env", "CartPole-v1", "--steps", "600", "--run-dir", run))
    assert "does not fit this run's learner (a genome that generation 0 cannot have)" in said

    ck.learner["ga"]["generation"] = 1
    members = [[seed, 7] for seed in range(2_000)]  # 2,000 parents of 18 KB each: 37 MB
    ck.learner["ga"]["members"] = [[], *members]
    ck.learner["ga"]["scores"] = [[] for _ in range(len(members) + 1)]
    shutil.rmtree(run)
    run = with_newest(ga_run, tmp_path, ck.to_bytes())
    memory = psutil.virtual_memory()._replace(available=16 * MIB)  # as the GA sees it
    monkeypatch.setattr("edgerl.learners.ga.psutil", SimpleNamespace(virtual_memory=lambda: memory))
    said = one_sentence(cli("train", "--env", "CartPole-v1", "--steps", "600", "--run-dir", run))
    assert "(2,000 parents and candidates to rebuild" in said and "GiB of memory is free" in said


def test_a_payload_of_more_entries_than_any_checkpoint_is_not_listed(tmp_path):
    """Each entry of a zip's directory costs tens of bytes in the file and hundreds once
    listed; a checkpoint has tens (its count is read from the zip64 record past 65,535)."""
    from edgerl.errors import CheckpointError

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for i in range(100_001):
            z.writestr(f"archive/{i}", b"")
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).digest()
    bad = tmp_path / "entries.ckpt"
    bad.write_bytes(HEADER.pack(MAGIC, CONTAINER_VERSION, 0, len(payload), digest) + payload)
    with pytest.raises(CheckpointError, match=r"its payload declares 100,001 entries, more than"):
        load(bad)
