"""The measurements of ``edgerl bench``: each stage alone, the learner alone, the actor alone and
the whole loop, each a function returning plain figures (:mod:`edgerl.measure.bench` runs and
reports
them).

Host time is what scales from a desktop to a Jetson's slower cores, so the actor and learner
figures come with the CPU time of the thread doing the work: the actor loop's thread per env step
(emulation runs in ALE's own threads and is not in it), the learner's thread per update (on a GPU
that is launching work, on a CPU the update itself).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

from edgerl.config import Config, EnvConfig
from edgerl.config.sections import MAX_STEPS
from edgerl.envs import EnvSpec, Step, VecEnv, make_env
from edgerl.hw.monitor import LoadMonitor
from edgerl.learners.dqn import DQN
from edgerl.learners.factory import build_learner
from edgerl.learners.kinds import acting_learner, modes_learner
from edgerl.learners.nets import NatureCNN
from edgerl.memories.replay.sampling import example_batch
from edgerl.report.balance import BalanceSample, cpu_gpu_ratio
from edgerl.report.hooks import Hook, Run

MIN_WINDOW_UPDATES = 3  # a loop's window holds at least this many updates
START_TIMEOUT_S = 600.0  # a loop that never reaches its window is reported, not waited for
ACTOR_WINDOWS = 3  # the actor and the raw env take turns, this many windows each
ACTOR_EPSILON = 0.01  # the actor alone explores as at the end of exploration
POWER_SAMPLE_MS = 200  # the power of a loop's window is sampled this often


def thread_cpu_s(native_id: int) -> float:
    """CPU seconds (user + system) of this process's thread ``native_id`` so far."""
    for t in psutil.Process().threads():
        if t.id == native_id:
            return t.user_time + t.system_time
    return float("nan")


class RawEnvWindows:
    """The raw vector env, random actions, stepped for a window at a time (its own speed)."""

    def __init__(self, env_cfg: EnvConfig) -> None:
        self.env = make_env(env_cfg)
        self.num_envs = env_cfg.num_envs
        self.env.reset(seed=0)
        rng = np.random.default_rng(0)
        self.actions = rng.integers(self.env.spec.num_actions, size=(64, self.num_envs))
        self.i = 0
        self.window(0.0)  # a few steps of warm-up

    def window(self, seconds: float) -> tuple[int, float]:
        """Step for ``seconds`` (at least 3 vector steps); returns (env steps, seconds)."""
        n, started = 0, time.perf_counter()
        while n < 3 or time.perf_counter() - started < seconds:
            self.env.step(self.actions[self.i % 64])
            self.i, n = self.i + 1, n + 1
        return n * self.num_envs, time.perf_counter() - started

    def close(self) -> None:
        self.env.close()


def env_steps_per_s(env_cfg: EnvConfig, seconds: float) -> float:
    """Env steps/s of the vector env alone, random actions (the emulator's own speed)."""
    raw = RawEnvWindows(env_cfg)
    try:
        steps, elapsed = raw.window(seconds)
        return steps / elapsed
    finally:
        raw.close()


def forwards_per_s(
    net: torch.nn.Module,
    obs_shape: tuple[int, ...],
    obs_dtype: str,
    batch: int,
    device: torch.device,
    seconds: float,
) -> float:
    dtype = getattr(torch, obs_dtype)
    x = torch.zeros((batch, *obs_shape), dtype=dtype, device=device)
    with torch.no_grad():
        for _ in range(3):
            net(x).argmax(dim=1).cpu()
        n, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            net(x).argmax(dim=1).cpu()  # the host copy is part of picking actions
            n += 1
    return n / (time.perf_counter() - started)


def update_variants(
    device: torch.device, compile_variant: bool = False
) -> dict[str, dict[str, Any]]:
    """The update configurations worth comparing on this device."""
    variants: dict[str, dict[str, Any]] = {
        "eager": {"amp": "off", "cuda_graphs": "off", "channels_last": False},
        "channels_last": {"amp": "off", "cuda_graphs": "off", "channels_last": True},
    }
    if device.type == "cpu" and compile_variant:
        variants["compiled"] = {
            "amp": "off",
            "cuda_graphs": "off",
            "channels_last": True,
            "compile": True,
        }
    if device.type == "cuda":
        variants["amp"] = {"amp": "auto", "cuda_graphs": "off", "channels_last": True}
        variants["cuda_graph"] = {"amp": "off", "cuda_graphs": "on", "channels_last": True}
        variants["amp+cuda_graph"] = {"amp": "auto", "cuda_graphs": "auto", "channels_last": True}
    return variants


