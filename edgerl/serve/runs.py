"""The runs ``edgerl serve`` shows, and what their files say now, as plain documents for the page
and the metrics.

A request names a run by its id, which is looked up in the table the last scan of the roots made:
no text from a request is ever joined to a path, and only the files a run directory is known to
hold are read. Every file may be damaged: a damaged or missing file becomes a sentence in the
document (``problem``, ``damage``), never an exception. What is read is kept until the file it
came from changes (its size and modification time), so many viewers cost one read; the curves,
which read whole files, are read again at most every few seconds (longer for long runs).

Viewers learn what a run does, not where the board keeps it or who its actors are: sentences
name files by their last part and no process (:func:`for_viewers`), and a fleet is shown as its
actors' states and counts, without their nodes' addresses, host names or pids
(:func:`viewer_fleet`).
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from edgerl.display.curves import Series, load_run
from edgerl.errors import EdgerlError
from edgerl.files.checkpoint_name import NAME as CHECKPOINT
from edgerl.files.csvread import number
from edgerl.hw.monitor import LOAD_CSV_COLUMNS
from edgerl.report.status import FIELDS, STATUS_FILE, liveness
from edgerl.serve.rundir import OpenRun, read_run_config, read_run_status, refusal
from edgerl.words import printable

log = logging.getLogger(__name__)

# An absolute path in a sentence: a slash, then anything but the characters that end one in the
# sentences edgerl writes (spaces, quotes, brackets and the punctuation after a path).
# Two segments at least (``/var/lib``: a lone ``/2`` is arithmetic), and not a URL's ``//``.
ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/])/[^\s'\"()\[\],;:/]+(?:/[^\s'\"()\[\],;:/]*)+")
# What a viewer sees of a fleet: counts, and each remote actor's state and counts (no node
# address, node id, host name or pid); anything else in their place is shown as unknown (None).
FLEET_FIELDS = ("running", "transitions", "weights_lag_max")
FLEET_ACTOR_COUNTS = ("id", "transitions", "restarts")
FLEET_STATES = ("starting", "running", "lost", "restarting")  # edgerl.fleet.transport's
MAX_ACTORS = 1024  # shown of a fleet: a damaged status.json may list any number
MAX_COUNT = 10**15
MAX_RATE = 1e9  # steps/s


PID = re.compile(r"\bpid[ =]\d+", re.IGNORECASE)


def for_viewers(text: str | None, run_dir: Path | None = None) -> str | None:
    """A sentence for viewers: the run's own directory (``run_dir``) replaced by its name (a file
    in it by its path there), each other absolute path by its last part (``status.json in
    /var/lib/edgerl/runs/pong is damaged`` reads ``status.json in pong is damaged``) and each
    ``pid N`` by ``the trainer``: the board's layout and processes stay on it. The run's
    directory is replaced as a whole first, so a name with spaces (``/home/me/My Runs/secret
    project``) leaves nothing of the folders above it (a path's end in a sentence cannot be
    told from the words after it)."""
    if text is None:
        return None
    if run_dir is not None:  # a file inside it by its path there, the folder by its name
        for known in sorted({str(run_dir), _resolved(run_dir)}, key=len, reverse=True):
            if len(known) > 1:
                text = text.replace(known + "/", "").replace(known, run_dir.name)
    text = ABSOLUTE_PATH.sub(lambda m: Path(m.group(0).rstrip("/.")).name or "/", text)
    return PID.sub("the trainer", text)


def _resolved(path: Path) -> str:
    try:
        return str(path.resolve())
    except (OSError, RuntimeError):  # a link loop: the path as given is all there is
        return str(path)


def _count(value: object, most: float = MAX_COUNT) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most
    return value if ok else None  # type: ignore[return-value]


def viewer_fleet(fleet: object) -> dict[str, Any] | None:
    """A status document's ``fleet`` as viewers see it: the totals and each actor's state and
    counts, whether it was lost; nothing that names or locates a machine, and no value that is
    not what the trainer writes there (a count out of range, a state it has not: None and
    "unknown")."""
    if not isinstance(fleet, dict):
        return None
    out: dict[str, Any] = {k: _count(fleet.get(k)) for k in FLEET_FIELDS}
    actors = fleet.get("actors")
    shown = []
    for a in (actors if isinstance(actors, list) else [])[:MAX_ACTORS]:
        if not isinstance(a, dict):
            continue
        actor: dict[str, Any] = {k: _count(a.get(k)) for k in FLEET_ACTOR_COUNTS}
        state, sps = a.get("state"), a.get("sps")
        actor["state"] = state if state in FLEET_STATES else "unknown"
        fine = isinstance(sps, (int, float)) and not isinstance(sps, bool)
        actor["sps"] = float(sps) if fine and 0 <= sps <= MAX_RATE else None
        actor["lost"] = bool(a.get("lost"))
        shown.append(actor)
    out["actors"] = shown
    return out


SCAN_EVERY_S = 5.0  # new run directories appear on the page within this
RUN_FILES = (STATUS_FILE, "metrics.csv")  # a directory holding one of them is a run
CURVE_FILES = ("metrics.csv", "episodes.csv", "eval.csv", "load.csv")
CURVES_EVERY_S = 5.0  # curves read whole files: at most this often, or ten times their read time
LOAD_TAIL_BYTES = 96 * 1024  # load.csv's rows are 40-90 bytes: the last ~20 minutes at 1 Hz
METRICS_TAIL_BYTES = 4096  # metrics.csv's rows are under 300 bytes
# The curves read at most this much of each file: a metrics.csv row every 5 s is under 300
# bytes, so about six days of training; a larger file (a damaged or hostile one) shows its end
# and cannot hold the reader threads for seconds while other viewers wait.
CURVE_FILE_BYTES = 32 << 20
LOAD_COLUMNS = [c for c in LOAD_CSV_COLUMNS if c not in ("time", "step", "gr3d_mhz")]

T = TypeVar("T")


def _holds_run(path: Path) -> bool:
    """Whether ``path`` is a folder (or a link to one) holding a run's files (or links)."""
    try:
        return path.is_dir() and any(os.path.lexists(path / name) for name in RUN_FILES)
    except OSError:
        return False


