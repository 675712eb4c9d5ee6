"""``edgerl doctor``: can this machine train, watch and export, and what to fix where it cannot.

Each check returns :class:`Check` lines (``pass``, ``warn``, ``fail`` or ``skip``, what was
found, the fix); a check that breaks is a ``fail`` line, never a crash. Checks by topic:

* :mod:`.software`: Python, PyTorch, CUDA and cuDNN, the GPU, the precision ``auto`` picks, the
  game, replay memory, ONNX Runtime, TensorRT;
* :mod:`.board`: the Jetson and its L4T release, jetson_clocks, tegrastats, nvpmodel, jtop;
* :mod:`.system`: the ``edgerl`` group, /dev/shm, a display for ``edgerl view``, the run dir;
* :mod:`.deep` (``--deep``): real updates, replay, ONNX and TensorRT exports on the device.

Heavy and optional packages (onnxruntime, tensorrt, pygame, jtop) are imported inside the check
that needs them, so a missing one is that check's line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from edgerl.doctor import board, software, system
from edgerl.doctor.core import Check, CheckFn, Context, Report, guarded
from edgerl.errors import EdgerlError

__all__ = ["Check", "DoctorOptions", "Report", "run_checks"]

# In order: later checks build on what earlier ones found (the board decides how a missing CUDA
# reads, the device which memory the replay needs, the game what a checkpoint weighs).
CHECKS: tuple[tuple[str, CheckFn], ...] = (
    ("python", software.check_python),
    ("torch", software.check_torch),
    ("board", board.check_board),
    ("cuda", software.check_cuda),
    ("gpu", software.check_gpu),
    ("precision", software.check_precision),
    ("game", software.check_game),
    ("cpu threads", software.check_threads),
    ("replay memory", software.check_replay_memory),
    ("onnxruntime", software.check_onnx),
    ("tensorrt", software.check_tensorrt),
    ("jetson_clocks", board.check_jetson_clocks),
    ("tegrastats", board.check_tegrastats),
    ("nvpmodel", board.check_nvpmodel),
    ("jtop", board.check_jtop),
    ("edgerl group", system.check_group),
    ("/dev/shm", system.check_shm),
    ("display", system.check_display),
    ("run dir", system.check_disk),
)


@dataclass(frozen=True)
class DoctorOptions:
    deep: bool = False
    config_file: Path | None = None
    overrides: tuple[str, ...] = ()


def load_config(opts: DoctorOptions) -> tuple[Context, Check]:
    """The config the checks judge (the service's file, ``--config``, ``--set``), and its line.

    A broken config is a ``fail`` line, and the checks go on with the built-in defaults.
    """
    from edgerl.config import Config, build_layers, resolve

    try:
        from edgerl.config.checks import check_learner_layers
        from edgerl.envs import training_learner

        layers = build_layers(opts.config_file, opts.overrides)
        cfg = resolve(layers)
        # A key the learner never reads (--set ppo.clip=0.1 with DQN) is refused as train does.
        check_learner_layers(cfg, layers, opts.config_file, lambda: training_learner(cfg))
    except EdgerlError as e:
        found = f"{e}; the other checks use the built-in defaults"
        return Context(Config()), Check("config", "fail", found, "fix the file or --set named")
    sources = ["built-in defaults", *(layer.source for layer in layers)]
    return Context(cfg), Check("config", "pass", " + ".join(sources), data={"sources": sources})


def run_checks(opts: DoctorOptions) -> Iterator[Check]:
    """Every check, one at a time as it finishes (the deep ones last, with ``opts.deep``)."""
    from edgerl.doctor.deep import deep_checks

    ctx, config_check = load_config(opts)
    ctx.is_root = board.effective_root()
    yield config_check
    for name, fn in CHECKS:
        yield from guarded(name, fn, ctx)
    if opts.deep:
        yield from deep_checks(ctx)
