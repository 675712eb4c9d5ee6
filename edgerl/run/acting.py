"""Where a run's steps come from: its own environments (:class:`LocalActing`, here) or remote
actors (:func:`edgerl.run.remote.run_remote`). Both drive the trainer through the same public
seam, :class:`ActingRun`: ``record_step`` stores a vector step (transitions and episodes),
``tick`` runs the hooks, progress, metrics and checkpoints after it, and ``show_frame``
publishes a frame for the viewer.

The local loop: one batched forward pass picks the actions of the environments whose step came
back (all of them, or one of ALE's async batches), they start their next step, and while ALE's
threads emulate it the step before it is recorded, the pipeline makes the learning the learner
owes and the viewer's frame is published.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from edgerl.envs import EnvSpec, Step, VecEnv, shown_action
from edgerl.envs.batches import Batches, overlaps_emulation, row_of
from edgerl.learners.kinds import learner_kind

if TYPE_CHECKING:
    from edgerl.config import Config
    from edgerl.learners import Learner
    from edgerl.memories import Memory
    from edgerl.report.episodes import Episodes
    from edgerl.report.metrics import EpisodeWriter
    from edgerl.run.pipeline_base import Pipeline
    from edgerl.stream import DisplayPublisher


class ActingRun(Protocol):
    """The trainer as the acting loops see it (:class:`edgerl.run.train.Trainer`)."""

    cfg: Config
    spec: EnvSpec
    device: torch.device
    step: int
    learner: Learner
    memory: Memory
    learning: Pipeline | None
    episode_tally: Episodes
    display: DisplayPublisher | None

    @property
    def stop_requested(self) -> bool: ...

    def record_step(self, actions: np.ndarray, result: Step, envs: np.ndarray | None) -> None: ...

    def record_episodes(
        self, scores: np.ndarray, lengths: np.ndarray, envs: np.ndarray, steps: int
    ) -> None: ...

    def tick(self) -> None: ...

    def show_frame(
        self, frames: np.ndarray, action: int, q: np.ndarray | None, step: int, epsilon: float
    ) -> None: ...


# The shown environment's frame waiting to be published: frames, action, Q-values, step, epsilon.
Shown = tuple[np.ndarray, int, "np.ndarray | None", int, float]


class LocalActing:
    """Steps ``env``, the run's own environments, for ``run``: picks actions, sends them,
    records what comes back, until the run's last step or a stop request."""

    def __init__(self, run: ActingRun, env: VecEnv) -> None:
        self.run = run
        self.env = env
        self.to_show: Shown | None = None
        # What the policy said of the observations it acted on before they were stored (its
        # extras, and the version of the weights that said it), for the memory once they are.
        self.to_note: tuple[dict[str, np.ndarray], int] | None = None
        self.batches: Batches | None = None  # ALE's async mode: rows of some environments
        spec = run.spec  # the action each env is taking: an id, or a continuous game's numbers
        self.taken = np.zeros((env.num_envs, *spec.action_shape), dtype=spec.action_dtype)

    def run_steps(self, total: int, episodes_csv: EpisodeWriter) -> None:
        """Step the environments until ``total`` steps or a stop request."""
        run, env = self.run, self.env
        learning = run.learning
        assert learning is not None
        cfg = run.cfg
        obs = env.reset(seed=cfg.env.seed + run.step)
        ids = env.reset_ids  # the environments of obs's rows; None: all, in order
        run.memory.add_first(obs, envs=ids)
        num_envs = env.num_envs
        shown = min(cfg.display.env_index, num_envs - 1)
        run.episode_tally.start(num_envs, shown, episodes_csv)
        batches = self.batches = Batches(num_envs, ids)
        # A learner whose acting network changes where an episode ends sees each step before
        # the next actions are picked (the first action of an episode is its new member's).
        overlap = overlaps_emulation(cfg.env, run.spec.has_frames, run.device)
        overlap = overlap and not learner_kind(cfg.agent.algo).switches_per_episode

        # With a core to spare (or a GPU learner), a step is started (actions picked and sent)
        # before the one before it is recorded: the replay write, the episodes, the updates and
        # the rest of this loop run while ALE's threads emulate, and in the sync pipeline a
        # step's actions come from the weights before the updates of the step preceding it.
        # Where ALE's threads take every core, that work would only take CPU from them: it
        # runs before the next step starts instead.
        actions = None
        if run.step < total and not run.stop_requested:
            actions = self._start_step(obs, ids, run.step, shown, not overlap, stored=True)
        while actions is not None:
            result = env.recv()
            ids = result.env_ids
            taken = actions if ids is None else self.taken[ids]  # what led to each row
            go_on = run.step + batches.steps_in(result) < total
            actions = None
            if go_on and overlap and not run.stop_requested:
                after = run.step + batches.steps_in(result)
                actions = self._start_step(result.obs, ids, after, shown, False, stored=False)
            if ids is None:  # every environment stepped, in order
                run.record_step(taken, result, None)
                if self.to_note is not None:  # the acting weights' extras of result.obs
                    run.memory.note_extras(*self.to_note)
                    self.to_note = None
            else:
                self._record_batch(taken, result)
            if self.to_show is not None:
                self._show(*self.to_show)
            learning.after_step(run.step)
            run.tick()
            if go_on and not overlap and not run.stop_requested:
                actions = self._start_step(result.obs, ids, run.step, shown, True, stored=True)

    def _start_step(
        self,
        obs: np.ndarray,
        ids: np.ndarray | None,
        step: int,
        shown: int,
        show_now: bool,
        stored: bool,
    ) -> np.ndarray:
        """Pick the actions for ``obs`` (the rows of environments ``ids``; None: all) at env
        step ``step`` and send them to the environments; publishes the shown environment's
        frame when it is due: now, or (``show_now`` false) once the step before is recorded,
        so that its episode's return is the frame's. What the policy said of ``obs`` (its
        extras: PPO's log-probabilities and values, PQN's greedy values) goes to the memory
        now where ``obs`` are its newest observations (``stored``), else into
        :attr:`to_note`, for the loop to note once they are: either way a rollout learner
        learns against the weights that acted. Returns the actions."""
        run = self.run
        assert run.learning is not None and run.display is not None
        show = run.display.due()
        row = shown if ids is None else row_of(ids, shown)
        epsilon = run.learner.epsilon(step)
        whole = ids is None  # a memory notes extras of every environment at once
        learning = run.learning
        actions, q_shown = learning.act(obs, epsilon, row if show else None, stored and whole, ids)
        if whole and not stored and learning.actor.extras:
            # the version now: the sync loop learns, the lagged one adopts, after the step
            self.to_note = (learning.actor.extras, learning._acted_version())
        self.env.send(actions)
        if ids is not None:
            self.taken[ids] = actions
        if show and row is not None:  # now, or once the step before is recorded
            action = shown_action(run.spec, actions[row])
            self.to_show = (obs[row], action, q_shown, step, epsilon)
            if show_now:
                self._show(*self.to_show)
        return actions

    def _show(
        self, frames: np.ndarray, action: int, q: np.ndarray | None, step: int, epsilon: float
    ) -> None:
        self.to_show = None
        self.run.show_frame(frames, action, q, step, epsilon)

    def _record_batch(self, actions: np.ndarray, result: Step) -> None:
        """Store what ALE's async mode returned (``actions``: what led to each row): first
        observations start their environment's ring, the other rows are steps."""
        assert self.batches is not None
        first, stepped, stepped_actions = self.batches.split(result, actions)
        if first is not None:
            self.run.memory.add_first(*first)
        if stepped is not None:
            self.run.record_step(stepped_actions, stepped, stepped.env_ids)
