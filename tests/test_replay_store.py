"""The replay saved with its checkpoints and restored on resume (replay_store.py, replay_save.py,
and the Trainer's resume in checkpointer.py).

Unit tests run the store against the reference model of test_replay.py; the end-to-end tests run
real CartPole and Pong processes, stop or kill them, and compare the resumed replay with the one a
run that was never interrupted had at the same step (the sync loop is deterministic per seed).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgerl.config import build_layers, resolve
from edgerl.files.checkpoint import list_checkpoints, load
from edgerl.memories.replay import ReplayBuffer
from edgerl.memories.replay.restore import TRAILER
from edgerl.memories.replay.sampling import VALID
from edgerl.memories.replay.store import ReplayFileError, ReplayStore
from edgerl.run.train import Trainer

from .conftest import PONG_FAST, edgerl_cmd, run_edgerl
from .damage import damaged_json
from .test_replay import SPEC, ReferenceEnvs, check_samples, fill

CARTPOLE = [
    "--env",
    "CartPole-v1",
    "--set",
    "env.num_envs=2",
    "--set",
    "agent.learning_starts=200",
    "--set",
    "agent.train_freq=4",
    "--set",
    "replay.capacity=600",
    "--set",
    "train.log_every_s=0.2",
    "--set",
    "train.checkpoint_every_s=1",
    "--set",
    "perf.pipeline=sync",
    "--set",
    "perf.compile=off",
    "--set",
    "agent.lr_end=-1",  # a schedule over train.steps would differ from the reference run's
]


def arrays(replay: ReplayBuffer) -> dict[str, np.ndarray]:
    """Everything that decides what the replay samples."""
    return {
        "items": replay.items.cpu().numpy().copy(),
        "actions": replay.actions.copy(),
        "rewards": replay.rewards.copy(),
        "flags": replay.flags.copy(),
        "head": replay.head.copy(),
        "count": replay.count.copy(),
        "written": replay.written.copy(),
        "valid": np.array(replay.valid),
    }


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def continue_episodes(buffer: ReplayBuffer, envs: ReferenceEnvs, steps: int) -> None:
    """More steps of the same episodes (no new add_first)."""
    for _ in range(steps):
        actions = envs.rng.integers(6, size=envs.n)
        rewards, term, trunc, obs, final = envs.step(actions, 0.15)
        buffer.add(actions, rewards, term, trunc, obs, final)


# ---------------------------------------------------------------------------------- the store


def test_incremental_saves_restore_exactly_after_the_ring_wrapped(tmp_path):
    envs = ReferenceEnvs(3, np.random.default_rng(1))
    buffer = ReplayBuffer(SPEC, 3 * 40, 3, "cpu", seed=1)
    store = ReplayStore(tmp_path, buffer)
    fill(buffer, envs, 25, 0.15)
    saves = []
    for steps in (0, 10, 30, 7, 55):  # the last one laps the whole ring
        continue_episodes(buffer, envs, steps)
        job = store.snapshot(step=len(saves))
        job.run()
        assert job.error is None
        store.commit(job)
        store.collect({s for s in range(len(saves) + 1)})
        saves.append((job, arrays(buffer)))
        continue_episodes(buffer, envs, 3)  # after the snapshot: not in it
    # Only what changed was written: the new slots and the one completed since, per env
    # (a step that ends an episode writes two slots: its last observation and the next first).
    first, second = saves[0][0], saves[1][0]
    assert first.result.slots == first.count.sum()  # everything at first
    assert second.result.slots == (second.written - first.written + 1).sum() < first.count.sum()
    for step, (job, want) in enumerate(saves):
        fresh = ReplayBuffer(SPEC, 3 * 40, 3, "cpu", seed=1)
        assert ReplayStore(tmp_path, fresh).restore(job.result.manifest) == int(want["valid"])
        assert_same(want, arrays(fresh))
        if step == len(saves) - 1:
            check_samples(fresh, envs, rounds=10)
    # Deltas no kept manifest needs are deleted.
    live = {d["file"] for d in saves[-1][0].chain}
    on_disk = {p.name for p in tmp_path.glob("delta-*")}
    assert live <= on_disk and len(on_disk) <= len(live) + 4


def test_a_kept_checkpoints_manifest_that_cannot_be_read_keeps_every_replay_file(tmp_path, caplog):
    """Cleanup reads each kept checkpoint's manifest to know its deltas; one it cannot read
    (damage, or an error that passes: EIO, too many open files) must not cost that checkpoint
    its replay: nothing is deleted that pass, and it is said."""
    buffer = ReplayBuffer(SPEC, 3 * 40, 3, "cpu", seed=1)
    fill(buffer, ReferenceEnvs(3, np.random.default_rng(1)), 25, 0.15)
    old = ReplayStore(tmp_path, buffer).snapshot(step=1)
    old.run()
    assert old.error is None
    (tmp_path / old.result.manifest).write_bytes(b'{"manifest": "{\\"delt')  # cut short
    deltas = {p.name for p in tmp_path.glob("delta-*")}
    ReplayStore(tmp_path, ReplayBuffer(SPEC, 3 * 40, 3, "cpu", seed=1)).collect({1})
    assert {p.name for p in tmp_path.glob("delta-*")} == deltas
    assert f"cannot read the replay manifest {old.result.manifest}" in caplog.text
    ReplayStore(tmp_path, buffer).collect(set())  # checkpoint 1 gone: its files may go
    assert not list(tmp_path.glob("delta-*")) and not list(tmp_path.glob("manifest-*"))


def test_resumed_episodes_never_pair_a_frame_from_before_the_restart(tmp_path):
    envs = ReferenceEnvs(2, np.random.default_rng(2))
    buffer = ReplayBuffer(SPEC, 200, 2, "cpu", seed=1)
    store = ReplayStore(tmp_path, buffer)
    fill(buffer, envs, 60, 0.05)
    in_flight = [frame_id_newest(s) for s in envs.stacks]
    job = store.snapshot(step=60)
    job.run()
    resumed = ReplayBuffer(SPEC, 200, 2, "cpu", seed=1)
    ReplayStore(tmp_path, resumed).restore(job.result.manifest)
    last = (resumed.head - 1) % resumed.slots  # the last observation before the restart
    # The restart: every environment starts a new episode.
    envs.stacks = [envs._new_episode(e) for e in range(2)]
    fill(resumed, envs, 40, 0.05)
    check_samples(resumed, envs, rounds=30)  # each sample is a transition that happened
    # The last observation before the restart starts no transition.
    for env in range(2):
        assert not resumed.flags[env, last[env]] & VALID
        assert in_flight[env] not in sampled_ids(resumed, 400)


def frame_id_newest(stack: list[np.ndarray]) -> int:
    f = stack[-1]
    return int(f[0, 0]) | (int(f[0, 1]) << 8)


def sampled_ids(buffer: ReplayBuffer, n: int) -> set[int]:
    batch = buffer.sample(n)
    return {int(o[-1, 0, 0]) | (int(o[-1, 0, 1]) << 8) for o in batch.obs.numpy()}


def test_a_damaged_or_missing_delta_leaves_an_empty_replay(tmp_path):
    envs = ReferenceEnvs(2, np.random.default_rng(3))
    buffer = ReplayBuffer(SPEC, 100, 2, "cpu", seed=1)
    store = ReplayStore(tmp_path, buffer)
    fill(buffer, envs, 30, 0.1)
    job = store.snapshot(step=30)
    job.run()
    (delta,) = tmp_path.glob("delta-*")
    data = bytearray(delta.read_bytes())
    data[len(data) // 3] ^= 0xFF
    delta.write_bytes(bytes(data))
    fresh = ReplayBuffer(SPEC, 100, 2, "cpu", seed=1)
    with pytest.raises(ReplayFileError, match=re.escape(f"replay file {delta} is damaged")):
        ReplayStore(tmp_path, fresh).restore(job.result.manifest)
    assert fresh.valid == 0 and not fresh.count.any() and not fresh.flags.any()
    delta.unlink()
    with pytest.raises(ReplayFileError, match=re.escape(f"replay file {delta} is missing")):
        ReplayStore(tmp_path, fresh).restore(job.result.manifest)
    other = ReplayBuffer(SPEC, 60, 2, "cpu", seed=1)  # replay.capacity changed
    job2 = ReplayStore(tmp_path / "b", buffer).snapshot(step=30)
    job2.run()
    with pytest.raises(ReplayFileError, match=r"replay\.capacity changed"):
        ReplayStore(tmp_path / "b", other).restore(job2.result.manifest)


def saved_pair(directory: Path) -> tuple[ReplayBuffer, str]:
    """A replay of 30 steps of 2 environments saved in ``directory``: (the replay, its
    manifest's name)."""
    envs = ReferenceEnvs(2, np.random.default_rng(3))
    buffer = ReplayBuffer(SPEC, 100, 2, "cpu", seed=1)
    fill(buffer, envs, 30, 0.1)
    job = ReplayStore(directory, buffer).snapshot(step=30)
    job.run()
    return buffer, job.result.manifest


def inner(path: Path) -> dict:
    return json.loads(json.loads(path.read_text())["manifest"])


def rewrite(path: Path, manifest: dict) -> None:
    """A manifest file whose SHA-256 matches what it now says (valid hash, wrong content)."""
    body = json.dumps(manifest, sort_keys=True, allow_nan=True)
    sha = hashlib.sha256(body.encode()).hexdigest()
    path.write_text(json.dumps({"sha256": sha, "manifest": body}))


def loads_or_text(data: bytes) -> object:
    """What JSON ``data`` holds, or the text itself where it is no JSON."""
    try:
        return json.loads(data)
    except ValueError:
        return data.decode(errors="replace")


def restores_or_says_why(directory: Path, name: str) -> str | None:
    """Restore into a fresh replay: None when it worked, else the ReplayFileError's sentence
    (after checking that the replay was left empty)."""
    fresh = ReplayBuffer(SPEC, 100, 2, "cpu", seed=1)
    try:
        ReplayStore(directory, fresh).restore(name)
    except ReplayFileError as e:
        assert fresh.valid == 0 and not fresh.count.any() and not fresh.flags.any()
        assert not fresh.written.any() and not fresh.items.any()
        return str(e)
    return None


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda m: m.pop("num_envs"), "is damaged (num_envs is None, not a whole number"),
        (lambda m: m.update(head=[str(h) for h in m["head"]]), "head[0] is '"),
        (lambda m: m["deltas"][0].pop("file"), "a delta names None"),
        (lambda m: m.update(head=[]), "head is not a list of 2 numbers"),
        (lambda m: m["deltas"][0].update(file="../../../etc/passwd"), "not a delta file"),
        (lambda m: m.update(written=[10**30, 1]), "written[0] is"),
        (lambda m: m.update(count=[m["count"][1], m["count"][0] + 1]), "positions disagree"),
        (lambda m: m.update(deltas=[]), "its deltas leave"),  # positions with nothing behind
    ],
)
def test_a_manifest_with_a_valid_hash_and_wrong_content_is_named(tmp_path, change, says):
    _, name = saved_pair(tmp_path)
    manifest = inner(tmp_path / name)
    change(manifest)
    rewrite(tmp_path / name, manifest)
    why = restores_or_says_why(tmp_path, name)
    assert why is not None and f"replay file {tmp_path / name}" in why and says in why, why


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_manifest_or_delta_index_restores_whole_or_leaves_the_replay_empty(
    tmp_path_factory, data
):
    directory = tmp_path_factory.mktemp("replay")
    _, name = saved_pair(directory)
    manifest = inner(directory / name)
    (delta_name,) = [d["file"] for d in manifest["deltas"]]
    if data.draw(st.booleans()):  # the manifest: one field, or one of the first delta's
        target = data.draw(st.sampled_from([manifest, manifest["deltas"][0]]))
        manifest_doc = loads_or_text(data.draw(damaged_json(target)))
        if target is manifest:
            manifest = manifest_doc
        else:
            manifest["deltas"][0] = manifest_doc
    else:  # the delta's index, with the delta's hash and size made to match again
        raw = (directory / delta_name).read_bytes()
        length, magic = TRAILER.unpack_from(raw, len(raw) - TRAILER.size)
        body = len(raw) - TRAILER.size - length
        index = json.loads(raw[body : len(raw) - TRAILER.size])
        part = data.draw(st.integers(0, len(index) - 1))
        index[part] = loads_or_text(data.draw(damaged_json(index[part])))
        tail = json.dumps(index, allow_nan=True).encode()
        raw = raw[:body] + tail + TRAILER.pack(len(tail), magic)
        (directory / delta_name).write_bytes(raw)
        delta = manifest["deltas"][0]
        delta.update(bytes=len(raw), sha256=hashlib.sha256(raw).hexdigest())
    rewrite(directory / name, manifest)
    why = restores_or_says_why(directory, name)
    if why is not None:
        assert why.startswith("replay file ") or why.startswith("the checkpoint names"), why


