"""Reading a run's CSV files whatever damage they carry (csvread.py), and the curves made of them
(curves.py): bounded points, exact totals, rows a resume replaced."""

from __future__ import annotations

import itertools
import math
import statistics

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from edgerl.display.curves import WINDOW, Series, read_curves
from edgerl.files.csvread import MAX_LINE, CsvReader

from .damage import CSV_TAILS, damaged_csv

GOOD = b"step,wall_s,return_mean\n100,1.0,5\n200,2.0,6\n300,3.0,7\n"


def test_each_damaged_line_is_skipped_counted_and_named(tmp_path):
    path = tmp_path / "eval.csv"
    path.write_bytes(GOOD + b"".join(CSV_TAILS.values()) + b"400,4.0,8\n")
    reader = CsvReader(path)
    rows = list(reader.rows())
    assert rows[0] == ["100", "1.0", "5"] and rows[-1] == ["400", "4.0", "8"]
    assert reader.header == ["step", "wall_s", "return_mean"]
    assert reader.damaged >= 3 and reader.first_damaged == 5
    assert reader.damage().endswith(f"(not text, or over {MAX_LINE // 1024} KiB)")


def test_a_line_of_many_megabytes_is_read_past_not_held(tmp_path):
    path = tmp_path / "metrics.csv"
    with path.open("wb") as f:
        f.write(GOOD)
        f.write(b"7" * (5 << 20))  # no newline for 5 MB, then the rows go on
        f.write(b"\n400,4.0,8\n")
    reader = CsvReader(path)
    assert [r[0] for r in reader.rows()] == ["100", "200", "300", "400"]
    assert reader.damage() == f"1 damaged line at line 5 (not text, or over {MAX_LINE // 1024} KiB)"


def test_the_tail_of_a_file_is_its_last_whole_rows_under_its_header(tmp_path):
    path = tmp_path / "load.csv"
    body = b"".join(f"{i},{i}.0,{i % 7}\n".encode() for i in range(1, 5001))
    path.write_bytes(GOOD.splitlines(keepends=True)[0] + body + b"\0\0\n" + b"5001,1.0,1\n")
    reader = CsvReader(path)
    rows = list(reader.tail(1000))
    assert reader.header == ["step", "wall_s", "return_mean"]
    assert rows[-1] == ["5001", "1.0", "1"] and rows[-2] == ["5000", "5000.0", "2"]
    assert 50 < len(rows) < 100  # rows of about 14 bytes in 1000: the cut line left out
    assert [int(r[0]) for r in rows] == list(range(int(rows[0][0]), 5002))
    assert (
        reader.damage() == f"1 damaged line near its end (not text, or over {MAX_LINE // 1024} KiB)"
    )
    assert [r[0] for r in CsvReader(path).tail(1 << 30)][:2] == ["1", "2"]  # all of it
    path.write_bytes(b"\xff\xfe" + GOOD)  # a header that cannot be read: no rows, and said
    reader = CsvReader(path)
    assert list(reader.tail(1000)) == []
    assert reader.damage() == f"1 damaged line at line 1 (not text, or over {MAX_LINE // 1024} KiB)"
    path.write_bytes(b"step,wall")  # a header still being written: no rows, no damage
    reader = CsvReader(path)
    assert list(reader.tail(1000)) == [] and reader.damage() is None


def test_curves_name_each_damaged_file(tmp_path):
    from edgerl.display.curves import load_run

    (tmp_path / "metrics.csv").write_bytes(GOOD + b"\xff\x00garbage\n" + b"400,4.0,8\n")
    curves = load_run(tmp_path)
    assert curves.returns.count == 4
    assert curves.damage == [
        f"metrics.csv has 1 damaged line at line 5 (not text, or over {MAX_LINE // 1024} KiB): "
        "skipped"
    ]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=damaged_csv(GOOD))
@example(data=b"step,\x01wall_s,return_mean\n100,1.0,5\n")  # a header without wall_s
def test_curves_of_any_damaged_file_are_finite_and_never_raise(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("csv") / "metrics.csv"
    path.write_bytes(data)
    returns, clock = Series(), Series()
    read_curves(path, {"return_mean": returns, "wall_s": clock})
    for series in (returns.finish(), clock.finish()):
        assert all(math.isfinite(v) for v in series.steps + series.wall_s + series.y)
        assert series.count >= len(series.y)


rows_of_steps = st.lists(
    st.tuples(st.integers(0, 10**6), st.floats(-1e6, 1e6, allow_nan=False)), max_size=3000
)


@settings(max_examples=60, deadline=None)
@given(rows=rows_of_steps, limit=st.integers(2, 50))
def test_a_series_keeps_few_points_and_exact_totals(rows, limit):
    series = Series(limit=limit, smooth=True)
    kept: list[tuple[int, float]] = []  # what the rows say once resumes replaced some
    for step, y in rows:
        if kept and step < kept[-1][0]:
            series.rewind(step)
            kept = [r for r in kept if r[0] <= step]
        series.add(step, step / 10, y)
        kept.append((step, y))
    series.finish()
    assert len(series.y) < 2 * limit and len(series.smooth or []) == len(series.y)
    if not any(step < before for (before, _), (step, _) in itertools.pairwise(rows)):
        # without rewinds every total is exact
        assert series.count == len(kept)
        if kept:
            ys = [y for _, y in kept]
            assert series.best == max(ys)
            assert math.isclose(series.mean(), statistics.fmean(ys), rel_tol=1e-9, abs_tol=1e-6)
            recent = ys[-WINDOW:]
            assert math.isclose(
                series.recent_mean(), statistics.fmean(recent), rel_tol=1e-9, abs_tol=1e-6
            )
            assert series.steps == sorted(series.steps)
    assert series.count <= len(kept)  # a point that straddles a resume goes whole
