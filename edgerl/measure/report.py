"""``edgerl bench``'s text report: the JSON document of :mod:`edgerl.measure.bench` as a few
lines a person reads."""

from __future__ import annotations

from typing import Any

from edgerl.config.learners import LEARNERS
from edgerl.learners.kinds import modes_learner, replay_learner
from edgerl.measure.replay import render_replay_save
from edgerl.measure.to_target import to_target_lines
from edgerl.words import duration

ACTOR_GOAL = 0.9  # the actor loop should reach this share of the raw vector env


def actor_row(a: dict[str, Any]) -> str:
    """The report's line for one actor measurement. The actor runs on top of the raw env, so a
    share above 100% cannot be real: it is shown as 100% and named as noise (the machine's load
    changed between the windows)."""
    if a.get("timed_out"):
        return f"actor alone:   {a['num_envs']} envs: did not start in time"
    share = a["share_of_raw"]
    if share > 1.0:
        mark = f" (measured {share:.0%}, which the actor cannot reach on top of the raw env: noise)"
    elif share < ACTOR_GOAL:
        mark = (
            f" (below the {ACTOR_GOAL:.0%} goal; env.batch_size={a['num_envs'] // 2}, ALE's "
            "async mode, keeps the emulator busy while the loop works, at the price of a "
            "step order that is not repeatable)"
        )
    else:
        mark = ""
    return (
        f"actor alone:   {a['num_envs']} envs x {a['threads']} threads: "
        f"{a['steps_per_s']:,.0f} steps/s = {min(share, 1.0):.0%} of the raw vector env's "
        f"{a['raw_steps_per_s']:,.0f} ({a['windows']} alternating windows of "
        f"{a['window_s']:g} s each){mark}; host work {a['host_us_per_env_step']:.1f} us per env "
        f"step (the loop on recorded steps; its thread with the emulator: "
        f"{a['thread_us_per_env_step']:.1f} us)"
    )


def render_compute(c: dict[str, Any]) -> str:
    """The compute figures as one line: what a step costs, what the update made of the peak."""
    parts = ", ".join(f"{name} {n:g}" for name, n in c["forwards_per_env_step"].items() if n > 0)
    share = c["update_share_of_peak"]
    return (
        f"compute:       {c['macs_per_forward'] / 1e6:.2f}M multiply-adds per forward pass; "
        f"{c['mflop_per_env_step']:,.1f} MFLOP per env step (forward passes: {parts}); the "
        f"update made {c['update_gflops']:,.1f} GFLOP/s"
        + (f" = {share:.0%}" if share is not None else "")
        + f" of this machine's fp32 matrix-product peak ({c['matmul_peak_gflops']:,.0f} GFLOP/s, "
        f"measured now{best_peak(c)}); the forward pass alone: {c['forward_gflops']:,.0f} GFLOP/s"
    )


def best_peak(c: dict[str, Any]) -> str:
    """Where a lower precision's matrix products run faster than fp32's here: the update's
    share of that peak too (the room that precision, ``perf.amp``, could give)."""
    peaks = c.get("matmul_peaks_gflops") or {}
    name = max(peaks, key=peaks.get, default="fp32")
    if name == "fp32" or c.get("update_share_of_best_peak") is None:
        return ""
    share = c["update_share_of_best_peak"]
    return f"; {share:.0%} of its {name} peak, {peaks[name]:,.0f} GFLOP/s"


def render(result: dict[str, Any]) -> str:
    """The bench result as a short text report."""
    lines: list[str] = []
    if "device" in result:  # an interrupted bench may have measured nothing
        lines += _header(result)
    if "updates_per_s" in result:
        lines += _stage_lines(result)
    if "learner_bound_limit" in result:
        lines += _limit_lines(result["learner_bound_limit"])
    if "compute" in result:
        lines.append(render_compute(result["compute"]))
    for a in result.get("actor", []):
        lines.append(actor_row(a))
        if a.get("who_waits"):
            lines.append(f"  against the learner alone: {a['who_waits']}")
    for loop in result.get("loops", []):
        lines += _loop_lines(loop, result.get("env_steps_per_s", {}).get(str(loop["num_envs"])))
    if "to_target" in result:
        lines += to_target_lines(result["to_target"])
    if "autotune" in result:
        a = result["autotune"]
        lines.append(f"autotune:      {a['num_envs']} envs x {a['threads']} threads: {a['reason']}")
    if "pipeline_verdict" in result:
        lines.append(result["pipeline_verdict"])
    if "replay_save" in result:
        lines.extend(render_replay_save(result["replay_save"]))
    if "elapsed_s" in result:
        lines.append(f"took:          {duration(result['elapsed_s'])} in all, set-up included")
    lines += [f"warning: {w}" for w in result.get("warnings", [])]
    return "\n".join(lines)


def _algo(result: dict[str, Any]) -> str:
    """The learner a bench result measured (results from before it was kept: the first
    registered, which they all were)."""
    return str(result.get("algo", next(iter(LEARNERS))))


