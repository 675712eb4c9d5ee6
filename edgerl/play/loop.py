"""The episode loop: :func:`play` on one environment, :func:`play_together` on several."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from edgerl.config import EnvConfig
from edgerl.envs import (
    EnvSpec,
    VecEnv,
    greedy_actions,
    make_env,
    shown_action,
    with_random_vectors,
    within_reference,
)
from edgerl.errors import EnvError
from edgerl.learners.explore import with_exploration
from edgerl.play.observer import Moment, Observer
from edgerl.words import plural

if TYPE_CHECKING:
    from edgerl.play.record import Recording
    from edgerl.policies import Policy


@dataclass(frozen=True)
class PlayOptions:
    """The episode loop's own settings."""

    env_id: str | None = None  # None: the game the policy learned
    episodes: int = 1
    seed: int = 0
    epsilon: float = 0.0  # the chance of a random action (0: greedy)
    sample: bool = False  # each action drawn from the softmax of the policy's outputs (a
    # policy that samples as it learns: PPO's logits), from the loop's seeded generator; else
    # the action of the largest output
    max_steps: int = 0  # ends playing after this many steps in all (the episode in flight is
    # not counted); 0: no limit
    max_episode_steps: int = 0  # cuts an episode after this many steps (it is counted, in
    # ``PlayResult.cut`` too); 0: no limit
    within_steps: int = 0  # also sums each episode's return over its first this many steps
    # (``PlayResult.returns_within``: the human reference's 5 minutes); 0: not
    fps: float = 0.0  # steps per second (0: as fast as possible)
    stop: Callable[[], bool] | None = None  # asked before every step: True ends playing, which
    # is then stopped (a recording is discarded: what it holds is cut short)
    progress: Callable[[int, int], None] | None = None  # play_together calls it after every
    # step with the episodes ended and the steps played so far (an evaluation says how far)


@dataclass
class PlayResult:
    backend: str
    env: str
    returns: list[float]
    steps: int
    latencies_ns: list[int] = field(repr=False)
    recording: Recording | None = None
    lengths: list[int] = field(default_factory=list)  # steps of each episode in ``returns``
    # episodes cut at a cap, not ended by the game (counted in ``returns``): at
    # ``max_episode_steps`` or at the environment's own (ALE's frame cap, a TimeLimit)
    cut: int = 0
    # each episode's return over its first ``PlayOptions.within_steps`` steps (where asked)
    returns_within: list[float] = field(default_factory=list)

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
        cut = f", {self.cut} cut at a cap" if self.cut else ""
        within = within_reference(self.returns, self.returns_within, 2)
        return (
            f"{summary['env']} with {summary['backend']}: "
            f"{plural(summary['episodes'], 'episode')}{cut}, mean return "
            f"{summary['return_mean']:.2f} (returns {summary['returns']}{within}); action "
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
            "lengths": list(self.lengths),
            "cut": self.cut,
        }
        if self.returns_within:  # an Atari game's: the human reference's 5 minutes
            summary["returns_5min"] = [float(r) for r in self.returns_within]
        if self.recording is not None:
            rec = self.recording
            summary["recording"] = {
                "path": str(rec.path),
                "frames": rec.frames,
                "seconds": round(rec.seconds, 3),
                "bytes": rec.bytes,
            }
        return summary


def draw_offscreen() -> None:
    """Let games that draw with pygame (gymnasium's CartPole) draw without a display.

    Their first render initialises SDL's video, which probes for a display and, on a machine
    without one, prints "error: XDG_RUNTIME_DIR is invalid or not set in the environment." on
    stderr. A recording needs no window: SDL's dummy drivers, unless the user chose others.
    """
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")


