"""`edgerl play` with the torch backend: JSON summary, determinism, errors."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edgerl.play import Observer

from .conftest import PONG_FAST, edgerl_cmd


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    from edgerl.cli import main

    run = tmp_path_factory.mktemp("play") / "cartpole"
    assert (
        main(["train", "--env", "CartPole-v1", "--steps", "3000", "--run-dir", str(run), "--quiet"])
        == 0
    )
    return run


@pytest.fixture(scope="module")
def pong_run(tmp_path_factory):
    from edgerl.cli import main

    run = tmp_path_factory.mktemp("play") / "pong"
    assert main(["train", *PONG_FAST, "--steps", "300", "--run-dir", str(run), "--quiet"]) == 0
    return run


def test_json_summary(cli, cartpole_run):
    r = cli("play", "--run-dir", cartpole_run, "--episodes", "3", "--json", "--seed", "5")
    assert r.code == 0, r.err
    summary = json.loads(r.out)
    assert summary["backend"] == "torch" and summary["env"] == "CartPole-v1"
    assert len(summary["returns"]) == 3 and summary["episodes"] == 3
    assert summary["return_mean"] == pytest.approx(sum(summary["returns"]) / 3)
    lat = summary["latency_us"]
    assert 0 < lat["p50"] <= lat["p99"] <= lat["max"]
    assert summary["steps"] == sum(summary["returns"])  # CartPole: +1 per step
    assert summary["lengths"] == summary["returns"] and summary["cut"] == sum(
        length == 500 for length in summary["lengths"]
    )  # gymnasium's 500-step TimeLimit cuts an episode
    # As the evaluations play (a policy that never presses FIRE does not idle), not 0.
    assert summary["epsilon"] == 0.001
    assert "returns_5min" not in summary  # CartPole has no human reference


def test_same_seed_same_returns(cli, cartpole_run):
    runs = [
        json.loads(
            cli("play", "--run-dir", cartpole_run, "--episodes", "4", "--json", "--seed", "9").out
        )["returns"]
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_a_checkpoint_file_and_epsilon(cli, cartpole_run):
    ckpt = sorted((cartpole_run / "checkpoints").iterdir())[-1]
    r = cli("play", "--checkpoint", ckpt, "--episodes", "2", "--epsilon", "1", "--json")
    assert r.code == 0
    assert max(json.loads(r.out)["returns"]) < 200  # random play does not balance long


def test_pong_play_reports_game_points(cli, pong_run):
    r = cli("play", "--run-dir", pong_run, "--episodes", "1", "--json")
    assert r.code == 0, r.err
    summary = json.loads(r.out)
    assert -21 <= summary["returns"][0] <= 21 and summary["env"] == "ALE/Pong-v5"
    assert summary["returns_5min"] == summary["returns"]  # a Pong game ends within 5 minutes
    assert "episode 1: return " in r.err and " after " in r.err  # the log says its length


def test_a_long_episode_says_how_far_it_is(cartpole_run, monkeypatch, caplog):
    import edgerl.play.observers
    from edgerl.play import PlayOptions, play
    from edgerl.play.observers import EpisodeLog
    from edgerl.policies import load_policy

    monkeypatch.setattr(edgerl.play.observers, "PROGRESS_S", 0.0)  # every step
    caplog.set_level("INFO", logger="edgerl.play.observers")
    play(load_policy(run_dir=cartpole_run), PlayOptions(max_episode_steps=3), [EpisodeLog()])
    said = [r.getMessage() for r in caplog.records]
    assert said[:3] == [f"episode 1: {n} steps so far, return {n}.0" for n in (1, 2, 3)]
    assert said[3] == "episode 1: return 3.0 after 3 steps"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--run-dir", "nowhere"], "run directory nowhere does not exist"),
        (["--model", "missing.ckpt"], "checkpoint missing.ckpt does not exist"),
        # not that TensorRT is missing: the file is (and the same where TensorRT is installed)
        (["--model", "nothere.engine"], "engine nothere.engine does not exist"),
        (["--model", "nothere.onnx"], "ONNX file nothere.onnx does not exist"),
        ([], "no run with checkpoints in"),
    ],
)
def test_errors(cli, args, message):
    r = cli("play", *args)
    assert r.code == 2 and message in r.err and "Traceback" not in r.err


def test_model_and_run_dir_together_is_a_usage_error(cli, tmp_path):
    r = cli("play", "--model", "a.ckpt", "--run-dir", "b")
    assert r.code == 2 and "not both" in r.err


def test_empty_run_dir(cli, tmp_path):
    (tmp_path / "empty").mkdir()
    r = cli("play", "--run-dir", "empty")
    assert r.code == 2 and "has no checkpoint yet" in r.err


def test_a_folder_that_is_no_run_is_not_called_one_without_checkpoints(cli, tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("train pong\n")
    for command in (["play"], ["export", "--onnx"]):
        r = cli(*command, "--run-dir", "notes")
        assert r.code == 2 and "notes is not a run directory" in r.err, r.err
        assert "no checkpoint yet" not in r.err and "Traceback" not in r.err


def test_a_run_of_damaged_checkpoints_is_not_told_a_train_option(cli, cartpole_run, tmp_path):
    """Play and export name what they take instead (--fresh is training's); the best policy,
    kept apart, is still played."""
    run = tmp_path / "damaged"
    shutil.copytree(cartpole_run, run)
    for ckpt in (run / "checkpoints").glob("ckpt-*.ckpt"):
        data = bytearray(ckpt.read_bytes())
        data[len(data) // 2] ^= 0xFF
        ckpt.write_bytes(bytes(data))
    r = cli("play", "--run-dir", run, "--last")
    assert r.code == 2 and "failed their checks" in r.err, r.err
    assert "--fresh" not in r.err and "--checkpoint" in r.err and "Traceback" not in r.err
    if (run / "checkpoints" / "best.ckpt").exists():
        r = cli("play", "--run-dir", run, "--episodes", "1", "--json")
        assert r.code == 0 and "best-evaluated policy" in r.err, r.err[-2000:]


def test_env_mismatch(cli, cartpole_run):
    r = cli("play", "--run-dir", cartpole_run, "--env", "Acrobot-v1")
    assert r.code == 2 and "does not match" in r.err


def test_console_rendering(cli, cartpole_run):
    r = cli(
        "play",
        "--run-dir",
        cartpole_run,
        "--episodes",
        "1",
        "--epsilon",
        "1",
        "--render",
        "console",
        "--seed",
        "3",
    )
    assert r.code == 0, r.err
    screens = [s for s in r.out.split("\x1b[H\x1b[2J") if s.strip()]
    assert len(screens) >= 8
    for n, screen in enumerate(screens, start=1):  # CartPole has no frames: its numbers
        assert screen.startswith("obs [") and f"| step {n} | score +{n} | action " in screen


def test_screen_rendering_with_the_dummy_driver(cli, pong_run):
    r = cli(
        "play",
        "--run-dir",
        pong_run,
        "--episodes",
        "1",
        "--render",
        "screen",
        "--fps",
        "100000",
        "--json",
    )
    assert r.code == 0, r.err
    assert json.loads(r.out.splitlines()[-1])["episodes"] == 1


def test_play_finds_the_newest_run_under_runs(cli, cartpole_run, tmp_path, monkeypatch):
    import os
    import shutil
    import time

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))  # no service run here
    (tmp_path / "runs" / "Old-v0" / "checkpoints").mkdir(parents=True)
    old = tmp_path / "runs" / "Old-v0" / "checkpoints" / "step-1.ckpt"
    old.write_bytes(b"not a checkpoint")
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))  # an older run: not the one to play
    shutil.copytree(cartpole_run, tmp_path / "runs" / "CartPole-v1")  # cwd is tmp_path
    r = cli("play", "--episodes", "1", "--json")
    assert r.code == 0, r.err
    assert "playing the newest checkpoint of runs/CartPole-v1" in r.err
    assert json.loads(r.out.splitlines()[-1])["env"] == "CartPole-v1"


class Seen(Observer):
    """An observer that notes what it is told; ``end_at``: it ends playing at that step."""

    def __init__(self, wants_q=False, end_at=0):
        self.events = []
        self.wants_q = wants_q
        self.end_at = end_at

    def on_reset(self, obs, episode):
        self.events.append(("reset", episode))

    def on_step(self, moment):
        self.events.append(("step", moment.episode, moment.steps, moment.q is not None))
        return moment.steps != self.end_at

    def on_episode(self, episode, ret, length):
        self.events.append(("episode", episode, ret, length))

    def on_end(self, stopped):
        self.events.append(("end", stopped))


def test_observers_are_told_of_each_reset_step_and_episode_in_order(cartpole_run):
    from edgerl.play import PlayOptions, play
    from edgerl.policies import load_policy

    policy = load_policy(run_dir=cartpole_run)
    seen, with_q = Seen(), Seen(wants_q=True)
    result = play(policy, PlayOptions(episodes=3, seed=2, max_episode_steps=5), [seen, with_q])
    assert result.cut == 3 and result.lengths == [5, 5, 5] and result.returns == [5.0] * 3
    expected = []
    for episode in (1, 2, 3):
        expected.append(("reset", episode))
        expected += [("step", episode, 5 * (episode - 1) + i, True) for i in range(1, 6)]
        expected.append(("episode", episode, 5.0, 5))
    expected.append(("end", False))
    assert with_q.events == expected  # the Q-values come to every observer when one asks
    assert seen.events == with_q.events


def test_an_observer_ends_playing_and_a_stop_stops_it(cartpole_run):
    from edgerl.play import PlayOptions, play
    from edgerl.policies import load_policy

    policy = load_policy(run_dir=cartpole_run)
    closed = Seen(end_at=3)  # as a window closed at the third step
    result = play(policy, PlayOptions(episodes=2), [closed])
    assert result.steps == 3 and result.returns == [] and closed.events[-1] == ("end", False)
    stopping = Seen()
    options = PlayOptions(episodes=2, stop=lambda: len(stopping.events) == 3)
    result = play(policy, options, [stopping])
    assert result.steps == 2 and stopping.events[-1] == ("end", True)


def gif_frames(path):
    from PIL import Image

    im = Image.open(path)
    frames = []
    for i in range(im.n_frames):
        im.seek(i)
        frames.append(np.asarray(im.convert("RGB")))
    return frames


def test_record_a_cartpole_gif_of_its_colour_screen(cli, cartpole_run):
    pytest.importorskip("PIL", reason="the record extra (Pillow) is not installed")
    from edgerl.play.record import CAPTION_HEIGHT, caption_scale

    plain = cli("play", "--run-dir", cartpole_run, "--episodes", "2", "--seed", "4", "--json")
    r = cli(
        "play", "--run-dir", cartpole_run, "--episodes", "2", "--seed", "4", "--record", "cp.gif"
    )
    assert r.code == 0, r.err
    summary = json.loads(plain.out)
    assert f"returns {summary['returns']}" in r.out  # recording does not change the play
    steps = summary["steps"]
    frames = gif_frames("cp.gif")
    # one frame after each reset and one after each step (the last of an episode included)
    assert len(frames) == steps + 2
    band = CAPTION_HEIGHT * caption_scale(600)
    assert frames[0].shape == (400 + band, 600, 3)  # CartPole's render: 600x400, in colour
    colours = {tuple(c) for c in frames[steps // 2][:400].reshape(-1, 3)}
    assert any(max(c) - min(c) > 60 for c in colours)  # the pole's brown, the axle's blue
    size = Path("cp.gif").stat().st_size
    seconds = (steps + 2) / 50  # CartPole's own pace: 50 steps a second
    assert r.out.splitlines()[-1] == (
        f"recorded {steps + 2:,} frames ({seconds:.1f} s) to {Path('cp.gif').resolve()} "
        f"({size / 1024:.1f} KiB)"
    )


def test_record_on_a_machine_without_a_display_prints_nothing_of_sdls(cartpole_run, tmp_path):
    """CartPole draws with pygame; SDL looks for a display as it starts and said "error:
    XDG_RUNTIME_DIR is invalid or not set" where there is none (a board over ssh)."""
    pytest.importorskip("PIL", reason="the record extra (Pillow) is not installed")
    pytest.importorskip("pygame", reason="the viewer extra (pygame) is not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SDL_", "XDG_"))}
    env = {k: v for k, v in env.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    r = subprocess.run(
        edgerl_cmd("play", "--run-dir", cartpole_run, "--record", tmp_path / "cp.gif"),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "XDG_RUNTIME_DIR" not in r.stderr and "error:" not in r.stderr, r.stderr
    assert (tmp_path / "cp.gif").exists()


def test_record_json_names_the_file(cli, cartpole_run):
    pytest.importorskip("PIL", reason="the record extra (Pillow) is not installed")
    r = cli("play", "--run-dir", cartpole_run, "--record", "one.gif", "--json", "--seed", "1")
    assert r.code == 0, r.err
    summary = json.loads(r.out)
    rec = summary["recording"]
    assert rec["path"] == str(Path("one.gif").resolve()) and rec["frames"] == summary["steps"] + 1
    assert rec["bytes"] == Path("one.gif").stat().st_size and rec["seconds"] > 0


def test_the_agents_view_of_a_cartpole_run_is_refused(cli, cartpole_run):
    r = cli("play", "--run-dir", cartpole_run, "--record", "a.gif", "--record-view", "agent")
    assert r.code == 2 and "no agent's view to record" in r.err
    assert not Path("a.gif").exists()


PONG_BROWN = (144, 72, 17)


def test_record_pong_in_colour_210x160(pong_run, tmp_path):
    pytest.importorskip("PIL", reason="the record extra (Pillow) is not installed")
    from edgerl.play import PlayOptions, play
    from edgerl.play.observers import Filming
    from edgerl.play.record import CAPTION_HEIGHT
    from edgerl.policies import load_policy

    policy = load_policy(run_dir=pong_run)
    filming = Filming(tmp_path / "pong.gif", policy.spec)
    result = play(policy, PlayOptions(max_steps=40), [filming])
    assert result.recording is not None and result.recording.frames == 41
    assert result.recording.seconds == pytest.approx(41 / 15)  # 60 Hz, frame skip 4
    frames = gif_frames(tmp_path / "pong.gif")
    assert len(frames) == 41 and frames[0].shape == (210 + CAPTION_HEIGHT, 160, 3)
    field = frames[-1][100, 80]
    assert tuple(field) == PONG_BROWN  # the colour screen, not the agent's grey


def test_record_pong_as_the_agent_sees_it(pong_run, tmp_path):
    pytest.importorskip("PIL", reason="the record extra (Pillow) is not installed")
    from edgerl.play import PlayOptions, play
    from edgerl.play.observers import Filming
    from edgerl.play.record import CAPTION_HEIGHT
    from edgerl.policies import load_policy

    policy = load_policy(run_dir=pong_run)
    filming = Filming(tmp_path / "agent.gif", policy.spec, "agent")
    result = play(policy, PlayOptions(max_steps=20), [filming])
    assert result.recording is not None and result.recording.frames == 21
    frames = gif_frames(tmp_path / "agent.gif")
    game = frames[-1][: 2 * 84]
    assert frames[-1].shape == (2 * 84 + CAPTION_HEIGHT, 2 * 84, 3)  # 84x84, each pixel 2x2
    assert np.array_equal(game[..., 0], game[..., 1]) and np.array_equal(game[..., 0], game[..., 2])


def test_ctrl_c_stops_play_started_with_sigint_ignored(cartpole_run):
    """A shell script's background job starts with SIGINT ignored; `edgerl play` then played on
    after SIGINT (train and bench installed handlers of their own, the other commands none)."""
    import select
    import signal
    import subprocess
    import time

    from .conftest import edgerl_cmd

    proc = subprocess.Popen(
        edgerl_cmd("play", "--run-dir", cartpole_run, "--episodes", "100000", "--fps", "20"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        said = select.select([proc.stderr], [], [], 300)[0]
        assert said, "play said nothing within 300 s"
        first = proc.stderr.readline()  # it says which policy it plays: it is running
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # it played on: the failure this test is for
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, first + err


def test_ctrl_c_while_recording_writes_nothing_under_the_name(cartpole_run, tmp_path):
    pytest.importorskip("PIL", reason="the record extra (Pillow) is not installed")
    import os
    import signal
    import subprocess
    import time

    from .conftest import edgerl_cmd

    proc = subprocess.Popen(
        edgerl_cmd("play", "--run-dir", cartpole_run, "--episodes", "10000", "--record", "k.gif"),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        # a shell's background job ignores SIGINT; a terminal's Ctrl-C does not
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    temp = tmp_path / f".k.gif.tmp-{proc.pid}"
    try:
        deadline = time.monotonic() + 240
        while not temp.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert temp.exists()  # recording, under a temporary name
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted: nothing was written to k.gif" in err
    assert os.listdir(tmp_path) == []


def test_a_ctrl_c_in_play_names_no_checkpoint(cli, monkeypatch):
    import edgerl.policies

    def interrupted(**kwargs):
        raise KeyboardInterrupt  # as a Ctrl-C while a policy loads

    monkeypatch.setattr(edgerl.policies, "load_policy", interrupted)
    r = cli("play", "--model", "policy.onnx")
    assert r.code == 130 and r.err.strip() == "interrupted"


def test_a_model_of_no_kind_edgerl_plays_is_one_sentence_not_a_checkpoint(cli, tmp_path):
    """A mistyped suffix (.onx) is named as what it is, not read as a damaged checkpoint."""
    typo = tmp_path / "policy.onx"
    typo.write_bytes(b"\x08\x07onnx bytes")
    r = cli("play", "--model", typo)
    assert r.code == 2 and "Traceback" not in r.err
    assert "is not a file edgerl plays (its name ends in '.onx')" in r.err
    assert "an ONNX file (.onnx)" in r.err and "checkpoint" not in r.err.split(":")[0]


def test_a_continuous_policy_is_not_played_where_its_actions_mean_other_numbers():
    """Same observations, same number of actions, other bounds: a torque learned within +-2
    sent where the bounds are +-1 is another action, so playing there is refused."""
    from types import SimpleNamespace

    from edgerl.envs import probe
    from edgerl.errors import EnvError
    from edgerl.play.loop import check_matches

    pendulum = probe("Pendulum-v1")
    policy = SimpleNamespace(spec=pendulum)
    check_matches(policy, SimpleNamespace(spec=pendulum))  # its own game: played
    narrower = dataclasses.replace(pendulum, action_low=(-1.0,), action_high=(1.0,))
    with pytest.raises(EnvError, match=r"within \(-2.0,\) and \(2.0,\)"):
        check_matches(policy, SimpleNamespace(spec=narrower))
