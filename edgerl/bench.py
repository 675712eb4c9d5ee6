"""``edgerl bench``: each stage of training alone, then the whole loop, on this machine.

Stages: env steps/s for several ``env.num_envs``; batched action selection (forward passes at
batch 1, 8, 32); updates/s of the update variants that apply here (eager NCHW, channels_last, AMP
and CUDA graph on a GPU). Then the real trainer for a few seconds in each pipeline (the plain
synchronous single-environment loop is the baseline), with the learner's busy fraction. The
learner-bound limit is ``agent.train_freq x updates/s``: a loop is as fast as it can be when it
reaches it. Figures are per second and per update / per env step, so they scale to other devices.

The limit is measured with the update the loops use (the same variant, not another one), for
``max(LIMIT_MIN_S, seconds / 2)``: a one-second measurement on a shared machine once gave a limit
a quarter of the real one and a loop "at 385% of the limit". A loop's share of the limit is
computed from unrounded figures; a loop cannot beat the limit, so a share a little above 100% is
noise (reported as 100%, flagged) and one far above it says the limit measurement was disturbed.
Each loop also reports its own milliseconds per update, measured inside the loop. Last, what
saving the replay costs per checkpoint (:mod:`edgerl.bench_replay`).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgerl.autotune import calibrate, measure_updates
from edgerl.bench_replay import render_replay_save, replay_save_cost
from edgerl.config import Config, EnvConfig, apply_presets, build_layers, check_consistency, resolve
from edgerl.device import configure_backends, resolve_device
from edgerl.dqn import DQN
from edgerl.envs import make_env, probe
from edgerl.nets import NatureCNN, build_q_network
from edgerl.replay import bytes_per_transition, example_batch

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
}


LIMIT_MIN_S = 3.0  # the shortest learner-limit measurement that repeated within a few % here
MIN_MEANINGFUL_S = 10.0  # shorter loops are dominated by start-up and scheduling noise
MIN_WINDOW_UPDATES = 3  # a loop's window holds at least this many updates
SHARE_NOISE = 0.15  # a loop up to this much above the limit is within measurement noise


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
    env_id: str = "ALE/Pong-v5"
    seconds: float = 20.0  # per whole-loop measurement; stages take a fraction of it
    config_file: Path | None = None
    overrides: tuple[str, ...] = ()
    autotune: bool = False
    compile: bool = False  # also measure the torch.compile'd CPU update (about 20 s)
    env_sizes: tuple[int, ...] = (1, 4, 8, 16)
    act_batches: tuple[int, ...] = (1, 8, 32)


def _config(opts: BenchOptions, extra: dict[str, Any] | None = None) -> Config:
    sets = [f"{k}={v}" for k, v in {**BENCH_SETTINGS, **(extra or {})}.items()]
    cfg = resolve(
        build_layers(
            opts.config_file, [*sets, *opts.overrides], {"env.id": opts.env_id}, use_system=False
        )
    )
    cfg = apply_presets(cfg, probe(opts.env_id).kind)
    check_consistency(cfg)
    return cfg


def env_steps_per_s(env_id: str, num_envs: int, seconds: float) -> float:
    env = make_env(EnvConfig(id=env_id, num_envs=num_envs))
    try:
        env.reset(seed=0)
        rng = np.random.default_rng(0)
        actions = rng.integers(env.spec.num_actions, size=(64, num_envs))
        for i in range(3):
            env.step(actions[i])
        n, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            env.step(actions[n % 64])
            n += 1
        return n * num_envs / (time.perf_counter() - started)
    finally:
        env.close()


def forwards_per_s(
    net: torch.nn.Module,
    obs_shape: tuple[int, ...],
    obs_dtype: str,
    batch: int,
    device: torch.device,
    seconds: float,
) -> float:
    dtype = getattr(torch, obs_dtype)
    x = torch.zeros((batch, *obs_shape), dtype=dtype, device=device)
    with torch.no_grad():
        for _ in range(3):
            net(x).argmax(dim=1).cpu()
        n, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            net(x).argmax(dim=1).cpu()  # the host copy is part of picking actions
            n += 1
    return n / (time.perf_counter() - started)


def update_variants(
    cfg: Config, device: torch.device, compile_variant: bool = False
) -> dict[str, dict[str, Any]]:
    """The update configurations worth comparing on this device."""
    variants: dict[str, dict[str, Any]] = {
        "eager": {"amp": "off", "cuda_graphs": "off", "channels_last": False},
        "channels_last": {"amp": "off", "cuda_graphs": "off", "channels_last": True},
    }
    if device.type == "cpu" and compile_variant:
        variants["compiled"] = {
            "amp": "off",
            "cuda_graphs": "off",
            "channels_last": True,
            "compile": True,
        }
    if device.type == "cuda":
        variants["amp"] = {"amp": "auto", "cuda_graphs": "off", "channels_last": True}
        variants["cuda_graph"] = {"amp": "off", "cuda_graphs": "on", "channels_last": True}
        variants["amp+cuda_graph"] = {"amp": "auto", "cuda_graphs": "auto", "channels_last": True}
    return variants


def measure_update_variant(
    cfg: Config, device: torch.device, variant: dict[str, Any], seconds: float
) -> float:
    spec = probe(cfg.env.id)
    perf = dataclasses.replace(
        cfg.perf, amp=variant["amp"], cuda_graphs=variant["cuda_graphs"], compile="off"
    )
    net = build_q_network(spec, cfg.agent.hidden)
    learner = DQN(net, cfg.agent, device, perf)
    if isinstance(learner.q, NatureCNN) and not variant["channels_last"]:
        learner.q.use_channels_last(False)
        learner.target.use_channels_last(False)
    if variant.get("compile"):
        started = time.perf_counter()
        learner.fast.compile_setting = "on"
        learner.fast.maybe_compile(
            0, example_batch(spec, cfg.agent.batch_size, device, random=True)
        )
        log.info("bench: compiling took %.0f s", time.perf_counter() - started)
    return measure_updates(learner, spec, cfg.agent.batch_size, seconds)


def run_loop(opts: BenchOptions, mode: str, num_envs: int, seconds: float) -> dict[str, Any]:
    """The real trainer for ``seconds`` once learning has started; steady-state figures."""
    from edgerl.train import Trainer

    cfg = _config(opts, {"perf.pipeline": mode, "env.num_envs": num_envs, "train.steps": 10**9})
    workdir = Path(tempfile.mkdtemp(prefix="edgerl-bench-"))
    cfg.train.run_dir = str(workdir / "run")
    try:
        window: dict[str, float] = {}
        with Trainer(cfg, quiet=True) as trainer:

            def stop_later() -> None:
                # The window opens once learning runs, and is read from the trainer's own
                # counters (the learner makes its updates before the actor steps on, in sync mode).
                while trainer.step < cfg.agent.learning_starts * 2:
                    time.sleep(0.01)
                window["step0"], window["t0"] = trainer.step, time.perf_counter()
                window["busy0"] = trainer.learning.busy_s
                window["updates0"] = trainer.learner.updates
                time.sleep(seconds)
                # On a loaded machine a short window can hold no update at all: a figure from
                # it would say nothing, so the window lasts until it holds a few.
                while trainer.learner.updates - window["updates0"] < MIN_WINDOW_UPDATES:
                    time.sleep(0.05)
                window["step1"], window["t1"] = trainer.step, time.perf_counter()
                window["busy1"] = trainer.learning.busy_s
                window["updates1"] = trainer.learner.updates
                trainer.request_stop("bench")

            timer = threading.Thread(target=stop_later, daemon=True)
            timer.start()
            trainer.run()
        elapsed = window["t1"] - window["t0"]
        sps = (window["step1"] - window["step0"]) / elapsed
        busy_s = window["busy1"] - window["busy0"]
        updates = window["updates1"] - window["updates0"]
        return {
            "mode": mode,
            "num_envs": num_envs,
            "steps_per_s": round(sps, 1),
            "steps_per_s_raw": sps,
            "learner_busy": round(min(1.0, busy_s / elapsed), 3),
            "updates": int(updates),
            "ms_per_update_in_loop": round(1000 * busy_s / updates, 2) if updates else None,
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run_bench(opts: BenchOptions) -> dict[str, Any]:
    """Measure everything; returns the JSON document (see README "Performance")."""
    cfg = _config(opts)
    device = resolve_device(cfg.perf.device)
    configure_backends(device, cfg.perf.threads)
    spec = probe(opts.env_id)
    stage_s = max(0.5, opts.seconds / 10)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "cpus": torch.get_num_threads(),
        "torch": torch.__version__,
        "env": opts.env_id,
        "train_freq": cfg.agent.train_freq,
        "batch_size": cfg.agent.batch_size,
        "replay_bytes_per_transition": bytes_per_transition(spec),
    }
    log.info("bench: env steps/s")
    result["env_steps_per_s"] = {
        str(n): round(env_steps_per_s(opts.env_id, n, stage_s), 1) for n in opts.env_sizes
    }
    log.info("bench: batched action selection")
    net = DQN(build_q_network(spec, cfg.agent.hidden), cfg.agent, device, cfg.perf).q.eval()
    result["act_per_s"] = {}
    for b in opts.act_batches:
        fps = forwards_per_s(net, spec.obs_shape, spec.obs_dtype, b, device, stage_s)
        result["act_per_s"][str(b)] = {
            "forwards_per_s": round(fps, 1),
            "actions_per_s": round(fps * b, 1),
        }
    log.info("bench: updates/s")
    result["updates_per_s"] = {
        name: round(measure_update_variant(cfg, device, v, stage_s * 2), 2)
        for name, v in update_variants(cfg, device, opts.compile).items()
    }
    from edgerl.pipeline import resolve_pipeline

    # The limit: the very update the loops run (perf.* as configured, compile off as in
    # BENCH_SETTINGS), measured long enough to be steady.
    used = f"as the loops run it (perf.amp={cfg.perf.amp}, perf.cuda_graphs={cfg.perf.cuda_graphs})"
    limit_s = max(LIMIT_MIN_S, opts.seconds / 2)
    log.info("bench: the learner-bound limit, update %s, %.0f s", used, limit_s)
    variant = {"amp": cfg.perf.amp, "cuda_graphs": cfg.perf.cuda_graphs, "channels_last": True}
    ups = measure_update_variant(cfg, device, variant, limit_s)
    limit = cfg.agent.train_freq * ups
    result["learner_bound_limit"] = {
        "update_variant": used,
        "measured_s": limit_s,
        "updates_per_s": round(ups, 2),
        "steps_per_s": round(limit, 1),
        "ms_per_update": round(1000 / ups, 2),
        "ms_per_env_step": round(1000 / limit, 3),
    }
    warnings: list[str] = []
    if opts.seconds < MIN_MEANINGFUL_S:
        warnings.append(
            f"--seconds {opts.seconds:g} is too short for steady figures (start-up and other "
            f"load weigh too much): take them as rough, and use --seconds "
            f"{MIN_MEANINGFUL_S:g} or more to compare"
        )
    if opts.autotune:
        log.info("bench: autotune")
        choice, measurements, _ = calibrate(
            cfg, spec, device, resolve_pipeline(cfg.perf.pipeline, device)
        )
        result["autotune"] = {
            **choice.to_dict(),
            "measurements": [m.__dict__ for m in measurements],
        }
    loops = [("sync", 1), ("sync", 4), ("async", 4)]
    result["loops"] = []
    for mode, n in loops:
        log.info("bench: the whole loop, %s with %d env(s), %.0f s", mode, n, opts.seconds)
        loop = run_loop(opts, mode, n, opts.seconds)
        share, note = share_of_limit(loop.pop("steps_per_s_raw"), limit)
        loop["share_of_limit"] = round(share, 3)
        if note:
            loop["share_note"] = note
            if "disturbed" in note:
                warnings.append(f"loop {mode} with {n} env(s): {note}")
        result["loops"].append(loop)
    base = result["loops"][0]["steps_per_s"]
    for loop in result["loops"]:  # None when the baseline made no step (a stalled machine)
        loop["vs_sync_1_env"] = round(loop["steps_per_s"] / base, 3) if base > 0 else None
    result["auto_pipeline"] = resolve_pipeline("auto", device)
    log.info("bench: the replay save of a checkpoint")
    result["replay_save"] = replay_save_cost(cfg, device, steps=cfg.replay.capacity // 4)
    result["warnings"] = warnings
    return result


def render(result: dict[str, Any]) -> str:
    """The bench result as a short text report."""
    lines = [
        f"edgerl bench on {result['device']} ({result['cpus']} CPU threads), "
        f"{result['env']}, train_freq {result['train_freq']}, batch {result['batch_size']}"
    ]
    lines.append(f"replay:        {result['replay_bytes_per_transition']:,} bytes per transition")
    lines.append(
        "env steps/s:   "
        + ", ".join(f"{n} envs {v:,.0f}" for n, v in result["env_steps_per_s"].items())
    )
    lines.append(
        "actions/s:     "
        + ", ".join(f"batch {b} {v['actions_per_s']:,.0f}" for b, v in result["act_per_s"].items())
    )
    lines.append(
        "updates/s:     " + ", ".join(f"{k} {v:,.1f}" for k, v in result["updates_per_s"].items())
    )
    lim = result["learner_bound_limit"]
    lines.append(
        f"learner limit: {lim['steps_per_s']:,.0f} env steps/s ({lim['ms_per_update']} "
        f"ms per update, {lim['update_variant']})"
    )
    for loop in result["loops"]:
        note = f" ({loop['share_note']})" if loop.get("share_note") else ""
        in_loop = loop.get("ms_per_update_in_loop")
        vs = loop["vs_sync_1_env"]
        lines.append(
            f"loop {loop['mode']:5s} {loop['num_envs']:>2d} env(s): {loop['steps_per_s']:>7,.1f} "
            f"steps/s = {loop['share_of_limit']:.0%} of the limit{note}, "
            + (f"{vs:.2f}x the sync 1-env loop" if vs is not None else "no sync 1-env baseline")
            + f", learner busy "
            f"{loop['learner_busy']:.0%}"
            + (f", {in_loop} ms per update" if in_loop is not None else "")
        )
    if "autotune" in result:
        a = result["autotune"]
        lines.append(f"autotune:      {a['num_envs']} envs x {a['threads']} threads: {a['reason']}")
    lines.append(f"perf.pipeline=auto picks {result['auto_pipeline']} here")
    lines.extend(render_replay_save(result["replay_save"]))
    lines += [f"warning: {w}" for w in result.get("warnings", [])]
    return "\n".join(lines)
