"""Checkpoints of other payload formats: a real checkpoint of the previous format resumes, plays
and exports; an old payload's learner kind; a newer format is refused with a sentence."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path

import pytest
import torch

from edgerl.errors import CheckpointError
from edgerl.files.checkpoint import (
    CONTAINER_VERSION,
    HEADER,
    MAGIC,
    Checkpoint,
    list_checkpoints,
    load,
)
from edgerl.files.checkpoint_migrate import MIGRATIONS, PAYLOAD_VERSION, CheckpointTooNewError

from .conftest import run_edgerl

DATA = Path(__file__).parent / "data"
# CartPole-v1, DQN, step 600, 30 episodes, hidden (16, 16): written in payload format 1 (see
# tests/data/README.md); its replay files were not kept.
OLD = DATA / "ckpt-v1-cartpole-dqn.ckpt"
OLD_ARGS = ["--env", "CartPole-v1", "--set", "agent.hidden=[16,16]", "--quiet"]


def container(payload: dict) -> bytes:
    """A checkpoint file holding ``payload`` as it is (the container every format shares)."""
    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    digest = hashlib.sha256(data).digest()
    return HEADER.pack(MAGIC, CONTAINER_VERSION, 0, len(data), digest) + data


def old_payload(**changes: object) -> dict:
    """A payload of format 1, as edgerl wrote them before checkpoints were typed."""
    payload = {
        "step": 5,
        "env": {"id": "CartPole-v1", "kind": "vector"},
        "config": {"env": {"id": "CartPole-v1"}, "agent": {"algo": "dqn"}},
        "learner": {"q": {"w": torch.ones(2)}},
    }
    return {**payload, **changes}


def test_every_older_format_has_one_step_to_the_next():
    assert sorted(MIGRATIONS) == list(range(1, PAYLOAD_VERSION))


def test_the_old_checkpoint_reads_as_a_checkpoint_of_the_current_format():
    ck = load(OLD)
    assert ck.payload_version == PAYLOAD_VERSION and ck.kind == "dqn"
    assert (ck.step, ck.episodes, ck.env["id"]) == (600, 30, "CartPole-v1")
    assert set(ck.learner) == {"q", "target", "optimizer", "updates"}
    assert ck.rng is not None and not ck.is_snapshot and ck.replay is not None
    assert len(ck.recent_returns) == 30 and ck.edgerl_version == "0.1.0"


@pytest.mark.parametrize(
    ("config", "kind"),
    [
        ({"agent": {"algo": "pqn"}}, "pqn"),
        ({"agent": {"algo": "dqn"}}, "dqn"),
        ({"agent": {"lr": 0.001}}, "dqn"),  # before agent.algo existed: DQN
        ({}, "dqn"),
    ],
)
def test_an_old_payload_s_learner_kind_comes_from_its_config(config, kind):
    ck = Checkpoint.from_bytes(container(old_payload(config=config)), "old.ckpt")
    assert ck.kind == kind and ck.step == 5 and ck.is_snapshot


def test_the_old_checkpoint_resumes_from_its_step(cli, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    copy = run / "checkpoints" / "ckpt-000001-step0000000600.ckpt"
    shutil.copyfile(OLD, copy)
    old = load(copy)
    r = cli(
        "train", *OLD_ARGS, "--steps", "800", "--set", "agent.learning_starts=100", "--run-dir", run
    )
    assert r.code == 0, r.err
    assert "resuming from step 600 (30 episodes)" in r.err
    assert "replay file" in r.err and "resuming with an empty replay" in r.err
    newest = list_checkpoints(run / "checkpoints")[-1]
    assert (newest.seq, newest.step) == (2, 800)
    new = load(newest.path)
    assert new.kind == "dqn" and new.payload_version == PAYLOAD_VERSION
    assert new.episodes > old.episodes and new.wall_s > old.wall_s
    # learning went on after 100 steps refilled the replay, at one update per 2 steps
    assert new.learner["updates"] == old.learner["updates"] + (800 - 700) // 2
    assert copy.read_bytes() == OLD.read_bytes()  # an old file is read, never rewritten


def test_the_old_checkpoint_plays(cli):
    r = cli("play", "--checkpoint", OLD, "--episodes", "2", "--json")
    assert r.code == 0, r.err
    summary = json.loads(r.out)
    assert summary["env"] == "CartPole-v1" and len(summary["returns"]) == 2


def test_the_old_checkpoint_exports_to_onnx(cli, tmp_path):
    out = tmp_path / "policy.onnx"
    r = cli("export", "--checkpoint", OLD, "--onnx", "-o", out, "--json")
    assert r.code == 0, r.err
    sidecar = json.loads(out.with_name(out.name + ".json").read_text())
    assert sidecar["step"] == 600 and sidecar["env_id"] == "CartPole-v1"
    r = cli("play", "--model", out, "--episodes", "1", "--json")
    assert r.code == 0, r.err


def newer(tmp_path: Path) -> Path:
    """A run directory whose checkpoint was written in the payload format after this one."""
    ck = load(OLD)
    ck.payload_version = PAYLOAD_VERSION + 1
    ck.edgerl_version = "9.0.0"
    path = tmp_path / "run" / "checkpoints" / "ckpt-000001-step0000000600.ckpt"
    path.parent.mkdir(parents=True)
    path.write_bytes(ck.to_bytes())
    return path


def test_a_newer_format_is_refused_by_train_play_and_export(tmp_path):
    path = newer(tmp_path)
    data = path.read_bytes()
    sentence = (
        f"edgerl: error: checkpoint {path} was written by a newer edgerl (9.0.0) in payload "
        f"format {PAYLOAD_VERSION + 1}, and this edgerl"
    )
    for args in (
        ["train", *OLD_ARGS, "--steps", "800", "--run-dir", path.parents[1]],
        ["play", "--run-dir", path.parents[1], "--episodes", "1"],
        ["export", "--checkpoint", path, "--onnx", "-o", tmp_path / "p.onnx"],
    ):
        r = run_edgerl(*args, cwd=tmp_path)
        assert r.returncode == 2, (args, r.stderr)
        assert sentence in r.stderr and "; upgrade edgerl to use it" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert path.read_bytes() == data  # neither pruned nor replaced by an older one
    assert [c.path for c in list_checkpoints(path.parent)] == [path]


def test_a_newer_format_is_not_skipped_for_an_older_checkpoint(tmp_path):
    """A run directory whose newest checkpoint a newer edgerl wrote: resuming from the one before
    would go on from behind it, so the lookup refuses instead of falling back."""
    from edgerl.files.checkpoint import CheckpointStore

    path = newer(tmp_path)
    store = CheckpointStore(path.parent, keep=3)
    older = path.with_name("ckpt-000000-step0000000300.ckpt")
    shutil.copyfile(OLD, older)
    with pytest.raises(CheckpointTooNewError, match="upgrade edgerl"):
        store.newest_valid()


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"payload_version": "2"}, "has a damaged payload format number ('2')"),
        ({"payload_version": 0}, "has a damaged payload format number (0)"),
        ({"step": "5"}, "has a damaged 'step' (a str)"),
        ({"learner": {"target": {}}}, "lacks the policy network's weights"),
        ({"env": None}, "has a damaged 'env' (a NoneType)"),
    ],
)
def test_a_damaged_payload_is_named_in_one_sentence(payload, message):
    with pytest.raises(CheckpointError, match=r"^checkpoint x\.ckpt ") as e:
        Checkpoint.from_bytes(container(old_payload(**payload)), "x.ckpt")
    assert message in str(e.value) and "; was it written by edgerl?" in str(e.value)


def test_a_payload_without_a_required_field_is_named():
    payload = old_payload()
    del payload["learner"]
    with pytest.raises(CheckpointError, match=r"checkpoint x\.ckpt lacks its 'learner'"):
        Checkpoint.from_bytes(container(payload), "x.ckpt")