def sampled_actions(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One action per row of ``logits``, drawn from their softmax by inverse CDF of a uniform
    number from ``rng`` (as a sampling learner's acting policy draws while it trains), int64."""
    z = np.asarray(logits, dtype=np.float64)
    weights = np.exp(z - z.max(axis=1, keepdims=True))
    cdf = np.cumsum(weights, axis=1) / weights.sum(axis=1, keepdims=True)
    below = (cdf < rng.random(len(z))[:, None]).sum(axis=1)
    return np.minimum(below, z.shape[1] - 1).astype(np.int64)  # a sum a hair under 1


def _env_config(policy: Policy, env_id: str | None) -> EnvConfig:
    """The policy's own [env] settings, on one environment (of ``env_id`` when given)."""
    env_cfg = EnvConfig(
        **{k: v for k, v in policy.env_config.items() if k in EnvConfig.__annotations__}
    )
    if env_id is not None and env_id != policy.spec.id:
        env_cfg.id = env_id
    env_cfg.num_envs, env_cfg.threads = 1, 1
    env_cfg.batch_size = 0  # every environment each step: ALE's async mode is for training
    return env_cfg


def explored(
    spec: EnvSpec, actions: np.ndarray, epsilon: float, rng: np.random.Generator
) -> np.ndarray:
    """``actions``, each replaced by a uniformly random action of ``spec``'s game with
    probability ``epsilon`` (``--epsilon``, an evaluation's ``eval.epsilon``)."""
    if spec.continuous:
        return with_random_vectors(spec, actions, epsilon, rng)
    return with_exploration(actions, epsilon, spec.num_actions, rng)


def check_matches(policy: Policy, env: VecEnv, sample: bool = False) -> None:
    """Raise EnvError unless ``env`` has the observations and actions ``policy`` learned, and
    can be played as asked (``sample``: drawn from a softmax of the policy's outputs)."""
    if sample and policy.spec.continuous:
        raise EnvError(
            f"the policy plays {policy.spec.id}, a game of continuous actions, and its "
            "network outputs the action itself: there is no softmax to sample; play it "
            "greedily (without --sample)"
        )
    if (
        env.spec.obs_shape != policy.spec.obs_shape
        or env.spec.num_actions != policy.spec.num_actions
        or env.spec.action_shape != policy.spec.action_shape
    ):
        raise EnvError(
            f"the policy was trained on {policy.spec.id} ({policy.spec.num_actions} actions, "
            f"observations {policy.spec.obs_shape}); {env.spec.id} does not match"
        )
    bounds = (tuple(policy.spec.action_low), tuple(policy.spec.action_high))
    if (
        policy.spec.continuous
        and (tuple(env.spec.action_low), tuple(env.spec.action_high)) != bounds
    ):
        raise EnvError(
            f"the policy was trained on {policy.spec.id} with actions within {bounds[0]} and "
            f"{bounds[1]}; {env.spec.id}'s are within {tuple(env.spec.action_low)} and "
            f"{tuple(env.spec.action_high)}, so its actions would mean something else there"
        )


def play(
    policy: Policy, options: PlayOptions | None = None, observers: Sequence[Observer] = ()
) -> PlayResult:
    """Play ``options.episodes`` episodes with ``policy``, telling ``observers`` of each reset,
    step and episode; the result holds the recording an observer made.

    Raises EnvError if ``options.env_id`` does not match what the policy was trained on; what an
    observer raises (a recording that cannot be made: RecordError, MissingDependencyError) ends
    playing, and observers' resources are left as their ``on_start`` arranged.
    """
    o = options or PlayOptions()
    env_cfg = _env_config(policy, o.env_id)
    rng = np.random.default_rng(o.seed)
    screens = any(w.screens for w in observers)
    if screens and not any(w.window for w in observers):
        draw_offscreen()
    wants_q = any(w.wants_q for w in observers)
    spec = policy.spec
    with contextlib.ExitStack() as cleanup:
        env = make_env(env_cfg, screens=screens)
        cleanup.callback(env.close)
        check_matches(policy, env, o.sample)
        for w in observers:
            w.on_start(env, cleanup)
        obs = env.reset(seed=o.seed)
        returns: list[float] = []
        lengths: list[int] = []
        latencies: list[int] = []
        ret, steps, length, cut, within = 0.0, 0, 0, 0, 0.0
        returns_within: list[float] = []
        for w in observers:
            w.on_reset(obs[0], 1)
        frame_s = 1.0 / o.fps if o.fps > 0 else 0.0
        next_frame = time.perf_counter()
        stopped = False
        while len(returns) < o.episodes:
            if o.stop is not None and o.stop():
                stopped = True
                break
            t0 = time.perf_counter_ns()
            if wants_q or o.sample:
                q = policy.q_values(obs)
                action = sampled_actions(q, rng) if o.sample else greedy_actions(spec, q)
            else:
                q = None
                action = policy.act(obs)
            latencies.append(time.perf_counter_ns() - t0)
            if o.epsilon > 0:
                action = explored(spec, action, o.epsilon, rng)
            if spec.continuous:  # what a screen shows of the step: the action's numbers
                q = np.asarray(action, dtype=np.float32)
            step = env.step(np.asarray(action, dtype=spec.action_dtype))
            ret += float(step.rewards[0])
            if length < o.within_steps:
                within += float(step.rewards[0])
            steps += 1
            length += 1
            done = bool(step.terminated[0] or step.truncated[0])
            if step.truncated[0] and not step.terminated[0]:
                cut += 1  # the game's own cap (env.max_episode_frames, a TimeLimit)
            final_obs = None
            if done:
                assert step.final_obs is not None
                final_obs = step.final_obs[0]
            moment = Moment(
                obs[0],
                shown_action(spec, action[0]),
                None if q is None else q[0],
                step.obs[0],
                final_obs,
                ret,
                len(returns) + 1,
                steps,
            )
            if not all([w.on_step(moment) for w in observers]):  # every observer sees it
                break
            if frame_s:
                next_frame += frame_s
                time.sleep(max(0.0, next_frame - time.perf_counter()))
            obs = step.obs
            if not done and o.max_episode_steps and length >= o.max_episode_steps:
                done, cut = True, cut + 1
                obs = env.reset(seed=o.seed + len(returns) + 1)  # the next episode, not this one
            if done:
                returns.append(ret)
                lengths.append(length)
                if o.within_steps:
                    returns_within.append(within)
                for w in observers:
                    w.on_episode(len(returns), ret, length)
                ret, length, within = 0.0, 0, 0.0
            if o.max_steps and steps >= o.max_steps:
                break
            if done and len(returns) < o.episodes:
                for w in observers:
                    w.on_reset(obs[0], len(returns) + 1)
        for w in observers:
            w.on_end(stopped)
    recording = next((w.recording for w in observers if w.recording is not None), None)
    return PlayResult(
        policy.backend, env_cfg.id, returns, steps, latencies, recording, lengths, cut,
        returns_within,
    )  # fmt: skip


# Environments play_together steps at once: enough for an evaluation's usual 5-10 episodes in
# one wave, few enough that eval.episodes = 1,000,000 builds 16 environments, not a million.
MAX_TOGETHER = 16


def play_together(policy: Policy, options: PlayOptions | None = None) -> PlayResult:
    """Play ``options.episodes`` episodes several at a time: waves of up to
    :data:`MAX_TOGETHER` environments, each wave's actions chosen by one batched forward pass
    per step, each environment's first episode counted (so long episodes count as much as short
    ones), the next wave reseeded after the last one's episodes all ended. This is what an
    evaluation plays, at a fraction of the CPU of one episode after another: the pass for ten
    observations costs about what one costs. No observers (nothing to record or show), and
    ``fps`` and ``max_steps`` are not used. Latencies are of the batched passes; fewer episodes
    come back when ``options.stop`` ended playing.

    Raises EnvError if ``options.env_id`` does not match what the policy was trained on.
    """
    o = options or PlayOptions()
    n = min(max(1, o.episodes), MAX_TOGETHER)
    env_cfg = _env_config(policy, o.env_id)
    env_cfg.num_envs = n  # one thread: an evaluation runs beside training, on its spare time
    rng = np.random.default_rng(o.seed)
    returns: list[float] = []
    lengths: list[int] = []
    latencies: list[int] = []
    returns_within: list[float] = []
    steps = cut = 0

    def result() -> PlayResult:
        return PlayResult(
            policy.backend, env_cfg.id, returns, steps, latencies, None, lengths, cut,
            returns_within,
        )  # fmt: skip

    spec = policy.spec
    with contextlib.closing(make_env(env_cfg)) as env:
        check_matches(policy, env, o.sample)
        while len(returns) < o.episodes:
            wave = min(n, o.episodes - len(returns))  # the first ``wave`` environments count
            obs = env.reset(seed=o.seed + len(returns))
            ret = np.zeros(n)
            within = np.zeros(n)
            length = np.zeros(n, dtype=np.int64)
            playing = np.arange(n) < wave  # still in its first episode, and counted
            was_cut = np.zeros(n, dtype=bool)
            while playing.any():
                if o.stop is not None and o.stop():
                    return result()
                t0 = time.perf_counter_ns()
                if o.sample:
                    actions = sampled_actions(policy.q_values(obs), rng)
                else:
                    actions = np.asarray(policy.act(obs), dtype=spec.action_dtype)
                latencies.append(time.perf_counter_ns() - t0)
                if o.epsilon > 0:
                    actions = explored(spec, actions, o.epsilon, rng)
                step = env.step(actions)
                steps += int(playing.sum())
                ret += np.where(playing, step.rewards, 0.0)
                within += np.where(playing & (length < o.within_steps), step.rewards, 0.0)
                length += playing
                ended = playing & (step.terminated | step.truncated)
                was_cut |= playing & step.truncated & ~step.terminated  # the game's own cap
                if o.max_episode_steps:
                    was_cut |= playing & ~ended & (length >= o.max_episode_steps)
                    ended |= was_cut
                playing &= ~ended
                obs = step.obs
                if o.progress is not None:
                    o.progress(len(returns) + wave - int(playing.sum()), steps)
            returns += [float(r) for r in ret[:wave]]
            lengths += [int(x) for x in length[:wave]]
            if o.within_steps:
                returns_within += [float(r) for r in within[:wave]]
            cut += int(was_cut.sum())
    return result()
