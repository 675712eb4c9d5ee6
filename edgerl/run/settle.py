"""The config a run trains with: every value that can change it set first, then checked once.

The order: the presets of the game and the learner, the device and PyTorch's threads, autotune's
``env.num_envs`` and ``env.threads`` (``perf.autotune``), ``env.batch_size``'s auto, the run
directory; then the checks (the keys against each other, against the learner, the precision
against the device, the memory against the machine's). The trainer settles the config before it
writes anything, and once more with autotune's measurement when ``perf.autotune`` is on, after it
holds the run directory (a second trainer, or another game's run there, is refused before the
measurement starts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgerl.config import Config, with_values
from edgerl.config.checks import check_consistency, check_fleet
from edgerl.config.learners import learner_info
from edgerl.config.presets import apply_presets
from edgerl.envs import EnvSpec, probe
from edgerl.errors import ConfigError
from edgerl.hw.device import (
    configure_for_training,
    resolve_amp,
    resolve_cuda_graphs,
    resolve_device,
    resolve_pin_threads,
)
from edgerl.learners.factory import check_memory, check_setup, resolve_env_batch
from edgerl.report.rundir import default_run_dir
from edgerl.run.autotune import Choice, autotune_config


@dataclass(frozen=True)
class Settled:
    """A run's config with every value set, and what deciding it found out."""

    cfg: Config
    spec: EnvSpec  # the game
    device: torch.device  # where learning runs
    autotune: Choice | None  # what perf.autotune chose, when it ran
    available: int  # bytes of memory the run may use (the replay is planned against it)


def settle_config(requested: Config, autotune: bool = False) -> Settled:
    """``requested`` (the config files and the command line) made final and checked; with
    ``autotune`` (and ``perf.autotune`` on), env.num_envs and env.threads measured first.

    Raises ConfigError, EnvError or ReplayMemoryError with one sentence that names the keys to
    change, DeviceError when the device asked for is not usable.
    """
    spec = probe(requested.env)
    cfg = apply_presets(requested, spec.kind, spec.continuous)
    device = resolve_device(cfg.perf.device)
    cfg = settle_deterministic(cfg)
    configure_for_training(device, cfg)
    choice = None
    check_fleet(cfg)  # before autotune, which measures actors here
    if autotune and cfg.perf.autotune:
        check_setup(cfg, spec)  # autotune measures this learner: refuse what it cannot learn
        cfg, choice = autotune_config(cfg, spec, device)
        if device.type == "cuda":  # what the measurement cached is the run's memory to plan
            torch.cuda.empty_cache()
    run_dir = cfg.train.run_dir or str(default_run_dir(spec.short_name))
    batch = 0 if cfg.fleet.actors else resolve_env_batch(cfg, spec, device)
    pin = resolve_pin_threads(cfg.env.pin_threads, device)
    cfg = with_values(
        cfg, {"train.run_dir": run_dir, "env.batch_size": batch, "env.pin_threads": pin}
    )
    check_consistency(cfg)
    check_setup(cfg, spec)
    amp = resolve_amp(cfg.perf.amp, device, frames=spec.has_frames)
    resolve_cuda_graphs(cfg.perf.cuda_graphs, device, amp)
    return Settled(cfg, spec, device, choice, check_memory(cfg, spec, device))


def settle_deterministic(cfg: Config) -> Config:
    """With ``perf.deterministic``: a replay learner learns in the actor's loop (its async
    pipeline samples what timing decides) and nothing is measured to decide the run; raises
    ConfigError for settings that cannot repeat."""
    perf = cfg.perf
    if not perf.deterministic:
        return cfg
    if perf.autotune:
        raise ConfigError(
            "perf.autotune picks env.num_envs by timing, which perf.deterministic cannot "
            "repeat: set env.num_envs yourself or perf.deterministic=false"
        )
    if learner_info(cfg.agent.algo).schedule.timing_decides_samples:
        if perf.pipeline == "async":
            raise ConfigError(
                f"perf.pipeline=async lets timing decide what agent.algo={cfg.agent.algo} "
                "samples, which perf.deterministic cannot repeat: set perf.pipeline=sync or auto"
            )
        cfg = with_values(cfg, {"perf.pipeline": "sync"})
    return cfg
