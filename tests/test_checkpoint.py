"""Checkpoints: the typed record and its formats, atomic writes, keep-last-K, corrupt and
truncated files, failed writes."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from dataclasses import fields

import pytest
import torch

from edgerl.errors import CheckpointError
from edgerl.files.checkpoint import (
    HEADER,
    Checkpoint,
    CheckpointStore,
    CheckpointWriteError,
    list_checkpoints,
    load,
)
from edgerl.files.checkpoint_migrate import PAYLOAD_VERSION


def state(step: int) -> Checkpoint:
    torch.manual_seed(step)
    return Checkpoint(
        kind="dqn",
        step=step,
        env={"id": "CartPole-v1", "kind": "vector"},
        config={"agent": {"algo": "dqn"}},
        learner={"q": {"w": torch.randn(64, 64)}, "nested": {"ints": [1, 2, 3]}},
        rng={"torch": torch.get_rng_state()},
    )


def test_round_trip(tmp_path):
    store = CheckpointStore(tmp_path / "ck", keep=3)
    path = store.save(state(7))
    assert path.name == "ckpt-000001-step0000000007.ckpt"
    got = load(path)
    assert got.step == 7 and got.learner["nested"] == {"ints": [1, 2, 3]}
    assert torch.equal(got.learner["q"]["w"], state(7).learner["q"]["w"])
    assert [p.name for p in (tmp_path / "ck").iterdir()] == [path.name]  # no temp file left


def test_keeps_the_newest_k(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for step in (10, 20, 30, 40):
        store.save(state(step))
    assert [c.step for c in list_checkpoints(tmp_path)] == [30, 40]
    found = store.newest_valid()
    assert found is not None and found[0].step == 40 and found[1].step == 40


def test_every_field_comes_back_as_it_was_written():
    ck = state(7)
    ck.episodes, ck.wall_s, ck.recent_returns = 3, 12.5, [1.0, 2.5]
    ck.replay = {"manifest": "manifest-step0000000007-ab.json", "learn_from": [4, 0]}
    ck.best = {"step": 7, "return_mean": 9.5}
    ck.saved_at = "2026-01-02T03:04:05+0000"
    got = Checkpoint.from_bytes(ck.to_bytes(), "x.ckpt")
    assert got.payload_version == PAYLOAD_VERSION and not got.is_snapshot
    for f in fields(Checkpoint):
        if f.name not in ("learner", "rng"):
            assert getattr(got, f.name) == getattr(ck, f.name), f.name
    assert torch.equal(got.learner["q"]["w"], ck.learner["q"]["w"])
    assert got.rng is not None and torch.equal(got.rng["torch"], ck.rng["torch"])


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        ({"step": 10**30}, "a step of"),  # the run would have nothing left to do, forever
        ({"step": -5}, "a step of -5"),
        ({"episodes": -1}, "an episode count of -1"),
        ({"wall_s": float("nan")}, "a training time of nan"),
        ({"recent_returns": [float("nan"), "a", None]}, "damaged recent returns"),
    ],
)
def test_counts_no_run_has_are_refused_as_damage(damage, says):
    """A checkpoint with a valid checksum and absurd counts (issue 58): one sentence, not an
    internal error, and never a run stuck at step 10**30."""
    ck = state(7)
    for key, value in damage.items():
        setattr(ck, key, value)
    with pytest.raises(CheckpointError, match=says):
        Checkpoint.from_bytes(ck.to_bytes(), "x.ckpt")


def test_a_pqn_run_s_checkpoint_says_pqn_and_plays_and_resumes(cli, tmp_path):
    run = tmp_path / "pqn"
    args = ["train", "--env", "CartPole-v1", "--set", "agent.algo=pqn", "--run-dir", run]
    args += ["--set", "agent.hidden=[16,16]", "--quiet"]
    assert cli(*args, "--steps", "500").code == 0
    (first,) = list_checkpoints(run / "checkpoints")
    ck = load(first.path)
    assert ck.kind == "pqn" and ck.config["agent"]["algo"] == "pqn" and not ck.is_snapshot
    assert "target" not in ck.learner  # PQN has no target network
    again = Checkpoint.from_bytes(ck.to_bytes(), "again")
    assert again.kind == "pqn" and set(again.learner) == set(ck.learner)
    r = cli("play", "--checkpoint", first.path, "--episodes", "1", "--json")
    assert r.code == 0, r.err  # PQN's network (with LayerNorm) is rebuilt from the kind
    assert json.loads(r.out)["env"] == "CartPole-v1"
    r = cli(*args, "--steps", "1000")
    assert r.code == 0, r.err
    assert f"resuming from step {first.step:,}" in r.err
    assert load(list_checkpoints(run / "checkpoints")[-1].path).kind == "pqn"
    # Asked for another learner, the run is refused (without one named, it keeps its own)
    r = cli("train", "--env", "CartPole-v1", "--run-dir", run, "--set", "agent.algo=dqn")
    assert r.code == 2 and "holds a run with agent.algo='pqn'" in r.err


def test_a_policy_snapshot_does_not_resume(cli, tmp_path):
    snapshot = state(5)
    snapshot.rng = None  # weights only, as evaluations and best.ckpt hold them
    path = CheckpointStore(tmp_path / "run" / "checkpoints", keep=3).save(snapshot)
    r = cli("train", "--env", "CartPole-v1", "--run-dir", tmp_path / "run", "--steps", "10")
    assert r.code == 2
    assert f"checkpoint {path} is a policy snapshot (weights only) and cannot resume" in r.err


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage"])
def test_a_corrupt_newest_is_reported_kept_and_skipped(tmp_path, caplog, damage):
    store = CheckpointStore(tmp_path, keep=5)
    store.save(state(1))
    newest = store.save(state(2))
    data = bytearray(newest.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[HEADER.size + 100] ^= 0xFF
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(b"not a checkpoint" * 10)
    newest.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        found = store.newest_valid()
    assert found is not None and found[1].step == 1
    assert newest.name in caplog.text
    assert newest.exists()  # left in place for inspection
    with pytest.raises(CheckpointError, match=newest.name):
        load(newest)


def test_no_valid_checkpoint_refuses(tmp_path):
    store = CheckpointStore(tmp_path, keep=5)
    p = store.save(state(1))
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=r"no valid checkpoint .* use --fresh"):
        store.newest_valid()


def test_pruning_never_deletes_a_file_that_fails_its_check(tmp_path):
    store = CheckpointStore(tmp_path, keep=1)
    bad = store.save(state(1))
    bad.write_bytes(bad.read_bytes()[:-1])
    store.save(state(2))
    store.save(state(3))
    assert bad.exists()
    assert [c.step for c in list_checkpoints(tmp_path)] == [1, 3]


def test_sequence_continues_after_resuming_from_an_older_step(tmp_path):
    store = CheckpointStore(tmp_path, keep=5)
    store.save(state(100))
    store.save(state(50))  # e.g. resumed from an older checkpoint
    assert store.newest_valid()[0].step == 50


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load(tmp_path / "nope.ckpt")
    with pytest.raises(CheckpointError, match="is a directory"):
        load(tmp_path)


def test_failed_write_leaves_the_previous_checkpoint_valid(tmp_path):
    """A real failed write (file-size limit, like a full disk): no temp file, old one intact."""
    script = textwrap.dedent(f"""
        import resource, signal, torch
        from edgerl.files.checkpoint import Checkpoint, CheckpointStore, CheckpointWriteError
        store = CheckpointStore(__import__("pathlib").Path({str(tmp_path)!r}), keep=3)
        def weights(n, step):
            return Checkpoint("dqn", step, {{}}, {{}}, {{"q": {{"w": torch.zeros(n)}}}})
        store.save(weights(10, 1))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            store.save(weights(100_000, 2))
        except CheckpointWriteError as e:
            print("FAILED:", e)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "FAILED: cannot write checkpoint" in out.stdout, out.stderr
    assert "ckpt-000001-step0000000001.ckpt is still the newest" in out.stdout
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["ckpt-000001-step0000000001.ckpt"]
    assert load(tmp_path / files[0]).learner["q"]["w"].shape == (10,)


