"""``<run_dir>/status.json``: what a running trainer is doing, rewritten every few seconds.

Written by every training run (``edgerl train`` and the service) and read by ``edgerl status`` and
``edgerl view``. Fields: ``state`` (starting, training, stopping, finished, stopped, failed),
``step``, ``total_steps``, ``sps``, ``episodes``, ``return_mean``, ``epsilon`` (null for a
learner that does not explore by epsilon), ``updates``, ``started_at``, ``updated_at`` (ISO
times), ``updated_unix``, ``checkpoint`` (newest path), ``checkpoint_error``, ``load`` (the newest
monitor record), ``eval_return`` and ``eval_step`` (the newest evaluation, see
:mod:`edgerl.report.evaluate`), ``evaluating_step``, ``_done`` and ``_episodes`` (one in
progress), ``clocks``, ``env``, ``run_dir``, ``pid``,
``message``, ``write_problems`` (side files that cannot be written now, see
:mod:`edgerl.files.sidefiles`), ``fleet`` (with ``fleet.actors``: each remote actor's state, node
and transitions, see :mod:`edgerl.fleet.transport`), ``figures`` (the learner's own figures by
name, such as a genetic algorithm's generation and scores: :meth:`edgerl.learners.Learner.figures`;
null where not known yet). A reader checks every field's type and
range (:func:`check_status`): the file may be damaged.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from edgerl.envs.scores import human_normalised
from edgerl.errors import RunDirError
from edgerl.files.atomic import write_atomic
from edgerl.files.processes import pid_alive
from edgerl.files.regular import read_regular
from edgerl.files.sidefiles import SideFiles
from edgerl.report.hooks import Hook, Run
from edgerl.report.metrics import TrainStats
from edgerl.words import duration, plural

STATUS_FILE = "status.json"
MAX_STATUS_BYTES = 1 << 20  # a status document is about 1 KiB
PID_MAX = 1 << 22  # Linux's largest pid (PID_MAX_LIMIT)
WRITE_EVERY_S = 3.0
STALE_AFTER_S = 30.0


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def _num(v: float) -> float | None:
    return None if isinstance(v, float) and math.isnan(v) else v


class StatusWriter(Hook):
    """A trainer hook that keeps ``status.json`` current; ``clocks`` says the clocks' state."""

    def __init__(
        self,
        clocks: Callable[[], str] = lambda: "unchanged",
        every_s: float = WRITE_EVERY_S,
        side: SideFiles | None = None,
    ) -> None:
        self.clocks = clocks
        self.side = side or SideFiles()
        self.every_s = every_s
        self.started = time.time()
        self._last = 0.0
        self.state = "starting"
        self.message = ""
        self.checkpoint_error: str | None = None

    def write(self, run: Run, stats: TrainStats | None = None) -> None:
        stats = stats or run.stats
        now = time.time()
        doc = {
            "state": self.state,
            "message": self.message,
            "env": run.cfg.env.id,
            "recipe": run.cfg.train.recipe or None,
            "frames": run.spec.has_frames,  # whether a viewer will ever see a frame of it
            "run_dir": str(run.run_dir),
            "pid": os.getpid(),
            "step": run.step,
            "total_steps": run.cfg.train.steps,
            "sps": round(stats.sps, 1),
            "episodes": run.episodes,
            "return_mean": _num(run.return_mean()),
            "eval_return": _num(stats.eval_return),
            "eval_step": stats.eval_step if stats.eval_step >= 0 else None,
            **dict(zip(EVALUATING, stats.evaluating or (None, None, None), strict=True)),
            "eval_human_normalised": _num(
                human_normalised(run.cfg.env.id, stats.eval_return)
                if math.isfinite(stats.eval_return)
                else math.nan
            ),
            # null for a learner that does not explore by epsilon: a 0 there said nothing true
            "epsilon": round(run.epsilon(), 4) if stats.explores else None,
            "updates": run.updates,
            "started_at": _iso(self.started),
            "updated_at": _iso(now),
            "updated_unix": now,
            "checkpoint": str(run.last_checkpoint) if run.last_checkpoint else None,
            "learning_starts": stats.learning_starts,
            "fill_from": stats.fill_from,
            "checkpoint_error": self.checkpoint_error,
            "load": stats.load.get("record"),
            "load_line": stats.load.get("load_line"),
            "clocks": self.clocks(),
            "write_problems": self.side.problems(),
            "fleet": stats.fleet,
            "cpu_gpu_ratio": _num(stats.cpu_gpu_ratio),
            "energy_j": stats.load.get("energy_j"),
            "who_waits": stats.who_waits or None,
            "balance_moves": list(stats.balance_moves),
            "figures": {k: v if math.isfinite(v) else None for k, v in stats.figures.items()},
        }
        data = json.dumps(doc, indent=1).encode()
        # A status file that cannot be written must not stop training (a full disk): said once.
        self.side.attempt(STATUS_FILE, lambda: write_atomic(run.run_dir / STATUS_FILE, data))
        self._last = time.monotonic()

    # -- hook --------------------------------------------------------------------------------

    def on_start(self, run: Run) -> None:
        self.state = "training"
        self.write(run)

    def on_tick(self, run: Run, stats: TrainStats) -> None:
        if time.monotonic() - self._last >= self.every_s:
            self.write(run, stats)

    def on_checkpoint(self, run: Run, path: Path | None, error: str | None) -> None:
        self.checkpoint_error = error

    def on_end(self, run: Run) -> None:
        self.state = "stopping"
        self.write(run)

    def finish(self, run: Run, state: str, message: str = "") -> None:
        """The last write: ``finished``, ``stopped`` or ``failed``."""
        self.state, self.message = state, message
        self.write(run)


