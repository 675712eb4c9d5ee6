"""What watching costs the trainer: steps/s with the display off, on without a viewer, and on at
every frame with a viewer attached (one run each, same machine, one after the other).

    python scripts/bench_display.py [--steps 6000] [--env ALE/Pong-v5] [--json]

Steps/s is measured from metrics.csv once learning has started (the learner dominates the loop),
so the three figures compare the same kind of work.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LEARNING_STARTS = 1000


def train_cmd(run: Path, env: str, steps: int, display: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "edgerl.cli",
        "train",
        "--env",
        env,
        "--steps",
        str(steps),
        "--run-dir",
        str(run),
        "--quiet",
        "--set",
        f"agent.learning_starts={LEARNING_STARTS}",
        "--set",
        "replay.capacity=20000",
        "--set",
        "train.log_every_s=2",
        *display,
    ]


def learning_sps(run: Path) -> float:
    """Steps/s between the first and last metrics rows after learning started (+1 interval)."""
    with (run / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if int(r["step"]) > LEARNING_STARTS * 1.5]
    first, last = rows[0], rows[-1]
    return (int(last["step"]) - int(first["step"])) / (
        float(last["wall_s"]) - float(first["wall_s"])
    )


def run_case(name: str, env: str, steps: int, display: list[str], viewer: bool) -> dict:
    run = Path(tempfile.mkdtemp(prefix=f"bench-display-{name}-"))
    trainer = subprocess.Popen(train_cmd(run, env, steps, display), stderr=subprocess.DEVNULL)
    view = None
    viewer_alive = False
    try:
        if viewer:
            while not (run / "display.json").exists() and trainer.poll() is None:
                time.sleep(0.1)
            view_env = {**os.environ, "SDL_VIDEODRIVER": os.environ.get("SDL_VIDEODRIVER", "dummy")}
            view = subprocess.Popen(
                [sys.executable, "-m", "edgerl.cli", "view", "--run-dir", str(run)],
                env=view_env,
                stderr=subprocess.DEVNULL,
            )
        trainer.wait()
        viewer_alive = view is not None and view.poll() is None  # watched to the end
    finally:
        if view is not None:
            view.terminate()
            view.wait()
    return {
        "case": name,
        "steps_per_s": round(learning_sps(run), 2),
        "viewer": viewer,
        "viewer_ran_throughout": viewer_alive,
        "run_dir": str(run),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--env", default="ALE/Pong-v5")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cases = [
        ("off", ["--set", "display.enabled=false"], False),
        ("every3-no-viewer", ["--set", "display.every=3"], False),
        ("every1-viewer", ["--set", "display.every=1"], True),
    ]
    results = [
        run_case(name, args.env, args.steps, display, viewer) for name, display, viewer in cases
    ]
    base = results[0]["steps_per_s"]
    for r in results:
        r["vs_off"] = round(r["steps_per_s"] / base, 3)
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print(f"{'case':20s} {'steps/s':>9s} {'vs off':>7s}")
        for r in results:
            print(f"{r['case']:20s} {r['steps_per_s']:9.1f} {r['vs_off']:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
