"""``edgerl bench``: each stage of training alone, then the whole loop, on this machine.

Stages: env steps/s for several ``env.num_envs``; batched action selection (forward passes at
batch 1, 8, 32); updates/s of the update variants that apply here (eager NCHW, channels_last, AMP
and CUDA graph on a GPU), each on a fixed batch. Then the two halves of training alone, as the
trainer runs them:

* **the learner** (the learner-bound limit): sampling from a filled replay on its device and the
  update, ``perf.updates_per_launch`` per CUDA-graph launch where one is captured. The limit is
  ``agent.train_freq x updates/s``: no loop can beat it at that replay ratio. It is measured with
  sampling included, for ``max(LIMIT_MIN_S, seconds / 2)`` (a one-second measurement on a shared
  machine once gave a limit a quarter of the real one);
* **the actor**: the real trainer before learning starts (epsilon 1), everything it does in the
  background included, against the raw vector env with the same environments and threads in
  alternating windows of the same length: its share of the emulator's own speed (at most 100%:
  a higher measurement is named as noise) and its host time per env step.

Then the real trainer for a few seconds in each pipeline, with the learner's busy fraction and
its share of the limit (from unrounded figures; a loop cannot beat the limit, so a share a
little above 100% is noise, reported as 100% and flagged, and one far above it says the limit
measurement was disturbed). Figures are per second and per update / per env step, so they scale
to other devices. Last, what saving the replay costs per checkpoint
(:mod:`edgerl.measure.replay`).
The measurements themselves are in :mod:`edgerl.measure.loops`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from edgerl.config import Config, Layer, build_layers, resolve
from edgerl.config.learners import learner_info
from edgerl.config.presets import (
    BOARD_PRESET,
    FIRST_RECIPE,
    NAMED_PRESETS,
    apply_presets,
    named_preset_layer,
)
from edgerl.envs import probe
from edgerl.envs.batches import overlaps_emulation
from edgerl.errors import ConfigError
from edgerl.hw.cpus import CpuLoad, CpuSample, others_busy, usable_cpus
from edgerl.hw.device import configure_for_training, oversubscription, precision_of, resolve_device
from edgerl.learners.factory import check_keys, memory_keeps_steps, memory_kind, policy_network
from edgerl.learners.nets import NatureCNN
from edgerl.measure.compute import (
    forward_gflops,
    forwards_per_env_step,
    hardware_precisions,
    learning_forwards_per_update,
    macs_per_forward,
    matmul_peak_gflops,
)
from edgerl.measure.loops import (
    actor_loop,
    env_steps_per_s,
    forwards_per_s,
    measure_update_variant,
    update_variants,
    whole_loop,
)
from edgerl.measure.replay import replay_save_cost
from edgerl.measure.stages import sigint_interrupts, stage
from edgerl.measure.to_target import time_to_target
from edgerl.memories.budget import bytes_per_transition
from edgerl.report.balance import who_waits
from edgerl.run.autotune import calibrate as autotune_envs
from edgerl.run.calibrate import calibrated_layer
from edgerl.run.learner_alone import learner_limit
from edgerl.run.pipeline import resolve_pipeline
from edgerl.words import duration, plural

log = logging.getLogger(__name__)

BENCH_SETTINGS = {  # learning starts early so a few seconds reach the learner-bound regime
    "agent.learning_starts": 500,
    "replay.capacity": 20_000,
    "hw.monitor": False,
    "display.enabled": False,
    "train.log_every_s": 1.0,
    "train.checkpoint_every_s": 1e6,
    "perf.compile": "off",  # the loops use the update the limit was measured with
    "replay.persist": False,  # the loops never checkpoint; replay_save measures its cost alone
    "eval.every_steps": 0,  # an evaluation would take CPU from the loop it measures
}


LIMIT_MIN_S = 3.0  # the shortest learner-limit measurement that repeated within a few % here
MIN_MEANINGFUL_S = 10.0  # shorter loops are dominated by start-up and scheduling noise
SHARE_NOISE = 0.15  # a loop up to this much above the limit is within measurement noise
VERDICT_NOISE = 0.1  # loops closer than this are within the run-to-run noise measured here
BUSY_WARNING = 0.25  # other programs busy on this share of the CPUs disturb the figures


def share_of_limit(steps_per_s: float, limit: float) -> tuple[float, str]:
    """(share, note): the loop's fraction of the learner-bound limit, at most 1.0, and what to
    say about it ("" when the figure is plain)."""
    share = steps_per_s / limit if limit > 0 else float("nan")
    if share <= 1.0:
        return share, ""
    if share <= 1.0 + SHARE_NOISE:
        return 1.0, f"{share:.0%} measured: at the limit within noise"
    return 1.0, (
        f"{share:.0%} measured, which a loop cannot reach: the limit measurement was disturbed "
        "(other load on the machine?); run again with a longer --seconds"
    )


@dataclass
class BenchOptions:
    env_id: str | None = None  # --env; None: the preset's, the config's, else Pong
    preset: str | None = None  # a named preset's settings, under BENCH_SETTINGS and --set
    seconds: float = 20.0  # per whole-loop measurement; stages take a fraction of it
    config_file: Path | None = None
    overrides: tuple[str, ...] = ()
    autotune: bool = False
    compile: bool = False  # also measure the torch.compile'd CPU update (20-50 s)
    env_sizes: tuple[int, ...] = (1, 4, 8, 16)
    act_batches: tuple[int, ...] = (1, 8, 32)
    actor_envs: tuple[int, ...] = (8, 32)  # the actor alone against the raw vector env
    # The whole loop: sync at each, async beside it where there are several environments.
    loop_envs: tuple[int, ...] = (1, 4)
    # The learner alone also at these (agent.batch_size, agent.train_freq) pairs (a replay
    # learner): bigger batches at the same samples per env step make fewer, larger kernels.
    batch_shapes: tuple[tuple[int, int], ...] = ()


def _config(
    opts: BenchOptions, extra: dict[str, Any] | None = None, bench_settings: bool = True
) -> Config:
    """The config the bench measures (``bench_settings``: with BENCH_SETTINGS, which make its
    replay small; without them, the one training would use, which the runs on record match)."""
    sets = [
        f"{k}={v}"
        for k, v in {**(BENCH_SETTINGS if bench_settings else {}), **(extra or {})}.items()
    ]
    # Without a recipe, the learner of the one README leads with, under the file and --set.
    default = {"agent.algo": NAMED_PRESETS[FIRST_RECIPE].values["agent.algo"]}
    layers = [Layer(f"{FIRST_RECIPE}'s learner (edgerl bench's default)", default)]
    layers += build_layers(opts.config_file, use_system=False)
    if opts.preset == BOARD_PRESET:  # what train would train here (measured once, remembered)
        said = resolve([*layers, *build_layers(None, opts.overrides, {}, False)])
        layers.append(calibrated_layer(said.hw.calibrate))
    elif opts.preset is not None:  # over the file, under what the bench and --set say
        layers.append(named_preset_layer(opts.preset))
    # --env when given (a shortcut of None is left out: the game of the layers below)
    layers += build_layers(None, [*sets, *opts.overrides], {"env.id": opts.env_id}, False)
    cfg = resolve(layers)
    spec = probe(cfg.env)
    if spec.continuous:
        raise ConfigError(
            f"edgerl bench measures games of discrete actions for now, and '{spec.id}' has "
            "continuous ones: time a run of it with edgerl train (its progress line gives env "
            "steps/s)"
        )
    cfg = apply_presets(cfg, spec.kind, spec.continuous)
    check_keys(cfg)
    return cfg


def _stages(
    cfg: Config, opts: BenchOptions, device: torch.device, stage_s: float
) -> dict[str, Any]:
    """Each stage alone: the vector env, batched action selection, the update variants."""
    spec = probe(cfg.env)
    out: dict[str, Any] = {}
    log.info("bench: env steps/s")
    out["env_steps_per_s"] = {
        str(n): round(env_steps_per_s(dataclasses.replace(cfg.env, num_envs=n), stage_s), 1)
        for n in opts.env_sizes
    }
    log.info("bench: batched action selection")
    net = policy_network(cfg, spec).to(device).eval()
    if isinstance(net, NatureCNN):
        net.use_channels_last()
    out["act_per_s"] = {}
    for b in opts.act_batches:
        fps = forwards_per_s(net, spec.obs_shape, spec.obs_dtype, b, device, stage_s)
        out["act_per_s"][str(b)] = {
            "forwards_per_s": round(fps, 1),
            "actions_per_s": round(fps * b, 1),
        }
    log.info("bench: updates/s")
    out["updates_per_s"] = {
        name: round(measure_update_variant(cfg, spec, device, v, stage_s * 2), 2)
        for name, v in update_variants(device, opts.compile).items()
    }
    return out


def _limit(cfg: Config, opts: BenchOptions, device: torch.device) -> dict[str, Any]:
    """The learner-bound limit: the learner alone, sampling included, as the loops run it."""
    used = (
        f"sampling and update as the loops run them (perf.amp={cfg.perf.amp}, "
        f"perf.cuda_graphs={cfg.perf.cuda_graphs})"
    )
    limit_s = max(LIMIT_MIN_S, opts.seconds / 2)
    with stage("the learner alone (the learner-bound limit)", limit_s):
        learner = learner_limit(cfg, probe(cfg.env), device, limit_s)
    ups = learner["updates_per_s"]
    limit = learner["steps_per_s"]
    return {
        "update_variant": used,
        "update": learner["describe"],
        "measured_s": limit_s,
        "updates_per_s": round(ups, 2),
        "updates_per_launch": learner["updates_per_launch"],
        "steps_per_s": round(limit, 1),
        "steps_per_s_raw": limit,
        "ms_per_update": round(1000 / ups, 3),
        "ms_per_env_step": round(1000 / limit, 4),
        "host_us_per_update": round(learner["host_us_per_update"], 1),
        **(
            {"population_forward": learner["population_forward"]}
            if "population_forward" in learner
            else {}
        ),
        "shapes": [_shape_limit(cfg, opts, device, b, f, limit_s) for b, f in opts.batch_shapes],
    }


def _shape_limit(
    cfg: Config, opts: BenchOptions, device: torch.device, batch: int, freq: int, seconds: float
) -> dict[str, Any]:
    """The learner-bound limit with ``agent.batch_size=batch, agent.train_freq=freq``."""
    log.info("bench: the learner alone at batch %d / train_freq %d", batch, freq)
    agent = dataclasses.replace(cfg.agent, batch_size=batch, train_freq=freq)
    learner = learner_limit(dataclasses.replace(cfg, agent=agent), probe(cfg.env), device, seconds)
    return {
        "batch_size": batch,
        "train_freq": freq,
        "updates_per_s": round(learner["updates_per_s"], 2),
        "ms_per_update": round(1000 / learner["updates_per_s"], 3),
        "steps_per_s": round(learner["steps_per_s"], 1),
        "host_us_per_update": round(learner["host_us_per_update"], 1),
    }


def _compute(
    cfg: Config, opts: BenchOptions, device: torch.device, updates_per_s: float, stage_s: float
) -> dict[str, Any]:
    """FLOPs per env step of the configured learner, the GFLOP/s its update made in the
    learner-alone measurement, and this machine's peak measured now (:mod:`compute`)."""
    spec = probe(cfg.env)
    net = policy_network(cfg, spec).to(device).eval()
    if isinstance(net, NatureCNN):
        net.use_channels_last()
    macs = macs_per_forward(net, spec.obs_shape, spec.obs_dtype)
    # The acting policy's values come back with the actions (CPU or GPU), and the memory keeps
    # them where the step is recorded before the next actions are picked (the plain loop).
    reused = not overlaps_emulation(cfg.env, spec.has_frames, device)
    per_step = forwards_per_env_step(cfg, values_reused=reused)
    update_gflops = updates_per_s * learning_forwards_per_update(cfg) * 2 * macs / 1e9
    log.info("bench: this machine's peak (matrix product in each precision, forward pass)")
    peaks = {
        name: round(matmul_peak_gflops(device, stage_s, dtype), 1)
        for name, dtype in hardware_precisions(device).items()
    }
    peak, best = peaks["fp32"], max(peaks.values())
    return {
        "macs_per_forward": macs,
        "forwards_per_env_step": {k: round(v, 4) for k, v in per_step.items()},
        "mflop_per_env_step": round(sum(per_step.values()) * 2 * macs / 1e6, 1),
        "values_reused": reused,
        "update_gflops": round(update_gflops, 1),
        "matmul_peak_gflops": round(peak, 1),
        "update_share_of_peak": round(update_gflops / peak, 3) if peak > 0 else None,
        "matmul_peaks_gflops": peaks,  # each precision in hardware here, fp32 included
        "update_share_of_best_peak": round(update_gflops / best, 3) if best > 0 else None,
        "forward_gflops": round(
            forward_gflops(net, spec.obs_shape, spec.obs_dtype, macs, stage_s), 1
        ),
    }


