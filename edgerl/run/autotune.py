"""Auto-balance: how many environments keep the learner busy (the CPU/GPU ratio question).

A short calibration measures the actor (``env.num_envs`` environments stepping in ALE's threads
with one batched forward pass per step) for a few sizes and thread counts, and the learner's
updates per second. The learner needs ``agent.train_freq x updates/s`` env steps per second. The
predicted loop speed of each setting is

* async: ``min(actor, learner limit)`` (acting and learning overlap),
* sync: ``1 / (1/actor + 1/learner limit)`` (they take turns),

and the smallest number of environments within 5% of the best prediction wins: more environments
than that only cost memory (replay per env) and staleness.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from edgerl.config import Config, EnvConfig, with_values
from edgerl.envs import EnvSpec, make_env
from edgerl.hw.cpus import usable_cpus
from edgerl.memories.replay.sampling import example_batch
from edgerl.report.balance import predict

log = logging.getLogger(__name__)

SIZES = (1, 2, 4, 8, 16)
WITHIN = 0.95


@dataclass(frozen=True)
class ActorMeasurement:
    num_envs: int
    threads: int
    steps_per_s: float


@dataclass(frozen=True)
class Choice:
    num_envs: int
    threads: int
    predicted_steps_per_s: float
    limit_steps_per_s: float
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose(
    measurements: list[ActorMeasurement], updates_per_s: float, train_freq: int, mode: str
) -> Choice:
    """The smallest num_envs (then fewest threads) within 5% of the best predicted loop speed."""
    limit = train_freq * updates_per_s
    scored = [(predict(m.steps_per_s, limit, mode), m) for m in measurements]
    best = max(s for s, _ in scored)
    good = sorted((m.num_envs, m.threads, s) for s, m in scored if s >= WITHIN * best)
    n, threads, predicted = good[0]
    fastest_actor = max(m.steps_per_s for m in measurements)
    if fastest_actor < limit:
        why = (
            f"the actor is the limit: at most {fastest_actor:,.0f} env steps/s against the "
            f"{limit:,.0f} the learner could use ({updates_per_s:,.1f} updates/s x "
            f"train_freq {train_freq})"
        )
    else:
        why = (
            f"the learner is the limit ({updates_per_s:,.1f} updates/s x train_freq "
            f"{train_freq} = {limit:,.0f} env steps/s); {n} environment(s) with {threads} "
            f"thread(s) predict {predicted:,.0f} steps/s in the {mode} loop, within 5% of the "
            f"best"
        )
    return Choice(n, threads, round(predicted, 1), round(limit, 1), why)


def measure_actor(
    env_cfg: EnvConfig, net: torch.nn.Module, device: torch.device, seconds: float, seed: int = 0
) -> float:
    """Env steps/s of stepping ``env_cfg.num_envs`` envs with one batched forward per step."""
    env = make_env(env_cfg)
    try:
        obs = env.reset(seed=seed)
        steps, deadline = 0, None
        for i in range(1_000_000):
            with torch.no_grad():
                q = net(torch.as_tensor(obs, device=device))
            env.send(q.argmax(dim=1).cpu().numpy())
            obs = env.recv().obs
            if i == 2:  # start the clock after the first steps (allocations, thread start-up)
                deadline = time.perf_counter() + seconds
                started, steps = time.perf_counter(), 0
            steps += env.num_envs
            if deadline is not None and time.perf_counter() >= deadline:
                return steps / (time.perf_counter() - started)
        raise AssertionError("unreachable")
    finally:
        env.close()


def measure_updates(learner: Any, spec: EnvSpec, batch_size: int, seconds: float) -> float:
    """Updates/s of ``learner`` on random batches of the training shape (its weights change)."""
    dev = learner.device
    batch = example_batch(spec, batch_size, dev, random=True)
    for _ in range(3):
        learner.update(batch)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds or n < 3:
        learner.update(batch)
        n += 1
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return n / (time.perf_counter() - started)


def calibrate(
    cfg: Config,
    spec: EnvSpec,
    device: torch.device,
    mode: str,
    seconds: float = 0.5,
    sizes: tuple[int, ...] = SIZES,
) -> tuple[Choice, list[ActorMeasurement], float]:
    """Measure and choose; returns (choice, actor measurements, learner updates/s)."""
    from edgerl.learners.factory import build_learner

    learner = build_learner(cfg, spec, device)
    actor_net = copy.deepcopy(learner.policy.net).eval()
    cpus = usable_cpus()
    measurements = []
    for n in sizes:
        for threads in sorted({1, min(n, cpus)}):
            env_cfg = dataclasses.replace(cfg.env, num_envs=n, threads=threads)
            sps = measure_actor(env_cfg, actor_net, device, seconds)
            measurements.append(ActorMeasurement(n, threads, round(sps, 1)))
            log.debug("autotune: %d envs, %d threads: %.0f steps/s", n, threads, sps)
    ups = measure_updates(learner, spec, cfg.agent.batch_size, max(seconds * 2, 1.0))
    choice = choose(measurements, ups, cfg.agent.train_freq, mode)
    return choice, measurements, ups


def table(measurements: list[ActorMeasurement]) -> str:
    rows = [
        f"{m.num_envs:>3d} envs x {m.threads} threads: {m.steps_per_s:>8,.0f} steps/s"
        for m in measurements
    ]
    return "\n".join(rows)


def autotune_config(
    cfg: Config, spec: EnvSpec, device: torch.device
) -> tuple[Config, Choice | None]:
    """``cfg`` with env.num_envs and env.threads picked by measuring (perf.autotune), and the
    choice; ``cfg`` itself and None when env.num_envs was set explicitly."""
    from edgerl.run.pipeline import resolve_pipeline

    if "env.num_envs" in cfg.explicit:
        log.info("autotune: env.num_envs=%d was set explicitly; keeping it", cfg.env.num_envs)
        return cfg, None
    mode = resolve_pipeline(cfg.perf.pipeline, device)
    log.info("autotune: measuring the actor and the learner (a few seconds)")
    choice, measurements, _ = calibrate(cfg, spec, device, mode)
    log.info("autotune measurements:\n%s", table(measurements))
    tuned = {"env.num_envs": choice.num_envs, "env.threads": choice.threads}
    if cfg.display.env_index >= choice.num_envs:
        tuned["display.env_index"] = 0
    cfg = with_values(cfg, tuned)  # the trainer checks the config it settles on
    log.info(
        "autotune: env.num_envs=%d, env.threads=%d: %s",
        choice.num_envs,
        choice.threads,
        choice.reason,
    )
    return cfg, choice
