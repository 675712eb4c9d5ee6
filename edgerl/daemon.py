"""The service: the Trainer plus systemd's protocol (``edgerl daemon``, run by edgerl.service).

Start-up: read ``/etc/edgerl/edgerl.toml`` (or ``--config``), resume the run directory (default
``$STATE_DIRECTORY/runs/<env>``, i.e. ``/var/lib/edgerl/runs/Pong-v5``), max the clocks
(``hw.max_clocks`` defaults to true here), start the load monitor, take the first environment step,
and only then send ``READY=1``. While training, from the training loop itself: ``STATUS=`` every few
seconds and ``WATCHDOG=1`` at half of ``$WATCHDOG_USEC``, so systemd restarts a hung loop.

SIGTERM/SIGINT: ``STOPPING=1``, finish the step, write a checkpoint, restore clocks, stop the
monitor, exit 0. SIGHUP: re-read the config and apply what can change live (display, log level,
monitor interval, metrics interval), saying which changed. A user error exits 2 and a crash exits 1
(after a checkpoint if possible, with clocks restored), so ``Restart=on-failure`` applies.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from edgerl.config import Config, build_layers, field_info, keys, resolve
from edgerl.errors import EdgerlError
from edgerl.metrics import TrainStats, progress_fields
from edgerl.notify import Notifier, watchdog_interval_s
from edgerl.rundir import service_run_dir
from edgerl.train import Hook, Trainer

log = logging.getLogger(__name__)

STATUS_EVERY_S = 5.0
LIVE_KEYS = [k for k in keys() if field_info(k)[0].metadata.get("live")]
SYSLOG_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


class JournalFormatter(logging.Formatter):
    """``<priority>message``: journald reads the priority, and adds the time itself."""

    def format(self, record: logging.LogRecord) -> str:
        return f"<{SYSLOG_PRIORITY.get(record.levelno, 6)}>{super().format(record)}"


def daemon_config(config_file: Path | None) -> Config:
    """The service's config: the usual layers, with service defaults for keys nobody set."""
    cfg = resolve(build_layers(config_file))
    if "hw.max_clocks" not in cfg.explicit:
        cfg.hw.max_clocks = True
    if "train.run_dir" not in cfg.explicit:
        cfg.train.run_dir = str(service_run_dir(cfg.env.id))
    return cfg


class ServiceHook(Hook):
    """READY, STATUS, WATCHDOG and STOPPING from the training loop; SIGHUP reloads there too."""

    def __init__(self, notifier: Notifier, config_file: Path | None) -> None:
        self.notifier = notifier
        self.config_file = config_file
        self.watchdog_s = watchdog_interval_s()
        self._last_watchdog = 0.0
        self._last_status = 0.0
        self.reload_requested = False
        self.checkpoint_problem: str | None = None

    def status_line(self, trainer: Trainer, stats: TrainStats) -> str:
        text = f"step {trainer.step:,}/{trainer.cfg.train.steps:,} | {progress_fields(stats)}"
        if self.checkpoint_problem:
            text += f" | {self.checkpoint_problem}"
        return text

    def on_start(self, trainer: Trainer) -> None:
        self.notifier.ready(f"training {trainer.cfg.env.id} from step {trainer.step:,}")
        log.info("ready: training %s, run directory %s", trainer.cfg.env.id, trainer.run_dir)

    def on_tick(self, trainer: Trainer, stats: TrainStats) -> None:
        now = time.monotonic()
        if self.watchdog_s is not None and now - self._last_watchdog >= self.watchdog_s:
            self.notifier.watchdog()
            self._last_watchdog = now
        if now - self._last_status >= STATUS_EVERY_S:
            self.notifier.status(self.status_line(trainer, stats))
            self._last_status = now
        if self.reload_requested:
            self.reload_requested = False
            self.reload(trainer)

    def on_checkpoint(self, trainer: Trainer, path: Path | None, error: str | None) -> None:
        if error is None:
            if self.checkpoint_problem:
                log.info("checkpoint written again: %s", path)
            self.checkpoint_problem = None
            return
        self.checkpoint_problem = f"checkpoint failed, retrying in 60 s: {error}"
        self.notifier.status(self.checkpoint_problem)

    def on_end(self, trainer: Trainer) -> None:
        self.notifier.stopping(f"stopping at step {trainer.step:,}: writing a checkpoint")

    def reload(self, trainer: Trainer) -> list[str]:
        """Apply the live keys of the re-read config; returns the changes ("key old -> new")."""
        self.notifier.reloading()
        try:
            new = daemon_config(self.config_file)
        except EdgerlError as e:
            log.error("reload failed, keeping the running config: %s", e)
            self.notifier.ready(f"reload failed: {e}")
            return []
        changes = []
        for key in LIVE_KEYS:
            old_value, new_value = trainer.cfg.get(key), new.get(key)
            if old_value != new_value:
                apply_live(trainer, key, new_value)
                changes.append(f"{key} {old_value} -> {new_value}")
        restart = [
            k
            for k in keys()
            if k not in LIVE_KEYS and k not in ("train.run_dir",) and _differs(trainer.cfg, new, k)
        ]
        log.info(
            "reloaded %s: %s",
            self.config_file or "the config",
            "; ".join(changes) if changes else "nothing that can change live changed",
        )
        if restart:
            log.warning("changed but only applied after a restart: %s", ", ".join(restart))
        self.notifier.ready(f"reloaded: {'; '.join(changes) or 'no live change'}")
        return changes


