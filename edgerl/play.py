"""Playing a learned policy: policy backends and the play loop.

A :class:`Policy` maps a batch of observations (numpy, exactly as the environment returns them) to
Q-values and greedy actions. Backends: a PyTorch checkpoint here; ONNX Runtime and TensorRT in
``edgerl.export`` load through :func:`load_policy`. The play loop measures the latency of each
action selection (observation in, action out) and reports episode returns in game points.
With ``record``, the played episodes are also recorded (see :mod:`edgerl.record`): the colour
screen, or the agent's own view, one frame after the reset and one after each step, each with its
episode and score beneath it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from edgerl.checkpoint import Checkpoint, CheckpointStore, load
from edgerl.config import EnvConfig, from_dict
from edgerl.device import resolve_device
from edgerl.envs import EnvSpec, VecEnv, make_env
from edgerl.errors import CheckpointError, EnvError
from edgerl.nets import NatureCNN, build_q_network
from edgerl.record import Recorder, Recording, open_recorder

log = logging.getLogger(__name__)


class Policy(Protocol):
    backend: str
    spec: EnvSpec
    env_config: dict[str, Any]  # the [env] section the policy was trained with

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values, shape (batch, num_actions), float32."""
        ...

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions, shape (batch,), int64."""
        ...


def newest_checkpoint(run_dir: Path) -> Path:
    """The newest valid checkpoint of a run; raises CheckpointError if there is none."""
    if not run_dir.is_dir():
        raise CheckpointError(f"run directory {run_dir} does not exist")
    found = CheckpointStore(run_dir / "checkpoints", keep=1 << 30).newest_valid()
    if found is None:
        raise CheckpointError(f"run directory {run_dir} has no checkpoint yet")
    return found[0].path


class TorchPolicy:
    """A PyTorch Q-network restored from an edgerl checkpoint."""

    backend = "torch"

    def __init__(self, checkpoint: Checkpoint, device: str = "cpu", source: Path | None = None):
        try:
            self.spec = EnvSpec.from_dict(checkpoint.env)
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(
                f"checkpoint {source} has a damaged game description ({e}); was it written by "
                "edgerl?"
            ) from None
        env_config = checkpoint.config.get("env")
        if not isinstance(env_config, dict):
            raise CheckpointError(
                f"checkpoint {source} lacks its [env] settings; was it written by edgerl?"
            )
        cfg = from_dict(checkpoint.config, f"checkpoint {source}")
        self.source = source
        self.env_config = env_config
        self.hidden = cfg.agent.hidden
        self.layer_norm = checkpoint.kind == "pqn"  # PQN's network normalises its layers
        self.step = checkpoint.step
        q_state = checkpoint.learner["q"]
        self._q_state = q_state
        self.device = resolve_device(device)
        # Built without random initial weights (they are replaced at once): an evaluation
        # beside training must not draw from torch's global RNG, which the trainer's state holds.
        with torch.device("meta"):
            net = build_q_network(self.spec, cfg.agent.hidden, self.layer_norm)
        net.load_state_dict(q_state, assign=True)
        if isinstance(net, NatureCNN):
            net.use_channels_last()
        self.net = net.to(self.device).eval()

    def state_dict_cpu(self) -> dict[str, Any]:
        """The Q-network's weights as saved in the checkpoint (CPU tensors)."""
        return self._q_state

    @classmethod
    def from_file(cls, path: Path, device: str = "cpu") -> TorchPolicy:
        return cls(load(path), device, path)

    @torch.inference_mode()
    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return self.net(torch.as_tensor(obs, device=self.device)).float().cpu().numpy()

    @torch.inference_mode()
    def act(self, obs: np.ndarray) -> np.ndarray:
        q = self.net(torch.as_tensor(obs, device=self.device))
        return q.argmax(dim=1).cpu().numpy()