def test_a_whole_ring_save_survives_the_actor_writing_on_at_once(tmp_path):
    """When every slot changed since the last save, the slots the actor overwrites next are
    copied in the snapshot itself; the rest has a head start."""
    envs = ReferenceEnvs(2, np.random.default_rng(7))
    buffer = ReplayBuffer(SPEC, 2 * 300, 2, "cpu", seed=1)
    store = ReplayStore(tmp_path, buffer)
    fill(buffer, envs, 700, 0.1)  # wrapped twice over
    job = store.snapshot(step=700)
    want = arrays(buffer)
    continue_episodes(buffer, envs, 100)  # the actor goes on before the copy starts
    job.run()
    assert job.error is None
    fresh = ReplayBuffer(SPEC, 2 * 300, 2, "cpu", seed=1)
    ReplayStore(tmp_path, fresh).restore(job.result.manifest)
    assert_same(want, arrays(fresh))


def test_a_save_the_actor_laps_is_abandoned_not_written(tmp_path):
    envs = ReferenceEnvs(1, np.random.default_rng(4))
    buffer = ReplayBuffer(SPEC, 50, 1, "cpu", seed=1)
    store = ReplayStore(tmp_path, buffer)
    store.head_start = 0  # no frames copied in the snapshot: all left to the background copy
    fill(buffer, envs, 30, 0.0)
    job = store.snapshot(step=30)
    continue_episodes(buffer, envs, 50)  # the actor comes all the way round first
    job.run()
    assert job.error is not None and "came round" in job.error
    assert not list(tmp_path.glob("manifest-*")) and not list(tmp_path.glob(".*"))


