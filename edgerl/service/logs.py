"""Logging set-up: one handler on stderr, timestamps on a terminal, priorities for journald."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

SYSLOG_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is now, so rich's progress bar can redirect it."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


class JournalFormatter(logging.Formatter):
    """``<priority>message``: journald reads the priority, and adds the time itself."""

    def format(self, record: logging.LogRecord) -> str:
        return f"<{SYSLOG_PRIORITY.get(record.levelno, 6)}>{super().format(record)}"


def setup_logging(debug: bool, level: str = "info", timestamps: bool = True) -> None:
    """Log to stderr at ``level`` (debug: everything), with or without times."""
    handler = _StderrHandler()
    fmt = "%(asctime)s %(levelname)s %(message)s" if timestamps else "%(levelname)s %(message)s"
    handler.setFormatter(logging.Formatter(fmt, datefmt="%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    set_level(debug, level)
    for noisy in ("PIL", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not debug:
        # torch gives its loggers their own handler and level as its import ends; a Ctrl-C
        # during that import leaves them to ours, and at exit torch logs "FakeTensor cache
        # stats" at INFO (an atexit hook registered earlier in the same import).
        logging.getLogger("torch").setLevel(logging.WARNING)


def set_level(debug: bool, level: str) -> None:
    """Change the log level of a running process (the service's reload)."""
    logging.getLogger().setLevel(logging.DEBUG if debug else getattr(logging, level.upper()))


def setup_service_logging(debug: bool, level: str) -> None:
    """Under systemd (``$JOURNAL_STREAM``): journald priorities, no times of our own."""
    journal = bool(os.environ.get("JOURNAL_STREAM"))
    setup_logging(debug, level, timestamps=not journal)
    if journal:
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JournalFormatter("%(message)s"))
