"""The time a recipe should take to its game's target on this machine: the runs on record's
samples to target (:mod:`edgerl.config.targets`) over the whole loop's steps/s measured here.

A prediction of training time alone: evaluations, start-up and the replay's saves come on top,
and the loop measured over seconds runs at the speed of its first minutes (PQN's and DQN's
updates cost the same all run long; the emulator's speed changes little with the score)."""

from __future__ import annotations

from typing import Any

from edgerl.config import Config
from edgerl.config.targets import samples_to_target
from edgerl.words import duration


def time_to_target(cfg: Config, loops: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The prediction for each measured loop at the configured ``env.num_envs`` (the count the
    runs on record trained with), or None where no run with ``cfg``'s settings reached its
    game's target."""
    found = samples_to_target(cfg)
    if found is None:
        return None
    here = [lp for lp in loops if lp["num_envs"] == cfg.env.num_envs and lp["steps_per_s"] > 0]
    return {
        "env": found.env_id,
        "target": found.target,
        "steps": found.steps,
        "reached": found.reached,
        "runs": len(found.runs),
        "said": found.describe(),
        "num_envs": cfg.env.num_envs,
        "loops": [
            {
                "mode": lp["mode"],
                "num_envs": lp["num_envs"],
                "steps_per_s": lp["steps_per_s"],
                "predicted_s": round(found.steps / lp["steps_per_s"], 1),
            }
            for lp in here
        ],
    }


def to_target_lines(t: dict[str, Any]) -> list[str]:
    """The prediction as the bench prints it."""
    lines = [f"to target:     {t['said']}"]
    if not t["loops"]:
        lines.append(
            f"  no loop was measured at the configured {t['num_envs']} environments: no prediction"
        )
    for lp in t["loops"]:
        lines.append(
            f"  loop {lp['mode']:5s} {lp['num_envs']:>2d} env(s) at {lp['steps_per_s']:,.0f} "
            f"steps/s: {duration(lp['predicted_s'])} of training predicted (evaluations aside)"
        )
    return lines