def _children(folder: Path) -> list[Path]:
    """What ``folder`` holds, in order; nothing where it is not there (yet) or not ours."""
    try:
        return sorted(folder.iterdir())
    except OSError:
        return []


def find_runs(roots: list[Path], refused: dict[Path, str] | None = None) -> dict[str, Path]:
    """The run directories among ``roots`` (each a run directory, a directory of them, or one
    of folders of seeds' runs: ``edgerl train --seeds``' ``seed-K``, two levels down) by id:
    the directory's name (:func:`~edgerl.words.printable`), a seed's after its folder's
    (``ppo-seeds.seed-0``), with ``-2``, ``-3``... where names repeat. Ids are stable while
    the directories stay: they are given in the order of the paths. A run that is a link, or
    that others may write in, is left out (see :mod:`edgerl.serve.rundir`), with why in
    ``refused``."""
    found: list[Path] = []
    candidates: list[Path] = []
    names: dict[Path, str] = {}
    for root in roots:
        if _holds_run(root):
            candidates.append(root)
            continue
        for child in _children(root):  # the folder named may be a link: the user's own
            if _holds_run(child):
                candidates.append(child)
            elif not child.is_symlink() and child.is_dir():  # a folder of seeds' runs
                seeds = [seed for seed in _children(child) if _holds_run(seed)]
                candidates += seeds
                names |= {seed.absolute(): f"{child.name}.{seed.name}" for seed in seeds}
    for path in candidates:
        why = refusal(path)
        if why is None:
            found.append(path)
        elif refused is not None:
            refused[path] = why
    runs: dict[str, Path] = {}
    for path in sorted(dict.fromkeys(p.absolute() for p in found)):
        name = printable(names.get(path, path.name))  # one no encoder took made /metrics a 500
        run_id, n = name, 2
        while run_id in runs:
            run_id, n = f"{name}-{n}", n + 1
        runs[run_id] = path
    return runs


def _checkpoint_seq(name: str) -> int:
    found = CHECKPOINT.match(name)
    return int(found["seq"]) if found else -1