def _dqn_said(result: dict[str, Any]) -> str:
    """How a figure of the update variants' learner (its update modes, its replay) is named:
    plainly where it is the learner measured, as that learner's where another one is (the
    stage table measures :func:`~edgerl.learners.kinds.modes_learner`'s update)."""
    algo = _algo(result)
    modes = modes_learner(algo)
    return "" if algo == modes else f"{modes.upper()}'s "


def _header(result: dict[str, Any]) -> list[str]:
    algo = _algo(result)
    settings = (  # a replay learner's update is these; another learner's is its own section's
        f", train_freq {result['train_freq']}, batch {result['batch_size']}, n_step "
        f"{result['n_step']}"
        if replay_learner(algo)
        else ""
    )
    dqn = _dqn_said(result)
    return [
        f"edgerl bench on {result['device']} ({result['cpus']} CPUs, {result['torch_threads']} "
        f"torch threads), {result['env']}, {algo}{settings}"
        + (f", --preset {result['preset']}" if result.get("preset") else ""),
        f"{dqn + 'replay:':<15}{result['replay_bytes_per_transition']:,} bytes per transition",
    ]


def _stage_lines(result: dict[str, Any]) -> list[str]:
    lines = []
    lines.append(
        "env steps/s:   "
        + ", ".join(f"{n} envs {v:,.0f}" for n, v in result["env_steps_per_s"].items())
    )
    lines.append(
        "actions/s:     "
        + ", ".join(f"batch {b} {v['actions_per_s']:,.0f}" for b, v in result["act_per_s"].items())
    )
    dqn = _dqn_said(result)
    lines.append(
        f"{dqn + 'updates/s:':<15}"
        + ", ".join(f"{k} {v:,.1f}" for k, v in result["updates_per_s"].items())
    )
    return lines


def _limit_lines(lim: dict[str, Any]) -> list[str]:
    lines = []
    lines.append(
        f"learner alone: {lim['updates_per_s']:,.1f} updates/s ({lim['ms_per_update']} ms per "
        f"update, {lim['host_us_per_update']:,.0f} us of host CPU per update, "
        f"{lim['updates_per_launch']} per launch; {lim['update']}): a limit of "
        f"{lim['steps_per_s']:,.0f} env steps/s"
    )
    if pop := lim.get("population_forward"):
        lines.append(
            f"  {pop['rows']:.0f} members' forward passes: {pop['batched_rows_per_s']:,.0f} "
            f"rows/s in one batched call, {pop['each_rows_per_s']:,.0f} one member at a time "
            f"({pop['speedup']:.2f}x)"
        )
    for shape in lim.get("shapes", []):
        lines.append(
            f"  at batch {shape['batch_size']} / train_freq {shape['train_freq']}: "
            f"{shape['updates_per_s']:,.1f} updates/s ({shape['ms_per_update']} ms each): a limit "
            f"of {shape['steps_per_s']:,.0f} env steps/s"
        )
    return lines


def _loop_lines(loop: dict[str, Any], raw: float | None) -> list[str]:
    """One whole loop's row and what it adds (``raw``: the emulator alone at its count)."""
    lines = []
    if not loop["steps_per_s"]:  # nothing counted in its window: no figure, and no advice on it
        return [
            f"loop {loop['mode']:5s} {loop['num_envs']:>2d} env(s): no step was counted in its "
            "window (the machine was too busy, or building its environments took the window): "
            "measure again with more --seconds"
        ]
    note = f" ({loop['share_note']})" if loop.get("share_note") else ""
    in_loop = loop.get("ms_per_update_in_loop")
    vs = loop["vs_sync_1_env"]
    lines.append(
        f"loop {loop['mode']:5s} {loop['num_envs']:>2d} env(s): {loop['steps_per_s']:>7,.1f} "
        f"steps/s = {loop['share_of_limit']:.0%} of the limit{note}, "
        + (f"{vs:.2f}x the sync 1-env loop" if vs is not None else "no sync 1-env baseline")
        + f", learner busy {loop['learner_busy']:.0%}"
        + (f", {in_loop} ms per update" if in_loop is not None else "")
    )
    if loop.get("us_per_env_step") is not None:
        act, learn = loop["act_us_per_env_step"], loop["learn_us_per_env_step"]
        alone = f" (the emulator alone: {1e6 / raw:,.0f} us)" if raw else ""
        if loop["mode"] == "sync":  # one thread does it all: the parts add up
            rest = loop["us_per_env_step"] - act - learn
            split = (
                f"acting {act:,.0f} + learning {learn:,.0f} + emulation and the loop {rest:,.0f}"
            )
        else:  # the learner works on a thread of its own, beside the step
            split = f"acting {act:,.0f} + the rest; the learner thread {learn:,.0f} beside it"
        lines.append(f"  per env step: {loop['us_per_env_step']:,.0f} us = {split}{alone}")
    if loop.get("who_waits"):
        lines.append(f"  balance: {loop['who_waits']}")
    if loop.get("mj_per_env_step") is not None:
        lines.append(
            f"  energy: {loop['mj_per_env_step']:,.3g} mJ per env step (the power the "
            "machine reports over the window)"
        )
    return lines