def make_learner(cfg: Config, spec: EnvSpec, device: torch.device, variant: dict[str, Any]) -> DQN:
    """The learner whose update runs in modes (:func:`~edgerl.learners.kinds.modes_learner`:
    the configured one where it does) with the update variant's precision, graph and layout
    settings: the stage table compares its update, whichever learner is configured."""
    perf = dataclasses.replace(
        cfg.perf, amp=variant["amp"], cuda_graphs=variant["cuda_graphs"], compile="off"
    )
    agent = dataclasses.replace(cfg.agent, algo=modes_learner(cfg.agent.algo))
    learner = build_learner(dataclasses.replace(cfg, agent=agent, perf=perf), spec, device)
    assert isinstance(learner, DQN)
    if isinstance(learner.q, NatureCNN) and not variant["channels_last"]:
        learner.q.use_channels_last(False)
        learner.target.use_channels_last(False)
    if variant.get("compile"):
        learner.fast.compile_setting = "on"
        learner.fast.maybe_compile(0, example_batch(spec, cfg.agent.batch_size, device, True))
    return learner


def measure_update_variant(
    cfg: Config, spec: EnvSpec, device: torch.device, variant: dict[str, Any], seconds: float
) -> float:
    """Updates/s of one variant on a fixed random batch (the update alone, no sampling)."""
    from edgerl.run.autotune import measure_updates

    learner = make_learner(cfg, spec, device, variant)
    return measure_updates(learner, spec, cfg.agent.batch_size, seconds)


CYCLE_POLL_S = 0.005  # how often a window's edge looks for the end of a rollout's learning


def at_cycle_end(trainer: Any, deadline: float) -> None:
    """Return as a learner that learns from whole rollouts (it counts them: PQN, PPO) has
    just finished learning from one, so that a window opened and closed so holds whole
    rollouts: counted in the env steps of the rollouts done inside a fixed window, a loop's
    figure moved by a whole rollout at once (4,096 steps: 205 steps/s over 20 s). A learner
    that counts no rollouts (DQN learns every few steps) returns at once, as does one still
    on the same rollout at ``deadline``."""
    counted = rollouts_of(trainer.learner)
    if counted is None:
        return
    while rollouts_of(trainer.learner) == counted and time.monotonic() < deadline:
        time.sleep(CYCLE_POLL_S)


def rollouts_of(learner: Any) -> int | None:
    """How many rollouts ``learner`` has learned from; None for one that counts none."""
    counted = getattr(learner, "rollouts", None)
    return counted if isinstance(counted, int) else None