# ---------------------------------------------------------------------------------- the trainer


def trainer_replay(args: list[str], run: Path, steps: int) -> dict[str, np.ndarray]:
    """The replay a Trainer for ``run`` starts with (a resume restores it), as arrays."""
    cfg = config([*pairs(args), f"train.run_dir={run}", f"train.steps={steps}"])
    with Trainer(cfg, quiet=True) as t:
        return arrays(t.memory)


def config(settings: list[str]):  # type: ignore[no-untyped-def]
    return resolve(build_layers(None, settings, use_system=False))


def pairs(args: list[str]) -> list[str]:
    """``--set k=v`` and ``--env ID`` as ``k=v`` settings."""
    out = []
    it = iter(args)
    for flag in it:
        value = next(it)
        out.append(value if flag == "--set" else f"env.id={value}")
    return out


def reference_replay(args: list[str], tmp: Path, steps: int) -> dict[str, np.ndarray]:
    """The replay of a run that went to ``steps`` without a stop (same seed, sync loop)."""
    cfg = config(
        [*pairs(args), f"train.run_dir={tmp}", f"train.steps={steps}", "replay.persist=false"]
    )
    with Trainer(cfg, quiet=True) as t:
        t.run()
        return arrays(t.memory)


def wait_for(predicate, timeout: float = 180) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def start(args: list[str], run: Path) -> subprocess.Popen[str]:
    cmd = edgerl_cmd("train", *args, "--steps", "10000000", "--run-dir", str(run))
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen[str], sig: int) -> str:
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_or_killed_run_resumes_with_the_replay_of_its_checkpoint(tmp_path, sig):
    run = tmp_path / "cartpole"
    proc = start(CARTPOLE, run)
    try:  # past learning_starts, with the ring wrapped and at least two checkpoints
        wait_for(lambda: len(list_checkpoints(run / "checkpoints")) >= 2)
        wait_for(lambda: list_checkpoints(run / "checkpoints")[-1].step > 900)
    finally:
        err = stop(proc, sig)
    if sig == signal.SIGTERM:
        assert proc.returncode != 0 and "Traceback" not in err, err
    newest = list_checkpoints(run / "checkpoints")[-1]
    state = load(newest.path)
    assert (run / "replay" / state.replay["manifest"]).is_file(), err

    restored = trainer_replay(CARTPOLE, run, newest.step + 200)
    want = reference_replay(CARTPOLE, tmp_path / "reference", newest.step)
    assert_same(want, restored)

    # Learning continues at once, at the replay ratio of a run that never stopped.
    r = run_edgerl("train", *CARTPOLE, "--steps", newest.step + 200, "--run-dir", run)
    assert r.returncode == 0, r.stderr
    assert f"resuming from step {newest.step:,}" in r.stderr and "with the replay" in r.stderr
    final = load(list_checkpoints(run / "checkpoints")[-1].path)
    assert final.step == newest.step + 200
    assert final.learner["updates"] == (newest.step + 200 - 200) // 4


