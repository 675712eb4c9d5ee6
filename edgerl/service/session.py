"""A training session: the Trainer inside the hardware around it (max clocks, load monitor),
and the evaluations that follow it.

``edgerl train`` and the service both train through :func:`training_session`, so clocks are
restored and the monitor stopped on every exit path, in reverse order of setting up.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from edgerl.config import Config
from edgerl.files.private import run_umask
from edgerl.files.sidefiles import SideFiles
from edgerl.hw.clocks import MaxClocks, state_dir_for
from edgerl.hw.monitor import LoadMonitor
from edgerl.learners.kinds import learner_kind
from edgerl.report.estimate import PaceEstimate
from edgerl.report.evaluate import Evaluator, eval_period
from edgerl.report.hooks import Hook, Run
from edgerl.report.metrics import TrainStats
from edgerl.report.status import StatusWriter
from edgerl.run.signals import StopRequest
from edgerl.run.train import Trainer

log = logging.getLogger(__name__)


class LoadHook(Hook):
    """The load monitor as a training run sees it: the newest sample in every metrics row
    (``cpu_max_core``, ``gr3d``, the run's ``energy_j`` where power is reported) and log line,
    the verdict counted from the run's start, and a reload's new sampling interval."""

    csv_columns = ("cpu_max_core", "gr3d", "energy_j")

    def __init__(self, monitor: LoadMonitor) -> None:
        self.monitor = monitor

    def on_start(self, run: Run) -> None:
        self.monitor.count_from_now()

    def on_tick(self, run: Run, stats: TrainStats) -> None:
        fields = self.monitor.latest_fields()
        if fields is not None:
            stats.load = fields

    def on_reconfigure(self, run: Run, cfg: Config) -> None:
        if cfg.hw.monitor_interval_ms != self.monitor.interval_ms:
            self.monitor.set_interval(cfg.hw.monitor_interval_ms)


@dataclass
class Session:
    """A ready trainer and the hardware that the session set up around it."""

    trainer: Trainer
    monitor: LoadMonitor | None = None
    clocks: MaxClocks | None = None

    def clocks_state(self) -> str:
        """``maximum``, why the clocks were left alone, or ``unchanged``."""
        if self.clocks is not None and self.clocks.active:
            return "maximum"
        if self.clocks is not None and self.clocks.skipped:
            return self.clocks.skipped
        return "unchanged"

    def verdict(self) -> str | None:
        """What limited training, as a sentence (None without a monitor)."""
        return self.monitor.verdict().sentence() if self.monitor is not None else None


@contextlib.contextmanager
def training_session(
    cfg: Config,
    *,
    fresh: bool = False,
    quiet: bool = False,
    hooks: Sequence[Hook] = (),
    stop: StopRequest | None = None,
    clocks: MaxClocks | None = None,
) -> Iterator[Session]:
    """Yield a ready session with clocks maxed (``hw.max_clocks``; ``clocks``: maxed already
    by the caller, who restores them: the service maxes them before it measures the machine),
    the monitor running and evaluations (``eval.every_steps``) following the run.

    Every run keeps ``<run_dir>/status.json`` current (``finished``, ``stopped`` or ``failed``
    at the end).
    Raises what :class:`Trainer` raises for user errors, before touching the clocks, and
    StoppedDuringSetup when ``stop`` is requested before the trainer is ready.
    """
    if cfg.train.recipe:  # where the settings came from, before the run says what it does
        log.info("recipe: %s", cfg.train.recipe)
    session: Session | None = None
    side = SideFiles()  # one record of the side files that cannot be written
    status = StatusWriter(
        clocks=lambda: session.clocks_state() if session else "unchanged", side=side
    )
    fleet = None
    if cfg.fleet.actors:  # Ray is imported only for a run that asks for remote actors
        from edgerl.fleet import open_fleet

        fleet = open_fleet
    trainer = Trainer(cfg, fresh=fresh, quiet=quiet, hooks=[status, *hooks], side=side, fleet=fleet)
    if stop is not None:
        stop.target = trainer.request_stop  # set-up (thousands of environments) stops early too
    with run_umask(), trainer, _final_status(trainer, status), contextlib.ExitStack() as stack:
        session = Session(trainer)
        hw = trainer.cfg.hw
        if clocks is not None:
            session.clocks = clocks
        elif hw.max_clocks:
            session.clocks = stack.enter_context(MaxClocks(hw, state_dir_for(hw)))
        if hw.monitor:
            monitor = LoadMonitor(hw, trainer.run_dir, step=lambda: trainer.step, side=side)
            session.monitor = stack.enter_context(monitor)
            trainer.add_hook(LoadHook(monitor), first=True)  # later hooks see the newest load
        gpu = trainer.device.type == "cuda"
        trainer.add_hook(PaceEstimate(trainer.spec.has_frames, gpu))
        period = eval_period(trainer.cfg)
        if period:
            device = trainer.device.type  # cpu or cuda
            played = learner_kind(trainer.cfg.agent.algo).samples_when_played
            sample = played and not trainer.spec.continuous  # else: the network's own action
            evaluator = Evaluator(
                trainer.run_dir, period, trainer.cfg.eval, side, device, sample=sample
            )
            stack.callback(evaluator.close)  # also when the loop fails: the thread ends first
            trainer.add_hook(evaluator)
        yield session


@contextlib.contextmanager
def _final_status(trainer: Trainer, status: StatusWriter) -> Iterator[None]:
    """Write the last status.json: failed (with the error) or stopped."""
    try:
        yield
    except BaseException as e:
        with contextlib.suppress(Exception):
            status.finish(trainer, "failed", f"{type(e).__name__}: {e}")
        raise
    done = trainer.step >= trainer.cfg.train.steps  # a finished run is no stopped one
    with contextlib.suppress(Exception):
        status.finish(trainer, "finished" if done else "stopped")