@dataclass(frozen=True)
class Liveness:
    running: bool
    stale: bool
    age_s: float
    reason: str
    finished: bool = False  # reached train.steps: nothing is wrong

    @property
    def exit_code(self) -> int:
        """``edgerl status``'s: 0 while it runs or once it finished, 3 otherwise."""
        return 0 if self.finished or (self.running and not self.stale) else 3


def liveness(doc: dict[str, Any], now: float | None = None) -> Liveness:
    """Is the trainer behind a (checked, see :func:`read_status`) status document running, and
    is its status fresh?"""
    now = time.time() if now is None else now
    age = now - float(doc.get("updated_unix") or 0)
    state = doc.get("state")
    step, total = doc.get("step") or 0, doc.get("total_steps") or 0
    if state == "finished" or (state == "stopped" and total and step >= total):
        reason = f"finished at {doc.get('updated_at')}: step {step:,} of {total:,}"
        return Liveness(False, False, age, reason, finished=True)
    if state in ("stopped", "failed"):
        return Liveness(False, False, age, f"{state} at {doc.get('updated_at')}")
    pid = doc.get("pid") or 0
    if not pid or not pid_alive(pid):
        return Liveness(
            False,
            False,
            age,
            f"not running: pid {pid} is gone (last update {doc.get('updated_at')})",
        )
    if age > STALE_AFTER_S:
        return Liveness(
            True,
            True,
            age,
            f"stale: pid {pid} runs but has not updated its status for {duration(age)}; "
            "the training loop may be hung",
        )
    return Liveness(True, False, age, f"running (pid {pid}, updated {duration(age)} ago)")


# What each field of status.json may hold (besides null), checked before anything reads it.
COUNT = ((int,), (0, 1 << 63))
# An evaluation in progress: the step of its weights, the episodes ended, of how many (or None)
EVALUATING = ("evaluating_step", "evaluating_done", "evaluating_episodes")
NUMBER = ((int, float), (-1e300, 1e300))
FIELDS: dict[str, tuple[tuple[type, ...], tuple[float, float] | None]] = {
    **dict.fromkeys(
        ("state", "message", "env", "run_dir", "started_at", "updated_at", "checkpoint",
         "checkpoint_error", "load_line", "clocks", "who_waits", "recipe"),
        ((str,), None),
    ),
    **dict.fromkeys(
        ("step", "total_steps", "episodes", "updates", "eval_step", "learning_starts",
         "fill_from", *EVALUATING),
        COUNT,
    ),
    **dict.fromkeys(
        ("sps", "return_mean", "eval_return", "epsilon", "cpu_gpu_ratio", "eval_human_normalised",
         "energy_j"),
        NUMBER,
    ),
    "pid": ((int,), (1, PID_MAX)),
    "updated_unix": ((int, float), (0, 1e11)),
    "load": ((dict,), None),
    "write_problems": ((list,), None),
    "balance_moves": ((list,), None),
    "fleet": ((dict,), None),
    "figures": ((dict,), None),
}  # fmt: skip
REQUIRED = ("state", "pid", "updated_unix")  # every trainer writes them


