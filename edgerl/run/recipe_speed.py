"""What a recipe's speed is on this machine (:mod:`edgerl.run.calibrate` weighs it): its actor
and its learner measured as ``edgerl bench`` measures them, in a process of its own.

ALE builds a recipe's environments in one call that holds Python's lock for seconds (25 s for
Pong's 128 on a loaded 2-core Xeon), so a stop (SIGTERM, Ctrl-C) could not be heard in the
process that measures: the starting process hands the recipes to a measuring one
(:func:`measure_child`), waits for its figures while it looks for a stop, and kills it on one
(it holds nothing to put back). Linux ends it with its parent, killed or not.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any

from edgerl.config import Config, build_layers, resolve, with_values
from edgerl.config.learners import learner_info
from edgerl.config.presets import NAMED_PRESETS
from edgerl.hw.cpus import cpu_load, mark_and_look
from edgerl.hw.recipe import Recipe

log = logging.getLogger(__name__)

POLL_S = 0.2  # how often the starting process looks for a stop while it waits for figures

Figures = tuple[float, float, str]  # actor env steps/s, learner-bound env steps/s, pipeline


def candidate_config(recipe: Recipe) -> Config:
    """The config a recipe trains with (the built-in defaults, the recipe, its learner's
    presets)."""
    cfg = resolve([*build_layers(None, [], use_system=False), recipe.layer()])
    return NAMED_PRESETS[recipe.preset].config(cfg)


def measure(cfg: Config, seconds: float) -> tuple[float, float, str]:
    """(actor env steps/s, learner-bound env steps/s, pipeline) of ``cfg`` on this machine."""
    import copy

    from edgerl.envs import probe
    from edgerl.hw.device import configure_for_training, resolve_device
    from edgerl.learners.factory import build_learner
    from edgerl.run.autotune import measure_actor
    from edgerl.run.learner_alone import learner_limit
    from edgerl.run.pipeline import resolve_pipeline

    # the update as the bench's loops measure it: compiling (perf.compile auto on a CPU) would
    # cost 20-50 s a recipe and is kept in training only where it pays
    cfg = with_values(cfg, {"perf.compile": "off"})
    device = resolve_device(cfg.perf.device)
    configure_for_training(device, cfg)
    spec = probe(cfg.env)
    net = copy.deepcopy(build_learner(cfg, spec, device).policy.net).eval()
    actor = measure_actor(cfg.env, net, device, seconds)
    limit = learner_limit(cfg, spec, device, seconds)["steps_per_s"]
    concurrent = learner_info(cfg.agent.algo).concurrent
    return actor, limit, resolve_pipeline(cfg.perf.pipeline, device, concurrent=concurrent)


def figures_of(entry: dict[str, Any] | None) -> Figures | None:
    """A remembered entry's figures, or None unless they are what a measurement leaves (a
    damaged or hand-edited entry is measured again)."""
    if not isinstance(entry, dict):
        return None
    actor, learner, pipeline = entry.get("actor"), entry.get("learner"), entry.get("pipeline")
    if not (_positive(actor) and _positive(learner)) or pipeline not in ("sync", "async"):
        return None
    return float(actor), float(learner), str(pipeline)  # type: ignore[arg-type]


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def measure_apart(
    recipes: list[Recipe],
    seconds: float,
    check: Callable[[int], None],
    announce: Callable[[int], None],
) -> Iterator[tuple[Figures, float] | None]:
    """For each of ``recipes`` in order, measured by :func:`measure` in a process of its own
    (:func:`measure_child`): (its figures, CPUs other work kept busy meanwhile), or None where
    it could not be measured (said). ``announce(i)`` is called as the ``i``-th begins;
    ``check(i)`` is called every :data:`POLL_S` while it is measured, and what it raises (a
    stop) ends the measuring process at once and goes on up."""
    request = {
        "parent": os.getpid(),
        "seconds": seconds,
        "recipes": [{"preset": r.preset, "why": r.why, "changes": r.changes} for r in recipes],
    }
    code = "from edgerl.run.recipe_speed import measure_child; raise SystemExit(measure_child())"
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            start_new_session=True,  # a Ctrl-C at the terminal is this process's to hear
        )
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps(request).encode())
            proc.stdin.close()
            lines: queue.Queue[bytes] = queue.Queue()
            reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True)
            reader.start()
            for i, recipe in enumerate(recipes):
                check(i)
                announce(i)
                line = _next_line(lines, functools.partial(check, i))
                if line is None:  # the process ended before its figures
                    why = _ended(proc.wait(), errors)
                    for rest in recipes[i:]:
                        log.warning(
                            "calibration: %s could not be measured here (%s): left out",
                            rest.name,
                            why,
                        )
                        yield None
                    return
                yield _answer(recipe, line)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _read_lines(stream: IO[bytes], lines: queue.Queue[bytes]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(b"")  # the end


def _next_line(lines: queue.Queue[bytes], check: Callable[[], None]) -> bytes | None:
    """The measuring process's next line (None at its end), calling ``check`` meanwhile."""
    while True:
        check()
        try:
            line = lines.get(timeout=POLL_S)
        except queue.Empty:
            continue
        return line or None


