"""The time a recipe should take to its game's target on this machine: the runs on record's
samples to target (:mod:`edgerl.config.targets`) over the whole loop's steps/s measured here.

Each loop is predicted from the runs that trained in its pipeline (sync or async) at the
precision the config trains in here: a run of another pipeline or precision says nothing of it.

A prediction of training time to the end of the evaluation that reaches the target: the loop's
steps and the time its evaluations add (the cost on record of each before the last, start-up
shared among them, and the last one's length, in env steps of the loop they ran beside:
:meth:`~edgerl.config.targets.SamplesToTarget.training_s`). The loop measured over seconds runs
at the speed of its first minutes (PQN's and DQN's updates cost the same all run long; the
emulator's speed changes little with the score)."""

from __future__ import annotations

from typing import Any

from edgerl.config import Config
from edgerl.config.targets import MIN_REACHING, samples_to_target
from edgerl.report.evaluate import eval_period
from edgerl.words import duration, plural

PIPELINES = ("sync", "async")


def time_to_target(
    cfg: Config, loops: list[dict[str, Any]], precision: str
) -> dict[str, Any] | None:
    """The prediction for each measured loop at the configured ``env.num_envs`` (the count the
    runs on record trained with), from the runs with ``cfg``'s settings in the loop's pipeline
    at ``precision``; None where no run with ``cfg``'s settings and that precision reached its
    game's target in either pipeline."""
    found = {p: f for p in PIPELINES if (f := samples_to_target(cfg, p, precision)) is not None}
    if not found:
        return None
    first = next(iter(found.values()))
    here = [lp for lp in loops if lp["num_envs"] == cfg.env.num_envs and lp["steps_per_s"] > 0]
    every = eval_period(cfg)
    return {
        "env": first.env_id,
        "target": first.target,
        "precision": precision,
        "pipelines": {
            p: {
                "steps": f.steps,
                "reached": f.reached,
                "runs": len(f.runs),
                "enough": f.enough,
                "said": f.describe(),
            }
            for p, f in found.items()
        },
        "num_envs": cfg.env.num_envs,
        "loops": [
            {
                "mode": lp["mode"],
                "num_envs": lp["num_envs"],
                "steps_per_s": lp["steps_per_s"],
                "predicted_s": (
                    round(found[lp["mode"]].training_s(lp["steps_per_s"], every), 1)
                    if lp["mode"] in found
                    else None
                ),
                "evaluations": (found[lp["mode"]].evaluations(every) if lp["mode"] in found else 0),
            }
            for lp in here
        ],
    }


def to_target_lines(t: dict[str, Any]) -> list[str]:
    """The prediction as the bench prints it."""
    lines = [f"to target:     {p['said']}" for p in t["pipelines"].values()]
    lines += [
        f"  ({p['reached']} of {p['runs']} {mode} runs at the target: fewer than {MIN_REACHING}, "
        "so the calibration would not choose on it)"
        for mode, p in t["pipelines"].items()
        if not p["enough"]
    ]
    if not t["loops"]:
        lines.append(
            f"  no loop was measured at the configured {t['num_envs']} environments: no prediction"
        )
    for lp in t["loops"]:
        loop = (
            f"  loop {lp['mode']:5s} {lp['num_envs']:>2d} env(s) at "
            f"{lp['steps_per_s']:,.0f} steps/s: "
        )
        if lp["predicted_s"] is None:
            lines.append(
                f"{loop}no run on record reached the target with the {lp['mode']} pipeline and "
                f"{t['precision']}: no prediction"
            )
        else:
            evaluations = lp.get("evaluations", 0)
            with_them = f", {plural(evaluations, 'evaluation')} included" if evaluations else ""
            lines.append(f"{loop}{duration(lp['predicted_s'])} of training predicted{with_them}")
    return lines