def _differs(old: Config, new: Config, key: str) -> bool:
    return old.get(key) != new.get(key)


def apply_live(trainer: Trainer, key: str, value: Any) -> None:
    """Change one live key in the running trainer."""
    section, name = key.split(".", 1)
    sub = getattr(trainer.cfg, section)
    setattr(trainer.cfg, section, dataclasses.replace(sub, **{name: value}))
    if key == "log.level":
        logging.getLogger().setLevel(getattr(logging, str(value).upper()))
    elif key == "hw.monitor_interval_ms" and trainer.monitor is not None:
        trainer.monitor.set_interval(int(value))
    display = getattr(trainer, "display", None)
    if section == "display" and display is not None:
        display.configure(trainer.cfg.display)


def setup_service_logging(debug: bool, level: str) -> None:
    from edgerl.cli import setup_logging

    setup_logging(debug, level, timestamps=not os.environ.get("JOURNAL_STREAM"))
    if os.environ.get("JOURNAL_STREAM"):
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JournalFormatter("%(message)s"))


def run(config_file: Path | None, debug: bool = False) -> int:
    """The service's main: returns the exit code (0 stopped, 2 user error, 1 crash)."""
    from edgerl.session import training_session
    from edgerl.signals import StopRequest, stop_on_signals

    notifier = Notifier()
    setup_service_logging(debug, "info")
    try:
        cfg = daemon_config(config_file)
    except EdgerlError as e:
        log.error("%s", e)
        notifier.status(f"failed: {e}")
        return e.exit_code
    setup_service_logging(debug, cfg.log.level)
    hook = ServiceHook(notifier, config_file)
    stop = StopRequest()

    def hangup() -> None:
        hook.reload_requested = True

    def request_stop(reason: str) -> None:
        notifier.stopping(f"{reason}: finishing the step, then a checkpoint")
        stop.set(reason)

    try:
        with (
            stop_on_signals(request_stop, hangup),
            training_session(cfg, quiet=True, hooks=[hook]) as trainer,
        ):
            stop.target = trainer.request_stop
            notifier.status(f"set up; taking the first step of {cfg.env.id}")
            result = trainer.run()
    except EdgerlError as e:
        log.error("%s", e)
        notifier.status(f"failed: {e}")
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        log.exception("the training loop crashed")
        notifier.status(f"crashed: {type(e).__name__}: {e}")
        return 1
    finally:
        notifier.close()
    log.info(
        "stopped at step %s of %s; checkpoint %s",
        f"{result.step:,}",
        f"{result.total_steps:,}",
        result.checkpoint,
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run(None))
