"""The best-evaluated policy (best.py) on real CartPole runs: kept by the evaluations beside the
checkpoints, taken by play and export unless --last, and kept over a resume."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from edgerl.files.checkpoint import load
from edgerl.policies.torch import TorchPolicy
from edgerl.report.best import BEST_NAME, best_evaluation, save_best

from .conftest import run_edgerl


@pytest.fixture(scope="module")
def best_run(tmp_path_factory) -> tuple[Path, str]:
    """A CartPole run of 3,000 steps evaluated every 1,000, and its log."""
    run = tmp_path_factory.mktemp("best") / "cartpole"
    r = run_edgerl(
        "train", "--env", "CartPole-v1", "--steps", "3000", "--run-dir", run, "--quiet",
        "--set", "eval.every_steps=1000", "--set", "eval.episodes=2",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return run, r.stderr


def eval_rows(run: Path) -> list[dict[str, str]]:
    with (run / "eval.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def copy_of(run: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "cartpole"
    shutil.copytree(run, dest)
    return dest


def test_the_best_evaluation_keeps_its_weights_beside_the_checkpoints(best_run):
    run, _ = best_run
    rows = eval_rows(run)
    assert rows, "no evaluation"
    top = max(float(r["return_mean"]) for r in rows)
    newest_top = [r for r in rows if float(r["return_mean"]) == top][-1]  # ties: the newer
    best = best_evaluation(run)
    assert best is not None
    assert best["step"] == int(newest_top["step"]) and best["return_mean"] == pytest.approx(top)
    assert best["episodes"] == 2
    path = run / "checkpoints" / BEST_NAME
    state = load(path)  # a checkpoint file: magic, length and SHA-256 checked
    assert state.best == best and state.is_snapshot
    policy = TorchPolicy.from_file(path)
    assert policy.step == best["step"] and policy.spec.id == "CartPole-v1"
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp left


def test_play_and_export_take_the_best_policy_unless_last(cli, best_run, tmp_path):
    run, _ = best_run
    best = best_evaluation(run)
    assert best is not None
    r = cli("play", "--run-dir", run, "--episodes", "1")
    assert r.code == 0, r.err
    assert f"playing the best-evaluated policy of {run}: best.ckpt, step {best['step']:,}" in r.err
    assert "--last takes the newest checkpoint (step 3,000)" in r.err
    r = cli("play", "--run-dir", run, "--episodes", "1", "--last")
    assert r.code == 0, r.err
    assert f"playing the newest checkpoint of {run}: ckpt-" in r.err and "(--last)" in r.err

    out = tmp_path / "export"
    r = cli("export", "--run-dir", run, "--onnx", "-o", out)
    assert r.code == 0, r.err
    assert f"exporting the best-evaluated policy of {run}" in r.err
    onnx = out / f"policy-CartPole-v1-step{best['step']}.onnx"
    sidecar = json.loads(onnx.with_name(onnx.name + ".json").read_text())
    assert sidecar["source_checkpoint"].endswith(f"checkpoints/{BEST_NAME}")
    r = cli("export", "--run-dir", run, "--onnx", "-o", out, "--last")
    assert r.code == 0, r.err
    assert (out / "policy-CartPole-v1-step3000.onnx").exists()

    r = cli("play", "--checkpoint", run / "checkpoints" / BEST_NAME, "--last")
    assert r.code == 2 and "--last picks a run's checkpoint" in r.err


def test_a_resume_keeps_a_better_best_of_an_earlier_session(cli, best_run, tmp_path):
    run = copy_of(best_run[0], tmp_path)
    path = run / "checkpoints" / BEST_NAME
    state = load(path)
    assert state.best is not None
    kept = {**state.best, "return_mean": 1e6}
    save_best(run, state, kept)
    r = cli(
        "train", "--run-dir", run, "--steps", "4000", "--quiet",
        "--set", "eval.every_steps=1000", "--set", "eval.episodes=2",
    )  # fmt: skip
    assert r.code == 0, r.err[-2000:]
    assert int(eval_rows(run)[-1]["step"]) == 4000  # it evaluated, and did worse than 1e6
    assert best_evaluation(run) == kept


def test_a_damaged_best_policy_is_named_and_the_newest_checkpoint_played(cli, best_run, tmp_path):
    run = copy_of(best_run[0], tmp_path)
    path = run / "checkpoints" / BEST_NAME
    path.write_bytes(path.read_bytes()[:1000])
    r = cli("play", "--run-dir", run, "--episodes", "1")
    assert r.code == 0, r.err
    assert f"checkpoint {path} is truncated" in r.err
    assert f"playing the newest checkpoint of {run}: ckpt-" in r.err


def test_training_says_when_it_keeps_a_best_policy(best_run):
    _, err = best_run
    assert "best policy so far: step " in err and f"checkpoints/{BEST_NAME}" in err
