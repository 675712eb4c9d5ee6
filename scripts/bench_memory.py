#!/usr/bin/env python3
"""Training memory of the two learners on one game: DQN with its replay, PQN with its rollout.

Each case is a real ``edgerl train`` run in a process of its own, long enough to fill the
learner's memory and to learn (DQN: the replay's frames are committed at start, then updates run;
PQN: two whole rollouts, each learned from). The figure is the process's peak resident memory
(``ru_maxrss`` of the waited child: host memory, which on a Jetson is also the GPU's), beside
what the learner's memory itself holds (edgerl's own plan of it, as `edgerl doctor` prints it).

    python scripts/bench_memory.py                       # Pong: each learner at its defaults
    python scripts/bench_memory.py --dqn-capacity 1000000 --json memory.json

On a discrete GPU the replay or rollout lives in GPU memory instead: there, compare the memory
figures, not the peak RSS. DQN's defaults are edgerl's (``replay.capacity``, ``env.num_envs``):
about 2 GB of free host memory; a replay of a million transitions needs about 8 GB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edgerl.config import Config

MEASURE = """
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stderr.write(r.stderr[-4000:])
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode)
"""


def cases(args: argparse.Namespace) -> dict[str, tuple[int, list[str]]]:
    """Each case's name: its env steps and config settings."""
    rollout = 128 * 32  # PQN's Atari preset: 128 environments x 32 steps
    dqn = [
        f"replay.capacity={args.dqn_capacity}",
        f"env.num_envs={args.dqn_envs}",
        "replay.persist=false",
        f"agent.learning_starts={args.dqn_steps // 2}",
    ]
    return {
        f"DQN, replay {args.dqn_capacity:,}, {args.dqn_envs} envs": (args.dqn_steps, dqn),
        "PQN, 128 envs x 32 steps": (2 * rollout, ["agent.algo=pqn"]),
    }


def options(env: str, settings: list[str]) -> list[str]:
    return [x for s in [f"env.id={env}", *settings] for x in ("--set", s)]


def memory_line(env: str, settings: list[str]) -> str:
    """What `edgerl doctor` says about the learner's memory for these settings."""
    cmd = [sys.executable, "-m", "edgerl.cli", "doctor", "--json", *options(env, settings)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    try:
        checks = json.loads(r.stdout)["checks"]
    except (ValueError, KeyError):
        return "(doctor failed: " + r.stderr.strip()[-200:] + ")"
    line = next(c for c in checks if c["name"] == "replay memory")
    return line["found"].split(";")[0]


def run(name: str, steps: int, settings: list[str], env: str, work: Path) -> dict:
    run_dir = work / name.split(",")[0].lower()
    cmd = [sys.executable, "-m", "edgerl.cli", "train", "--steps", str(steps), "--quiet"]
    cmd += ["--run-dir", str(run_dir), "--set", "eval.every_steps=0", "--set", "hw.monitor=false"]
    cmd += options(env, settings)
    started = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-c", MEASURE, *cmd], capture_output=True, text=True, timeout=3600
    )
    wall = time.monotonic() - started
    peak_kib, code = (int(x) for x in r.stdout.split())
    if code != 0:
        sys.exit(f"{name}: edgerl train exited {code}:\n{r.stderr}")
    return {
        "case": name,
        "peak_rss_bytes": peak_kib * 1024,
        "memory": memory_line(env, settings),
        "wall_s": round(wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="ALE/Pong-v5")
    defaults = Config()  # edgerl's defaults: what a run that sets nothing uses
    parser.add_argument("--dqn-capacity", type=int, default=defaults.replay.capacity)
    parser.add_argument("--dqn-envs", type=int, default=defaults.env.num_envs)
    parser.add_argument("--dqn-steps", type=int, default=4000)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgerl-memory-") as tmp:
        for name, (steps, settings) in cases(args).items():
            row = run(name, steps, settings, args.env, Path(tmp))
            print(
                f"{row['case']}: peak RSS {row['peak_rss_bytes'] / 2**30:.2f} GiB; "
                f"{row['memory']} ({row['wall_s']} s)",
                flush=True,
            )
            rows.append(row)
    print(f"\n| {args.env} | peak RSS (host) | the learner's memory |\n| --- | --- | --- |")
    for row in rows:
        print(f"| {row['case']} | {row['peak_rss_bytes'] / 2**30:.2f} GiB | {row['memory']} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
