#!/usr/bin/env python3
"""SAC's env steps/s against CleanRL's ``sac_continuous_action.py``, at equal settings, in turns.

CleanRL's script is not part of edgerl: give the folder holding it and what it imports
(``--cleanrl DIR``) and the Python that runs it (``--cleanrl-python``; gymnasium with MuJoCo,
tyro, tensorboard). Each pair runs ``edgerl train`` and the reference in turn on the same game
for the same env steps with the same settings: one environment, batches of 256, 256x256
networks, uniformly random actions for ``--learning-starts`` steps, then a critic update every
step and the policy's every other, the same number of torch threads, no evaluations. The figure
is each one's env steps/s while learning, from ``--skip`` steps after learning began to the end:
edgerl's from its metrics.csv rows, the reference's from the SPS lines it prints (its steps over
the seconds since it started, so ``steps / SPS`` is when it got there). Prints each pair and the
median of the pairs' ratios (edgerl's / the reference's).

    python scripts/bench_sac.py --cleanrl ~/cleanrl --cleanrl-python ~/cleanrl/venv/bin/python \\
        --steps 6000 --learning-starts 2000 --threads 1 --pairs 3

Run it with nothing else running: a shared machine's figures vary by 10-20% between runs; the
ratio of a pair, run back to back, varies less.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_threads import learning_rows

SPS_LINE = re.compile(r"^SPS:\s*(\d+)", re.MULTILINE)


def threads_env(threads: int) -> dict[str, str]:
    """The environment that holds both to ``threads`` torch threads (the reference never sets
    its own count, so OpenMP's variables do)."""
    n = str(threads)
    return {**os.environ, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "CUDA_VISIBLE_DEVICES": ""}


def edgerl_rate(args: argparse.Namespace, seed: int) -> float:
    """edgerl's env steps/s from ``--skip`` steps after learning began to the end."""
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "edgerl.cli", "train", "--env", args.env, "--quiet"]
        cmd += ["--steps", str(args.steps), "--seed", str(seed), "--run-dir", str(run)]
        for setting in (
            "agent.algo=sac",
            f"agent.learning_starts={args.learning_starts}",
            f"perf.threads={args.threads}",
            "eval.every_steps=0",
            "train.log_every_s=2",
        ):
            cmd += ["--set", setting]
        subprocess.run(cmd, check=True, env=threads_env(args.threads), timeout=3600)
        start = args.learning_starts + args.skip
        rows = [r for r in learning_rows(run) if int(r["step"]) >= start]
    if len(rows) < 2:
        raise SystemExit("edgerl wrote too few metrics rows: give more --steps")
    first, last = rows[0], rows[-1]
    wall = float(last["wall_s"]) - float(first["wall_s"])
    return (int(last["step"]) - int(first["step"])) / wall


def reference_rate(args: argparse.Namespace, seed: int) -> float:
    """The reference's env steps/s over the same stretch, from its SPS lines (one each 100
    steps once learning began: step ``k`` was reached ``k / SPS`` seconds after its start)."""
    cmd = [args.cleanrl_python, "-u", "sac_continuous_action.py", "--env-id", args.env]
    cmd += ["--total-timesteps", str(args.steps), "--learning-starts", str(args.learning_starts)]
    cmd += ["--seed", str(seed), "--no-track", "--no-capture-video", "--no-cuda"]
    done = subprocess.run(
        cmd, cwd=args.cleanrl, env=threads_env(args.threads), capture_output=True, text=True,
        timeout=3600, check=True,
    )  # fmt: skip
    sps = [int(s) for s in SPS_LINE.findall(done.stdout)]
    first = (args.learning_starts // 100 + 1) * 100  # the first step past it that 100 divides
    reached = [(first + 100 * i, s) for i, s in enumerate(sps)]
    start = args.learning_starts + args.skip
    stretch = [(k, k / s) for k, s in reached if k >= start and s > 0]
    if len(stretch) < 2:
        raise SystemExit("the reference printed too few SPS lines: give more --steps")
    (k0, t0), (k1, t1) = stretch[0], stretch[-1]
    return (k1 - k0) / (t1 - t0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cleanrl", type=Path, required=True, help="the reference's folder")
    parser.add_argument("--cleanrl-python", default=sys.executable)
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--learning-starts", type=int, default=2000)
    parser.add_argument("--skip", type=int, default=500, help="steps of warm-up not counted")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    if not (args.cleanrl / "sac_continuous_action.py").is_file():
        parser.error(f"{args.cleanrl} holds no sac_continuous_action.py")
    ratios = []
    load = os.getloadavg()[0]
    print(f"{args.env}, {args.steps} steps, learning from {args.learning_starts}, "
          f"{args.threads} torch thread(s), load average {load:.1f}", flush=True)  # fmt: skip
    for pair in range(args.pairs):
        ours = edgerl_rate(args, seed=pair)
        theirs = reference_rate(args, seed=pair)
        ratios.append(ours / theirs)
        print(f"pair {pair + 1}: edgerl {ours:.1f} env steps/s, reference {theirs:.1f}, "
              f"ratio {ours / theirs:.2f}", flush=True)  # fmt: skip
    print(f"median ratio over {len(ratios)} pairs: {statistics.median(ratios):.2f} "
          f"(range {min(ratios):.2f}-{max(ratios):.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