@dataclass
class PlayResult:
    backend: str
    env: str
    returns: list[float]
    steps: int
    latencies_ns: list[int] = field(repr=False)
    recording: Recording | None = None
    lengths: list[int] = field(default_factory=list)  # steps of each episode in ``returns``
    cut: int = 0  # episodes cut at ``max_episode_steps`` (counted in ``returns``)

    def latency_us(self) -> dict[str, float]:
        lat = np.asarray(self.latencies_ns, dtype=np.float64) / 1000.0
        if lat.size == 0:
            return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
        return {
            "p50": round(float(np.percentile(lat, 50)), 2),
            "p99": round(float(np.percentile(lat, 99)), 2),
            "max": round(float(lat.max()), 2),
        }

    def describe(self) -> str:
        """One line: returns and action latency."""
        summary = self.to_json()
        lat = summary["latency_us"]
        return (
            f"{summary['env']} with {summary['backend']}: {summary['episodes']} episodes, "
            f"mean return {summary['return_mean']:.2f} (returns {summary['returns']}); action "
            f"latency p50 {lat['p50']:.0f} us, p99 {lat['p99']:.0f} us, max {lat['max']:.0f} us"
        )

    def to_json(self) -> dict[str, Any]:
        returns = [float(r) for r in self.returns]
        summary: dict[str, Any] = {
            "backend": self.backend,
            "env": self.env,
            "episodes": len(returns),
            "returns": returns,
            "return_mean": float(np.mean(returns)) if returns else float("nan"),
            "latency_us": self.latency_us(),
            "steps": self.steps,
        }
        if self.recording is not None:
            rec = self.recording
            summary["recording"] = {
                "path": str(rec.path),
                "frames": rec.frames,
                "seconds": round(rec.seconds, 3),
                "bytes": rec.bytes,
            }
        return summary


# A renderer gets the observation, the action, the Q-values, the running return, the episode and
# the step; it returns False to stop playing (the window was closed).
Renderer = Callable[[np.ndarray, int, np.ndarray | None, float, int, int], bool]

RECORD_VIEWS = ("screen", "agent")  # the colour screen, or the agent's 84x84 grey frame
AGENT_VIEW_SCALE = 2  # the agent's frame is small: each pixel becomes 2x2 in a recording


class _Filming:
    """Takes the frames of a recording from the play loop: what the view shows, captioned."""

    def __init__(self, recorder: Recorder, env: VecEnv, view: str) -> None:
        self.recorder, self.env, self.view = recorder, env, view

    def _agent(self, obs: np.ndarray) -> np.ndarray:
        frame = obs[-1]  # the newest frame of the stack
        return frame.repeat(AGENT_VIEW_SCALE, axis=0).repeat(AGENT_VIEW_SCALE, axis=1)

    def film(self, obs: np.ndarray, episode: int, ret: float, final: bool = False) -> None:
        """Add the frame after a reset or step (``final``: the last of an episode, whose
        observation is ``final_obs``)."""
        if self.view == "agent":
            frame = self._agent(obs)
        else:
            screen = self.env.screen(0, final=final)
            assert screen is not None  # the env was made with screens=True
            frame = screen
        self.recorder.add(frame, caption=f"episode {episode}  score {ret:+.0f}")


def draw_offscreen() -> None:
    """Let games that draw with pygame (gymnasium's CartPole) draw without a display.

    Their first render initialises SDL's video, which probes for a display and, on a machine
    without one, prints "error: XDG_RUNTIME_DIR is invalid or not set in the environment." on
    stderr. A recording needs no window: SDL's dummy drivers, unless the user chose others.
    """
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")


