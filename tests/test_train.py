"""`edgerl train` end to end on real Pong (train.py, checkpointer.py): metrics, checkpoints, resume,
signals, errors."""

from __future__ import annotations

import csv
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
import torch

from edgerl.files.checkpoint import list_checkpoints, load
from edgerl.report.rundir import RunDir

from .conftest import PONG_FAST, edgerl_cmd


def rows(run: Path) -> list[dict[str, str]]:
    with (run / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def test_pong_run_writes_metrics_checkpoint_config_and_resumes(cli, tmp_path):
    run = tmp_path / "pong"
    r = cli("train", *PONG_FAST, "--steps", "600", "--run-dir", run)
    assert r.code == 0, r.err
    assert "step 600/600" in r.err
    # a mistyped --run-dir starts a new run: said, not silent
    assert f"new run in {run} (no checkpoint there to resume)" in r.err
    # the replay filled first: the session's pace is the learning one, the filling's apart
    assert "steps/s learning (the replay filled at" in r.err

    first = rows(run)
    assert list(first[0]) == [
        "step",
        "wall_s",
        "sps",
        "episodes",
        "return_mean",
        "epsilon",
        "loss",
        "updates",
        "cpu_gpu_ratio",
        "cpu_max_core",
        "gr3d",
        "energy_j",
    ]
    assert first[-1]["energy_j"] == ""  # no power source on this machine: nothing claimed
    assert int(first[-1]["step"]) == 600
    assert int(first[-1]["updates"]) == (600 - 100) // 16
    assert float(first[-1]["loss"]) >= 0
    config = (run / "config.toml").read_text()
    assert 'id = "ALE/Pong-v5"' in config and "batch_size = 8" in config
    (ck,) = list_checkpoints(run / "checkpoints")
    state = load(ck.path)
    assert state.step == 600 and state.env["id"] == "ALE/Pong-v5" and state.kind == "dqn"
    assert set(state.learner) == {"q", "target", "optimizer", "updates"}
    assert state.rng is not None and set(state.rng) == {"actor", "replay", "torch", "cuda"}

    r = cli("train", *PONG_FAST, "--steps", "1000", "--run-dir", run)
    assert r.code == 0, r.err
    assert "resuming from step 600" in r.err and "new run" not in r.err
    second = rows(run)
    assert len(second) > len(first) and int(second[-1]["step"]) == 1000
    steps = [int(row["step"]) for row in second[len(first) :]]
    assert min(steps) > 600
    newest = list_checkpoints(run / "checkpoints")[-1]
    state2 = load(newest.path)
    assert state2.step == 1000 and newest.seq == 2
    # the replay was restored: learning went on at once, at 1 per 16 as if it had never stopped
    assert "with the replay of that checkpoint" in r.err
    assert state2.learner["updates"] == (1000 - 100) // 16
    assert not torch.equal(
        state2.learner["q"]["head.2.weight"], state.learner["q"]["head.2.weight"]
    )

    # Run again (`make run` twice): what to do instead, and no sentence about this session's
    # learning or load, since it made none.
    r = cli("train", *PONG_FAST, "--steps", "1000", "--run-dir", run)
    assert r.code == 0 and "is already at step 1,000 of 1,000: nothing to do" in r.err
    assert "--steps 2,000" in r.err and "--fresh" in r.err
    assert "building " not in r.err  # no environments built for nothing (seconds for Pong)
    for unsaid in ("learning continues at once", "too few load samples", "steps/s"):
        assert unsaid not in r.err, r.err


def test_ctrl_c_writes_a_checkpoint_and_the_next_run_resumes(tmp_path):
    run = tmp_path / "pong"
    args = ["train", *PONG_FAST, "--steps", "10000000", "--run-dir", str(run)]
    proc = subprocess.Popen(
        edgerl_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 600  # generous: a loaded machine takes long to start Pong
    while time.monotonic() < deadline:
        if (run / "metrics.csv").exists() and len(rows(run)) >= 2:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err
    assert "stopped by SIGINT; run the same command to resume" in err
    (ck,) = list_checkpoints(run / "checkpoints")
    assert ck.step > 0
    assert not RunDir(run)._check_not_in_use()  # lock released


def test_fresh_moves_the_old_run_aside(cli, tmp_path):
    run = tmp_path / "pong"
    assert cli("train", *PONG_FAST, "--steps", "200", "--run-dir", run).code == 0
    r = cli("train", *PONG_FAST, "--steps", "200", "--run-dir", run, "--fresh")
    assert r.code == 0, r.err
    (aside,) = tmp_path.glob("pong.old-*")
    assert list_checkpoints(aside / "checkpoints")[0].step == 200
    assert "resuming" not in r.err


def test_fresh_without_env_takes_the_runs_game_and_never_says_it_resumes(cli, tmp_path):
    run = tmp_path / "cp"
    assert cli("train", "--env", "CartPole-v1", "--steps", "200", "--run-dir", run).code == 0
    r = cli("train", "--steps", "200", "--run-dir", run, "--fresh")
    assert r.code == 0, r.err[-2000:]
    assert "resuming" not in r.err and "moved the previous run to" in r.err
    assert f"the game of the run in {run}: CartPole-v1" in r.err


def test_a_run_resumes_with_its_own_recipe_from_its_run_directory_alone(cli, tmp_path):
    """A run trained with settings of its own (PQN here, as --preset atari-cpu makes one)
    resumes with --run-dir alone, or with its game named, as it was trained: the defaults
    (DQN) do not stand in for them. What the command line sets still wins; --fresh starts over
    from the defaults."""
    run = tmp_path / "cp"
    first = ["--env", "CartPole-v1", "--set", "agent.algo=pqn", "--set", "pqn.epochs=3"]
    assert cli("train", *first, "--steps", "1024", "--run-dir", run, "--quiet").code == 0
    r = cli("train", "--run-dir", run, "--steps", "2048", "--quiet")
    assert r.code == 0, r.err[-2000:]
    assert "keeps its own settings (agent.algo=pqn, from its config.toml) for every key" in r.err
    assert "resuming from step 1,024" in r.err
    saved = (run / "config.toml").read_text()
    assert 'algo = "pqn"' in saved and "epochs = 3" in saved
    r = cli("train", "--env", "CartPole-v1", "--run-dir", run, "--steps", "3072", "--quiet")
    assert r.code == 0 and "resuming from step 2,048" in r.err, r.err[-2000:]
    r = cli("train", "--run-dir", run, "--steps", "4096", "--set", "pqn.epochs=1", "--quiet")
    assert r.code == 0 and "epochs = 1" in (run / "config.toml").read_text()
    r = cli("train", "--env", "CartPole-v1", "--run-dir", run, "--steps", "300", "--fresh")
    assert r.code == 0 and 'algo = "dqn"' in (run / "config.toml").read_text()


def test_a_resume_from_before_learning_started_says_when_learning_starts(cli, tmp_path):
    """CartPole's preset starts learning at step 1,000: a checkpoint at 300 resumes with its
    replay, and learning still waits for step 1,000 (the progress bar says "filling replay")."""
    args = ["train", "--env", "CartPole-v1", "--run-dir", tmp_path / "cp", "--quiet"]
    assert cli(*args, "--steps", "300").code == 0
    r = cli(*args, "--steps", "600")
    assert r.code == 0, r.err
    assert (
        "with the replay of that checkpoint (300 transitions); learning starts at step 1,000 "
        in r.err
    )
    assert "learning continues at once" not in r.err


def test_a_corrupt_newest_checkpoint_is_named_and_the_previous_one_used(cli, tmp_path):
    run = tmp_path / "pong"
    assert cli("train", *PONG_FAST, "--steps", "200", "--run-dir", run).code == 0
    assert cli("train", *PONG_FAST, "--steps", "400", "--run-dir", run).code == 0
    newest = list_checkpoints(run / "checkpoints")[-1]
    newest.path.write_bytes(newest.path.read_bytes()[:1000])
    r = cli("train", *PONG_FAST, "--steps", "500", "--run-dir", run)
    assert r.code == 0
    assert f"checkpoint {newest.path} is truncated" in r.err
    assert "resuming from step 200" in r.err
    assert newest.path.exists()


def test_a_run_directory_of_another_game_is_refused(cli, tmp_path):
    run = tmp_path / "run"
    assert cli("train", *PONG_FAST, "--steps", "100", "--run-dir", run).code == 0
    r = cli("train", "--env", "CartPole-v1", "--steps", "100", "--run-dir", run)
    assert r.code == 2
    assert "holds a run with env.id='ALE/Pong-v5'" in r.err and "--fresh" in r.err


def test_a_run_directory_in_use_is_refused(cli, tmp_path):
    run = tmp_path / "busy"
    holder = RunDir(run)
    holder.open()
    try:
        r = cli("train", *PONG_FAST, "--steps", "100", "--run-dir", run)
    finally:
        holder.close()
    assert r.code == 2
    assert "is in use by another edgerl process" in r.err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--run-dir", "/proc/edgerl-test-run"],
            "run directory /proc/edgerl-test-run is not writable (No such file or directory): "
            "give a directory on a disk of yours with --run-dir",  # not 'fix its owner and mode'
        ),
        (
            ["--env", "ALE/Pongg-v5"],
            "unknown environment id 'ALE/Pongg-v5'; did you mean 'ALE/Pong-v5'",
        ),
        (["--env", "Pendulum-v1", "--set", "agent.algo=dqn"], "continuous action space"),
        (["--set", "replay.capacity=100000000000"], "set replay.capacity to at most"),
        (["--config", "missing.toml"], "config file missing.toml does not exist"),
        # issue 58: an empty --run-dir trained into the current directory, a name that is not
        # UTF-8 was an internal error, and --env won over --set env.id without a word
        (["--run-dir", ""], "'--run-dir': is empty: give a directory"),
        (["--run-dir", "/tmp/edgerl-\udcff"], "has a name that is not UTF-8 text"),
        (["--env", "CartPole-v1", "--set", "env.id=ALE/Pong-v5"], "disagree: give it once"),
    ],
)
def test_user_errors_exit_2_with_one_sentence(cli, args, message):
    r = cli("train", "--steps", "10", *args)
    assert r.code == 2, r.err
    assert message in r.err
    assert "Traceback" not in r.err
    assert r.err.strip().count("\n") == 0  # one line


