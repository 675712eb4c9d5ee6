"""How counts and durations read (words.py): `1 environment`, `3 h 58 min`, never `14284 s`."""

from __future__ import annotations

import math

import pytest

from edgerl.words import duration, plural


def test_plural_forms():
    assert plural(1, "environment") == "1 environment"
    assert plural(0, "episode") == "0 episodes"
    assert plural(1024, "environment") == "1,024 environments"
    assert plural(2, "process", "processes") == "2 processes"


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (0.4, "0 s"),
        (59.4, "59 s"),
        (59.6, "1 min"),
        (2442.6, "40 min 43 s"),  # as docs/results.md rounds a run's wall time
        (60, "1 min"),
        (725, "12 min 5 s"),
        (14284, "3 h 58 min"),
        (7200, "2 h"),
        (2 * 86400 + 4 * 3600 + 59, "2 d 4 h"),
        (math.nan, "n/a"),
    ],
)
def test_durations_read_in_the_largest_units(seconds, said):
    assert duration(seconds) == said
