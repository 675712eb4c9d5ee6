"""The one extension point of a training run: a :class:`Hook` follows it from start to end.

Whatever follows a run (the load monitor, ``status.json``, the service protocol, evaluations) is a
Hook. The trainer calls each hook in order, from the training loop's thread, and hands it a
:class:`Run`: a read-only view of the run's progress. Hooks never reach into the trainer's parts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from edgerl.config import Config
    from edgerl.files.checkpoint import Checkpoint
    from edgerl.report.metrics import TrainStats

# How often the trainer calls on_tick (and refreshes its progress line): a few times a second.
TICK_EVERY_S = 0.25


class Run(Protocol):
    """What a hook may read of the run it follows."""

    @property
    def cfg(self) -> Config:
        """The run's resolved config (replaced, never changed, by a live reload)."""
        ...

    @property
    def run_dir(self) -> Path: ...

    @property
    def step(self) -> int:
        """Env steps so far, over all environments."""
        ...

    @property
    def episodes(self) -> int: ...

    @property
    def updates(self) -> int:
        """Gradient updates so far."""
        ...

    @property
    def stats(self) -> TrainStats:
        """The newest progress snapshot."""
        ...

    @property
    def last_checkpoint(self) -> Path | None: ...

    def epsilon(self) -> float: ...

    def write_problems(self) -> list[str]:
        """Side files (status.json, metrics.csv...) that cannot be written now, a phrase each."""
        ...

    def return_mean(self) -> float:
        """Mean return of the last 100 episodes (NaN before the first)."""
        ...

    def wall_s(self) -> float:
        """Training time so far, across sessions (seconds)."""
        ...

    @property
    def stop_requested(self) -> bool:
        """A stop (Ctrl-C, the service's stop) was requested."""
        ...

    def policy_snapshot(self) -> Checkpoint:
        """A CPU copy of the online network's weights, as a checkpoint without the training
        state: ``edgerl.policies.torch.TorchPolicy`` plays it."""
        ...

    def waiting(self) -> None:
        """Called by a hook while the run's end waits for its work (the last evaluation), a
        few times a second: every hook's :meth:`Hook.on_wait`."""
        ...


class Hook:
    """Something that follows a training run; every method is optional (a no-op here)."""

    csv_columns: tuple[str, ...] = ()  # columns this hook fills in metrics.csv (from stats.load)

    def on_start(self, run: Run) -> None:
        """Called once the run is fully set up, after the first environment step."""

    def on_step(self, run: Run) -> None:
        """Called after every step of the environments (``run.step`` has grown by
        ``env.num_envs``); it must be cheap."""

    def on_tick(self, run: Run, stats: TrainStats) -> None:
        """Called a few times a second from the training loop; may add to ``stats.load``."""

    def on_checkpoint(self, run: Run, path: Path | None, error: str | None) -> None:
        """Called after every checkpoint attempt (``error`` set when it failed)."""

    def on_reconfigure(self, run: Run, cfg: Config) -> None:
        """Called when live settings changed (the service's reload); ``cfg`` is the new config."""

    def on_wait(self, run: Run) -> None:
        """Called a few times a second while the run's end waits for another hook's work (the
        evaluation of the last step): keep alive what must be (the service's watchdog)."""

    def on_end(self, run: Run) -> None:
        """Called when the loop has ended, before the final checkpoint is written."""