def test_file_in_the_way_of_the_run_directory(cli, tmp_path):
    (tmp_path / "afile").write_text("x")
    r = cli("train", *PONG_FAST, "--steps", "10", "--run-dir", tmp_path / "afile" / "run")
    assert r.code == 2 and "is not writable (a part of its path is a file)" in r.err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present")
def test_cuda_without_a_gpu_is_refused(cli):
    r = cli("train", "--steps", "10", "--set", "perf.device=cuda")
    assert r.code == 2
    assert "perf.device=cuda but no usable CUDA GPU was found" in r.err


@pytest.mark.skipif(os.geteuid() != 0, reason="sharing a run with a group needs root")
def test_a_root_run_is_shared_with_the_display_group(tmp_path):
    import grp
    import stat

    gid = grp.getgrnam("daemon").gr_gid  # a group every Debian/Ubuntu (L4T) system has
    before = tmp_path.stat()
    holder = RunDir(tmp_path / "runs" / "pong")
    holder.open(group="daemon")
    holder.close()
    for path in (
        tmp_path / "runs",
        tmp_path / "runs" / "pong",
        tmp_path / "runs" / "pong" / "checkpoints",
    ):
        st = path.stat()
        assert st.st_gid == gid and st.st_mode & stat.S_ISGID and st.st_mode & stat.S_IRGRP
    after = tmp_path.stat()  # a parent that existed before is left alone
    assert (after.st_gid, after.st_mode) == (before.st_gid, before.st_mode)