def _trainer_window(
    cfg: Config, seconds: float, ready: Callable[[Any], bool], min_updates: int
) -> dict[str, Any]:
    """Run the real trainer and measure a window of ``seconds`` once ``ready(trainer)``; returns
    the window's steps/s and the loop thread's CPU time per env step, plus the learner's busy
    time and updates (``timed_out`` when the window never opened). For a learner of whole
    rollouts the window runs from the end of one rollout's learning to the end of another's
    (:func:`at_cycle_end`, seen within a few milliseconds) and its steps are those rollouts'."""
    from edgerl.run.train import Trainer

    workdir = Path(tempfile.mkdtemp(prefix="edgerl-bench-"))
    cfg.train.run_dir = str(workdir / "run")
    loop_thread = threading.get_native_id()
    window: dict[str, float] = {}
    balance: dict[str, BalanceSample] = {}
    # The machine's power through the window, where it reports any (edgerl.hw.energy); no files.
    power = LoadMonitor(dataclasses.replace(cfg.hw, monitor_interval_ms=POWER_SAMPLE_MS))
    try:
        with power, Trainer(cfg, quiet=True) as trainer:

            def mark(key: str) -> None:
                window[f"joules{key}"] = power.energy.joules
                window[f"power_samples{key}"] = power.energy.samples
                if trainer.learning is not None:
                    balance[key] = trainer.learning.balance_sample()
                window[f"step{key}"] = trainer.step
                window[f"t{key}"] = time.perf_counter()
                window[f"cpu{key}"] = thread_cpu_s(loop_thread)
                learning = trainer.learning
                window[f"busy{key}"] = learning.busy_s if learning else 0.0
                window[f"host{key}"] = learning.host_s if learning else 0.0
                window[f"act{key}"] = learning.act_s if learning else 0.0
                window[f"updates{key}"] = trainer.learner.updates
                rollouts = rollouts_of(trainer.learner)
                if rollouts is not None:
                    window[f"rollouts{key}"] = rollouts
                    window["rollout_steps"] = trainer.learner.steps_per_unit

            def stop_later() -> None:
                deadline = time.monotonic() + START_TIMEOUT_S
                while not ready(trainer) and time.monotonic() < deadline:
                    time.sleep(0.01)
                if not ready(trainer):
                    window["timed_out"] = 1.0
                    trainer.request_stop("bench")
                    return
                at_cycle_end(trainer, deadline)
                mark("0")
                time.sleep(seconds)
                # On a loaded machine a short window can hold no update at all: a figure from
                # it would say nothing, so the window lasts until it holds a few.
                while trainer.learner.updates - window["updates0"] < min_updates:
                    time.sleep(0.05)
                at_cycle_end(trainer, time.monotonic() + START_TIMEOUT_S)
                mark("1")
                trainer.request_stop("bench")

            timer = threading.Thread(target=stop_later, daemon=True)
            timer.start()
            trainer.run()
            timer.join()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if "timed_out" in window:
        return {"timed_out": True}
    elapsed = window["t1"] - window["t0"]
    moved = window["step1"] - window["step0"]
    steps = moved  # what the loop's counter moved; whole rollouts where it learns by them
    if "rollouts1" in window and window["rollouts1"] > window["rollouts0"]:
        steps = (window["rollouts1"] - window["rollouts0"]) * window["rollout_steps"]
    updates = window["updates1"] - window["updates0"]
    ratio, busy = math.nan, (window["busy1"] - window["busy0"]) / elapsed
    if len(balance) == 2:  # the learner's time as the balance counts it: its device's included
        ratio = cpu_gpu_ratio(balance["0"], balance["1"])
        counted = balance["1"].learner_busy_s - balance["0"].learner_busy_s
        if not math.isnan(counted):
            busy = counted / (balance["1"].wall - balance["0"].wall)
    measured_power = window["power_samples1"] - window["power_samples0"] >= 2
    joules = window["joules1"] - window["joules0"] if measured_power else math.nan
    return {
        "steps_per_s": steps / elapsed,
        "joules_per_env_step": joules / max(1, steps),
        "host_us_per_env_step": 1e6 * (window["cpu1"] - window["cpu0"]) / max(1, steps),
        "learner_busy": min(1.0, busy),
        "cpu_gpu_ratio": ratio,
        "learner_host_s": window["host1"] - window["host0"],
        "busy_s": window["busy1"] - window["busy0"],
        "act_s": window["act1"] - window["act0"],
        "steps": int(steps),
        "counted_steps": int(moved),
        "updates": int(updates),
    }


@contextlib.contextmanager
def trainer_logs_quiet() -> Iterator[None]:
    """Around a trainer that only stands in for a stage: its INFO lines (the display stream for
    edgerl view, the learning pipeline, a new run) would read as if the bench were training.
    Warnings still show, and --debug shows everything."""
    logger = logging.getLogger("edgerl")
    before = logger.level
    if logger.getEffectiveLevel() > logging.DEBUG:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(before)