def test_pong_resumes_with_its_frames(cli, tmp_path):
    run = tmp_path / "pong"
    args = [*PONG_FAST, "--set", "perf.pipeline=sync"]
    assert cli("train", *args, "--steps", "600", "--run-dir", run).code == 0
    restored = trainer_replay(args, run, 1000)
    want = reference_replay(args, tmp_path / "reference", 600)
    assert_same(want, restored)
    assert restored["items"].any()  # real frames, not zeros
    r = cli("train", *args, "--steps", "1000", "--run-dir", run)
    assert r.code == 0, r.err
    assert "with the replay of that checkpoint" in r.err
    state = load(list_checkpoints(run / "checkpoints")[-1].path)
    assert state.learner["updates"] == (1000 - 100) // 16  # no refill pause


def test_a_replay_save_killed_half_way_leaves_the_previous_pair(tmp_path):
    """Kill the trainer while a replay file is being written: the newest checkpoint is still
    the previous one, with its complete replay."""
    run = tmp_path / "pong"
    args = [
        *PONG_FAST,
        "--set",
        "replay.capacity=12000",
        "--set",
        "train.checkpoint_every_s=1",
        "--set",
        "perf.pipeline=sync",
    ]
    for _attempt in range(5):  # the kill must land inside a save; try again if it missed
        proc = start(args, run)
        try:
            wait_for(lambda: len(list_checkpoints(run / "checkpoints")) >= 1)
            wait_for(lambda: any(p.name.startswith(".") for p in (run / "replay").iterdir()))
        finally:
            proc.kill()
            proc.communicate(timeout=240)
        tmp_files = [p for p in (run / "replay").iterdir() if ".tmp-" in p.name]
        if tmp_files:
            break
    else:
        pytest.fail("never caught the trainer inside a replay save")
    newest = list_checkpoints(run / "checkpoints")[-1]
    restored = trainer_replay(args, run, newest.step + 100)
    assert restored["valid"] > 0
    assert_same(reference_replay(args, tmp_path / "reference", newest.step), restored)
    # The next run's first checkpoint clears what the killed save left.
    r = run_edgerl("train", *args, "--steps", newest.step + 100, "--run-dir", run)
    assert r.returncode == 0, r.stderr
    assert not [p for p in (run / "replay").iterdir() if ".tmp-" in p.name]