def test_ale_async_batches_train_and_store_every_environment(tmp_path):
    """env.batch_size below env.num_envs: the loop acts on whichever environments finish first;
    every environment's ring fills, each stored transition is a real one (its next observation
    is its observation one frame on), and the steps count env steps, not rows."""
    from edgerl.run.train import Trainer

    from .helpers import pong_config

    cfg = pong_config(tmp_path, "env.num_envs=4", "env.batch_size=2", steps=800)
    with Trainer(cfg, quiet=True) as trainer:
        result = trainer.run()
        replay = trainer.memory
        assert result.step >= 800 and trainer.learner.updates == (result.step - 400) // 4
        # Every environment stepped, not just the first two. Which ones finish first is the
        # machine's timing (on a loaded CI machine one got 100 of 804 rows), so the bar is a fifth
        # of a fair share: a loop that stepped only the first batch leaves the others at 1 row.
        assert replay.written.min() > replay.written.sum() / 4 / 5
        assert abs(int(replay.written.sum()) - result.step - 4) <= 2 * result.episodes + 4
        batch = replay.sample(64)
        assert torch.equal(batch.obs[:, 1:], batch.next_obs[:, :-1])


def test_env_batch_size_is_refused_where_it_cannot_work(cli, tmp_path):
    r = cli(
        "train",
        "--env",
        "CartPole-v1",
        "--set",
        "env.num_envs=4",
        "--set",
        "env.batch_size=2",
        "--run-dir",
        tmp_path / "r",
    )
    assert r.code == 2 and "env.batch_size (ALE's async mode) is for Atari ids" in r.err
    r = cli(
        "train", "--set", "env.num_envs=4", "--set", "env.batch_size=4", "--run-dir", tmp_path / "p"
    )
    assert r.code == 2 and "env.batch_size (4) must be below env.num_envs (4)" in r.err


