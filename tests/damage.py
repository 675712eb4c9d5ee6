"""Damage as a failing disk, a kill, a copy cut short or a careless edit leaves it, for the tests of
every reader of edgerl's files: fixed cases that were seen, and Hypothesis strategies that
generate more (random bytes, JSON of the wrong types, huge and non-finite numbers)."""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import strategies as st

# Fixed cases, each seen to break a reader before: (name, bytes to append to a good file).
# The same random bytes every run (os.urandom's began with a newline now and then, which made
# test_csvread's damaged line one later in about one run of 256).
RANDOM_4K = random.Random(4096).randbytes(4096)
HUGE_CELL = b"1," + b"9" * (200 * 1024) + b"\n"  # a cell over the csv module's 128 KiB limit
CSV_TAILS = {
    "4 KiB of random bytes": RANDOM_4K,
    "a 200 KiB cell": HUGE_CELL,
    "NUL bytes": b"\0" * 64 + b"\n",
    "a badly quoted line": b'1,"2\n',
    "inf and nan": b"inf,nan,-inf,1e999,inf,inf,inf,inf,inf,inf\n",
    "the largest finite numbers": b"1e308,-1e308,1e308,-1e308,1e308,-1e308,1e308,1e308,1e308\n",
}

# status.json, display.json, clocks.json: documents of the wrong kind altogether.
WRONG_DOCUMENTS = [b"[]", b"{}", b"null", b"42", b'"text"', b"", RANDOM_4K, b"[" * 100_000]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=6,
)


def dumps(doc: Any) -> bytes:
    """JSON as Python writes it, NaN and Infinity included (json.loads reads them back)."""
    return json.dumps(doc, allow_nan=True).encode()


@st.composite
def damaged_json(draw: st.DrawFn, good: dict[str, Any]) -> bytes:
    """``good`` with one field given a random value (wrong types, huge or non-finite numbers) or
    removed, a random JSON document, or random bytes."""
    kind = draw(st.sampled_from(["field", "field", "field", "removed", "document", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "document":
        return dumps(draw(json_values))
    doc = dict(good)
    key = draw(st.sampled_from(sorted(doc)))
    if kind == "removed":
        del doc[key]
    else:
        doc[key] = draw(json_values)
    return dumps(doc)


@st.composite
def damaged_csv(draw: st.DrawFn, good: bytes) -> bytes:
    """``good`` (a CSV file's bytes) with random bytes, one of :data:`CSV_TAILS` or numbers
    no reader expects put in at a random place."""
    cut = draw(st.integers(min_value=0, max_value=len(good)))
    numbers = st.sampled_from(
        ["inf", "-inf", "nan", "1e999", "9" * 400, "1e308", "-1e308", "-0", "", "x", '"']
    )
    junk = draw(
        st.binary(max_size=200)
        | st.sampled_from(list(CSV_TAILS.values()))
        | st.lists(numbers, min_size=1, max_size=12).map(lambda c: (",".join(c) + "\n").encode())
    )
    return good[:cut] + junk + good[cut:]
