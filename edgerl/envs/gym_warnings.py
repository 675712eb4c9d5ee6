"""gymnasium's warnings as plain log lines: it colours them for a terminal whatever the stream
(``\x1b[33mWARN: The environment CartPole-v0 is out of date...``, raw escapes in a log)."""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from collections.abc import Iterator

log = logging.getLogger(__name__)

ANSI_CODE = re.compile(r"\x1b\[[0-9;]*m")


@contextlib.contextmanager
def gym_warnings_logged() -> Iterator[None]:
    """Around ``gymnasium.make``: each warning it gives becomes one WARNING log line,
    ``gymnasium: The environment CartPole-v0 is out of date...``, without colour codes."""
    with warnings.catch_warnings(record=True) as caught:
        yield
    for w in caught:
        text = ANSI_CODE.sub("", str(w.message)).strip().removeprefix("WARN: ")
        log.warning("gymnasium: %s", text)
