"""What every export shares: the sidecar, real observations, agreement with PyTorch, latency."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from edgerl.config import EnvConfig
from edgerl.envs import make_env, random_actions


def slug(text: str) -> str:
    """``NVIDIA Jetson AGX Orin`` -> ``jetson-agx-orin`` (for file names)."""
    s = re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")
    return re.sub(r"^nvidia-", "", s) or "unknown"


def collect_observations(
    env_config: dict[str, Any], count: int = 96, seed: int = 0, every: int = 5
) -> np.ndarray:
    """``count`` real observations from the game, one every ``every`` random-action steps."""
    cfg = EnvConfig(**{k: v for k, v in env_config.items() if k in EnvConfig.__annotations__})
    cfg.num_envs, cfg.threads = 1, 1
    env = make_env(cfg)
    rng = np.random.default_rng(seed)
    try:
        obs = env.reset(seed=seed)
        out = []
        step = 0
        while len(out) < count:
            if step % every == 0:
                out.append(obs[0].copy())
            obs = env.step(random_actions(env.spec, 1, rng)).obs
            step += 1
        return np.stack(out)
    finally:
        env.close()


@dataclass(frozen=True)
class Agreement:
    """How closely an exported policy matches PyTorch on the same observations."""

    max_abs_diff: float
    tolerance: float
    actions_equal: int
    near_ties: int  # differing actions whose Q-values PyTorch itself puts within the tolerance
    total: int
    outputs: str = "Q"  # what the network outputs (outputs_of): what the difference is of

    @property
    def ok(self) -> bool:
        return (
            self.max_abs_diff <= self.tolerance
            and self.actions_equal + self.near_ties == self.total
        )

    def describe(self) -> str:
        return (
            f"max |d{self.outputs if self.outputs == 'Q' else ' ' + self.outputs}| "
            f"{self.max_abs_diff:.2e} (tolerance {self.tolerance:.1e}), actions "
            f"{self.actions_equal}/{self.total} equal"
            + (f", {self.near_ties} near-ties" if self.near_ties else "")
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2, "int8": 1e-1}  # relative to max(1, max |Q|)


def compare(
    reference_q: np.ndarray,
    q: np.ndarray,
    actions: np.ndarray,
    precision: str = "fp32",
    continuous: bool = False,
    outputs: str = "Q",
) -> Agreement:
    """Compare Q-values and greedy actions with PyTorch's; for a ``continuous`` game the
    network's outputs are the actions, and an action is equal when each of its numbers is
    within the tolerance of PyTorch's."""
    scale = max(1.0, float(np.abs(reference_q).max()))
    tol = TOLERANCE[precision] * scale
    diff = float(np.abs(reference_q - q.astype(np.float64)).max())
    if continuous:
        off = np.abs(actions.reshape(reference_q.shape).astype(np.float64) - reference_q)
        close = off.max(axis=1) <= tol
        return Agreement(diff, tol, int(close.sum()), 0, len(reference_q), outputs)
    ref_actions = reference_q.argmax(axis=1)
    equal = actions.reshape(-1) == ref_actions
    ties = 0
    for i in np.flatnonzero(~equal):
        a = int(actions.reshape(-1)[i])
        if 0 <= a < reference_q.shape[1] and reference_q[i].max() - reference_q[i, a] <= tol:
            ties += 1
    return Agreement(diff, tol, int(equal.sum()), ties, len(ref_actions), outputs)


def outputs_of(policy: Any) -> str:
    """What a torch policy's network outputs, as its agreement names them: ``Q`` (Q-values),
    ``logits`` (a policy that samples its actions), ``actions`` (a continuous game's)."""
    if policy.spec.continuous:
        return "actions"
    return "logits" if policy.samples else "Q"


def check_agreement(
    policy: Any,
    obs: np.ndarray,
    reference_q: np.ndarray,
    precision: str = "fp32",
    outputs: str = "Q",
) -> Agreement:
    """Run ``policy`` on ``obs`` and compare with PyTorch's outputs ``reference_q`` (what they
    are: ``outputs``, of :func:`outputs_of`).

    The observations go in chunks of at most the policy's ``batch_max`` (a TensorRT engine
    accepts no larger batch than its optimisation profile's maximum; None: no limit).
    """
    limit = getattr(policy, "batch_max", None) or len(obs)
    q_values, actions = [], []
    for start in range(0, len(obs), limit):
        chunk = obs[start : start + limit]
        q_values.append(policy.q_values(chunk))
        actions.append(policy.act(chunk))
    continuous = policy.spec.continuous
    q, a = np.concatenate(q_values), np.concatenate(actions)
    return compare(reference_q, q, a, precision, continuous, outputs)


def latency_us(
    act: Callable[[np.ndarray], Any], obs: np.ndarray, runs: int = 300, warmup: int = 30
) -> dict[str, float]:
    """Per-call latency of ``act`` on single observations: p50, p99, max in microseconds."""
    one = obs[:1]
    for _ in range(warmup):
        act(one)
    times = []
    for i in range(runs):
        x = obs[i % len(obs) : i % len(obs) + 1]
        t = time.perf_counter_ns()
        act(x)
        times.append(time.perf_counter_ns() - t)
    lat = np.asarray(times, dtype=np.float64) / 1000
    return {
        "p50": round(float(np.percentile(lat, 50)), 1),
        "p99": round(float(np.percentile(lat, 99)), 1),
        "max": round(float(lat.max()), 1),
    }