def test_a_damaged_replay_file_is_named_and_the_run_resumes_empty(cli, tmp_path):
    run = tmp_path / "cartpole"
    assert cli("train", *CARTPOLE, "--steps", "400", "--run-dir", run).code == 0
    state = load(list_checkpoints(run / "checkpoints")[-1].path)
    manifest = run / "replay" / state.replay["manifest"]
    manifest.write_text(manifest.read_text().replace('"step', '"stop', 1))
    r = cli("train", *CARTPOLE, "--steps", "800", "--run-dir", run)
    assert r.code == 0, r.err
    assert f"replay file {manifest} is damaged" in r.err
    assert "resuming with an empty replay" in r.err
    assert "Traceback" not in r.err
    final = load(list_checkpoints(run / "checkpoints")[-1].path)
    # The empty replay refilled for learning_starts steps before learning went on.
    assert final.learner["updates"] == state.learner["updates"] + (800 - 600) // 4


def test_a_manifest_that_lies_with_a_valid_hash_is_named_and_the_run_resumes_empty(cli, tmp_path):
    run = tmp_path / "cartpole"
    assert cli("train", *CARTPOLE, "--steps", "400", "--run-dir", run).code == 0
    state = load(list_checkpoints(run / "checkpoints")[-1].path)
    manifest = run / "replay" / state.replay["manifest"]
    lie = inner(manifest)
    del lie["num_envs"]
    rewrite(manifest, lie)
    r = cli("train", *CARTPOLE, "--steps", "600", "--run-dir", run)
    assert r.code == 0 and "internal error" not in r.err, r.err[-2000:]
    assert f"replay file {manifest} is damaged (num_envs is None" in r.err
    assert "resuming with an empty replay" in r.err


