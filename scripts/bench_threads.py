#!/usr/bin/env python3
"""Training speed against PyTorch's thread count, on a quiet and on a busy machine.

For each number of busy loops (``python3 -c 'while 1: pass'``, one process each, started by this
script and stopped after), and each ``perf.threads`` value (0 is edgerl's auto choice), run the
real ``edgerl train`` until ``--seconds`` after learning started, stop it with SIGTERM, and take
the steps/s of the rows of its metrics.csv written after learning started (the update is what
threads change). Prints one
line per run and a Markdown table; ``--json FILE`` keeps the figures.

    python scripts/bench_threads.py --env CartPole-v1 --busy 0,2 --threads 1,2,0
    python scripts/bench_threads.py --env ALE/Pong-v5 --busy 0,2 --threads 1,2,0 --seconds 90

Run it with nothing else of yours running; the load average before each run is printed with it,
since other users of the machine count as busy loops too. Figures vary by 10-20% between runs on
a shared machine: compare within a run of this script.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUSY = [sys.executable, "-c", "while 1: pass"]


def learning_rows(run_dir: Path) -> list[dict[str, str]]:
    """metrics.csv rows written after the first update."""
    try:
        with open(run_dir / "metrics.csv", newline="") as f:
            return [r for r in csv.DictReader(f) if r["step"] and r["updates"] not in ("", "0")]
    except (OSError, KeyError):
        return []


def train(env: str, threads: int, seconds: float, run_dir: Path, extra: list[str]) -> dict:
    """One ``edgerl train``, stopped ``seconds`` after learning started (or after 10 minutes
    without); returns its figures."""
    cmd = [sys.executable, "-m", "edgerl.cli", "train", "--env", env, "--steps", "100M"]
    cmd += ["--run-dir", str(run_dir), "--quiet", "--set", f"perf.threads={threads}"]
    cmd += ["--set", "train.log_every_s=2", "--set", "eval.every_steps=0", *extra]
    env_vars = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS",)}
    load = os.getloadavg()[0]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env_vars)
    started = time.monotonic()
    while not learning_rows(run_dir) and time.monotonic() - started < 600 and proc.poll() is None:
        time.sleep(1)
    time.sleep(seconds)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    chosen = next((line for line in err.splitlines() if " torch thread" in line), "")
    rows = learning_rows(run_dir)
    if len(rows) < 2:
        return {"threads": threads, "sps": None, "load_before": load, "log": chosen}
    first, last = rows[0], rows[-1]
    steps = int(last["step"]) - int(first["step"])
    wall = float(last["wall_s"]) - float(first["wall_s"])
    return {
        "threads": threads,
        "sps": steps / wall if wall > 0 else None,
        "updates": int(last["updates"]) - int(first["updates"]),
        "seconds_learning": wall,
        "load_before": load,
        "log": chosen.split(", ", 1)[-1].split(": run directory")[0],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--busy", default="0,2", help="busy loops to run beside training")
    parser.add_argument("--threads", default="1,2,0", help="perf.threads values (0: auto)")
    parser.add_argument("--seconds", type=float, default=45.0, help="per run, once learning")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    extra = [a for o in args.overrides for a in ("--set", o)]
    results = []
    for busy in [int(b) for b in args.busy.split(",")]:
        loops = [subprocess.Popen(BUSY) for _ in range(busy)]
        try:
            time.sleep(2 if busy else 0)
            for threads in [int(t) for t in args.threads.split(",")]:
                with tempfile.TemporaryDirectory() as tmp:
                    r = train(args.env, threads, args.seconds, Path(tmp) / "run", extra)
                r["busy_loops"] = busy
                results.append(r)
                sps = "n/a (learning did not start)" if r["sps"] is None else f"{r['sps']:.0f}"
                print(
                    f"busy {busy}, perf.threads={threads}: {sps} steps/s "
                    f"(load average before {r['load_before']:.1f}) {r['log']}",
                    flush=True,
                )
        finally:
            for p in loops:
                p.kill()
                p.wait()
    print(f"\n{args.env}, {os.cpu_count()} CPUs, {args.seconds:g} s per run\n")
    print("| busy loops | perf.threads | steps/s while learning | load average before |")
    print("| --- | --- | --- | --- |")
    for r in results:
        sps = "-" if r["sps"] is None else f"{r['sps']:,.0f}"
        name = "0 (auto)" if r["threads"] == 0 else str(r["threads"])
        print(f"| {r['busy_loops']} | {name} | {sps} | {r['load_before']:.1f} |")
    if args.json:
        args.json.write_text(json.dumps({"env": args.env, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
