"""The Trainer: environments, the learner and its memory, in one loop that reads top to bottom
(the stepping itself in :mod:`edgerl.run.acting`, or :mod:`edgerl.run.remote` with remote actors).

Each iteration: one batched forward pass picks the learner's policy's actions for all environments
and they start their step; while ALE's threads emulate it, the step before it goes to the learner's
memory (DQN's replay, PQN's rollout), the pipeline makes exactly the learning the learner asks for
(DQN: its replay ratio's updates) and the viewer's frame is published. The host work per step is a
few vectorised numpy operations; episode bookkeeping runs only for the environments whose episode
ended. Metrics, progress and checkpoints happen on wall-clock intervals. The loop stops when
``train.steps`` is reached or a stop is requested (Ctrl-C, SIGTERM): the step in flight finishes and
a checkpoint is written.

A run resumes from its run directory's newest valid checkpoint (:mod:`edgerl.run.checkpointer`):
the learner, counters, RNGs and (``replay.persist``) the replay, so learning goes on at once.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from edgerl.config import Config
from edgerl.config.fleet import fleet_envs
from edgerl.config.learners import learner_info
from edgerl.envs import EnvSpec, Step, VecEnv, ale_game, make_env
from edgerl.errors import RunDirError
from edgerl.files.atomic import write_atomic
from edgerl.files.checkpoint import Checkpoint, CheckpointLostError, CheckpointStore
from edgerl.files.sidefiles import SideFiles
from edgerl.hw.device import precision_of
from edgerl.learners.decisions import CompileDecisions
from edgerl.learners.factory import build_learner, build_memory
from edgerl.learners.kinds import learner_kind
from edgerl.memories.replay.store import ReplayStore
from edgerl.report import balance
from edgerl.report.episodes import Episodes
from edgerl.report.hooks import TICK_EVERY_S, Hook
from edgerl.report.metrics import (
    CSV_COLUMNS,
    ConsoleProgress,
    EpisodeWriter,
    MetricsWriter,
    Pace,
    TrainResult,
    TrainStats,
    nothing_to_do,
)
from edgerl.report.rundir import RunDir
from edgerl.run.acting import LocalActing
from edgerl.run.autotune import Choice
from edgerl.run.checkpointer import Checkpointer
from edgerl.run.pipeline import build_learning
from edgerl.run.pipeline_base import Pipeline
from edgerl.run.settle import settle_config
from edgerl.run.signals import HeldCall, StoppedDuringSetup, said_while_held
from edgerl.run.transport import Transport
from edgerl.stream import DisplayPublisher
from edgerl.words import duration, plural

log = logging.getLogger(__name__)


class Trainer:
    """Owns the environments, the learner, its memory and the run directory of one training run.

    Use as a context manager: ``with Trainer(cfg) as t: t.run()``. Entering builds everything and
    raises an EdgerlError subclass for anything the user can fix; leaving always releases the run
    directory and environments (and writes a checkpoint if the loop crashed). ``hooks`` follow
    the run: the Trainer is the :class:`~edgerl.report.hooks.Run` they read. Its checkpoints are
    its :class:`~edgerl.run.checkpointer.Checkpointer`'s (``self.checkpointer``).
    """

    def __init__(
        self,
        cfg: Config,
        *,
        fresh: bool = False,
        hooks: list[Hook] | None = None,
        quiet: bool = False,
        side: SideFiles | None = None,
        make_envs: Callable[..., VecEnv] = make_env,
        fleet: Callable[[Config, EnvSpec], Transport] | None = None,
    ) -> None:
        self.requested_cfg = cfg
        self.side_files = side or SideFiles()
        self._make_envs = make_envs  # edgerl bench times the loop with a stand-in here
        self._open_fleet = fleet  # what brings actors elsewhere (fleet.actors > 0)
        self.remote: Transport | None = None  # those actors, once open
        self.fresh = fresh
        self.hooks = list(hooks or [])
        self.quiet = quiet
        self.cfg = cfg
        self.step = 0
        self.episode_tally = Episodes()
        self.checkpointer: Checkpointer | None = None  # once the run directory is open
        self.resumed_from: Path | None = None
        self.moved_aside: Path | None = None
        self.stats = TrainStats()
        self.learning: Pipeline | None = None  # the pipeline, while run() runs
        self.autotune: Choice | None = None  # when perf.autotune ran
        self.display: DisplayPublisher | None = None
        self._stop_reason: str | None = None
        self.wall_before = 0.0  # seconds trained before this session
        self._session_start = time.monotonic()
        self._pace = Pace(0, self._session_start, 0)
        self._env: VecEnv | None = None
        self._rundir: RunDir | None = None
        self._metrics: MetricsWriter | None = None
        self._episodes_csv: EpisodeWriter | None = None
        self._progress: ConsoleProgress | None = None

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
            if self.checkpointer is not None:
                self.checkpointer.wait_pending()
                if crashed and self._acting and self.checkpointer.unsaved:
                    log.error("training loop failed (%s); writing a checkpoint before exiting", exc)
                    self.checkpointer.save()
        finally:
            self._close_resources()

    def _open(self) -> None:
        settled = settle_config(self.requested_cfg)  # every value set, then checked
        self.cfg = cfg = settled.cfg
        self.spec = spec = settled.spec
        self.device = settled.device
        run_path = Path(cfg.train.run_dir)
        self._rundir = RunDir(run_path)
        if self.fresh:
            self.moved_aside = self._rundir.move_aside()
            if self.moved_aside:
                log.info("--fresh: moved the previous run to %s", self.moved_aside)
        self._rundir.open(group=cfg.display.group)
        self.run_dir = run_path = self._rundir.path  # the real path, checked folder by folder
        checkpoints = CheckpointStore(self._rundir.checkpoints, cfg.train.keep_checkpoints)
        found = checkpoints.newest_valid()
        self.checkpointer = Checkpointer(self, checkpoints, replay_store=None)
        if found is not None:
            self.checkpointer.check_compatible(found[1], found[0].path)
        if cfg.perf.autotune:  # measured now that the run directory is this trainer's
            self._check_stop()
            settled = settle_config(self.requested_cfg, autotune=True)
            self.cfg = cfg = settled.cfg
            self.autotune = settled.autotune
        self._check_stop()
        torch.manual_seed(cfg.env.seed)
        self.actor_rng = np.random.default_rng(cfg.env.seed)
        # A replay fills its memory in the background from here.
        self.memory = build_memory(cfg, spec, self.device, settled.available, fleet_envs(cfg))
        self.learner = build_learner(cfg, spec, self.device)
        kind = learner_kind(cfg.agent.algo)
        # What its memory is written of the game's rewards (a score, or the clipped ones).
        self.learning_rewards = kind.learning_rewards
        self.stats.explores = learner_info(cfg.agent.algo).explores_by_epsilon  # epsilon shown
        if cfg.replay.persist and self.memory.keeps_steps:
            store = ReplayStore(self._rundir.path / "replay", self.memory)
            if store.check_disk(explicit="replay.persist" in cfg.explicit):
                self.checkpointer.replay_store = store
        if found is not None:
            self.checkpointer.resume(found[1], found[0].path)
            self.resumed_from = found[0].path
        else:
            log.info("new run in %s (no checkpoint there to resume)", run_path)
        self._check_stop()
        if self.step >= cfg.train.steps:
            pass  # nothing to do (run() says so): no environments built for it, no fleet
        elif cfg.fleet.actors:  # the environments are the remote actors'
            if self._open_fleet is None:
                raise RuntimeError("fleet.actors is set but the trainer was given no fleet")
            self.remote = self._open_fleet(cfg, spec)
        else:
            self._env = self._build_envs(cfg)
        self._check_stop()
        config_toml = cfg.to_toml().encode()
        self.side_files.attempt(
            "config.toml", lambda: write_atomic(self._rundir.config_file, config_toml)
        )
        self.display = DisplayPublisher(cfg.display, run_path, spec)

    def _build_envs(self, cfg: Config) -> VecEnv:
        """The environments, said as they are built: ALE builds an Atari game's in one call
        that no stop interrupts (seconds for 128 on two cores: a stop meanwhile is said at
        once, :func:`said_while_held`), and the first progress line waits for them to be reset
        and stepped."""
        envs = plural(cfg.env.num_envs, "environment")
        atari = ale_game(cfg.env.id) is not None
        # a stop while ALE builds is said at once, and acted on as the call returns
        held = (
            said_while_held(f"ALE builds {envs} of {cfg.env.id} in one call")
            if atari
            else contextlib.nullcontext()
        )
        with held as call:
            log.info(
                "building %s of %s%s",
                envs,
                cfg.env.id,
                " (ALE builds them in one call: a stop is heard as it returns)" if atari else "",
            )
            built = time.monotonic()
            env = self._make_envs(cfg.env, self.spec, self._check_stop_then(call))
        log.info(
            "%s built in %s; resetting them and taking the first steps (then a progress line)",
            envs,
            duration(time.monotonic() - built),
        )
        return env

    def _check_stop_then(self, call: HeldCall | None) -> Callable[[], None]:
        """The building's stop check; ALE calls it just before its one call, which ``call``
        (when given) is then armed for."""

        def check() -> None:
            if call is not None:  # armed first: a stop from here on is said by one or the other
                call.arm()
            self._check_stop()

        return check

    def _check_stop(self) -> None:
        """Abandon set-up if a stop was requested (nothing to save before the first step)."""
        if self._stop_reason is not None:
            raise StoppedDuringSetup(self._stop_reason)

    def _close_resources(self) -> None:
        for closer in (
            lambda: self.display and self.display.close(),
            lambda: self._progress and self._progress.close(),
            lambda: self._metrics and self._metrics.close(),
            lambda: self._episodes_csv and self._episodes_csv.close(),
            lambda: self._env and self._env.close(),
            lambda: self.remote and self.remote.close(),
            lambda: self._rundir and self._rundir.close(),
        ):
            try:
                closer()
            except Exception:  # cleanup must go on
                log.exception("error while closing the trainer")

    # ----------------------------------------------------------------------------- state

    @property
    def _acting(self) -> bool:
        """Environments (here or remote) are open: the loop can run."""
        return self._env is not None or self.remote is not None

    def wall_s(self) -> float:
        return self.wall_before + (time.monotonic() - self._session_start)

    @property
    def last_checkpoint(self) -> Path | None:
        """The run's newest checkpoint: this session's newest, else the one it resumed from."""
        written = self.checkpointer.last_path if self.checkpointer is not None else None
        return written or self.resumed_from

    def policy_snapshot(self) -> Checkpoint:
        assert self.checkpointer is not None
        return self.checkpointer.policy_snapshot()

    @property
    def updates(self) -> int:
        return self.learner.updates

    def epsilon(self) -> float:
        return self.learner.epsilon(self.step)

    @property
    def episodes(self) -> int:
        return self.episode_tally.count

    @episodes.setter
    def episodes(self, count: int) -> None:
        self.episode_tally.count = count

    @property
    def recent_returns(self) -> deque[float]:
        return self.episode_tally.recent

    def return_mean(self) -> float:
        return self.episode_tally.mean_return()

    def write_problems(self) -> list[str]:
        return self.side_files.problems()

    def request_stop(self, reason: str) -> None:
        """Ask the loop to stop after the current step (safe from a signal handler); during
        set-up, said at once (set-up ends at its next check, or after the first step)."""
        if self._stop_reason is None and self.learning is None:
            log.info("%s: stopping the start-up where it can", reason)
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

    # ----------------------------------------------------------------------------- the loop

    def run(self) -> TrainResult:
        """Train until ``train.steps`` or a stop request; returns a summary of the session."""
        cfg = self.cfg
        extra = [c for hook in self.hooks for c in hook.csv_columns if c not in CSV_COLUMNS]
        extra += [c for c in self.learner.figures() if c not in CSV_COLUMNS + extra]
        self._metrics = MetricsWriter(
            self.run_dir, CSV_COLUMNS + extra, cfg.train.tensorboard, side=self.side_files
        )
        self._episodes_csv = EpisodeWriter(self.run_dir, side=self.side_files)
        self._progress = ConsoleProgress(cfg.train.steps, self.step, quiet=self.quiet)
        self._session_start = time.monotonic()
        self._pace = Pace(self.step, self._session_start, self.learner.learn_from[0])
        total = cfg.train.steps
        if self.step >= total:
            log.info("%s", nothing_to_do(self.run_dir, self.step, total))
            self._refresh_stats(time.monotonic())
            for hook in self.hooks:  # the run's figures as its files have them: its evaluation
                hook.on_tick(self, self.stats)
            self._progress.close()
            return self._result(stopped=False)
        assert self._acting

        remaining, decisions = (total - self.step) // cfg.agent.train_freq, CompileDecisions()
        parts = (cfg, self.spec, self.learner, self.memory, self.actor_rng, remaining, decisions)
        self.learning = build_learning(*parts)
        log.info("learning: %s pipeline, update on %s", self.learning.mode, self.learner.describe())
        self.learning.start()
        # The pace counts from here: a compile or graph capture is neither filling nor learning.
        self._pace = Pace(self.step, time.monotonic(), self.learner.learn_from[0])
        precision = precision_of(cfg.perf.amp, self.device, frames=self.spec.has_frames)
        gpu = self.device.type == "cuda"
        self._balance = balance.watch(cfg, self.learning, gpu, self.step, precision=precision)
        if self.stop_requested:
            self.learning.interrupt()
        try:
            with self.learning.context():
                return self._loop(total)
        finally:
            self.learning.finish(drain=False)  # stops the learner thread on every exit path

    def _loop(self, total: int) -> TrainResult:
        assert self._progress is not None and self.checkpointer is not None
        assert self.learning is not None
        self._clock = dict.fromkeys(("tick", "row"), time.monotonic())
        self.checkpointer.restart_clock()
        self._row_step = self.step
        self._started = False
        if self.remote is not None:
            from edgerl.run.remote import run_remote

            self.episode_tally.start(self.remote.num_envs, 0, self._episodes_csv)
            run_remote(self, self.remote, total)
        else:
            assert self._env is not None and self._episodes_csv is not None
            LocalActing(self, self._env).run_steps(total, self._episodes_csv)
        self.learning.finish(drain=self.step >= total)  # the last updates due, then it stops
        if not self._started:
            for hook in self.hooks:
                hook.on_start(self)
        for hook in self.hooks:
            hook.on_end(self)
        self._refresh_stats(time.monotonic())
        self._progress.update(self.stats)
        if self.step != self._row_step:
            self._write_row()
        self.checkpointer.finish()
        self._progress.close()
        return self._result(stopped=self.stop_requested and self.step < total)

    def waiting(self) -> None:
        """While the run's end waits for a hook's work (the last evaluation): every hook's
        on_wait (the service's watchdog is pinged there)."""
        for hook in self.hooks:
            hook.on_wait(self)

    def tick(self) -> None:
        """After each step: hooks, and on their intervals the progress line, metrics rows and
        checkpoints."""
        assert self._progress is not None and self.checkpointer is not None
        cfg, clock = self.cfg, self._clock
        if not self._started:
            self._started = True
            for hook in self.hooks:
                hook.on_start(self)
        for hook in self.hooks:
            hook.on_step(self)
        now = time.monotonic()
        self._pace.follow(self.step, self.learner.learn_from[0], now)
        if now - clock["tick"] >= TICK_EVERY_S:
            clock["tick"] = now
            self._refresh_stats(now)
            self._progress.update(self.stats)
            for hook in self.hooks:
                hook.on_tick(self, self.stats)
        if now - clock["row"] >= cfg.train.log_every_s:
            self._refresh_stats(now)
            self._write_row()
            clock["row"], self._row_step = now, self.step
        self.checkpointer.after_step(now)

    def record_step(self, actions: np.ndarray, result: Step, envs: np.ndarray | None) -> None:
        """Store one step of ``envs`` (None: all, in order): the transitions and the episodes;
        counts the env steps."""
        self.memory.add(
            actions,
            self.learning_rewards(self.spec, result.rewards),
            result.terminated,
            result.truncated,
            result.obs,
            result.final_obs,
            envs=envs,
        )
        self.step += len(actions)
        done = result.terminated | result.truncated
        self.episode_tally.add(result.rewards, done, envs, self.step, self.wall_s())

    def record_episodes(
        self, scores: np.ndarray, lengths: np.ndarray, envs: np.ndarray, steps: int
    ) -> None:
        """Count ``steps`` env steps played elsewhere, in which the whole episodes of
        ``scores``, ``lengths`` and ``envs`` ended (a population's remote actors)."""
        self.step += steps
        for episode in zip(scores.tolist(), lengths.tolist(), envs.tolist(), strict=True):
            self.episode_tally.add_whole(*episode, self.step, self.wall_s())

    def _result(self, stopped: bool) -> TrainResult:
        phases = self._pace.phases(self.step, time.monotonic())  # fill and learn: steps, seconds
        counts = (self.step, self.cfg.train.steps, self.episodes, self.return_mean(), self.wall_s())
        return TrainResult(*counts, *phases, checkpoint=self.last_checkpoint, stopped=stopped)

    def show_frame(
        self, frames: np.ndarray, action: int, q_values: np.ndarray | None, step: int, eps: float
    ) -> None:
        """Publish the shown environment's frame at ``step`` for `edgerl view` (a copy into
        shared memory, never a wait)."""
        assert self.display is not None
        meta = self.episode_tally.frame_meta(step, eps, action, self.stats, q_values)
        self.display.publish(frames[-1], meta)

    def _refresh_stats(self, now: float) -> None:
        s = self.stats
        s.step, s.total_steps, s.wall_s = self.step, self.cfg.train.steps, self.wall_s()
        s.sps = self._pace.rate(self.step, now)
        s.episodes, s.return_mean = self.episodes, self.return_mean()
        s.epsilon, s.updates = self.learner.epsilon(self.step), self.learner.updates
        s.learning_starts, s.fill_from = self.learner.learn_from[0], self._pace.start[1]
        s.figures = self.learner.figures()
        _, _, learned, learning_s = self._pace.phases(self.step, now)
        left = max(0, self.cfg.train.steps - self.step)
        s.left_s = left * learning_s / learned if learned > 0 and learning_s >= 10 else math.nan
        loss = self.learner.losses.peek()
        if not math.isnan(loss):  # no update since the last row: keep the last mean
            s.loss = loss
        if self.remote is not None:
            s.fleet = self.remote.status()

    def _write_row(self) -> None:
        assert self._metrics is not None and self._progress is not None
        self._balance.row(self.stats, self.step)
        self._metrics.write(self.stats)
        self._progress.log_line(self.stats)
        self.learner.losses.take()