def test_a_new_replay_ratio_counts_from_the_resume(cli, tmp_path):
    run = tmp_path / "cartpole"
    assert cli("train", *CARTPOLE, "--steps", "400", "--run-dir", run).code == 0
    before = load(list_checkpoints(run / "checkpoints")[-1].path).learner["updates"]
    assert before == (400 - 200) // 4
    r = cli("train", *CARTPOLE, "--set", "agent.train_freq=8", "--steps", "800", "--run-dir", run)
    assert r.code == 0 and "with the replay of that checkpoint" in r.err
    after = load(list_checkpoints(run / "checkpoints")[-1].path).learner["updates"]
    assert after == before + (800 - 400) // 8


def test_persist_false_saves_no_replay_and_fresh_moves_it_aside(cli, tmp_path):
    run = tmp_path / "cartpole"
    off = [*CARTPOLE, "--set", "replay.persist=false"]
    assert cli("train", *off, "--steps", "300", "--run-dir", run).code == 0
    assert not (run / "replay").exists()
    assert load(list_checkpoints(run / "checkpoints")[-1].path).replay is None
    r = cli("train", *CARTPOLE, "--steps", "300", "--run-dir", run, "--fresh")
    assert r.code == 0, r.err
    assert list((run / "replay").glob("manifest-*"))
    assert cli("train", *CARTPOLE, "--steps", "300", "--run-dir", run, "--fresh").code == 0
    assert any(
        list((aside / "replay").glob("manifest-*")) for aside in tmp_path.glob("cartpole.old-*")
    )


def test_a_disk_too_small_for_the_replay_is_refused_with_a_sentence(cli, tmp_path, monkeypatch):
    import shutil

    real = shutil.disk_usage

    def small(path):  # type: ignore[no-untyped-def]
        u = real(path)
        return type(u)(u.total, u.total - 1000, 1000)

    monkeypatch.setattr("edgerl.memories.replay.store.shutil.disk_usage", small)
    r = cli(
        "train",
        *CARTPOLE,
        "--set",
        "replay.persist=true",
        "--steps",
        "10",
        "--run-dir",
        tmp_path / "r",
    )
    assert r.code == 2
    assert "replay.persist needs up to" in r.err and "set replay.persist=false" in r.err
    assert r.err.strip().count("\n") == 0
    # Not set explicitly: training goes on without saving the replay, and says so.
    r = cli("train", *CARTPOLE, "--steps", "10", "--run-dir", tmp_path / "r")
    assert r.code == 0 and "training without saving the replay" in r.err


def test_a_disk_that_fills_later_costs_that_replay_not_the_run(cli, tmp_path, monkeypatch):
    import errno

    import edgerl.memories.replay.store

    original = edgerl.memories.replay.store.write_atomic
    failures = [1]

    def write_atomic(path, data):  # type: ignore[no-untyped-def]
        if failures[0] > 0:
            failures[0] -= 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(path, data)

    monkeypatch.setattr(edgerl.memories.replay.store, "write_atomic", write_atomic)
    run = tmp_path / "cartpole"
    once = [*CARTPOLE, "--set", "train.checkpoint_every_s=100000"]  # the final save only
    r = cli("train", *once, "--steps", "600", "--run-dir", run)
    assert r.code == 0, r.err
    assert "cannot write replay file" in r.err and "(the disk is full)" in r.err
    assert not failures[0]
    assert list_checkpoints(run / "checkpoints")[-1].step == 600  # the checkpoint itself made it
    # Its resume says what is missing and starts empty; the next save writes the whole replay.
    r = cli("train", *once, "--steps", "800", "--run-dir", run)
    assert r.code == 0, r.err
    assert "is missing; resuming with an empty replay" in r.err
    assert trainer_replay(CARTPOLE, run, 1000)["valid"] > 0


GPU = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    ],
)