def _actor(cfg: Config, opts: BenchOptions, limit: float, gpu: bool) -> list[dict[str, Any]]:
    """The actor alone against the raw vector env, at each of ``opts.actor_envs``, and its
    CPU/GPU ratio: the env steps/s it supplies over the learner-bound ``limit``."""
    out = []
    cpus = usable_cpus()
    for n in opts.actor_envs:
        threads = cfg.env.threads or min(n, cpus)
        window = max(1.0, opts.seconds / 2)  # the actor's, then the raw env's, in turns
        with stage(f"the actor alone, {n} envs x {threads} threads", 2 * window):
            a = actor_loop(cfg, n, threads, window)
        if not a.get("timed_out") and limit > 0:
            a["cpu_gpu_ratio"] = a["steps_per_s"] / limit
            a["who_waits"] = who_waits(a["cpu_gpu_ratio"], gpu)
        out.append({k: round(v, 3) if isinstance(v, float) else v for k, v in a.items()})
    return out


def _loop_plan(cfg: Config, opts: BenchOptions) -> list[tuple[str, int]]:
    """The whole loops to measure, (pipeline, environments): sync at each of ``--loop-envs``,
    async beside it where there are several; PQN's rollout at its own count, both pipelines."""
    if memory_kind(cfg).lockstep:
        return [("sync", cfg.env.num_envs), ("async", cfg.env.num_envs)]
    sizes = dict.fromkeys(opts.loop_envs)  # each number once, in the order given
    return [(mode, n) for n in sizes for mode in ("sync", "async") if mode == "sync" or n > 1]