def play(
    policy: Policy,
    *,
    env_id: str | None = None,
    episodes: int = 1,
    seed: int = 0,
    epsilon: float = 0.0,
    renderer: Renderer | None = None,
    fps: float = 0.0,
    max_steps: int = 0,
    record: Path | None = None,
    record_view: str = "screen",
    max_episode_steps: int = 0,
    stop: Callable[[], bool] | None = None,
    log_episodes: bool = True,
) -> PlayResult:
    """Play ``episodes`` episodes with ``policy`` (epsilon-greedy, 0: greedy); with ``record``,
    record them to that GIF or MP4 at the game's pace, whatever ``fps``.

    ``max_steps`` ends playing after that many steps in all (the episode in flight is not
    counted); ``max_episode_steps`` cuts an episode after that many steps (it is counted, in
    ``cut`` too); ``stop`` is asked before every step and ends playing when it returns True
    (a recording then ends without a file: what it holds is cut short).

    Raises EnvError if ``env_id`` does not match what the policy was trained on, or when
    ``record_view`` is "agent" for a policy on vector observations; RecordError /
    MissingDependencyError when the recording cannot be made (nothing is then written under its
    name, nor when playing fails or is interrupted).
    """
    if record_view not in RECORD_VIEWS:
        raise ValueError(f"record_view must be one of {RECORD_VIEWS}, not {record_view!r}")
    if record is not None and record_view == "agent" and not policy.spec.has_frames:
        raise EnvError(
            f"{policy.spec.id} has vector observations, not frames: there is no agent's view to "
            "record; record its screen instead"
        )
    env_cfg = EnvConfig(
        **{k: v for k, v in policy.env_config.items() if k in EnvConfig.__annotations__}
    )
    if env_id is not None and env_id != policy.spec.id:
        env_cfg.id = env_id
    env_cfg.num_envs, env_cfg.threads = 1, 1
    rng = np.random.default_rng(seed)
    screens = record is not None and record_view == "screen"
    if screens and getattr(renderer, "kind", None) != "screen":
        draw_offscreen()
    with contextlib.ExitStack() as cleanup:
        env = make_env(env_cfg, screens=screens)
        cleanup.callback(env.close)
        if (
            env.spec.obs_shape != policy.spec.obs_shape
            or env.spec.num_actions != policy.spec.num_actions
        ):
            raise EnvError(
                f"the policy was trained on {policy.spec.id} ({policy.spec.num_actions} actions, "
                f"observations {policy.spec.obs_shape}); {env_cfg.id} does not match"
            )
        filming = None
        if record is not None:
            # Leaving the block by an exception (Ctrl-C included) discards the recording.
            recorder = cleanup.enter_context(open_recorder(record, env.steps_per_second))
            filming = _Filming(recorder, env, record_view)
        obs = env.reset(seed=seed)
        returns: list[float] = []
        lengths: list[int] = []
        latencies: list[int] = []
        ret, steps, length, cut = 0.0, 0, 0, 0
        if filming is not None:
            filming.film(obs[0], 1, ret)
        frame_s = 1.0 / fps if fps > 0 else 0.0
        next_frame = time.perf_counter()
        stopped = False
        while len(returns) < episodes:
            if stop is not None and stop():
                stopped = True
                break
            t0 = time.perf_counter_ns()
            if renderer is not None:
                q = policy.q_values(obs)
                action = q.argmax(axis=1)
            else:
                q = None
                action = policy.act(obs)
            latencies.append(time.perf_counter_ns() - t0)
            if epsilon > 0 and rng.random() < epsilon:
                action = rng.integers(policy.spec.num_actions, size=1)
            step = env.step(np.asarray(action, dtype=np.int64))
            ret += float(step.rewards[0])
            steps += 1
            length += 1
            done = bool(step.terminated[0] or step.truncated[0])
            if filming is not None:
                if done:
                    assert step.final_obs is not None
                    filming.film(step.final_obs[0], len(returns) + 1, ret, final=True)
                    if len(returns) + 1 < episodes and steps != max_steps:
                        filming.film(step.obs[0], len(returns) + 2, 0.0)  # the next one's start
                else:
                    filming.film(step.obs[0], len(returns) + 1, ret)
            if renderer is not None and not renderer(
                obs[0], int(action[0]), None if q is None else q[0], ret, len(returns) + 1, steps
            ):
                break
            if frame_s:
                next_frame += frame_s
                time.sleep(max(0.0, next_frame - time.perf_counter()))
            obs = step.obs
            if not done and max_episode_steps and length >= max_episode_steps:
                done, cut = True, cut + 1
                obs = env.reset(seed=seed + len(returns) + 1)  # the next episode, not this one
                if filming is not None and len(returns) + 1 < episodes:
                    filming.film(obs[0], len(returns) + 2, 0.0)
            if done:
                returns.append(ret)
                lengths.append(length)
                if log_episodes:
                    log.info("episode %d: return %.1f", len(returns), ret)
                ret, length = 0.0, 0
            if max_steps and steps >= max_steps:
                break
        recording = None
        if filming is not None and stopped:
            recorder.abort()  # an episode cut short by a stop is no recording of it
        elif filming is not None:
            recording = recorder.close()
        return PlayResult(
            policy.backend, env_cfg.id, returns, steps, latencies, recording, lengths, cut
        )


def load_policy(
    *,
    model: Path | None = None,
    run_dir: Path | None = None,
    checkpoint: Path | None = None,
    backend: str = "auto",
    device: str = "cpu",
) -> Policy:
    """A policy from ``--model`` (checkpoint, .onnx or .engine) or a run's checkpoint.

    Raises CheckpointError / EdgerlError with a sentence when the file cannot be used.
    """
    if model is None:
        if checkpoint is not None:
            model = checkpoint
        elif run_dir is not None:
            model = newest_checkpoint(run_dir)
        else:
            raise CheckpointError("give a model with --model FILE or a run with --run-dir RUN")
    kind = backend
    if kind == "auto":
        suffix = model.suffix.lower()
        kind = {".onnx": "onnx", ".engine": "trt", ".plan": "trt"}.get(suffix, "torch")
    if kind == "torch":
        return TorchPolicy.from_file(model, device)
    if kind == "onnx":
        from edgerl.export.onnx import OnnxPolicy

        return OnnxPolicy(model)
    if kind == "trt":
        from edgerl.export.tensorrt import TensorRTPolicy

        return TensorRTPolicy(model)
    raise CheckpointError(f"unknown backend {backend!r}; use auto, torch, onnx or trt")