def _answer(recipe: Recipe, line: bytes) -> tuple[Figures, float] | None:
    """The figures in one of the measuring process's lines, or None (said) for its error."""
    try:
        answer = json.loads(line)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        answer = {"error": f"it answered {line[:80]!r}"}
    figures = answer.get("figures")
    listed = isinstance(figures, list) and len(figures) == 3
    named = dict(zip(("actor", "learner", "pipeline"), figures, strict=True)) if listed else None
    found, busy = figures_of(named), answer.get("busy")
    if found is None or isinstance(busy, bool) or not isinstance(busy, (int, float)):
        why = answer.get("error") or "it answered no figures"
        log.warning("calibration: %s could not be measured here (%s): left out", recipe.name, why)
        return None
    if isinstance(threads := answer.get("threads"), str):
        log.info("calibration: %s measured with %s", recipe.name, threads[:200])
    return found, float(busy)


def _ended(code: int, errors: IO[bytes]) -> str:
    """Why the measuring process ended early, in words: its exit and its last line."""
    errors.seek(0)
    said = [line.strip() for line in errors.read().decode(errors="replace").splitlines()]
    last = next((line for line in reversed(said) if line), "")
    how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    return f"the measuring process ended with {how}" + (f": {last}" if last else "")


def measure_child() -> int:
    """The measuring process (:func:`_measure_apart`): reads the recipes to measure as JSON on
    stdin and writes one JSON line per recipe, its figures or its error; what the games and
    libraries print goes to stderr."""
    results = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    request = json.load(sys.stdin)
    _end_with_parent(int(request["parent"]))
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from edgerl.hw.device import describe_threads

    for item in request["recipes"]:
        recipe = Recipe(item["preset"], item["why"], dict(item["changes"]))
        # The learner is measured at the thread count training would take (perf.threads auto:
        # the CPUs other work leaves free), judged by a look at the CPUs as it begins: this
        # process has no mark of the command line's, and the load average still counts a run
        # that ended seconds before. Right after a run, pong-cpu's learner was measured at one
        # thread (706 env steps/s on a 2-core Xeon) and remembered as quiet; training's loop
        # then ran at 968 with two.
        mark_and_look()
        seen = cpu_load()
        try:
            cfg = candidate_config(recipe)
            figures, busy = measure_once(cfg, request["seconds"], measure)
            # Remembered as quiet only where the CPUs were quiet as it began too: a busy look
            # takes fewer threads, which a quiet average over the measuring would hide.
            busy = max(busy, seen.load)
            answer: dict[str, Any] = {"figures": list(figures), "busy": round(busy, 3)}
            answer["threads"] = describe_threads(cfg.perf.threads, seen) + " as it began"
        except Exception as e:  # out of memory on a small board, a driver's error
            answer = {"error": str(e) or type(e).__name__}
        results.write(json.dumps(answer) + "\n")
    return 0


def _end_with_parent(parent: int) -> None:
    """Have Linux end this process with the one that started it (a SIGKILL to the service
    must not leave its measuring running)."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: it ends when its pipe does
        return
    if os.getppid() != parent:  # it ended before the request took effect
        os._exit(1)


def measure_once(cfg: Config, seconds: float, measure_fn: Any) -> tuple[Figures, float]:
    """(``measure_fn``'s figures of ``cfg``, CPUs other work kept busy meanwhile)."""
    from edgerl.hw.cpus import CpuSample, others_busy

    before = CpuSample.now()
    try:
        actor, learner, pipeline = measure_fn(cfg, seconds)
    finally:
        _free_memory()
    busy = others_busy(before, CpuSample.now()) or 0.0
    return (actor, learner, pipeline), busy


def _free_memory() -> None:
    """Give back what measuring allocated (a Jetson's GPU shares the board's memory)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
