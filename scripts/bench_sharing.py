#!/usr/bin/env python3
"""Training speed on a shared CPU: a run alone, beside busy loops, beside a second trainer.

Each run is the real ``edgerl train`` (default ``--preset pong-cpu``) for ``--steps`` env steps,
from nothing, in a fresh run directory; its speed is the env steps/s between its first and last
``metrics.csv`` rows (set-up and the first row's window left out). The conditions, each in turn:

* ``alone``: nothing else of this script's running;
* ``busy1``, ``busy2``: beside one or two busy loops (``python3 -c 'while 1: pass'``);
* ``trainer``: beside a second trainer of the same command (its speed is not counted).

With ``--baseline DIR`` (a checkout of another commit, e.g. ``git worktree add /tmp/base
HEAD~3``), every condition runs for both checkouts, one after the other, ``--pairs`` times, so
both meet the same drift of a shared machine; each run uses the same Python (the one running
this script) with ``PYTHONPATH`` at its checkout. Prints one line per run, then a table of the
medians and each condition's share of ``alone``; ``--json FILE`` keeps every figure.

    python scripts/bench_sharing.py                          # this checkout, one pair
    python scripts/bench_sharing.py --baseline /tmp/base --pairs 2 --json sharing.json

Run it with nothing else of yours on the machine: the load average before each run is printed,
and other users' work counts as busy loops too.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
BUSY = [sys.executable, "-c", "while 1: pass"]
CONDITIONS = ("alone", "busy1", "busy2", "trainer")
RUN_TIMEOUT_S = 3600  # one run; a run that takes longer is reported as failed


def train_cmd(args: argparse.Namespace, run_dir: Path) -> list[str]:
    cmd = [sys.executable, "-m", "edgerl.cli", "train", *args.train.split()]
    cmd += ["--steps", str(args.steps), "--run-dir", str(run_dir)]
    return [*cmd, "--set", "train.log_every_s=2", "--set", "eval.every_steps=0"]


def speed(run_dir: Path) -> float | None:
    """Env steps/s between the first and the last metrics.csv rows (from the start when there
    is one row)."""
    try:
        with open(run_dir / "metrics.csv", newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("step")]
    except OSError:
        return None
    if not rows:
        return None
    first = rows[0] if len(rows) > 1 else {"step": "0", "wall_s": "0"}  # a short run: from 0
    steps = int(rows[-1]["step"]) - int(first["step"])
    wall = float(rows[-1]["wall_s"]) - float(first["wall_s"])
    return steps / wall if wall > 0 else None


def one_run(args: argparse.Namespace, tree: Path, condition: str, scratch: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("OMP_NUM_THREADS", None)
    others: list[subprocess.Popen] = []
    load = os.getloadavg()[0]
    run_dir = Path(tempfile.mkdtemp(dir=scratch))
    if condition.startswith("busy"):
        others = [subprocess.Popen(BUSY) for _ in range(int(condition[4:]))]
    elif condition == "trainer":  # the second trainer trains for longer than the measured one
        second = Path(tempfile.mkdtemp(dir=scratch))
        longer = argparse.Namespace(**{**vars(args), "steps": 10 * args.steps})
        others = [
            subprocess.Popen(
                train_cmd(longer, second), env=env, stderr=subprocess.DEVNULL, cwd=scratch
            )
        ]
        time.sleep(20)  # it is building its environments: let it reach its loop first
    started = time.monotonic()
    try:
        done = subprocess.run(
            train_cmd(args, run_dir),
            env=env,
            cwd=scratch,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
        code = done.returncode
        moves = [
            ln.split("balance: ", 1)[1] for ln in done.stderr.splitlines() if "balance: " in ln
        ]
        threads = next((ln for ln in done.stderr.splitlines() if " torch thread" in ln), "")
    except subprocess.TimeoutExpired:
        code, moves, threads = None, [], ""
    finally:
        for p in others:
            p.kill()
            p.wait(timeout=60)
    return {
        "tree": str(tree),
        "condition": condition,
        "steps_per_s": speed(run_dir) if code == 0 else None,
        "exit": code,
        "seconds": round(time.monotonic() - started, 1),
        "load_before": round(load, 2),
        "threads_at_start": threads.split(", ", 1)[-1].split(": run directory")[0],
        "balance_moves": moves,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", default="--preset pong-cpu", help="edgerl train's options")
    parser.add_argument("--steps", type=int, default=40_000)
    parser.add_argument("--conditions", default=",".join(CONDITIONS))
    parser.add_argument("--baseline", type=Path, help="a checkout of the commit to compare with")
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    conditions = [c for c in args.conditions.split(",") if c]
    unknown = set(conditions) - set(CONDITIONS)
    if unknown:
        parser.error(f"unknown conditions {sorted(unknown)}; they are {', '.join(CONDITIONS)}")
    trees = [HERE] + ([args.baseline.resolve()] if args.baseline else [])
    results = []
    with tempfile.TemporaryDirectory(prefix="edgerl-sharing-") as scratch:
        for pair in range(args.pairs):
            for condition in conditions:
                for tree in trees:
                    r = one_run(args, tree, condition, Path(scratch))
                    r["pair"] = pair
                    results.append(r)
                    print(json.dumps(r), flush=True)
    print("\n| checkout | " + " | ".join(conditions) + " |")
    print("| --- |" + " --- |" * len(conditions))
    for tree in trees:
        alone = _median(results, tree, "alone")
        cells = []
        for condition in conditions:
            m = _median(results, tree, condition)
            share = f" ({m / alone:.2f})" if m and alone and condition != "alone" else ""
            cells.append("failed" if m is None else f"{m:,.0f}{share}")
        print(f"| {tree} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if all(r["steps_per_s"] for r in results) else 1


def _median(results: list[dict], tree: Path, condition: str) -> float | None:
    figures = [
        r["steps_per_s"]
        for r in results
        if r["tree"] == str(tree) and r["condition"] == condition and r["steps_per_s"]
    ]
    return statistics.median(figures) if figures else None


if __name__ == "__main__":
    sys.exit(main())