@pytest.mark.parametrize(
    ("sets", "device", "batch"),
    [
        ([], "cuda", 4),  # DQN on a GPU, 8 environments: half of them at a time
        ([], "cpu", 0),  # on a CPU the update is the limit: lockstep, a run repeats exactly
        (["env.batch_size=0"], "cuda", 0),  # lockstep asked for: kept
        (["env.batch_size=3"], "cpu", 3),  # a number given: kept
        (["agent.algo=pqn"], "cuda", 0),  # a rollout steps every environment together
        (["env.num_envs=4"], "cuda", 0),  # too few environments to split
        (["env.id=CartPole-v1"], "cuda", 0),  # ALE's async mode is Atari's
    ],
)
def test_env_batch_size_auto_is_ales_async_mode_only_where_acting_limits(sets, device, batch):
    import torch

    from edgerl.config import build_layers, resolve
    from edgerl.config.presets import apply_presets
    from edgerl.envs import probe
    from edgerl.learners.factory import resolve_env_batch

    cfg = resolve(build_layers(None, ["env.num_envs=8", *sets], use_system=False))
    assert resolve(build_layers(None, [], use_system=False)).env.batch_size == -1  # the default
    spec = probe(cfg.env.id)
    cfg = apply_presets(cfg, spec.kind)
    if "agent.algo=pqn" in sets:
        cfg.env.num_envs = 8  # over PQN's preset of 128: the rule, not the count, says no
    assert resolve_env_batch(cfg, spec, torch.device(device)) == batch


def test_a_run_saves_the_env_batch_size_it_resolved_and_evaluates_in_lockstep(tmp_path):
    """The default (auto) trains Pong on a CPU in lockstep and says so in config.toml; a policy
    trained with ALE's async mode still plays every evaluation environment each step."""
    from edgerl.play.loop import _env_config
    from edgerl.run.train import Trainer

    from .helpers import pong_config

    cfg = pong_config(tmp_path, "env.num_envs=2", steps=40)
    with Trainer(cfg, quiet=True) as trainer:
        trainer.run()
    assert "batch_size = 0" in (tmp_path / "run" / "config.toml").read_text()

    from types import SimpleNamespace

    trained = SimpleNamespace(env_config={"id": "ALE/Pong-v5", "num_envs": 8, "batch_size": 4})
    assert _env_config(trained, None).batch_size == 0  # what _env_config reads of a policy


def test_a_directory_that_holds_no_run_is_refused_and_left_as_it_was(cli, tmp_path):
    """`edgerl train --run-dir /tmp` (or a home folder, or /etc through a link): its mode is
    not changed, nothing in it is cleaned, and the run does not start (issue 58). An empty
    directory is taken without changing its mode."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)
    stale = shared / ".notes.txt.tmp-999999"  # named like a killed writer's temporary file
    stale.write_text("someone's notes")
    args = ["--env", "CartPole-v1", "--steps", "200", "--quiet"]
    r = cli("train", *args, "--run-dir", shared)
    assert r.code == 2 and "holds 1 entry but no edgerl run" in r.err and "Traceback" not in r.err
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777 and stale.exists()
    link = tmp_path / "link"
    link.symlink_to(shared)
    assert cli("train", *args, "--run-dir", link).code == 2
    r = cli("train", *args, "--run-dir", shared, "--fresh")  # never moved aside either
    assert r.code == 2 and "but no edgerl run" in r.err and stale.exists()
    assert not list(tmp_path.glob("shared.old-*"))
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o755)
    empty.chmod(0o755)
    r = cli("train", *args, "--run-dir", empty)
    assert r.code == 0, r.err[-2000:]
    assert stat.S_IMODE(empty.stat().st_mode) == 0o755 and (empty / "config.toml").exists()
    assert cli("train", *args[:-1], "--steps", "300", "--run-dir", empty).code == 0  # resumes


def test_a_run_that_ended_names_no_trainer_even_while_its_process_lives(cli, tmp_path, monkeypatch):
    """The lock file of a run that ended holds no pid: the process that trained may live on (a
    test, a notebook, a service between runs), and a viewer that reads the lock file without
    taking the lock must not wait for it as for a trainer (a fresh clone in a folder named
    edgerl made this test process look like one, and `view --timeout 1` waited for ever)."""
    from edgerl.report import rundir

    run = tmp_path / "cp"
    assert cli("train", "--env", "CartPole-v1", "--steps", "200", "--run-dir", run).code == 0
    monkeypatch.setattr(rundir, "pid_alive", lambda pid: True)  # this process: alive, edgerl
    assert rundir.trainer_of(run) is None
