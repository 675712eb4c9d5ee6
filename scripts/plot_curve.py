"""Draw a run's learning curve from its metrics.csv: mean return against wall time and env steps.

    python scripts/plot_curve.py RUN_DIR/metrics.csv OUT.svg [--title TEXT]

Needs matplotlib (``pip install matplotlib``), which edgerl itself does not depend on. A run
resumed after a stop keeps one metrics.csv whose ``wall_s`` counts training time across sessions;
a header repeated by a resume is skipped.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path


def read_rows(path: Path) -> list[dict[str, float]]:
    rows = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if row.get("step") == "step":  # the header again, written by a resumed session
                continue
            try:
                rows.append({k: float(v) for k, v in row.items() if k and v not in (None, "")})
            except ValueError:
                continue  # a row cut short by a kill
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_curve.py needs matplotlib: pip install matplotlib", file=sys.stderr)
        return 2
    rows = [r for r in read_rows(args.metrics) if not math.isnan(r.get("return_mean", math.nan))]
    if not rows:
        print(f"{args.metrics} has no rows with a mean return yet", file=sys.stderr)
        return 2
    returns = [r["return_mean"] for r in rows]
    fig, (by_time, by_steps) = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    by_time.plot([r["wall_s"] / 60 for r in rows], returns)
    by_time.set_xlabel("wall time (minutes)")
    by_time.set_ylabel("mean return, last 100 episodes")
    by_steps.plot([r["step"] / 1e6 for r in rows], returns)
    by_steps.set_xlabel("env steps (millions)")
    for ax in (by_time, by_steps):
        ax.grid(alpha=0.3)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
