"""The Trainer: environments, replay and learner, in one loop that reads top to bottom.

Each iteration: one batched forward pass picks epsilon-greedy actions for all environments, the
environments step, the transitions go to the replay, and the pipeline makes exactly the updates
the learner's replay ratio asks for. Metrics, progress and checkpoints happen on wall-clock
intervals. The loop stops when ``train.steps`` is reached or a stop is requested (Ctrl-C,
SIGTERM): the step in flight finishes and a checkpoint is written.

A run directory is resumed from its newest valid checkpoint: network, target network, optimizer,
step and episode counts, the epsilon schedule position and every RNG, and (``replay.persist``)
the replay buffer as it was at that checkpoint, so learning continues at once at the same replay
ratio (see :mod:`edgerl.replay_store`). The episodes that were in flight are restarted; without a
saved replay, learning pauses until ``agent.learning_starts`` new steps have refilled it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgerl import __version__
from edgerl.atomic import write_atomic
from edgerl.checkpoint import CheckpointLostError, CheckpointStore, CheckpointWriteError, encode
from edgerl.config import Config, apply_presets, check_consistency, with_values
from edgerl.device import configure_backends, resolve_device
from edgerl.display.stream import DisplayPublisher, FrameMeta
from edgerl.dqn import DQN, epsilon_greedy
from edgerl.envs import EnvSpec, VecEnv, make_env, probe
from edgerl.errors import RunDirError
from edgerl.hooks import Hook
from edgerl.metrics import CSV_COLUMNS, ConsoleProgress, EpisodeWriter, MetricsWriter, TrainStats
from edgerl.nets import build_q_network
from edgerl.pipeline import Learning, make_learning
from edgerl.replay import (
    MemoryPlan,
    ReplayBuffer,
    available_memory,
    example_batch,
    plan_env_memory,
    plan_memory,
)
from edgerl.replay_store import ReplayFileError, ReplayStore, SaveJob
from edgerl.rundir import RunDir, default_run_dir
from edgerl.sidefiles import SideFiles
from edgerl.signals import StoppedDuringSetup

log = logging.getLogger(__name__)

RECENT_EPISODES = 100
PROGRESS_EVERY_S = 0.25
CHECKPOINT_RETRY_S = 60.0  # after a failed checkpoint (disk full), try again this soon
FINAL_RETRY_EVERY_S = 5.0  # the last checkpoint of a session is retried this often
CPU = torch.device("cpu")
# Config keys a resumed run must share with its checkpoint (they shape the network).
SHAPING_KEYS = ("env.id", "agent.hidden")


@dataclass(frozen=True)
class TrainResult:
    step: int
    total_steps: int
    episodes: int
    return_mean: float
    wall_s: float
    session_steps: int
    session_s: float
    checkpoint: Path | None
    stopped: bool  # a stop was requested before train.steps was reached

    def summary(self) -> str:
        """One line for the end of ``edgerl train``."""
        ret = "n/a" if math.isnan(self.return_mean) else f"{self.return_mean:.2f}"
        sps = self.session_steps / self.session_s if self.session_s > 0 else 0.0
        return (
            f"step {self.step:,}/{self.total_steps:,}: {self.episodes:,} episodes, "
            f"mean return (last 100) {ret}, {sps:,.0f} steps/s this session; "
            f"checkpoint {self.checkpoint or 'unchanged'}"
        )


def _integrated_gpu(device: torch.device) -> bool:
    """True for a CUDA GPU that shares the host's memory (a Jetson's)."""
    if device.type != "cuda":
        return False
    try:
        return bool(torch.cuda.get_device_properties(device).is_integrated)
    except Exception:  # an old torch without the field, or a driver problem: assume separate
        return False


def _nan(v: float | None) -> float:
    return math.nan if v is None else float(v)


class Trainer:
    """Owns the environments, replay, learner and run directory of one training run.

    Use as a context manager: ``with Trainer(cfg) as t: t.run()``. Entering builds everything and
    raises an EdgerlError subclass for anything the user can fix; leaving always releases the run
    directory and environments (and writes a checkpoint if the loop crashed). ``hooks`` follow
    the run (see :mod:`edgerl.hooks`); the Trainer is the :class:`~edgerl.hooks.Run` they read.
    """

    def __init__(
        self,
        cfg: Config,
        *,
        fresh: bool = False,
        hooks: list[Hook] | None = None,
        quiet: bool = False,
        side: SideFiles | None = None,
    ) -> None:
        self.requested_cfg = cfg
        self.side = side or SideFiles()
        self.fresh = fresh
        self.hooks = list(hooks or [])
        self.quiet = quiet
        self.cfg = cfg
        self.step = 0
        self.episodes = 0
        self.recent_returns: deque[float] = deque(maxlen=RECENT_EPISODES)
        self.last_checkpoint: Path | None = None
        self.checkpoint_error: str | None = None  # why the newest checkpoint attempt failed
        self.resumed_from: Path | None = None
        self.moved_aside: Path | None = None
        self.stats = TrainStats()
        self.learning: Learning | None = None  # the pipeline, while run() runs
        self.autotune: Any = None  # the autotune Choice, when perf.autotune ran
        self.display: DisplayPublisher | None = None
        self._stop_reason: str | None = None
        self._wall_before = 0.0
        self._session_start = time.monotonic()
        self._session_step0 = 0
        self._env: VecEnv | None = None
        self._rundir: RunDir | None = None
        self._metrics: MetricsWriter | None = None
        self._episodes_csv: EpisodeWriter | None = None
        self._progress: ConsoleProgress | None = None
        self._last_saved_step = -1
        self.replay_store: ReplayStore | None = None  # replay.persist
        self._pending: tuple[SaveJob, bytes, int] | None = None  # a checkpoint awaiting its replay

    # ----------------------------------------------------------------------------- set-up

    def __enter__(self) -> Trainer:
        try:
            self._open()
        except BaseException:
            self._close_resources()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        try:
            crashed = exc is not None and not isinstance(
                exc, (KeyboardInterrupt, RunDirError, CheckpointLostError)
            )
            if self._pending is not None:
                self._complete_checkpoint()
            if crashed and self._env is not None and self.step != self._last_saved_step:
                log.error("training loop failed (%s); writing a checkpoint before exiting", exc)
                self.save_checkpoint()
        finally:
            self._close_resources()

    def _open(self) -> None:
        cfg = self.requested_cfg
        spec = probe(cfg.env.id)
        cfg = apply_presets(cfg, spec.kind)
        check_consistency(cfg)
        self.spec = spec
        self.device = resolve_device(cfg.perf.device)
        replay_device = (
            self.device if cfg.replay.device == "auto" else resolve_device(cfg.replay.device)
        )
        available, where = available_memory(replay_device)
        replay_plan = plan_memory(spec, cfg.replay.capacity, available, where)
        replay_plan.check()
        self._check_env_memory(cfg, spec, replay_plan, replay_device)

        run_path = (
            Path(cfg.train.run_dir) if cfg.train.run_dir else default_run_dir(spec.short_name)
        )
        cfg = with_values(cfg, {"train.run_dir": str(run_path)})
        self.cfg = cfg
        self._rundir = RunDir(run_path)
        if self.fresh:
            self.moved_aside = self._rundir.move_aside()
            if self.moved_aside:
                log.info("--fresh: moved the previous run to %s", self.moved_aside)
        self._rundir.open(group=cfg.display.group)
        self.run_dir = run_path
        self.checkpoints = CheckpointStore(self._rundir.checkpoints, cfg.train.keep_checkpoints)
        found = self.checkpoints.newest_valid()
        if found is not None:
            self._check_compatible(found[1], found[0].path)

        self._check_stop()
        configure_backends(self.device, cfg.perf.threads)
        if cfg.perf.autotune:
            self.cfg = cfg = self._autotune(cfg, spec)
        seed = cfg.env.seed
        torch.manual_seed(seed)
        self.actor_rng = np.random.default_rng(seed)
        self.learner = DQN(
            build_q_network(spec, cfg.agent.hidden),
            cfg.agent,
            self.device,
            cfg.perf,
            total_steps=cfg.train.steps,
        )
        self.replay = ReplayBuffer(
            spec,
            cfg.replay.capacity,
            cfg.env.num_envs,
            replay_device,
            seed + 1,
            available,
            out_device=self.device,
        )
        if cfg.replay.persist:
            store = ReplayStore(self._rundir.path / "replay", self.replay)
            if store.check_disk(explicit="replay.persist" in cfg.explicit):
                self.replay_store = store
        if found is not None:
            self._restore(found[1])
            self.resumed_from = found[0].path
        self._check_stop()
        log.info("building %s environments of %s", f"{cfg.env.num_envs:,}", cfg.env.id)
        self._env = make_env(cfg.env, spec, self._check_stop)
        self._check_stop()
        config_toml = cfg.to_toml().encode()
        self.side.attempt(
            "config.toml", lambda: write_atomic(self._rundir.config_file, config_toml)
        )
        self.display = DisplayPublisher(cfg.display, run_path, spec)

    def _check_stop(self) -> None:
        """Abandon set-up if a stop was requested (nothing to save before the first step)."""
        if self._stop_reason is not None:
            raise StoppedDuringSetup(self._stop_reason)

    def _check_env_memory(
        self, cfg: Config, spec: EnvSpec, replay_plan: MemoryPlan, replay_device: torch.device
    ) -> None:
        """Refuse more environments than host memory holds (beside a host replay), before
        building any: too many would swap the board or get the trainer killed."""
        host = replay_device.type == "cpu"
        available = replay_plan.available_bytes if host else available_memory(CPU)[0]
        # A Jetson's GPU memory is the host's: a replay "on the GPU" takes from the same pool.
        shared = host or _integrated_gpu(replay_device)
        replay_bytes = replay_plan.total_bytes if shared else 0
        plan_env_memory(spec, cfg.env.num_envs, available, replay_bytes).check()

    def _autotune(self, cfg: Config, spec: EnvSpec) -> Config:
        """``cfg`` with env.num_envs and env.threads picked by measuring (perf.autotune)."""
        from edgerl.autotune import calibrate, table
        from edgerl.pipeline import resolve_pipeline

        if "env.num_envs" in cfg.explicit:
            log.info("autotune: env.num_envs=%d was set explicitly; keeping it", cfg.env.num_envs)
            return cfg
        mode = resolve_pipeline(cfg.perf.pipeline, self.device)
        log.info("autotune: measuring the actor and the learner (a few seconds)")
        choice, measurements, _ = calibrate(cfg, spec, self.device, mode)
        log.info("autotune measurements:\n%s", table(measurements))
        tuned = {"env.num_envs": choice.num_envs, "env.threads": choice.threads}
        if cfg.display.env_index >= choice.num_envs:
            tuned["display.env_index"] = 0
        cfg = with_values(cfg, tuned)
        check_consistency(cfg)
        self.autotune = choice
        log.info(
            "autotune: env.num_envs=%d, env.threads=%d: %s",
            choice.num_envs,
            choice.threads,
            choice.reason,
        )
        return cfg

    def _check_compatible(self, state: dict[str, Any], path: Path) -> None:
        old_env = state.get("env", {})
        old_cfg = state.get("config", {})
        for key in SHAPING_KEYS:
            section, name = key.split(".")
            old = old_cfg.get(section, {}).get(name)
            new = self.cfg.get(key)
            if isinstance(new, tuple):
                new = list(new)
            if key == "agent.hidden" and old_env.get("kind") != "vector":
                continue
            if old is not None and old != new:
                raise RunDirError(
                    f"run directory {self.run_dir} holds a run with {key}={old!r} "
                    f"({path.name}), not {new!r}; use another --run-dir, or --fresh to move "
                    "the old run aside"
                )

    def _restore(self, state: dict[str, Any]) -> None:
        self.learner.load_state_dict(state["learner"])
        self.step = int(state["step"])
        self.episodes = int(state["episodes"])
        self._wall_before = float(state["wall_s"])
        self.recent_returns.extend(float(r) for r in state["recent_returns"])
        rng = state["rng"]
        self.actor_rng.bit_generator.state = rng["actor"]
        self.replay.set_rng_state(rng["replay"])
        torch.set_rng_state(rng["torch"])
        if self.device.type == "cuda" and rng.get("cuda") is not None:
            with contextlib.suppress(RuntimeError):
                torch.cuda.set_rng_state(rng["cuda"], self.device)
        self._last_saved_step = self.step
        self._session_step0 = self.step
        restored = self._restore_replay(state.get("replay"))
        if restored is not None:
            log.info(
                "resuming from step %s (%s episodes) with the replay of that checkpoint "
                "(%s transitions); learning continues at once",
                f"{self.step:,}",
                f"{self.episodes:,}",
                f"{restored:,}",
            )
            return
        refill = min(self.cfg.agent.learning_starts, self.replay.capacity)
        self.learner.resume_at(self.step, refill)
        log.info(
            "resuming from step %s (%s episodes); learning continues after %s steps refill the "
            "replay",
            f"{self.step:,}",
            f"{self.episodes:,}",
            f"{self.learner.learn_from[0] - self.step:,}",
        )

    def _restore_replay(self, saved: dict[str, Any] | None) -> int | None:
        """Refill the replay from the checkpoint's replay files and continue the replay ratio
        where it was; the transitions restored, or None (empty replay, reason logged)."""
        if self.replay_store is None or not saved:
            if saved and not self.cfg.replay.persist:
                log.info("replay.persist is false: resuming with an empty replay")
            return None
        started = time.monotonic()
        try:
            restored = self.replay_store.restore(saved["manifest"])
        except ReplayFileError as e:
            log.warning("%s; resuming with an empty replay", e)
            return None
        if saved.get("train_freq") == self.cfg.agent.train_freq:
            # The replay ratio counts on from where it started: updates the async learner still
            # owed at the checkpoint are made at once.
            start_step, start_updates = saved["learn_from"]
            self.learner.learn_from = (int(start_step), int(start_updates))
        else:  # a new ratio counts from here
            self.learner.resume_at(self.step, 0)
        log.info("replay restored in %.1f s", time.monotonic() - started)
        return restored

    def _close_resources(self) -> None:
        for closer in (
            lambda: self.display and self.display.close(),
            lambda: self._progress and self._progress.close(),
            lambda: self._metrics and self._metrics.close(),
            lambda: self._episodes_csv and self._episodes_csv.close(),
            lambda: self._env and self._env.close(),
            lambda: self._rundir and self._rundir.close(),
        ):
            try:
                closer()
            except Exception:  # cleanup must go on
                log.exception("error while closing the trainer")

    # ----------------------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """Everything a checkpoint holds (plain types and tensors only)."""
        cuda_rng = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        return {
            "edgerl_version": __version__,
            "step": self.step,
            "episodes": self.episodes,
            "wall_s": self.wall_s(),
            "recent_returns": [float(r) for r in self.recent_returns],
            "learner": self.learner.state_dict(),
            "rng": {
                "actor": self.actor_rng.bit_generator.state,
                "replay": self.replay.rng_state(),
                "torch": torch.get_rng_state(),
                "cuda": cuda_rng,
            },
            "config": self.cfg.to_dict(),
            "env": self.spec.to_dict(),
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }

    def policy_snapshot(self) -> dict[str, Any]:
        """A CPU copy of the online network's weights with what rebuilds it, laid out as a
        checkpoint (``edgerl.play.TorchPolicy`` plays it); taken between updates."""
        paused = self.learning.paused() if self.learning is not None else contextlib.nullcontext()
        with paused, torch.no_grad():
            q = {k: v.detach().to(CPU, copy=True) for k, v in self.learner.q.state_dict().items()}
        return {
            "step": self.step,
            "env": self.spec.to_dict(),
            "config": self.cfg.to_dict(),
            "learner": {"q": q},
        }

    def wall_s(self) -> float:
        return self._wall_before + (time.monotonic() - self._session_start)

    @property
    def updates(self) -> int:
        return self.learner.updates

    def epsilon(self) -> float:
        return self.learner.epsilon(self.step)

    def return_mean(self) -> float:
        return float(np.mean(self.recent_returns)) if self.recent_returns else math.nan

    def write_problems(self) -> list[str]:
        return self.side.problems()

    def request_stop(self, reason: str) -> None:
        """Ask the loop to stop after the current step (safe from a signal handler)."""
        self._stop_reason = reason
        if self.learning is not None:
            self.learning.interrupt()

    @property
    def stop_requested(self) -> bool:
        return self._stop_reason is not None

    def add_hook(self, hook: Hook, first: bool = False) -> None:
        """Let ``hook`` follow the run (``first``: before the hooks given so far)."""
        self.hooks.insert(0 if first else len(self.hooks), hook)

    def reconfigure(self, cfg: Config) -> None:
        """Take a new config with changed live settings (the service's reload): the display
        and the hooks follow it."""
        self.cfg = cfg
        if self.display is not None:
            self.display.configure(cfg.display)
        for hook in self.hooks:
            hook.on_reconfigure(self, cfg)

    def save_checkpoint(self, background: bool = False) -> Path | None:
        """Write a checkpoint now; returns its path, or None if writing failed (logged).

        With a saved replay, the checkpoint file is written only once the replay files it names
        are on disk; ``background`` lets the actor go on meanwhile (returns None; the training
        loop finishes it with :meth:`_complete_checkpoint`).
        """
        if self._pending is not None:  # one replay save at a time, checkpoints in order
            self._complete_checkpoint()
        paused = self.learning.paused() if self.learning is not None else contextlib.nullcontext()
        job = None
        with paused:  # a consistent learner state, encoded in memory; the disk write is outside
            state = self.state_dict()
            if self.replay_store is not None:
                storing = self.learning.storing() if self.learning else contextlib.nullcontext()
                with storing:  # on CUDA: ordered after the actor's replay writes
                    job = self.replay_store.snapshot(self.step)
                state["replay"] = {
                    "manifest": job.result.manifest,
                    "learn_from": list(self.learner.learn_from),
                    "train_freq": self.cfg.agent.train_freq,
                }
            data = encode(state)
        if job is None:
            return self._write_checkpoint(data, self.step)
        self._pending = (job, data, self.step)
        if background:
            job.start()
            return None
        job.run()
        return self._complete_checkpoint()

    def _complete_checkpoint(self) -> Path | None:
        """Write the pending checkpoint once its replay save ended (waits for it)."""
        assert self._pending is not None and self.replay_store is not None
        job, data, step = self._pending
        job.wait()
        self._pending = None
        r = job.result
        if job.error is not None:
            # The checkpoint still names the replay it should have had: a resume says so.
            log.error("%s; checkpoint at step %s has no replay", job.error, f"{step:,}")
        else:
            log.info(
                "replay saved: %s slots, %.1f MB (%.1f MB raw) in %.2f s, actor paused %.1f ms",
                f"{r.slots:,}",
                r.bytes / 1e6,
                r.raw_bytes / 1e6,
                r.save_s,
                r.pause_s * 1e3,
            )
        path = self._write_checkpoint(data, step)
        if path is not None and job.error is None:
            self.replay_store.commit(job)
        self.replay_store.collect({c.step for c in self.checkpoints.files()})
        return path

    def _write_checkpoint(self, data: bytes, step: int) -> Path | None:
        try:
            path = self.checkpoints.save_encoded(data, step)
        except CheckpointWriteError as e:
            log.error("%s", e)
            self.checkpoint_error = str(e)
            for hook in self.hooks:
                hook.on_checkpoint(self, None, str(e))
            return None
        self.last_checkpoint = path
        self._last_saved_step = step
        self.checkpoint_error = None
        for hook in self.hooks:
            hook.on_checkpoint(self, path, None)
        return path

    # ----------------------------------------------------------------------------- the loop

    def run(self) -> TrainResult:
        """Train until ``train.steps`` or a stop request; returns a summary of the session."""
        assert self._env is not None
        cfg = self.cfg
        extra = [c for hook in self.hooks for c in hook.csv_columns if c not in CSV_COLUMNS]
        self._metrics = MetricsWriter(
            self.run_dir, CSV_COLUMNS + extra, cfg.train.tensorboard, side=self.side
        )
        self._episodes_csv = EpisodeWriter(self.run_dir, side=self.side)
        self._progress = ConsoleProgress(cfg.train.steps, self.step, quiet=self.quiet)
        self._session_start = time.monotonic()
        self._session_step0 = self.step
        total = cfg.train.steps
        if self.step >= total:
            log.info(
                "the run is already at step %s of %s: nothing to do", f"{self.step:,}", f"{total:,}"
            )
            self._progress.close()
            return self._result(stopped=False)

        remaining = (total - self.step) // cfg.agent.train_freq
        example = example_batch(self.spec, cfg.agent.batch_size, self.device)  # zeros: no RNG
        self.learner.prepare(example, remaining)  # CUDA graph or compile, now
        self.learning = make_learning(cfg.perf, self.learner, self.replay)
        log.info("learning: %s pipeline, update on %s", self.learning.mode, self.learner.describe())
        self.learning.start()
        if self.stop_requested:
            self.learning.interrupt()
        try:
            return self._loop(total)
        finally:
            self.learning.finish(drain=False)  # stops the learner thread on every exit path

    def _loop(self, total: int) -> TrainResult:
        assert self._env is not None and self._progress is not None
        assert self.learning is not None and self.display is not None
        assert self._episodes_csv is not None
        cfg, env, learning = self.cfg, self._env, self.learning
        clip = self.spec.has_frames  # Atari rewards are clipped for learning only
        obs = env.reset(seed=cfg.env.seed + self.step)
        with learning.storing() as replay:
            replay.add_first(obs)
        episode_returns = np.zeros(env.num_envs, dtype=np.float64)
        episode_lengths = np.zeros(env.num_envs, dtype=np.int64)
        shown = min(cfg.display.env_index, env.num_envs - 1)
        shown_episode = self.episodes + 1
        now = time.monotonic()
        last_tick = last_row = last_ckpt = now
        row_step = self.step
        started = False

        while self.step < total and not self.stop_requested:
            epsilon = self.learner.epsilon(self.step)
            q_values = learning.act(obs) if epsilon < 1.0 else None
            actions = epsilon_greedy(
                q_values, epsilon, self.spec.num_actions, len(obs), self.actor_rng
            )
            if self.display.due():
                q_shown = None if q_values is None else q_values[shown]
                self._show(
                    obs[shown], actions[shown], q_shown, shown_episode, episode_returns[shown]
                )
            result = env.step(actions)
            rewards = np.clip(result.rewards, -1.0, 1.0) if clip else result.rewards
            with learning.storing() as replay:
                replay.add(
                    actions,
                    rewards,
                    result.terminated,
                    result.truncated,
                    result.obs,
                    result.final_obs,
                )
            episode_returns += result.rewards
            episode_lengths += 1
            for i in np.flatnonzero(result.terminated | result.truncated):
                self.recent_returns.append(float(episode_returns[i]))
                self.episodes += 1
                self._episodes_csv.write(
                    self.step + env.num_envs,
                    self.episodes,
                    int(i),
                    float(episode_returns[i]),
                    int(episode_lengths[i]),
                    self.wall_s(),
                )
                episode_returns[i] = 0.0
                episode_lengths[i] = 0
                if i == shown:
                    shown_episode = self.episodes + 1
            self.step += env.num_envs
            learning.after_step(self.step)
            obs = result.obs

            if not started:
                started = True
                for hook in self.hooks:
                    hook.on_start(self)
            for hook in self.hooks:
                hook.on_step(self)
            now = time.monotonic()
            if now - last_tick >= PROGRESS_EVERY_S:
                last_tick = now
                self._refresh_stats(row_step, now - last_row)
                self._progress.update(self.stats)
                for hook in self.hooks:
                    hook.on_tick(self, self.stats)
            if now - last_row >= cfg.train.log_every_s:
                self._refresh_stats(row_step, now - last_row)
                self._write_row()
                last_row, row_step = now, self.step
            if self._pending is not None and self._pending[0].done:
                if self._complete_checkpoint() is None:  # retried soon, as below
                    retry_in = min(CHECKPOINT_RETRY_S, cfg.train.checkpoint_every_s)
                    last_ckpt = now - cfg.train.checkpoint_every_s + retry_in
            elif self._pending is None and now - last_ckpt >= cfg.train.checkpoint_every_s:
                path = self.save_checkpoint(background=True)  # None while its replay is saved
                saved = path is not None or self._pending is not None
                retry_in = min(CHECKPOINT_RETRY_S, cfg.train.checkpoint_every_s)
                last_ckpt = now if saved else now - cfg.train.checkpoint_every_s + retry_in
            cfg = self.cfg  # a live reload may have replaced it

        learning.finish(drain=self.step >= total)  # the last updates due, then the learner stops
        if not started:
            for hook in self.hooks:
                hook.on_start(self)
        for hook in self.hooks:
            hook.on_end(self)
        now = time.monotonic()
        self._refresh_stats(row_step, now - last_row)
        self._progress.update(self.stats)
        if self.step != row_step:
            self._write_row()
        if self._pending is not None:
            self._complete_checkpoint()
        if self.step != self._last_saved_step:
            self._final_checkpoint()
        self._progress.close()
        return self._result(stopped=self.stop_requested and self.step < total)

    def _final_checkpoint(self) -> None:
        """The session's last checkpoint, retried for ``train.final_checkpoint_retry_s`` (a full
        disk may get room); raises CheckpointLostError saying which steps are lost."""
        deadline = time.monotonic() + self.cfg.train.final_checkpoint_retry_s
        while self.save_checkpoint() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CheckpointLostError(self._lost_sentence())
            log.warning("retrying the last checkpoint for up to %.0f s more", left)
            wait_until = time.monotonic() + min(FINAL_RETRY_EVERY_S, left)
            while time.monotonic() < wait_until:
                time.sleep(min(PROGRESS_EVERY_S, max(0.0, wait_until - time.monotonic())))
                for hook in self.hooks:  # the service's watchdog and status go on meanwhile
                    hook.on_tick(self, self.stats)

    def _lost_sentence(self) -> str:
        error = self.checkpoint_error or "unknown error"
        seconds = self.cfg.train.final_checkpoint_retry_s
        since = self._last_saved_step
        if since < 0:
            lost = f"all {self.step:,} steps of this run are lost (no checkpoint was ever written)"
        else:
            lost = (
                f"steps {since:,} to {self.step:,} are lost and the next run resumes from step "
                f"{since:,}"
            )
        return (
            f"the last checkpoint could not be written within {seconds:g} s ({error}): {lost}; "
            "free space in the run directory and run again"
        )

    def _result(self, stopped: bool) -> TrainResult:
        return TrainResult(
            step=self.step,
            total_steps=self.cfg.train.steps,
            episodes=self.episodes,
            return_mean=self.return_mean(),
            wall_s=self.wall_s(),
            session_steps=self.step - self._session_step0,
            session_s=time.monotonic() - self._session_start,
            checkpoint=self.last_checkpoint,
            stopped=stopped,
        )

    def _show(
        self,
        frames: np.ndarray,
        action: int,
        q_values: np.ndarray | None,
        episode: int,
        episode_return: float,
    ) -> None:
        """Publish one frame for `edgerl view` (a copy into shared memory, never a wait)."""
        assert self.display is not None
        load = self.stats.load
        meta = FrameMeta(
            step=self.step,
            episode=episode,
            episode_return=float(episode_return),
            epsilon=self.learner.epsilon(self.step),
            action=int(action),
            sps=self.stats.sps,
            cpu_max_core=_nan(load.get("cpu_max_core")),
            gr3d=_nan(load.get("gr3d")),
            time=time.time(),
            q_values=() if q_values is None else tuple(float(q) for q in q_values),
        )
        self.display.publish(frames[-1], meta)

    def _refresh_stats(self, row_step: int, interval_s: float) -> None:
        s = self.stats
        s.step, s.total_steps, s.wall_s = self.step, self.cfg.train.steps, self.wall_s()
        s.sps = (self.step - row_step) / interval_s if interval_s > 0 else 0.0
        s.episodes, s.return_mean = self.episodes, self.return_mean()
        s.epsilon = self.learner.epsilon(self.step)
        s.updates = self.learner.updates
        s.learning_starts, s.fill_from = self.learner.learn_from[0], self._session_step0
        loss = self.learner.losses.peek()
        if not math.isnan(loss):  # no update since the last row: keep the last mean
            s.loss = loss

    def _write_row(self) -> None:
        assert self._metrics is not None and self._progress is not None
        self._metrics.write(self.stats)
        self._progress.log_line(self.stats)
        self.learner.losses.take()