def _loops(
    cfg: Config, opts: BenchOptions, limit: float, warnings: list[str], out: list[dict[str, Any]]
) -> None:
    """The whole loop in each pipeline, with its share of the limit, into ``out`` as each one
    ends."""
    plan = _loop_plan(cfg, opts)
    cuda = resolve_device(cfg.perf.device).type == "cuda"
    if memory_kind(cfg).lockstep and opts.loop_envs != BenchOptions.loop_envs:
        warnings.append(
            f"--loop-envs is not used with {cfg.agent.algo}: its loop runs at its own "
            f"env.num_envs ({cfg.env.num_envs})"
        )
    for mode, n in plan:
        with stage(f"the whole loop, {mode} with {plural(n, 'env')}", opts.seconds):
            loop = whole_loop(cfg, mode, n, opts.seconds)
        if loop.get("timed_out"):
            warnings.append(f"loop {mode} with {n} env(s) never reached learning: left out")
            continue
        if loop.get("cpu_gpu_ratio") is not None:
            loop["who_waits"] = who_waits(loop["cpu_gpu_ratio"], cuda)
        share, note = share_of_limit(loop.pop("steps_per_s_raw"), limit)
        loop["share_of_limit"] = round(share, 3)
        if note:
            loop["share_note"] = note
            if "disturbed" in note:
                warnings.append(f"loop {mode} with {n} env(s): {note}")
        loop["vs_sync_1_env"] = None  # until every loop is measured
        out.append(loop)
    base = next((lp["steps_per_s"] for lp in out if lp["num_envs"] == 1), 0.0)
    for loop in out:  # None when the baseline made no step (a stalled machine)
        loop["vs_sync_1_env"] = round(loop["steps_per_s"] / base, 3) if base > 0 else None


