"""A run's checkpoints: what a checkpoint holds, writing it, and resuming from it.

A checkpoint holds the learner (network, target network, optimizer, its schedules' position), the
step and episode counts, the recent returns and every RNG. With ``replay.persist`` it also names
the replay files saved with it (see :mod:`edgerl.memories.replay.store`): the replay is saved in the
background while the actor goes on, and the checkpoint file is written only once those files are
on disk, so a checkpoint never names a replay that is not there. A failed write (a full disk) is
logged and reported to the hooks, and training goes on; the last checkpoint of a session is
retried for ``train.final_checkpoint_retry_s`` before the steps since the previous one are
declared lost.

:class:`Checkpointer` does this for a :class:`~edgerl.run.train.Trainer`, which holds one: it
reads the trainer's state through :class:`TrainingState` (the few attributes it needs), owns the
checkpoint files, the replay files and the checkpoint clock, and the training loop calls it after
each step, at its end and on resume.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from edgerl.config.learners import LEARNERS
from edgerl.envs import EnvSpec
from edgerl.errors import CheckpointError, RunDirError
from edgerl.files.checkpoint import (
    POLICY_KEY,
    Checkpoint,
    CheckpointLostError,
    CheckpointStore,
    CheckpointWriteError,
)
from edgerl.learners import Learner
from edgerl.learners.nets import weights_problem
from edgerl.memories import Memory
from edgerl.memories.replay.saving import SaveJob
from edgerl.memories.replay.store import ReplayFileError, ReplayStore
from edgerl.report.hooks import TICK_EVERY_S, Hook, Run
from edgerl.run.pipeline_base import Pipeline
from edgerl.run.saved_state import check_replay_entry, nonfinite, restore_rngs
from edgerl.words import plural

log = logging.getLogger(__name__)

RETRY_S = 60.0  # after a failed checkpoint (disk full), try again this soon
FINAL_RETRY_EVERY_S = 5.0  # the last checkpoint of a session is retried this often
# Config keys a resumed run must share with its checkpoint (they shape the network); the learner
# (agent.algo) is checked against the checkpoint's kind.
SHAPING_KEYS = ("env.id", "agent.hidden")  # and the learner's own resume_keys


class TrainingState(Run, Protocol):
    """What the checkpointing part reads of a trainer (the Run its hooks read), and sets on
    resume."""

    spec: EnvSpec
    device: torch.device
    learner: Learner
    memory: Memory  # the learner's: a ReplayBuffer or a RolloutBuffer
    actor_rng: np.random.Generator
    learning: Pipeline | None  # the pipeline, while the loop runs
    hooks: list[Hook]
    step: int
    episodes: int
    wall_before: float  # seconds trained before this session

    @property
    def recent_returns(self) -> deque[float]: ...


class Checkpointer:
    """The checkpoints of one run: :meth:`save`, :meth:`after_step` (on the clock), :meth:`finish`
    (the session's last one) and :meth:`resume`.

    ``run`` is the trainer whose state is saved; ``store`` holds the checkpoint files and
    ``replay_store`` (with ``replay.persist``) the replay files saved with them.
    """

    def __init__(
        self, run: TrainingState, store: CheckpointStore, replay_store: ReplayStore | None
    ) -> None:
        self.run = run
        self.store = store
        self.replay_store = replay_store
        self.last_path: Path | None = None  # the newest checkpoint written
        self.error: str | None = None  # why the newest attempt failed
        self.saved_step = -1  # the step of the newest checkpoint written or resumed from
        self._pending: tuple[SaveJob, bytes, int] | None = None  # awaiting its replay files
        self._clock = time.monotonic()  # when the newest checkpoint was due

    @property
    def unsaved(self) -> bool:
        """Steps were made since the newest checkpoint."""
        return self.run.step != self.saved_step

    def restart_clock(self) -> None:
        """The next checkpoint is due ``train.checkpoint_every_s`` from now (the loop starts)."""
        self._clock = time.monotonic()

    def after_step(self, now: float) -> None:
        """After a step of the loop: write the checkpoint whose replay save ended, or start one
        when one is due (in the background while its replay is saved). A failed one is tried
        again within ``RETRY_S``."""
        every = self.run.cfg.train.checkpoint_every_s
        retry_at = now - every + min(RETRY_S, every)
        if self._pending is not None and self._pending[0].done:
            if self._complete() is None:
                self._clock = retry_at
        elif self._pending is None and now - self._clock >= every:
            path = self.save(background=True)  # None while its replay is saved
            saved = path is not None or self._pending is not None
            self._clock = now if saved else retry_at

    def wait_pending(self) -> None:
        """Write the checkpoint whose replay is being saved, once it is (nothing if none)."""
        if self._pending is not None:
            self._complete()

    def finish(self) -> None:
        """The session's end: the pending checkpoint, then one of the steps since, retried for
        ``train.final_checkpoint_retry_s``; raises CheckpointLostError saying what is lost."""
        self.wait_pending()
        if self.unsaved:
            self._final()

    # ----------------------------------------------------------------------------- saving

    def capture(self) -> Checkpoint:
        """Everything a checkpoint holds, now (its replay entry is added by the save)."""
        run = self.run
        cuda_rng = torch.cuda.get_rng_state(run.device) if run.device.type == "cuda" else None
        return Checkpoint(
            kind=run.learner.kind,
            step=run.step,
            env=run.spec.to_dict(),
            config=run.cfg.to_dict(),
            learner=run.learner.state_dict(),
            episodes=run.episodes,
            wall_s=run.wall_s(),
            recent_returns=[float(r) for r in run.recent_returns],
            rng={
                "actor": run.actor_rng.bit_generator.state,
                "replay": run.memory.rng_state(),
                "torch": torch.get_rng_state(),
                "cuda": cuda_rng,
            },
            saved_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        )

    def policy_snapshot(self) -> Checkpoint:
        """A CPU copy of the online network's weights with what rebuilds it, as a checkpoint
        without the training state (``edgerl.policies.torch.TorchPolicy`` plays it); taken between
        updates."""
        run = self.run
        paused = run.learning.paused() if run.learning is not None else contextlib.nullcontext()
        with paused, torch.no_grad():
            q = {k: v.detach().to("cpu", copy=True) for k, v in run.learner.q.state_dict().items()}
        return Checkpoint(
            kind=run.learner.kind,
            step=run.step,
            env=run.spec.to_dict(),
            config=run.cfg.to_dict(),
            learner={POLICY_KEY: q},
        )

    def save(self, background: bool = False) -> Path | None:
        """Write a checkpoint now; returns its path, or None if writing failed (logged).

        With a saved replay, the checkpoint file is written only once the replay files it names
        are on disk; ``background`` lets the actor go on meanwhile (returns None; the training
        loop finishes it with :meth:`after_step`).
        """
        run = self.run
        if self._pending is not None:  # one replay save at a time, checkpoints in order
            self._complete()
        paused = run.learning.paused() if run.learning is not None else contextlib.nullcontext()
        job = None
        with paused:  # a consistent learner state, encoded in memory; the disk write is outside
            checkpoint = self.capture()
            if self.replay_store is not None:
                actor = run.learning.context() if run.learning else contextlib.nullcontext()
                with actor:  # on CUDA: ordered after the actor's replay writes
                    job = self.replay_store.snapshot(run.step)
                checkpoint.replay = {
                    "manifest": job.result.manifest,
                    "learn_from": list(run.learner.learn_from),
                    "train_freq": run.cfg.agent.train_freq,
                }
            data = checkpoint.to_bytes()
        if job is None:
            return self._write(data, run.step)
        self._pending = (job, data, run.step)
        if background:
            job.start()
            return None
        job.run()
        return self._complete()

    def _complete(self) -> Path | None:
        """Write the pending checkpoint once its replay save ended (waits for it)."""
        assert self._pending is not None and self.replay_store is not None
        job, data, step = self._pending
        job.wait()
        self._pending = None
        if not job.ended:  # cut short (Ctrl-C again during the save): its manifest may be absent
            log.warning(
                "the replay save of step %s was cut short: its checkpoint is not written, and "
                "the run resumes from the one before",
                f"{step:,}",
            )
            return None
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
        path = self._write(data, step)
        if path is not None and job.error is None:
            self.replay_store.commit(job)
        self.replay_store.collect({c.step for c in self.store.files()})
        return path

    def _write(self, data: bytes, step: int) -> Path | None:
        run = self.run
        try:
            path = self.store.save_encoded(data, step)
        except CheckpointWriteError as e:
            log.error("%s", e)
            self.error = str(e)
            for hook in run.hooks:
                hook.on_checkpoint(run, None, str(e))
            return None
        self.last_path = path
        self.saved_step = step
        self.error = None
        for hook in run.hooks:
            hook.on_checkpoint(run, path, None)
        return path

    def _final(self) -> None:
        """The session's last checkpoint, retried for ``train.final_checkpoint_retry_s`` (a full
        disk may get room); raises CheckpointLostError saying which steps are lost."""
        run = self.run
        deadline = time.monotonic() + run.cfg.train.final_checkpoint_retry_s
        while self.save() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CheckpointLostError(self._lost_sentence())
            log.warning("retrying the last checkpoint for up to %.0f s more", left)
            wait_until = time.monotonic() + min(FINAL_RETRY_EVERY_S, left)
            while time.monotonic() < wait_until:
                time.sleep(min(TICK_EVERY_S, max(0.0, wait_until - time.monotonic())))
                for hook in run.hooks:  # the service's watchdog and status go on meanwhile
                    hook.on_tick(run, run.stats)

    def _lost_sentence(self) -> str:
        run = self.run
        error = self.error or "unknown error"
        seconds = run.cfg.train.final_checkpoint_retry_s
        since = self.saved_step
        if since < 0:
            lost = f"all {run.step:,} steps of this run are lost (no checkpoint was ever written)"
        else:
            lost = (
                f"steps {since:,} to {run.step:,} are lost and the next run resumes from step "
                f"{since:,}"
            )
        return (
            f"the last checkpoint could not be written within {seconds:g} s ({error}): {lost}; "
            "free space in the run directory and run again"
        )

    # ----------------------------------------------------------------------------- resuming

    def check_compatible(self, checkpoint: Checkpoint, path: Path) -> None:
        """Raises CheckpointError for a policy snapshot, RunDirError for another game, learner
        or network shape."""
        run = self.run
        checkpoint.require_training_state(str(path))
        found = {"agent.algo": checkpoint.kind}
        own = LEARNERS[checkpoint.kind].resume_keys if checkpoint.kind in LEARNERS else ()
        for key in (*SHAPING_KEYS, *own):
            section, name = key.split(".")
            old_section = checkpoint.config.get(section)
            found[key] = old_section.get(name) if isinstance(old_section, dict) else None
        if checkpoint.env.get("kind") != "vector":  # hidden widths shape only the MLP
            del found["agent.hidden"]
        for key, old in found.items():
            new = run.cfg.get(key)
            if isinstance(new, tuple):
                new = list(new)
            if old is not None and old != new:
                raise RunDirError(
                    f"run directory {run.run_dir} holds a run with {key}={old!r} "
                    f"({path.name}), not {new!r}; use another --run-dir, or --fresh to move "
                    "the old run aside"
                )
        saved = checkpoint.env  # the game's shape: env.make_kwargs can change it
        now = (list(run.spec.obs_shape), run.spec.num_actions)
        if (saved.get("obs_shape"), saved.get("num_actions")) not in ((None, None), now):
            raise RunDirError(
                f"run directory {run.run_dir} holds a run of {run.spec.id} with observations "
                f"{saved.get('obs_shape')} and {saved.get('num_actions')} actions ({path.name}), "
                f"not {now[0]} and {now[1]} (is env.make_kwargs the run's?); use another "
                "--run-dir, or --fresh to move the old run aside"
            )

    def resume(self, checkpoint: Checkpoint, path: Path) -> None:
        run = self.run
        # A valid checksum over weights of other shapes or dtypes, NaN anywhere, a damaged
        # optimizer state or replay entry: one sentence naming the file, not an internal error.
        problem = weights_problem(run.learner.q, checkpoint.learner.get(POLICY_KEY))
        if problem is None and (where := nonfinite(checkpoint.learner)) is not None:
            problem = f"{where} holds NaN or infinite values"
        if problem is None:
            check_replay_entry(checkpoint.replay, path)
            try:
                run.learner.load_state_dict(checkpoint.learner)
            except (RuntimeError, ValueError, KeyError, TypeError, IndexError, OverflowError) as e:
                lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
                detail = [ln for ln in lines if not ln.endswith(":")] or [type(e).__name__]
                problem = detail[0][:200]
        if problem is not None:
            raise CheckpointError(
                f"checkpoint {path} does not fit this run's learner ({problem}); was it written "
                "by edgerl? Move it aside to resume from the one before"
            )
        _say_ratio(run)
        run.step = checkpoint.step
        run.episodes = checkpoint.episodes
        run.wall_before = float(checkpoint.wall_s)
        run.recent_returns.extend(float(r) for r in checkpoint.recent_returns)
        rng = checkpoint.rng
        assert rng is not None  # check_compatible refused a policy snapshot
        restore_rngs(rng, run.actor_rng, run.memory, run.device, path)
        self.saved_step = run.step
        restored = self._restore_replay(checkpoint.replay)
        if restored is not None:
            starts = run.learner.learn_from[0]
            if run.step >= run.cfg.train.steps:
                learning = ""  # nothing is left to learn: the trainer says so
            elif starts <= run.step:
                learning = "; learning continues at once"
            else:
                learning = (
                    f"; learning starts at step {starts:,} (the checkpoint was taken while the "
                    "replay was still filling)"
                )
            log.info(
                "resuming from step %s (%s) with the replay of that checkpoint (%s)%s",
                f"{run.step:,}",
                plural(run.episodes, "episode"),
                plural(restored, "transition"),
                learning,
            )
            return
        refill = min(run.cfg.agent.learning_starts, run.memory.capacity)
        run.learner.resume_at(run.step, refill)
        wait = run.learner.learn_from[0] - run.step
        log.info(
            "resuming from step %s (%s); %s",
            f"{run.step:,}",
            plural(run.episodes, "episode"),
            f"learning continues after {wait:,} steps refill the replay"
            if wait > 0
            else "learning continues at once",
        )

    def _restore_replay(self, saved: dict[str, Any] | None) -> int | None:
        """Refill the replay from the checkpoint's replay files and continue the replay ratio
        where it was; the transitions restored, or None (empty replay, reason logged)."""
        run = self.run
        if self.replay_store is None or not saved:
            if saved and not run.cfg.replay.persist:
                log.info("replay.persist is false: resuming with an empty replay")
            return None
        started = time.monotonic()
        try:
            restored = self.replay_store.restore(saved["manifest"])
        except ReplayFileError as e:
            log.warning("%s; resuming with an empty replay", e)
            return None
        if saved.get("train_freq") == run.cfg.agent.train_freq:
            # The replay ratio counts on from where it started: updates the async learner still
            # owed at the checkpoint are made at once.
            start_step, start_updates = saved["learn_from"]
            run.learner.learn_from = (int(start_step), int(start_updates))
        else:  # a new ratio counts from here
            run.learner.resume_at(run.step, 0)
        log.info("replay restored in %.1f s", time.monotonic() - started)
        return restored


def _say_ratio(run: Any) -> None:
    """Where the learning balance had moved the learner's ratio (PQN's epochs) away from the
    config's, the checkpoint's value goes on (metrics.csv's column has it): said."""
    from edgerl.config.learners import learner_info

    key = learner_info(run.cfg.agent.algo).ratio_key
    if key and run.learner.ratio != run.cfg.get(key):
        log.info(
            "%s = %s as the learning balance left it in the checkpoint (the config says %s)",
            key,
            run.learner.ratio,
            run.cfg.get(key),
        )