def test_write_error_reports_disk_full():
    import errno

    assert CheckpointWriteError("x", errno.ENOSPC).disk_full
    assert not CheckpointWriteError("x", errno.EACCES).disk_full


def test_weights_or_a_game_no_network_can_have_are_one_sentence(cli, tmp_path):
    """A valid checksum over a game of 10^6 x 10^6 observations, a weight of another shape
    (the policy's or the target's): play and resume say which file and what, in one sentence
    (issue 58; they were internal errors, the first after building a 1 GB layer)."""
    run = tmp_path / "run"
    r = cli("train", "--env", "CartPole-v1", "--steps", "300", "--run-dir", run, "--quiet")
    assert r.code == 0, r.err
    (good,) = list_checkpoints(run / "checkpoints")
    ck = load(good.path)

    def damaged(name: str, change) -> object:  # type: ignore[no-untyped-def]
        bad = load(good.path)
        change(bad)
        return CheckpointStore(tmp_path / name, keep=1).save(bad)

    huge = damaged("huge", lambda c: c.env.update(obs_shape=[10**6, 10**6]))
    r = cli("play", "--checkpoint", huge)
    assert r.code == 2 and "has a damaged game description (observations of shape" in r.err

    first = next(iter(ck.learner["q"]))
    shape = list(ck.learner["q"][first].shape)
    policy = damaged("policy", lambda c: c.learner["q"].update({first: torch.zeros(3, 3)}))
    r = cli("play", "--checkpoint", policy)
    assert r.code == 2 and r.err.count("\n") == 1 and "Traceback" not in r.err
    assert f"policy network does not fit its own settings (weight '{first}' has shape " in r.err
    assert f"[3, 3], not {shape})" in r.err

    target = damaged("target", lambda c: c.learner["target"].update({first: torch.zeros(3, 3)}))
    for bad, says in ((policy, f"weight '{first}' has shape [3, 3]"), (target, "size mismatch")):
        newest = run / "checkpoints" / "ckpt-000009-step0000000400.ckpt"
        newest.write_bytes(bad.read_bytes())
        r = cli("train", "--env", "CartPole-v1", "--steps", "500", "--run-dir", run, "--quiet")
        assert r.code == 2 and f"checkpoint {newest} does not fit this run's learner (" in r.err
        assert says in r.err and "Move it aside to resume from the one before" in r.err
        assert newest.exists()  # reported, not deleted


def test_a_ctrl_c_that_cut_training_short_names_the_checkpoint_this_session_wrote(
    tmp_path, monkeypatch
):
    """A second Ctrl-C during the last save said "without writing a checkpoint" after one was
    written (issue 59): the sentence names the newest this process wrote, or says there is
    none."""
    from edgerl.cli.app import interrupted
    from edgerl.files import checkpoint

    monkeypatch.setattr(checkpoint, "WRITTEN", [])
    assert "before this session wrote a checkpoint" in interrupted(["train"])
    path = CheckpointStore(tmp_path, keep=2).save(state(3))
    said = interrupted(["--debug", "train", "--env", "CartPole-v1"])
    assert said.startswith("interrupted: stopped at once; this session's newest checkpoint is ")
    assert f" is {path} (the run resumes from it" in said
    assert interrupted(["play"]) == "interrupted"  # nothing of a run to name