def pipeline_verdict(loops: list[dict[str, Any]], auto: str, device: torch.device) -> str:
    """What ``perf.pipeline = "auto"`` picks here, and whether this run's loops agree (at the
    most environments both pipelines ran with)."""
    said = f"perf.pipeline=auto picks {auto} here"
    by_mode: dict[int, dict[str, float]] = {}
    for lp in loops:
        by_mode.setdefault(lp["num_envs"], {})[lp["mode"]] = lp["steps_per_s"]
    both = [n for n, m in by_mode.items() if {"sync", "async"} <= set(m)]
    if not both:
        return said
    n = max(both)
    at = by_mode[n]
    if min(at.values()) <= 0:
        return said
    other = "async" if auto == "sync" else "sync"
    ratio = at[other] / at[auto]
    envs = f"{n} envs"
    if ratio <= 1.0:
        return f"{said}, and this run agrees ({auto} {1 / ratio:.2f}x {other} at {envs})"
    if ratio <= 1.0 + VERDICT_NOISE:
        return (
            f"{said}; this run measured {other} {ratio:.2f}x {auto} at {envs}, within the "
            f"{VERDICT_NOISE:.0%} run-to-run noise"
        )
    why = (
        "on a CPU, auto keeps one loop: an actor thread beside the update's parallel regions "
        "often stalls them when other programs share the cores"
        if device.type == "cpu"
        else "auto runs the learner on its own thread beside a GPU learner"
    )
    return (
        f"{said}, but this run measured {other} {ratio:.2f}x faster at {envs} ({why}); "
        f"set perf.pipeline={other} to use it on this machine"
    )


