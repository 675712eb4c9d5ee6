"""Gymnasium games that show pictures (envs/gym_image.py), with a real one: CarRacing-v3 on Box2D
with discrete actions (``env.make_kwargs``). The pictures become ALE's frame stacks; training,
the viewer, play and export work on them as on Atari."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import numpy as np
import pytest

from edgerl.config import EnvConfig
from edgerl.envs import FRAME_SIZE, FRAME_STACK, make_env, probe
from edgerl.envs.gym_image import LUMA, is_image, to_frames
from edgerl.errors import ConfigError

pytest.importorskip("Box2D", reason="CarRacing needs the box2d extra")

CAR = "{continuous = false}"
# Episodes cut after 40 frames (10 agent steps) so that episode ends come quickly.
SHORT_CAR = "{continuous = false, max_episode_steps = 40}"


def car(num_envs: int = 2, kwargs: str = CAR) -> EnvConfig:
    from edgerl.config import build_layers, resolve

    sets = ["env.id=CarRacing-v3", f"env.make_kwargs={kwargs}", f"env.num_envs={num_envs}"]
    return resolve(build_layers(None, sets, use_system=False)).env


def test_which_spaces_are_pictures():
    from gymnasium import spaces

    assert is_image(spaces.Box(0, 255, (96, 96, 3), np.uint8))
    assert is_image(spaces.Box(0, 255, (64, 48), np.uint8))
    assert not is_image(spaces.Box(0, 255, (96, 96, 3), np.float32))  # not pixels
    assert not is_image(spaces.Box(0, 255, (96, 96, 4), np.uint8))  # four channels
    assert not is_image(spaces.Box(0, 255, (4, 4, 3), np.uint8))  # too small to see
    assert not is_image(spaces.Box(-1, 1, (8,), np.float32))


def test_a_picture_becomes_an_84x84_grey_frame():
    colour = np.array([200, 100, 50], dtype=np.uint8)
    pictures = np.broadcast_to(colour, (2, 96, 96, 3)).copy()
    pictures[1, :48] = 0  # the top half black: the frame's top half too
    frames = to_frames(pictures)
    assert frames.shape == (2, FRAME_SIZE, FRAME_SIZE) and frames.dtype == np.uint8
    grey = round(float(np.dot(colour, LUMA)))
    assert (frames[0] == grey).all()
    assert (frames[1, :40] == 0).all() and (frames[1, 44:] == grey).all()


def test_carracing_probes_as_frames_with_its_discrete_actions():
    spec = probe(car())
    assert spec.has_frames and spec.obs_shape == (FRAME_STACK, FRAME_SIZE, FRAME_SIZE)
    assert spec.num_actions == 5


def test_make_kwargs_mistakes_are_one_sentence():
    from edgerl.config import build_layers, resolve

    with pytest.raises(ConfigError, match=r"env.make_kwargs must be a TOML inline table"):
        resolve(build_layers(None, ["env.make_kwargs=continuous"], use_system=False))
    with pytest.raises(ConfigError, match=r"env.make_kwargs does not suit CarRacing-v3"):
        probe(car(kwargs="{wheels = 3}"))
    with pytest.raises(ConfigError, match=r"env.make_kwargs is for gymnasium ids"):
        probe(EnvConfig(id="ALE/Pong-v5", make_kwargs={"continuous": False}))


def test_stacks_shift_and_a_new_episode_starts_its_own():
    with make_env(car(2, SHORT_CAR), screens=True) as env:
        obs = env.reset(seed=0)
        assert not obs[:, :-1].any() and obs[:, -1].any()  # zeros before the first picture
        assert env.screen(0).shape == (96, 96, 3)
        before = obs
        ended = None
        for _ in range(20):
            step = env.step(np.array([3, 3]))  # gas
            done = step.terminated | step.truncated
            if done.any():
                ended = step
                break
            assert (step.obs[:, :-1] == before[:, 1:]).all()  # shifted by one
            before = step.obs
        assert ended is not None and ended.truncated.all(), "no episode ended in 20 steps"
        assert ended.final_obs is not None
        assert (ended.final_obs[:, :-1] == before[:, 1:]).all()  # the old episode, shifted
        assert not ended.obs[:, :-1].any()  # the new one: zeros before its first picture
        assert env.screen(0, final=True).shape == (96, 96, 3)


@pytest.mark.slow
def test_carracing_trains_from_pixels_and_is_watched_played_and_exported(cli, tmp_path):
    """A few thousand steps of DQN on CarRacing's pixels, watched live through the frame
    stream, then played with PyTorch and, exported to ONNX, with ONNX Runtime."""
    from .conftest import edgerl_cmd

    run = tmp_path / "car"
    args = [
        "train",
        "--env",
        "CarRacing-v3",
        "--set",
        f"env.make_kwargs={CAR}",
        "--set",
        "env.num_envs=2",
        "--set",
        "agent.learning_starts=200",
        "--set",
        "replay.capacity=4000",
        "--set",
        "eval.every_steps=0",
        "--set",
        "display.every=1",
        "--steps",
        "100000",
        "--run-dir",
        run,
    ]
    proc = subprocess.Popen(
        edgerl_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        png = tmp_path / "car.png"
        r = cli("view", "--run-dir", run, "--snapshot", png, "--timeout", "300")
        assert r.code == 0, r.err
        import pygame

        pixels = pygame.surfarray.array3d(pygame.image.load(str(png)))
        assert pixels.std() > 10  # the track and the grass, not a blank window
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:  # learning has started and made updates
            metrics = run / "metrics.csv"
            if metrics.exists() and any(
                line.split(",")[0].isdigit() and int(line.split(",")[0]) >= 600
                for line in metrics.read_text().splitlines()[1:]
            ):
                break
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "stopped by SIGINT" in err
    r = cli("play", "--run-dir", run, "--episodes", "1", "--json")
    assert r.code == 0, r.err
    played = json.loads(r.out)
    assert played["env"] == "CarRacing-v3" and played["steps"] > 0
    onnx = tmp_path / "car.onnx"
    r = cli("export", "--onnx", "--run-dir", run, "-o", onnx)
    assert r.code == 0, r.err
    r = cli("play", "--model", onnx, "--episodes", "1", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["returns"] == played["returns"]  # the same policy, the same game


def test_ales_async_batches_and_overlap_are_for_ale_only():
    """A picture game steps every environment in Python: env.batch_size auto stays 0 there
    even where a GPU learns from a replay, and a number given is refused in one sentence."""
    import torch

    from edgerl.config import Config, with_values
    from edgerl.envs.batches import overlaps_emulation
    from edgerl.learners.factory import check_setup, resolve_env_batch

    spec = probe(car(16))
    cfg = with_values(Config(), {"env.id": "CarRacing-v3", "env.num_envs": 16})
    assert resolve_env_batch(cfg, spec, torch.device("cuda")) == 0
    assert not overlaps_emulation(cfg.env, spec.has_frames, torch.device("cuda"))
    with pytest.raises(ConfigError, match=r"env.batch_size .* is for Atari ids"):
        check_setup(with_values(cfg, {"env.batch_size": 8}), spec)


def test_a_picture_run_resumes_with_its_make_kwargs_and_is_no_vector_run(cli, tmp_path):
    """`edgerl train --run-dir DIR` resumes a run's game with the gymnasium.make arguments it
    was made with; the viewer does not take it for a run without frames."""
    from edgerl.files.checkpoint import list_checkpoints
    from edgerl.report.status import game_without_frames

    run = tmp_path / "car"
    small = ["--set", "env.num_envs=2", "--set", "agent.learning_starts=50", "--quiet"]
    first = ["--env", "CarRacing-v3", "--set", f"env.make_kwargs={CAR}", *small]
    r = cli("train", *first, "--steps", "100", "--run-dir", run)
    assert r.code == 0, r.err
    assert game_without_frames(run) is None  # status.json says it has frames
    r = cli("train", *small, "--steps", "200", "--run-dir", run)
    assert r.code == 0, r.err  # no --env, no make_kwargs: the run's own
    assert max(c.step for c in list_checkpoints(run / "checkpoints")) == 200
    r = cli("train", "--env", "CarRacing-v3", *small, "--steps", "300", "--run-dir", run)
    assert r.code == 0, r.err  # the same game named again: its arguments still go with it
