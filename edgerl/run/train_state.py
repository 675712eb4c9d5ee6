"""The Trainer's saved state: what a checkpoint holds, writing it, and resuming from it.

A checkpoint holds the learner (network, target network, optimizer, its schedules' position), the
step and episode counts, the recent returns and every RNG. With ``replay.persist`` it also names
the replay files saved with it (see :mod:`edgerl.files.replay_store`): the replay is saved in the
background while the actor goes on, and the checkpoint file is written only once those files are
on disk, so a checkpoint never names a replay that is not there. A failed write (a full disk) is
logged and reported to the hooks, and training goes on; the last checkpoint of a session is
retried for ``train.final_checkpoint_retry_s`` before the steps since the previous one are
declared lost.

:class:`TrainerState` is the part of :class:`~edgerl.run.train.Trainer` that does this; the training
loop in ``train.py`` calls it at its checkpoints, at its end and on resume.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgerl.config import Config
from edgerl.errors import RunDirError
from edgerl.files.checkpoint import (
    Checkpoint,
    CheckpointLostError,
    CheckpointStore,
    CheckpointWriteError,
)
from edgerl.files.replay_save import SaveJob
from edgerl.files.replay_store import ReplayFileError, ReplayStore
from edgerl.learn.envs import EnvSpec
from edgerl.learn.learner import Learner
from edgerl.learn.pipeline import Learning
from edgerl.run.hooks import TICK_EVERY_S, Hook
from edgerl.run.metrics import TrainStats

log = logging.getLogger(__name__)

FINAL_RETRY_EVERY_S = 5.0  # the last checkpoint of a session is retried this often
# Config keys a resumed run must share with its checkpoint (they shape the network); the learner
# (agent.algo) is checked against the checkpoint's kind.
SHAPING_KEYS = ("env.id", "agent.hidden")


class TrainerState:
    """Checkpoints of a Trainer: :meth:`checkpoint`, :meth:`save_checkpoint` and the resume.

    A base of :class:`~edgerl.run.train.Trainer`, which sets the attributes below and has
    ``wall_s()``.
    """

    cfg: Config
    spec: EnvSpec
    device: torch.device
    run_dir: Path
    learner: Learner
    memory: Any  # the learner's: a ReplayBuffer or a RolloutBuffer
    actor_rng: np.random.Generator
    learning: Learning | None
    hooks: list[Hook]
    stats: TrainStats
    step: int
    episodes: int
    recent_returns: deque[float]
    checkpoints: CheckpointStore
    last_checkpoint: Path | None
    checkpoint_error: str | None
    replay_store: ReplayStore | None
    _pending: tuple[SaveJob, bytes, int] | None
    _last_saved_step: int
    _session_step0: int
    _wall_before: float

    # ----------------------------------------------------------------------------- saving

    def checkpoint(self) -> Checkpoint:
        """Everything a checkpoint holds, now (its replay entry is added by the save)."""
        cuda_rng = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        return Checkpoint(
            kind=self.learner.kind,
            step=self.step,
            env=self.spec.to_dict(),
            config=self.cfg.to_dict(),
            learner=self.learner.state_dict(),
            episodes=self.episodes,
            wall_s=self.wall_s(),
            recent_returns=[float(r) for r in self.recent_returns],
            rng={
                "actor": self.actor_rng.bit_generator.state,
                "replay": self.memory.rng_state(),
                "torch": torch.get_rng_state(),
                "cuda": cuda_rng,
            },
            saved_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        )

    def policy_snapshot(self) -> Checkpoint:
        """A CPU copy of the online network's weights with what rebuilds it, as a checkpoint
        without the training state (``edgerl.policies.torch.TorchPolicy`` plays it); taken between
        updates."""
        paused = self.learning.paused() if self.learning is not None else contextlib.nullcontext()
        with paused, torch.no_grad():
            q = {k: v.detach().to("cpu", copy=True) for k, v in self.learner.q.state_dict().items()}
        return Checkpoint(
            kind=self.learner.kind,
            step=self.step,
            env=self.spec.to_dict(),
            config=self.cfg.to_dict(),
            learner={"q": q},
        )

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
            checkpoint = self.checkpoint()
            if self.replay_store is not None:
                actor = self.learning.context() if self.learning else contextlib.nullcontext()
                with actor:  # on CUDA: ordered after the actor's replay writes
                    job = self.replay_store.snapshot(self.step)
                checkpoint.replay = {
                    "manifest": job.result.manifest,
                    "learn_from": list(self.learner.learn_from),
                    "train_freq": self.cfg.agent.train_freq,
                }
            data = checkpoint.to_bytes()
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
                time.sleep(min(TICK_EVERY_S, max(0.0, wait_until - time.monotonic())))
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

    # ----------------------------------------------------------------------------- resuming

    def _check_compatible(self, checkpoint: Checkpoint, path: Path) -> None:
        """Raises CheckpointError for a policy snapshot, RunDirError for another game, learner
        or network shape."""
        checkpoint.require_training_state(str(path))
        found = {"agent.algo": checkpoint.kind}
        for key in SHAPING_KEYS:
            section, name = key.split(".")
            old_section = checkpoint.config.get(section)
            found[key] = old_section.get(name) if isinstance(old_section, dict) else None
        if checkpoint.env.get("kind") != "vector":  # hidden widths shape only the MLP
            del found["agent.hidden"]
        for key, old in found.items():
            new = self.cfg.get(key)
            if isinstance(new, tuple):
                new = list(new)
            if old is not None and old != new:
                raise RunDirError(
                    f"run directory {self.run_dir} holds a run with {key}={old!r} "
                    f"({path.name}), not {new!r}; use another --run-dir, or --fresh to move "
                    "the old run aside"
                )

    def _restore(self, checkpoint: Checkpoint) -> None:
        self.learner.load_state_dict(checkpoint.learner)
        self.step = checkpoint.step
        self.episodes = checkpoint.episodes
        self._wall_before = float(checkpoint.wall_s)
        self.recent_returns.extend(float(r) for r in checkpoint.recent_returns)
        rng = checkpoint.rng
        assert rng is not None  # _check_compatible refused a policy snapshot
        self.actor_rng.bit_generator.state = rng["actor"]
        self.memory.set_rng_state(rng["replay"])
        torch.set_rng_state(rng["torch"])
        if self.device.type == "cuda" and rng.get("cuda") is not None:
            with contextlib.suppress(RuntimeError):
                torch.cuda.set_rng_state(rng["cuda"], self.device)
        self._last_saved_step = self.step
        self._session_step0 = self.step
        restored = self._restore_replay(checkpoint.replay)
        if restored is not None:
            starts = self.learner.learn_from[0]
            learning = (
                "learning continues at once"
                if starts <= self.step
                else f"learning starts at step {starts:,} (the checkpoint was taken while the "
                "replay was still filling)"
            )
            log.info(
                "resuming from step %s (%s episodes) with the replay of that checkpoint "
                "(%s transitions); %s",
                f"{self.step:,}",
                f"{self.episodes:,}",
                f"{restored:,}",
                learning,
            )
            return
        refill = min(self.cfg.agent.learning_starts, self.memory.capacity)
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