class Alternating(Hook):
    """In the training loop's thread, once ``warm`` env steps are taken: a window of the actor
    (the loop running), then a window of the same length of the raw env (the loop waiting),
    ``windows`` times each; then a stop. A change in the machine's load between windows weighs
    on both figures alike, where one measured after the other could read 178%."""

    def __init__(self, raw: RawEnvWindows, window_s: float, windows: int, warm: int) -> None:
        self.raw, self.window_s, self.windows, self.warm = raw, window_s, windows, warm
        self.actor_steps = self.raw_steps = self.done = 0
        self.actor_s = self.raw_s = self.actor_cpu_s = 0.0
        self.mark: tuple[float, int, float] | None = None  # the actor window's start
        self.stop: Callable[[str], None] = lambda reason: None

    def on_step(self, run: Run) -> None:
        if self.done >= self.windows or run.step < self.warm:
            return
        now = time.perf_counter()
        if self.mark is None:
            self.mark = (now, run.step, time.thread_time())
            return
        t0, step0, cpu0 = self.mark
        if now - t0 < self.window_s:
            return
        self.actor_cpu_s += time.thread_time() - cpu0
        self.actor_steps += run.step - step0
        self.actor_s += now - t0
        steps, seconds = self.raw.window(self.window_s)
        self.raw_steps += steps
        self.raw_s += seconds
        self.done += 1
        if self.done >= self.windows:
            self.stop("bench")
        self.mark = (time.perf_counter(), run.step, time.thread_time())


def actor_loop(
    cfg: Config, num_envs: int, threads: int, seconds: float, windows: int = ACTOR_WINDOWS
) -> dict[str, Any]:
    """The actor alone: the real trainer acting as it does once learning runs (a forward pass
    for every step, epsilon ``ACTOR_EPSILON``) and storing every step, with no update ever
    owed, and with everything it does in the background (display stream, load monitor,
    status), against the raw vector env with the same environments and threads, in
    alternating windows of ``seconds / windows`` each (``seconds`` of each in all)."""
    from edgerl.run.train import Trainer

    env_cfg = dataclasses.replace(cfg.env, num_envs=num_envs, threads=threads)
    cfg = dataclasses.replace(
        cfg,
        env=env_cfg,
        # The actor alone: a learner whose updates are never due (acting_learner: the configured
        # one where it learns from a replay); acting from the first step, as after the replay
        # filled (at epsilon 1 no forward pass runs, and on a GPU the act's round trip was left
        # out of the figure).
        agent=dataclasses.replace(
            cfg.agent,
            algo=acting_learner(cfg.agent.algo),
            learning_starts=0,
            train_freq=MAX_STEPS,
            eps_start=ACTOR_EPSILON,
            eps_end=ACTOR_EPSILON,
        ),
        train=dataclasses.replace(cfg.train, steps=10**12),
        display=dataclasses.replace(cfg.display, enabled=True, env_index=0),
        hw=dataclasses.replace(cfg.hw, monitor=True),
    )
    out: dict[str, Any] = {"num_envs": num_envs, "threads": threads, "windows": windows}
    workdir = Path(tempfile.mkdtemp(prefix="edgerl-bench-"))
    cfg.train.run_dir = str(workdir / "run")
    raw = RawEnvWindows(env_cfg)
    turns = Alternating(raw, seconds / windows, windows, warm=20 * num_envs)
    try:
        with trainer_logs_quiet(), Trainer(cfg, quiet=True, hooks=[turns]) as trainer:
            turns.stop = trainer.request_stop
            give_up = threading.Timer(START_TIMEOUT_S + 2 * seconds, trainer.request_stop, ["late"])
            give_up.daemon = True
            give_up.start()
            try:
                trainer.run()
            finally:
                give_up.cancel()
        host_us = loop_host_work(cfg, num_envs)
    finally:
        raw.close()
        shutil.rmtree(workdir, ignore_errors=True)
    if turns.done < windows:
        return {**out, "timed_out": True}
    actor, env_only = turns.actor_steps / turns.actor_s, turns.raw_steps / turns.raw_s
    return {
        **out,
        "window_s": round(seconds / windows, 2),
        "raw_steps_per_s": env_only,
        "steps_per_s": actor,
        "share_of_raw": actor / env_only if env_only > 0 else float("nan"),
        "thread_us_per_env_step": 1e6 * turns.actor_cpu_s / max(1, turns.actor_steps),
        "host_us_per_env_step": host_us,
    }