def run_bench(opts: BenchOptions) -> dict[str, Any]:
    """Measure everything; returns the JSON document (see README "Performance"). A Ctrl-C
    (SIGINT) ends the measuring: what was measured by then is returned, marked interrupted."""
    started = CpuSample.now()
    clock = time.monotonic()
    result: dict[str, Any] = {}
    warnings: list[str] = []
    try:
        with sigint_interrupts():
            _measure(opts, result, warnings)
    except KeyboardInterrupt:
        result["interrupted"] = True
        warnings.append(
            "interrupted: the measurements above are complete, what would have followed was not "
            "measured"
        )
    if "cpus" in result:
        others = others_busy(started, CpuSample.now())
        result["others_busy_cpus"] = others
        warnings += machine_warnings(result["cpus"], others, result["torch_threads"])
    result["warnings"] = warnings
    result["elapsed_s"] = round(time.monotonic() - clock, 1)
    return result


def _measure(opts: BenchOptions, result: dict[str, Any], warnings: list[str]) -> None:
    """Each measurement in turn, into ``result`` as it ends (a Ctrl-C keeps those before)."""
    cfg = _config(opts)
    device = resolve_device(cfg.perf.device)
    configure_for_training(device, cfg)
    spec = probe(cfg.env)
    concurrent = learner_info(cfg.agent.algo).concurrent  # may it learn beside the actor?
    stage_s = max(0.5, opts.seconds / 10)
    result |= {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "cpus": usable_cpus(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "env": cfg.env.id,
        "preset": opts.preset,
        "algo": cfg.agent.algo,
        "train_freq": cfg.agent.train_freq,
        "batch_size": cfg.agent.batch_size,
        "n_step": cfg.agent.n_step,
        "replay_bytes_per_transition": bytes_per_transition(spec),
    }
    if memory_kind(cfg).lockstep and cfg.env.num_envs not in opts.env_sizes:
        # the emulator's own speed at a rollout's many environments (PQN's loop row uses it)
        opts = dataclasses.replace(opts, env_sizes=(*opts.env_sizes, cfg.env.num_envs))
    log.info("bench: %s", plan_sentence(cfg, opts, spec.has_frames))
    result.update(_stages(cfg, opts, device, stage_s))
    lim = _limit(cfg, opts, device)
    limit = lim.pop("steps_per_s_raw")
    result["learner_bound_limit"] = lim
    result["compute"] = _compute(cfg, opts, device, lim["updates_per_s"], stage_s)
    if opts.seconds < MIN_MEANINGFUL_S:
        warnings.append(
            f"--seconds {opts.seconds:g} is too short for steady figures (start-up and other "
            f"load weigh too much): take them as rough, and use --seconds "
            f"{MIN_MEANINGFUL_S:g} or more to compare"
        )
    if opts.autotune:
        log.info("bench: autotune")
        choice, measurements, _ = autotune_envs(
            cfg, spec, device, resolve_pipeline(cfg.perf.pipeline, device, concurrent=concurrent)
        )
        result["autotune"] = {
            **choice.to_dict(),
            "measurements": [m.__dict__ for m in measurements],
        }
    if spec.has_frames and opts.actor_envs:
        result["actor"] = _actor(cfg, opts, limit, device.type == "cuda")
    result["loops"] = []
    _loops(cfg, opts, limit, warnings, result["loops"])
    precision = precision_of(cfg.perf.amp, device, frames=spec.has_frames)
    if predicted := time_to_target(_config(opts, bench_settings=False), result["loops"], precision):
        result["to_target"] = predicted
    result["auto_pipeline"] = resolve_pipeline("auto", device, concurrent=concurrent)
    result["pipeline_verdict"] = pipeline_verdict(result["loops"], result["auto_pipeline"], device)
    if memory_keeps_steps(cfg):  # a rollout is never saved
        with stage("the replay save of a checkpoint"):
            result["replay_save"] = replay_save_cost(cfg, device, steps=cfg.replay.capacity // 4)


# The whole bench against its timed measuring, on 2 CPU cores: `edgerl bench --seconds 5` took 73 s
# for 25 s of measuring on a 2-core Intel Xeon with one core busy (the replay save, the actor's
# 32 environments and the loops' replay fill are the set-up); a newcomer's loaded AMD EPYC took
# about 2 minutes.
SET_UP_FACTOR = 3


def plan_sentence(cfg: Config, opts: BenchOptions, frames: bool) -> str:
    """What the bench is about to do, and that its set-up is not in ``--seconds``: the whole
    loops and the actor-alone rows run ``--seconds`` each, every other stage a tenth of it, and
    each one first builds its environments (and fills a replay, warms up) untimed."""
    loops = len(_loop_plan(cfg, opts))
    actors = len(opts.actor_envs) if frames else 0
    timed = (loops + actors) * opts.seconds
    return (
        f"{loops + actors} measurements of {opts.seconds:g} s (the whole loop and the actor "
        f"alone) and shorter stages, at least {duration(timed)} of measuring; each stage first "
        "builds its environments and warms up, untimed: on 2 CPU cores the whole takes about "
        f"{duration(SET_UP_FACTOR * timed)} or more (the report ends with the time it took)"
    )


def machine_warnings(cpus: int, others: float | None, threads: int) -> list[str]:
    """What this machine's other work did to the figures: other programs kept ``others`` of
    its ``cpus`` busy while the bench ran, beside PyTorch's ``threads``."""
    if others is None:
        return []
    out = []
    if others >= BUSY_WARNING * cpus:
        out.append(
            f"other programs kept {others:.1f} of the {cpus} CPUs busy while this bench ran: "
            "its figures are lower than this machine gives alone, and loops measured at "
            "different moments met different load; run it again when the machine is quiet"
        )
    oversubscribed = oversubscription(threads, CpuLoad(cpus, others, 1.0))
    if oversubscribed is not None:
        out.append(oversubscribed)
    return out
