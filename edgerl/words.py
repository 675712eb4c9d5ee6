"""How counts and durations read in the sentences edgerl prints: ``1 episode``, ``2 episodes``,
``3 h 58 min`` rather than ``14284 s``."""

from __future__ import annotations

import math
import re


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 environment``, ``1,024 environments`` (``nouns``: an irregular plural)."""
    word = noun if count == 1 else (nouns or noun + "s")
    return f"{count:,} {word}"


def duration(seconds: float) -> str:
    """``45 s``, ``12 min 5 s``, ``3 h 58 min``, ``2 d 4 h``: two units at most; to the nearest
    second (as docs/results.md writes a run's times), a longer span cut to its second unit."""
    if math.isnan(seconds) or seconds < 0:
        return "n/a"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s} s" if s else f"{m} min"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def fmt_bytes(n: float) -> str:
    """``1.3 GiB``: a size the way a user reads it (errors, `edgerl doctor`, the page)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")


_DURATION_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600}


def parse_duration(text: str) -> float:
    """``90s``, ``40m`` (or ``40min``), ``1h``, ``1.5h``, a bare number of seconds, as seconds;
    raises ValueError with what is accepted."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h)?\s*", text)
    if m is None:
        raise ValueError(f"{text!r} is not a duration: give seconds, or 90s, 40m, 1h")
    return float(m[1]) * _DURATION_UNITS[m[2] or "s"]


def printable(name: str) -> str:
    """A file name as text every encoder takes: the bytes that are not UTF-8 (Python holds them
    as lone surrogates, which UTF-8 cannot encode) written as ``\\xff``."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
