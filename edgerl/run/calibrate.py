"""The machine measures itself and picks its recipe: ``--preset board`` and the service.

For its class of machine (:func:`edgerl.hw.recipe.board_recipe`: no GPU, a GPU of its own, an
integrated one) edgerl has a few recipes whose samples to target are on record
(:mod:`edgerl.config.targets`: PQN's 1.2M env steps to Pong 18, DQN's 0.5M with batches of 32
every 4 steps). What each costs here is measured, as ``edgerl bench`` measures it, for a few
seconds per recipe:

* **the actor**: env steps/s of the recipe's environments stepping with one batched forward pass
  of its network per step (:func:`edgerl.run.autotune.measure_actor`);
* **the learner alone**: the env steps/s its learning allows (the learner-bound limit,
  :func:`edgerl.run.learner_alone.learner_limit`, updates per env step included).

The loop's speed follows from the two as autotune predicts it (the slower of the two where the
learner has a thread of its own, their harmonic sum where they take turns), and the predicted
training time is the samples to target over that speed. The recipe with the least wins; a
recipe without a run on record at its settings is measured and shown, never chosen. The
figures are remembered per machine, PyTorch, edgerl and recipe (``calibration.json`` in the
cache directory :mod:`edgerl.learners.decisions` uses), so only the first start measures.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import platform
from dataclasses import dataclass
from typing import Any

from edgerl.config import Config, Layer, build_layers, resolve
from edgerl.config.learners import learner_info
from edgerl.config.presets import apply_presets
from edgerl.config.targets import SamplesToTarget, samples_to_target
from edgerl.hw.cpus import usable_cpus
from edgerl.hw.recipe import Recipe, board_recipe
from edgerl.learners.decisions import CompileDecisions
from edgerl.words import duration

log = logging.getLogger(__name__)

# The recipes each class's own may be traded for: those whose learning the runs on record
# measured on such a machine or whose speed the calibration can measure there.
CANDIDATES: dict[str, tuple[str, ...]] = {
    "pong-cpu": ("pong-cpu", "pong-cpu-dqn"),
    "pong-gpu": ("pong-gpu", "pong-gpu-dqn"),
    "pong-jetson": ("pong-jetson", "pong-gpu-dqn"),
}
MEASURE_S = 3.0  # each half of each recipe: enough for steady figures on a quiet machine
FILE_NAME = "calibration.json"


@dataclass(frozen=True)
class Measured:
    """One recipe on this machine: its halves' speeds, the loop they predict and the time to
    its target that predicts."""

    recipe: Recipe
    actor_steps_per_s: float
    learner_steps_per_s: float  # the learner-bound limit
    pipeline: str  # "sync" or "async", as the recipe would train here
    samples: SamplesToTarget | None

    @property
    def loop_steps_per_s(self) -> float:
        a, b = self.actor_steps_per_s, self.learner_steps_per_s
        if a <= 0 or b <= 0:
            return 0.0
        return min(a, b) if self.pipeline == "async" else 1.0 / (1.0 / a + 1.0 / b)

    @property
    def predicted_s(self) -> float | None:
        """Training time to the target, or None without samples on record (or a stalled
        measurement)."""
        if self.samples is None or self.loop_steps_per_s <= 0:
            return None
        return self.samples.steps / self.loop_steps_per_s

    def describe(self) -> str:
        limit = (
            "the emulator" if self.actor_steps_per_s < self.learner_steps_per_s else "the learner"
        )
        speed = (
            f"actor {self.actor_steps_per_s:,.0f} and learner {self.learner_steps_per_s:,.0f} "
            f"env steps/s, {self.pipeline}: {self.loop_steps_per_s:,.0f} predicted ({limit} the "
            "limit)"
        )
        if self.predicted_s is None:
            return f"{self.recipe.preset}: {speed}; no run on record at its settings"
        return (
            f"{self.recipe.preset}: {speed}; {self.samples.steps:,} env steps to "  # type: ignore[union-attr]
            f"{self.samples.target:g} on record: {duration(self.predicted_s)}"  # type: ignore[union-attr]
        )


def candidate_config(recipe: Recipe) -> Config:
    """The config a recipe trains with (the built-in defaults, the recipe, its learner's
    presets)."""
    cfg = resolve([*build_layers(None, [], use_system=False), recipe.layer()])
    return apply_presets(cfg, "frames")


def candidates(class_recipe: Recipe) -> list[Recipe]:
    """The class's own recipe and the others it may be traded for, the machine's changes (a
    small board's environments) kept on the class's own."""
    names = CANDIDATES.get(class_recipe.preset, (class_recipe.preset,))
    return [
        class_recipe if name == class_recipe.preset else Recipe(name, class_recipe.why, {})
        for name in names
    ]


def machine_key() -> dict[str, Any]:
    """What the figures depend on besides the recipe: the processor, how many CPUs this
    process may use, the GPU, PyTorch and edgerl."""
    import torch

    from edgerl import __version__

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    return {
        "processor": _processor(),
        "cpus": usable_cpus(),
        "gpu": gpu,
        "torch": torch.__version__,
        "edgerl": __version__,
    }


def _processor() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what Python knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _key(recipe: Recipe, cfg: Config, machine: dict[str, Any]) -> str:
    settings = cfg.to_dict()
    settings["train"].pop("recipe", None)  # the words, not the recipe
    text = json.dumps({"machine": machine, "config": settings}, sort_keys=True, default=str)
    return f"calibration {recipe.preset} " + hashlib.sha256(text.encode()).hexdigest()[:32]


def measure(cfg: Config, seconds: float) -> tuple[float, float, str]:
    """(actor env steps/s, learner-bound env steps/s, pipeline) of ``cfg`` on this machine."""
    import copy

    from edgerl.envs import probe
    from edgerl.hw.device import configure_for_training, resolve_device
    from edgerl.learners.factory import build_learner
    from edgerl.run.autotune import measure_actor
    from edgerl.run.learner_alone import learner_limit
    from edgerl.run.pipeline import resolve_pipeline

    device = resolve_device(cfg.perf.device)
    configure_for_training(device, cfg)
    spec = probe(cfg.env)
    net = copy.deepcopy(build_learner(cfg, spec, device).policy.net).eval()
    actor = measure_actor(cfg.env, net, device, seconds)
    limit = learner_limit(cfg, spec, device, seconds)["steps_per_s"]
    concurrent = learner_info(cfg.agent.algo).concurrent
    return actor, limit, resolve_pipeline(cfg.perf.pipeline, device, concurrent=concurrent)


def calibrate(
    class_recipe: Recipe,
    store: CompileDecisions | None = None,
    seconds: float = MEASURE_S,
    measure_fn: Any = measure,
    remembered_only: bool = False,
) -> list[Measured]:
    """Each candidate recipe of the class measured here (or remembered from an earlier
    measurement with the same machine, software and settings; ``remembered_only``: those
    alone, nothing measured)."""
    store = store or CompileDecisions(file_name=FILE_NAME, what="the calibration")
    machine = machine_key()
    out = []
    for recipe in candidates(class_recipe):
        cfg = candidate_config(recipe)
        key = _key(recipe, cfg, machine)
        known = store.get(key)
        if known is not None and {"actor", "learner", "pipeline"} <= set(known):
            actor, learner, pipeline = known["actor"], known["learner"], known["pipeline"]
            log.info("calibration: %s remembered from %s", recipe.preset, store.path)
        elif remembered_only:
            continue
        else:
            log.info("calibration: measuring %s (about %.0f s)", recipe.preset, 2 * seconds)
            actor, learner, pipeline = measure_fn(cfg, seconds)
            store.put(key, {"actor": actor, "learner": learner, "pipeline": pipeline})
        out.append(Measured(recipe, actor, learner, pipeline, samples_to_target(cfg)))
    return out


def choose(measured: list[Measured], class_recipe: Recipe) -> Recipe:
    """The recipe with the least predicted time to its target, naming the figures in its
    ``why``; the class's own where none has a prediction."""
    timed = [m for m in measured if m.predicted_s is not None]
    figures = "; ".join(m.describe() for m in measured)
    if not timed:
        return dataclasses.replace(
            class_recipe, why=f"{class_recipe.why}; calibrated, nothing to choose by: {figures}"
        )
    best = min(timed, key=lambda m: m.predicted_s)  # type: ignore[arg-type, return-value]
    machine = class_recipe.why.split(":", 1)[0]  # the class's words name its own learner too
    why = f"{machine}: calibrated here, the least time predicted: {figures}"
    return dataclasses.replace(best.recipe, why=why)


def calibrated_recipe(
    calibrated: bool = True, measure_now: bool = True, store: CompileDecisions | None = None
) -> Recipe:
    """This machine's recipe, chosen by measuring (``--preset board``, the service): the
    class's own, unmeasured, where not ``calibrated`` (``hw.calibrate = false``); from the
    remembered figures alone without ``measure_now`` (a reload while training runs)."""
    class_recipe = board_recipe()
    if not calibrated:
        return class_recipe
    measured = calibrate(class_recipe, store, remembered_only=not measure_now)
    if not measured:  # nothing remembered, and no measuring now
        return class_recipe
    chosen = choose(measured, class_recipe)
    for m in measured:
        log.info("calibration: %s", m.describe())
    log.info("calibration: training %s", chosen.preset)
    return chosen


def calibrated_layer(calibrated: bool = True) -> Layer:
    """``--preset board`` as a config layer."""
    return calibrated_recipe(calibrated).layer()
