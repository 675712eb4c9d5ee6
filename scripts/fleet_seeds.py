"""The fleet's DQN across seeds beside the local one: CartPole-v1 runs of the local learning
test's recipe (60,000 steps, tests/test_learning.py) fed by two Ray actors on two worker nodes of
a cluster started here, each run's best policy played for 10 episodes as tests/test_fleet.py
plays it, and each group summarised by ``edgerl results`` (k of n, final scores, IQM).

python scripts/fleet_seeds.py --out DIR [--seeds 5] [--steps 60000]
                              [--group NAME=KEY=VALUE,KEY=VALUE ...]

A group is a name and the settings its runs add; the group named ``local`` (or any group with
``fleet.actors=0``) trains without the fleet. The setting ``lose=STEP`` is the script's own: at
training step STEP a worker node is removed (its actor is lost, as tests/test_fleet.py loses
one), and 5,000 steps later a node is added back (the actor rejoins); the group ``fleet-loss``
does that at step 15,000. The default groups: ``local``, ``fleet`` (the
fleet's defaults: Ape-X exploration, weights every 50 updates), ``fleet-schedule`` (every
environment follows the local exploration schedule) and ``fleet-schedule-w1`` (also weights
after every update). Runs are kept under DIR/GROUP/seed-N; a run whose play.json is there is
not run again, so the same command resumes a study that was stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GROUPS = {
    "local": [],
    "fleet": [],
    "fleet-schedule": ["fleet.exploration=schedule"],
    "fleet-schedule-w1": ["fleet.exploration=schedule", "fleet.weights_every=1"],
    "fleet-loss": ["lose=15000"],
}
LOSS_FOR = 5_000  # steps between losing a node and adding one back
NODE = {"num_cpus": 1, "object_store_memory": 80 << 20}
RESOURCE = "edgerl_seeds"  # only the worker nodes have it: one actor each
EDGERL = [sys.executable, "-c", "import sys; from edgerl.cli import main; sys.exit(main())"]


def parse_groups(given: list[str] | None) -> dict[str, list[str]]:
    if not given:
        return GROUPS
    groups = {}
    for text in given:
        name, _, sets = text.partition("=")
        groups[name] = [s for s in sets.split(",") if s]
    return groups


def uses_fleet(name: str, sets: list[str]) -> bool:
    return name != "local" and "fleet.actors=0" not in sets


def status_step(run: Path) -> int:
    """The training step the run's status.json says (0 before it is written)."""
    try:
        return int(json.loads((run / "status.json").read_text()).get("step", 0))
    except (OSError, ValueError):
        return 0


def lose_a_node(proc: subprocess.Popen[str], run: Path, cluster: object, at: int) -> None:
    """At step ``at`` remove a worker node; ``LOSS_FOR`` steps later add one back."""
    removed = False
    while proc.poll() is None:
        step = status_step(run)
        if not removed and step >= at:
            cluster.remove_node(next(iter(cluster.worker_nodes)))  # type: ignore[attr-defined]
            removed = True
            print(f"  {run.name}: a worker node removed at step {step:,}", flush=True)
        elif removed and step >= at + LOSS_FOR:
            cluster.add_node(**NODE, resources={RESOURCE: 1})  # type: ignore[attr-defined]
            print(f"  {run.name}: a worker node added back at step {step:,}", flush=True)
            return
        time.sleep(0.5)


def run_one(
    run: Path,
    seed: int,
    steps: int,
    sets: list[str],
    env: dict[str, str],
    cluster: object = None,
) -> dict:
    """Train one seed and play its best policy; the summary also goes to run/play.json."""
    args = ["train", "--env", "CartPole-v1", "--steps", str(steps), "--seed", str(seed)]
    args += ["--run-dir", str(run), "--quiet"]
    lose = [int(s.split("=", 1)[1]) for s in sets if s.startswith("lose=")]
    for key in ["hw.monitor=false", "display.enabled=false", *sets]:
        if not key.startswith("lose="):
            args += ["--set", key]
    started = time.monotonic()
    proc = subprocess.Popen(
        [*EDGERL, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if lose:
        lose_a_node(proc, run, cluster, lose[0])
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{run}: training failed ({proc.returncode}): {err[-2000:]}")
    wall = time.monotonic() - started
    play = subprocess.run(
        [*EDGERL, "play", "--run-dir", str(run), "--episodes", "10", "--json"],
        capture_output=True,
        text=True,
    )
    if play.returncode != 0:
        raise SystemExit(f"{run}: play failed ({play.returncode}): {play.stderr[-2000:]}")
    summary = {**json.loads(play.stdout), "train_wall_s": round(wall, 1)}
    (run / "play.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60_000)
    ap.add_argument("--group", action="append", help="NAME=KEY=VALUE,KEY=VALUE (repeatable)")
    args = ap.parse_args(argv)
    groups = parse_groups(args.group)

    temp = tempfile.mkdtemp(prefix="edgerl-fs-", dir="/tmp")  # short: Ray's socket paths
    ray_env = {
        "RAY_TMPDIR": temp,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    os.environ.update(ray_env)
    cluster = None
    try:
        if any(uses_fleet(name, sets) for name, sets in groups.items()):
            from ray.cluster_utils import Cluster

            cluster = Cluster(
                initialize_head=True, head_node_args={**NODE, "include_dashboard": False}
            )
            for _ in range(2):
                cluster.add_node(**NODE, resources={RESOURCE: 1})
        for name, sets in groups.items():
            if uses_fleet(name, sets):
                assert cluster is not None
                sets = ["fleet.actors=2", f"fleet.resource={RESOURCE}", *sets]
                sets.append(f"fleet.address={cluster.address}")
            for seed in range(args.seeds):
                run = args.out / name / f"seed-{seed}"
                done = run / "play.json"
                if done.exists():
                    summary = json.loads(done.read_text())
                else:
                    summary = run_one(run, seed, args.steps, sets, dict(os.environ), cluster)
                print(
                    f"{name} seed {seed}: best policy played {summary['return_mean']:.1f} "
                    f"over {summary['episodes']} episodes (trained in {summary['train_wall_s']} s)",
                    flush=True,
                )
    finally:
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    for name in groups:
        runs = sorted(str(p) for p in (args.out / name).glob("seed-*"))
        print(f"\n== {name} ({' '.join(groups[name]) or 'the defaults'})", flush=True)
        subprocess.run(
            [*EDGERL, "results", *runs, "--target", "500", "-o", str(args.out / f"{name}.svg")],
            check=False,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