def check_status(doc: Any, path: Path) -> dict[str, Any]:
    """``doc`` if it is a status document whose fields have the types and ranges of
    :data:`FIELDS` (control characters in its text shown escaped); raises RunDirError naming the
    first field that does not."""

    def damaged(why: str) -> RunDirError:
        return RunDirError(
            f"{path} is damaged ({why}); a running trainer rewrites it every few seconds, so try "
            "again, or look at the run with edgerl plot"
        )

    if not isinstance(doc, dict):
        held = "null" if doc is None else type(doc).__name__
        raise damaged(f"it holds {held}, not an object")
    missing = [key for key in REQUIRED if doc.get(key) is None]
    if missing:
        raise damaged(f"it has no {missing[0]}")
    clean = dict(doc)
    for key, (types, bounds) in FIELDS.items():
        value = doc.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, types):
            raise damaged(f"{key} is {_show(value)}, not {_kind(types)}")
        # Comparisons only: false for NaN and infinities, exact for integers of any size (where
        # math.isfinite would overflow on a 400-digit one).
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            raise damaged(f"{key} is {_show(value)}, out of range")
        if isinstance(value, str):
            clean[key] = _printable(value)
    for key in ("fleet", "load"):  # objects of a few levels: anything deeper is damage
        if _depth(clean.get(key)) > MAX_DEPTH:
            raise damaged(f"{key} nests deeper than {MAX_DEPTH} levels")
    figures = clean.get("figures") or {}
    if len(figures) > MAX_FIGURES or not all(
        isinstance(k, str) and len(k) <= 40 and _figure(v) for k, v in figures.items()
    ):
        raise damaged("figures is not a few named numbers")
    clean["figures"] = {_printable(k): v for k, v in figures.items()}
    for key in ("write_problems", "balance_moves"):
        texts = clean.get(key) or []
        if not all(isinstance(t, str) for t in texts):
            raise damaged(f"{key} is not a list of text")
        clean[key] = [_printable(t) for t in texts]
    return clean


MAX_DEPTH = 6  # the deepest object status.json holds (fleet: actors, each a few fields)
MAX_FIGURES = 16  # a learner's own figures (status.json's "figures")


def _figure(value: Any) -> bool:
    """A learner's figure: a number within NUMBER's range (not NaN, not infinite: comparisons
    only, which hold for integers of any size), or None (not known yet)."""
    if value is None:
        return True
    low, high = NUMBER[1]
    return isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high


def _depth(value: Any, limit: int = MAX_DEPTH + 1) -> int:
    """How deep ``value`` nests (0 for a plain value), counted no further than ``limit``."""
    if limit <= 0 or not isinstance(value, (dict, list)):
        return 0
    items = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(v, limit - 1) for v in items), default=0)


def _kind(types: tuple[type, ...]) -> str:
    names = {str: "text", int: "a whole number", float: "a number", dict: "an object",
             list: "a list"}  # fmt: skip
    return names[types[-1]]


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _printable(text: str) -> str:
    """``text`` with control characters shown as escapes: a file's bytes never reach the
    terminal raw."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def game_without_frames(run_dir: Path) -> str | None:
    """The game of the run in ``run_dir`` when it has no frames to show (vector observations),
    else None (pictures, or nothing known yet). Its status.json says so; one written before it
    did (no ``frames``) is read as before: any game that is not ALE's is vectors."""
    from edgerl.envs import ale_game
    from edgerl.report.rundir import run_game

    try:
        status = read_status(run_dir)
    except RunDirError:
        status = {}
    frames = status.get("frames")
    game = run_game(run_dir)
    if isinstance(frames, bool):
        return None if frames else (game or str(status.get("env", "")) or None)
    return game if game is not None and ale_game(game) is None else None