class RecordedEnv(VecEnv):
    """A stand-in vector env replaying steps recorded from the real game, at once: timing the
    training loop with it leaves the loop's own host work (for :func:`loop_host_work`)."""

    def __init__(self, cfg: EnvConfig, spec: EnvSpec, check_stop: Any = None) -> None:
        real = make_env(cfg, spec)
        try:
            self.spec, self.num_envs = real.spec, real.num_envs
            self._first = real.reset(seed=0)
            rng = np.random.default_rng(0)
            self._steps = [
                real.step(rng.integers(spec.num_actions, size=cfg.num_envs)) for _ in range(64)
            ]
        finally:
            real.close()
        self._i = 0

    def reset(self, seed: int) -> np.ndarray:
        return self._first

    def send(self, actions: np.ndarray) -> None:
        self._i += 1

    def recv(self) -> Step:
        return self._steps[self._i % len(self._steps)]

    def close(self) -> None:
        pass


def loop_host_work(cfg: Config, num_envs: int, steps_per_env: int = 2_000) -> float:
    """Host CPU microseconds per env step of the training loop itself, acting at epsilon 1 with
    everything it does in the background (display stream, load monitor, status), on recorded
    steps instead of the emulator (its CPU time is the thread's, emulation excluded)."""
    from edgerl.run.train import Trainer

    marks: dict[int, float] = {}
    start, end = 100 * num_envs, (100 + steps_per_env) * num_envs

    class Marks(Hook):
        def on_step(self, run: Any) -> None:
            for at in (start, end):
                if run.step >= at and at not in marks:
                    marks[at] = time.thread_time()

    cfg = dataclasses.replace(
        cfg,
        env=dataclasses.replace(cfg.env, num_envs=num_envs, batch_size=0),
        agent=dataclasses.replace(
            cfg.agent, algo=acting_learner(cfg.agent.algo), learning_starts=10**12
        ),
        train=dataclasses.replace(cfg.train, steps=end + num_envs),
        display=dataclasses.replace(cfg.display, enabled=True, env_index=0),
        hw=dataclasses.replace(cfg.hw, monitor=True),
    )
    workdir = Path(tempfile.mkdtemp(prefix="edgerl-bench-"))
    cfg.train.run_dir = str(workdir / "run")
    try:
        with (
            trainer_logs_quiet(),
            Trainer(cfg, quiet=True, hooks=[Marks()], make_envs=RecordedEnv) as trainer,
        ):
            trainer.run()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1e6 * (marks[end] - marks[start]) / (end - start)


def whole_loop(cfg: Config, mode: str, num_envs: int, seconds: float) -> dict[str, Any]:
    """The real trainer for ``seconds`` once learning has started; steady-state figures."""
    cfg = dataclasses.replace(
        cfg,
        env=dataclasses.replace(cfg.env, num_envs=num_envs),
        perf=dataclasses.replace(cfg.perf, pipeline=mode),
        train=dataclasses.replace(cfg.train, steps=10**12),
    )
    # The window opens once learning runs (a few updates made: the first ones pay for warm-up),
    # and is read from the trainer's own counters.
    out = _trainer_window(
        cfg, seconds, lambda t: t.learner.updates >= MIN_WINDOW_UPDATES, MIN_WINDOW_UPDATES
    )
    if out.get("timed_out"):
        return {"mode": mode, "num_envs": num_envs, "timed_out": True}
    updates = out["updates"]
    return {
        "mode": mode,
        "num_envs": num_envs,
        "steps_per_s_raw": out["steps_per_s"],
        "steps_per_s": round(out["steps_per_s"], 1),
        "learner_busy": round(out["learner_busy"], 3),
        "cpu_gpu_ratio": None
        if math.isnan(out["cpu_gpu_ratio"])
        else round(out["cpu_gpu_ratio"], 3),
        # the machine's reported power over the window per env step (None: no power source)
        "mj_per_env_step": None
        if math.isnan(out["joules_per_env_step"])
        else round(1000 * out["joules_per_env_step"], 4),
        "updates": updates,
        "ms_per_update_in_loop": round(1000 * out["busy_s"] / updates, 2) if updates else None,
        "host_us_per_env_step": round(out["host_us_per_env_step"], 1),
        # Where a step's wall time went: acting, learning (on the loop's thread in sync mode,
        # beside it in async), and the rest (waiting for the emulator, the loop's own work).
        "us_per_env_step": round(1e6 / out["steps_per_s"], 1) if out["steps_per_s"] else None,
        "act_us_per_env_step": round(1e6 * out["act_s"] / max(1, out["steps"]), 1),
        "learn_us_per_env_step": round(1e6 * out["busy_s"] / max(1, out["steps"]), 1),
    }