def _signature(path: Path) -> tuple[int, int] | None:
    try:
        st = path.lstat()  # a link's own: what it leads to is never read
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


@dataclass
class _Entry:
    signature: tuple[object, ...]
    value: Any
    at: float
    took: float


class FileCache:
    """Values computed from files, kept until one of the files changes (thread-safe: one
    computation of a key at a time, whoever asks)."""

    def __init__(self) -> None:
        self._entries: dict[object, _Entry] = {}
        self._locks: dict[object, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(
        self, key: object, paths: list[Path], compute: Callable[[], T], min_age: float = 0.0
    ) -> T:
        """``compute()``'s value for ``key``, computed again only when a file of ``paths`` has
        changed and the value kept is older than ``min_age`` seconds (or ten times what it took)."""
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            signature = tuple(_signature(p) for p in paths)
            entry = self._entries.get(key)
            if entry is not None:
                fresh = time.monotonic() - entry.at < max(min_age, 10 * entry.took)
                if entry.signature == signature or (min_age and fresh):
                    return entry.value  # type: ignore[no-any-return]
            start = time.monotonic()
            value = compute()
            now = time.monotonic()
            self._entries[key] = _Entry(signature, value, now, now - start)
            return value


def finite(value: Any) -> float | None:
    """A number as a float when it is a finite one (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def clean_load(record: Any) -> dict[str, Any] | None:
    """The load record of a status document with every field checked (a damaged file may hold
    anything there): numbers finite or None, per-core lists, sensor and rail maps of numbers."""
    if not isinstance(record, dict):
        return None
    out: dict[str, Any] = {}
    for key in ("ram_used_mb", "ram_total_mb", "swap_used_mb", "swap_total_mb", "emc",
                "emc_mhz", "gr3d", "gr3d_mhz"):  # fmt: skip
        out[key] = finite(record.get(key))
    for key in ("cpu", "cpu_mhz"):
        cores = record.get(key)
        out[key] = [finite(v) for v in cores[:1024]] if isinstance(cores, list) else []
    for key in ("temps", "power_mw"):  # sensor or rail name -> number
        named = record.get(key)
        pairs = list(named.items())[:64] if isinstance(named, dict) else []
        values = {name[:40]: finite(v) for name, v in pairs if name.isprintable()}
        out[key] = {name: v for name, v in values.items() if v is not None}
    time_text = record.get("time")
    out["time"] = time_text if isinstance(time_text, str) and time_text.isprintable() else None
    return out


class RunFiles:
    """What the files of the runs below ``roots`` say; every method takes a run directory that
    came from :meth:`runs`."""

    def __init__(self, roots: list[Path]) -> None:
        self.roots = roots
        self.cache = FileCache()
        self._runs: dict[str, Path] = {}
        self._scanned = -math.inf
        self._scan_lock = threading.Lock()
        self._told: set[tuple[Path, str]] = set()  # runs left out, said once each

    def runs(self) -> dict[str, Path]:
        """The runs by id, scanned again every :data:`SCAN_EVERY_S`."""
        with self._scan_lock:
            if time.monotonic() - self._scanned >= SCAN_EVERY_S:
                refused: dict[Path, str] = {}
                self._runs = find_runs(self.roots, refused)
                self._scanned = time.monotonic()
                for path, why in refused.items():
                    if (path, why) not in self._told:
                        self._told.add((path, why))
                        log.warning("edgerl serve: leaving out the run in %s: %s", path, why)
            return self._runs

    def status(self, run_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
        """(the checked status document, None), or (None, why there is none)."""

        def read() -> tuple[dict[str, Any] | None, str | None]:
            try:
                with OpenRun(run_dir) as run:
                    return read_run_status(run), None
            except EdgerlError as e:
                return None, str(e)
            except OSError as e:
                return None, f"cannot read {run_dir}: {e.strerror or e}"

        return self.cache.get(("status", run_dir), [run_dir / STATUS_FILE], read)

    def learner(self, run_dir: Path) -> tuple[str | None, str | None]:
        """(the run's learner, ``agent.algo`` of its config.toml; its game), None where unknown."""

        def read() -> tuple[str | None, str | None]:
            try:
                with OpenRun(run_dir) as run:
                    saved = read_run_config(run)
            except OSError:
                return None, None
            agent, env = saved.get("agent"), saved.get("env")
            algo = agent.get("algo") if isinstance(agent, dict) else None
            game = env.get("id") if isinstance(env, dict) else None
            return (
                algo if isinstance(algo, str) and algo.isprintable() else None,
                game if isinstance(game, str) and game.isprintable() else None,
            )

        return self.cache.get(("config", run_dir), [run_dir / "config.toml"], read)

    def best_eval(self, run_dir: Path) -> dict[str, float] | None:
        """The best evaluation in eval.csv: ``{"return_mean", "step"}``, or None."""

        def read() -> dict[str, float] | None:
            best: dict[str, float] | None = None
            try:
                with OpenRun(run_dir) as run, run.csv("eval.csv") as reader:
                    for cells in reader.rows():
                        row = dict(zip(reader.header or [], cells, strict=False))
                        value = number(row.get("return_mean", ""))
                        step = number(row.get("step", ""))
                        if value is None or step is None or abs(value) >= 1e15:
                            continue
                        if best is None or value >= best["return_mean"]:  # ties: the later
                            best = {"return_mean": value, "step": step}
            except OSError:
                return None
            return best

        return self.cache.get(("eval", run_dir), [run_dir / "eval.csv"], read)

    def last_metrics(self, run_dir: Path) -> dict[str, float]:
        """The numbers of metrics.csv's newest row by column (the loss is only there)."""

        def read() -> dict[str, float]:
            last: list[str] = []
            try:
                with OpenRun(run_dir) as run, run.csv("metrics.csv") as reader:
                    for cells in reader.tail(METRICS_TAIL_BYTES):
                        last = cells
                    header = reader.header or []
            except OSError:
                return {}
            values = {k: number(v) for k, v in zip(header, last, strict=False)}
            return {k: v for k, v in values.items() if v is not None and abs(v) < 1e300}

        return self.cache.get(("last", run_dir), [run_dir / "metrics.csv"], read)

    def summary(self, run_id: str, run_dir: Path) -> dict[str, Any]:
        """The status panel's document: the checked status.json (or why there is none), whether
        its trainer runs, the time left, the learner, the newest checkpoint, the best
        evaluation."""
        doc, problem = self.status(run_dir)
        algo, game = self.learner(run_dir)
        problem = for_viewers(problem, run_dir)
        out: dict[str, Any] = {"id": run_id, "problem": problem, "learner": algo, "env": game}
        out["checkpoint"] = self.newest_checkpoint(run_dir)
        out["best_eval"] = self.best_eval(run_dir)
        if doc is None:
            out.update(status=None, live=None, eta_s=None, load=None)
            return out
        live = liveness(doc)
        # Only the fields the reader checked (a damaged file may add anything), and no paths or
        # pids of the board: a name is enough.
        shown = {k: doc.get(k) for k in FIELDS if k not in ("run_dir", "load", "pid")}
        shown["write_problems"] = doc.get("write_problems") or []
        for key, value in shown.items():  # every sentence (message, write_problems, ...)
            if isinstance(value, str):
                shown[key] = for_viewers(value, run_dir)
            elif isinstance(value, list):
                shown[key] = [for_viewers(v, run_dir) if isinstance(v, str) else v for v in value]
        shown["fleet"] = viewer_fleet(doc.get("fleet"))
        if isinstance(shown.get("checkpoint"), str):  # a name: the board's paths stay on it
            shown["checkpoint"] = Path(shown["checkpoint"]).name
        out["status"] = shown
        out["env"] = doc.get("env") or game
        out["live"] = {
            "running": live.running and not live.stale,
            "stale": live.stale,
            "finished": live.finished,
            "reason": for_viewers(live.reason, run_dir),
            "age_s": round(max(live.age_s, 0.0), 1),
        }
        step, total, sps = doc.get("step") or 0, doc.get("total_steps") or 0, doc.get("sps") or 0
        learning = step >= (doc.get("learning_starts") or 0)
        running = live.running and not live.stale
        out["eta_s"] = (total - step) / sps if running and learning and sps > 0 else None
        out["load"] = clean_load(doc.get("load")) if running else None
        return out

    def newest_checkpoint(self, run_dir: Path) -> str | None:
        """The name of the run's newest checkpoint by its sequence number, or None."""
        try:
            with OpenRun(run_dir) as run:
                names = [n for n in run.files_in("checkpoints") if CHECKPOINT.match(n)]
        except OSError:
            return None
        return max(names, key=_checkpoint_seq, default=None)

    def listing(self) -> list[dict[str, Any]]:
        """Every run: id, game, state and when its status was last written, newest first."""
        rows = []
        for run_id, run_dir in self.runs().items():
            doc, _ = self.status(run_dir)
            if doc is None:
                _, game = self.learner(run_dir)
                rows.append({"id": run_id, "env": game, "state": "no status", "updated": 0})
                continue
            live = liveness(doc)
            state = "running" if live.running and not live.stale else str(doc.get("state"))
            state = "stale" if live.stale else "finished" if live.finished else state
            rows.append(
                {
                    "id": run_id,
                    "env": doc.get("env"),
                    "state": state,
                    "updated": doc.get("updated_unix") or 0,
                }
            )
        return sorted(rows, key=lambda r: -r["updated"])

    def curves(self, run_dir: Path) -> dict[str, Any]:
        """The learning curves: training return (with its moving mean), evaluations and steps/s
        against env steps and training time; ``damage`` names each damaged file, ``problem``
        says why there are none."""

        def read() -> dict[str, Any]:
            try:
                with OpenRun(run_dir) as run:
                    for name in CURVE_FILES:  # links and others' files are not read
                        run.check(name)
                    here = str(run.here)  # the directory opened, whatever is renamed meanwhile
                    try:
                        curves = load_run(run.here, max_bytes=CURVE_FILE_BYTES)
                    except EdgerlError as e:
                        problem = str(e).replace(here, str(run_dir))
                        return {"problem": for_viewers(problem, run_dir), "damage": []}
            except OSError as e:
                problem = f"cannot read {e.filename}: {e.strerror or e}"
                return {"problem": for_viewers(problem, run_dir), "damage": []}
            return {
                "problem": None,
                "per_episode": curves.returns_per_episode,
                "returns": _points(curves.returns),
                "evals": _points(curves.evals),
                "sps": _points(curves.sps),
                "damage": [for_viewers(d, run_dir) for d in curves.damage],
            }

        files = [run_dir / n for n in CURVE_FILES]
        return self.cache.get(("curves", run_dir), files, read, min_age=CURVES_EVERY_S)

    def load_history(self, run_dir: Path) -> dict[str, Any]:
        """The last minutes of load.csv: ``t`` (Unix seconds) and a list per column of
        :data:`LOAD_COLUMNS` (None where a sample has no value); ``damage`` names damage."""

        def read() -> dict[str, Any]:
            out: dict[str, Any] = {"t": [], **{c: [] for c in LOAD_COLUMNS}, "damage": None}
            try:
                with OpenRun(run_dir) as run, run.csv("load.csv") as reader:
                    for cells in reader.tail(LOAD_TAIL_BYTES):
                        row = dict(zip(reader.header or [], cells, strict=False))
                        try:
                            t = datetime.fromisoformat(row.get("time", "")).timestamp()
                        except (ValueError, OverflowError, OSError):
                            continue
                        out["t"].append(t)
                        for c in LOAD_COLUMNS:
                            out[c].append(number(row.get(c, "")))
            except OSError:
                return out
            if (damage := reader.damage()) is not None:
                out["damage"] = f"load.csv has {damage}: skipped"
            return out

        return self.cache.get(("load", run_dir), [run_dir / "load.csv"], read, min_age=1.0)


def _points(series: Series) -> dict[str, list[float]]:
    """A curve's points, rounded to what a chart shows (the JSON stays small)."""
    out = {
        "steps": [round(s) for s in series.steps],
        "wall_s": [round(w, 1) for w in series.wall_s],
        "y": [float(f"{y:.5g}") for y in series.y],
    }
    if series.smooth is not None:
        out["smooth"] = [float(f"{y:.5g}") for y in series.smooth]
    return out