def read_status(run_dir: Path) -> dict[str, Any]:
    """The checked status document of a run (see :func:`check_status`); raises RunDirError when
    it is missing, unreadable or damaged."""
    path = run_dir / STATUS_FILE
    try:
        data = read_regular(path, MAX_STATUS_BYTES, follow=False)
    except FileNotFoundError:
        raise RunDirError(
            f"{path} does not exist: no edgerl run has used {run_dir} (train one there, or "
            "start the service where it is installed: systemctl start edgerl)"
        ) from None
    except OSError as e:
        raise RunDirError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested beyond reason
        raise RunDirError(
            f"{path} is damaged (it is not JSON); a running trainer rewrites it every few "
            "seconds, so try again, or look at the run with edgerl plot"
        ) from None
    return check_status(doc, path)


def newest_checkpoint_file(run_dir: Path) -> Path | None:
    """The run's newest checkpoint file by its sequence number (any session's), or None."""
    from edgerl.files.checkpoint_name import NAME

    try:
        names = [p for p in (run_dir / "checkpoints").iterdir() if NAME.match(p.name)]
    except OSError:
        return None
    return max(names, key=lambda p: int(NAME.match(p.name)["seq"]), default=None)  # type: ignore[index]


# Why a run can show no episode after many steps (an Atari game is played to its end, thousands
# of steps, and the games in flight are not in a checkpoint): it looked broken.
NO_EPISODE_YET = (
    "no episode has ended yet: each environment plays its game to the end (an Atari game takes "
    "thousands of steps), and every resume starts the games in flight over, so short sessions "
    "of many environments may end none; evaluations (eval.csv, edgerl plot) show learning "
    "meanwhile"
)


def describe(doc: dict[str, Any], live: Liveness, run_dir: Path | None = None) -> str:
    """A short human summary of a status document (``run_dir``: also look at its checkpoints,
    since a new session has written none yet while the run has older ones)."""
    ret = doc.get("return_mean")
    evaluated = doc.get("eval_return")
    checkpoint = doc.get("checkpoint")
    on_disk = newest_checkpoint_file(run_dir) if run_dir is not None else None
    if on_disk is not None and (checkpoint is None or Path(checkpoint).name < on_disk.name):
        checkpoint = str(on_disk)
    step, starts = doc.get("step") or 0, doc.get("learning_starts") or 0
    filling = ""
    if step < starts:
        fill_from = doc.get("fill_from") or 0
        needed = max(starts - fill_from, 1)
        filling = (
            f"filling replay {min(step - fill_from, needed):,}/{needed:,}: learning starts at "
            f"step {starts:,}"
        )
    # null for a learner whose exploration is not epsilon's (a policy's noise, sampled actions)
    epsilon = "" if doc.get("epsilon") is None else f"epsilon {doc['epsilon']}, "
    lines = [
        f"{doc.get('env')} in {doc.get('run_dir')}: {live.reason}",
        f"step {step:,}/{doc.get('total_steps') or 0:,}, {doc.get('sps') or 0:,.0f} "
        f"steps/s, {plural(doc.get('episodes') or 0, 'episode')}, mean return "
        f"{'n/a' if ret is None else f'{ret:.2f}'}, {epsilon}"
        f"{plural(doc.get('updates') or 0, 'update')}",
        f"started {doc.get('started_at')}, clocks {doc.get('clocks')}",
        f"load: {doc.get('load_line') or 'n/a'}",
        f"checkpoint: {checkpoint or 'none yet'}",
    ]
    if doc.get("recipe"):
        lines.insert(-1, f"recipe: {doc['recipe']}")
    if doc.get("who_waits"):
        lines.insert(-1, f"balance: {doc['who_waits']}")
    if doc.get("energy_j") is not None:
        wh = doc["energy_j"] / 3600
        lines.insert(-1, f"energy: {wh:,.3g} Wh so far, from the power the machine reports")
    lines += [f"balance move: {move}" for move in doc.get("balance_moves") or ()]
    if figures := doc.get("figures"):
        shown = [f"{name} {'n/a' if v is None else f'{v:g}'}" for name, v in figures.items()]
        lines.insert(2, f"learner: {', '.join(shown)}")
    if evaluated is not None:
        step_of = doc.get("eval_step") or 0
        hns = doc.get("eval_human_normalised")
        normalised = "" if hns is None else f" ({hns:.2f} human-normalised)"
        lines.insert(2, f"evaluation at step {step_of:,}: mean return {evaluated:.2f}{normalised}")
    evaluating = [doc.get(key) for key in EVALUATING]
    if all(isinstance(v, int) for v in evaluating):  # an evaluation in progress
        step_of, done, of = evaluating
        lines.insert(2, f"evaluating step {step_of:,}: {done:,} of {of:,} episodes ended")
    if not doc.get("episodes") and step > 0:
        lines.insert(2, NO_EPISODE_YET)
    if filling:
        lines.insert(2, filling)
    if doc.get("checkpoint_error"):
        lines.append(f"checkpoint problem: {doc['checkpoint_error']}")
    lines += fleet_lines(doc.get("fleet"))
    for problem in doc.get("write_problems") or ():
        lines.append(f"{problem}: training goes on, the file catches up when it can be written")
    if doc.get("message"):
        lines.append(doc["message"])
    return "\n".join(lines)