@pytest.mark.parametrize("device", ["cpu", GPU])
def test_a_replay_round_trips_by_the_background_copy(tmp_path, device):
    """The frames go by the background copy (on CUDA: its own stream, after the snapshot's
    event), not in the snapshot: with a head start as large as the ring, every frame would be
    copied in the snapshot and the background copy never run. The CPU run checks the test. The
    ring (80 slots) holds what the actor writes before the copy (at most 70) without lapping
    it."""
    envs = ReferenceEnvs(3, np.random.default_rng(6))
    buffer = ReplayBuffer(SPEC, 3 * 80, 3, device, seed=1)
    store = ReplayStore(tmp_path, buffer)
    store.head_start = 0  # as the CPU save tests: all frames left to the background copy
    fill(buffer, envs, 30, 0.15)
    job = store.snapshot(step=1)
    assert job.parts and all(part.early is None for part in job.parts)
    want_first = arrays(buffer)
    continue_episodes(buffer, envs, 5)  # queued on the GPU after the snapshot's event
    job.run()
    assert job.error is None
    assert (store._copy_stream is not None) == (device == "cuda")  # the GPU copy ran
    first = ReplayBuffer(SPEC, 3 * 80, 3, device, seed=1)
    ReplayStore(tmp_path, first).restore(job.result.manifest)
    assert_same(want_first, arrays(first))
    store.commit(job)
    continue_episodes(buffer, envs, 20)
    job = store.snapshot(step=2)
    want = arrays(buffer)
    job.run()
    fresh = ReplayBuffer(SPEC, 3 * 80, 3, device, seed=1)
    ReplayStore(tmp_path, fresh).restore(job.result.manifest)
    assert_same(want, arrays(fresh))
    assert os.path.exists(tmp_path / job.result.manifest)


def test_a_manifest_missing_one_delta_of_its_chain_is_named(tmp_path):
    envs = ReferenceEnvs(2, np.random.default_rng(4))
    buffer = ReplayBuffer(SPEC, 100, 2, "cpu", seed=1)  # as restores_or_says_why's
    store = ReplayStore(tmp_path, buffer)
    fill(buffer, envs, 25, 0.1)
    for steps in (0, 10):  # two saves: the second manifest names both deltas
        continue_episodes(buffer, envs, steps)
        job = store.snapshot(step=steps)
        job.run()
        store.commit(job)
    name = job.result.manifest
    manifest = inner(tmp_path / name)
    assert len(manifest["deltas"]) == 2
    assert restores_or_says_why(tmp_path, name) is None  # whole, it restores
    manifest["deltas"] = manifest["deltas"][1:]  # the first save's slots: named by nothing
    rewrite(tmp_path / name, manifest)
    why = restores_or_says_why(tmp_path, name)
    assert why is not None and "its deltas leave" in why and "unwritten" in why, why


def test_a_second_ctrl_c_during_the_last_replay_save_writes_no_checkpoint_naming_it(
    tmp_path, monkeypatch, caplog
):
    """Ctrl-C, then Ctrl-C again while the session's last replay save writes its files (issue
    59, item 5): the save is cut short before its manifest is on disk, so the checkpoint that
    would name it is not written (it used to be, and its resume found no manifest and refilled
    the replay); the log says so, and the run resumes from the checkpoint before."""
    import edgerl.memories.replay.store

    original = edgerl.memories.replay.store.write_atomic
    cut = []

    def write_atomic(path, data):  # type: ignore[no-untyped-def]
        if Path(path).name.startswith("manifest-") and not cut:
            cut.append(path)
            raise KeyboardInterrupt  # the second Ctrl-C, as the manifest is about to be written
        return original(path, data)

    run = tmp_path / "cartpole"
    settings = [*pairs(CARTPOLE), f"train.run_dir={run}", "train.checkpoint_every_s=100000"]
    with Trainer(config([*settings, "train.steps=200"]), quiet=True) as t:
        t.run()  # a checkpoint and its replay at step 200
    monkeypatch.setattr(edgerl.memories.replay.store, "write_atomic", write_atomic)
    with pytest.raises(KeyboardInterrupt), Trainer(config([*settings, "train.steps=300"])) as t:
        t.run()
    assert cut, "the final save wrote no manifest"
    assert [c.step for c in list_checkpoints(run / "checkpoints")] == [200]
    assert "the replay save of step 300 was cut short: its checkpoint is not written" in caplog.text
    monkeypatch.setattr(edgerl.memories.replay.store, "write_atomic", original)
    caplog.clear()
    with Trainer(config([*settings, "train.steps=400"]), quiet=True) as t:
        assert t.step == 200 and len(t.memory) == 200  # step 200's checkpoint, with its replay
        t.run()
    assert "missing" not in caplog.text
    assert list_checkpoints(run / "checkpoints")[-1].step == 400