def fleet_lines(fleet: dict[str, Any] | None) -> list[str]:
    """The remote actors of a status document: a line for the fleet, one per actor; what is
    damaged in it is left out (the document's own fields are checked)."""
    if not fleet:
        return []
    actors = [a for a in fleet.get("actors") or () if isinstance(a, dict)]
    total, running, lag = (
        fleet.get("transitions"),
        fleet.get("running"),
        fleet.get("weights_lag_max"),
    )
    head = f"fleet ({fleet.get('address')}): {running if isinstance(running, int) else '?'} of "
    head += f"{plural(len(actors), 'actor')} running"
    members, sizes = fleet.get("members"), fleet.get("bytes_per_member")
    if isinstance(members, int):  # a population's actors: episodes played from seeds
        head += f", {plural(members, 'episode')} played"
        if isinstance(sizes, dict) and all(
            isinstance(sizes.get(k), (int, float)) for k in ("out", "back")
        ):
            head += f" ({sizes['out']:,.0f} bytes out and {sizes['back']:,.0f} back per member)"
    elif isinstance(total, int):
        head += f", {total:,} transitions received"
    if isinstance(lag, int) and not isinstance(members, int):
        head += f", weights at most {plural(lag, 'update')} behind the newest sent"
    return [_printable(head)] + [_printable(_actor_line(a)) for a in actors]


def _actor_line(actor: dict[str, Any]) -> str:
    """``actor 1 on 10.0.0.2 (board2), pid 4242: running, 120,000 transitions, 850 steps/s``."""
    state, lost, node = actor.get("state"), actor.get("lost"), actor.get("node")
    where = f" on {node}" if isinstance(node, str) else ""
    if isinstance(actor.get("host"), str):
        where += f" ({actor['host']})"
    if isinstance(actor.get("pid"), int) and state == "running":
        where += f", pid {actor['pid']}"
    index = actor.get("id")
    shown = index if isinstance(index, int) and not isinstance(index, bool) else "?"
    text = f"actor {shown}{where}: "
    if state == "running":
        text += "running"
        if isinstance(actor.get("transitions"), int):
            text += f", {actor['transitions']:,} transitions"
        if isinstance(actor.get("sps"), (int, float)):
            text += f", {actor['sps']:,.0f} steps/s"
    elif state == "lost":
        text += f"lost ({lost}), starting again shortly"
    elif state == "restarting":
        text += f"lost ({lost}), waiting for a node with room to start again"
    elif state == "starting":
        text += "starting (waiting for a node with room)"
    else:  # not a state the trainer writes: a damaged or hostile status.json
        text += "in an unknown state"
    return text


def disk_full(run_dir: Path) -> bool:
    """True if the file system holding ``run_dir`` has no space left for edgerl's files (then
    status.json itself may be older than the run's progress)."""
    try:
        st = os.statvfs(run_dir)
    except OSError:
        return False
    return st.f_bavail == 0 or (st.f_files > 0 and st.f_favail == 0)
