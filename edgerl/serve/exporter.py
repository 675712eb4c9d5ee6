"""``/metrics``: the runs and the board in Prometheus' text format, through prometheus-client.

Every scrape reads the files again (through the server's cache: a file that has not changed is
not read twice). Names follow Prometheus' conventions: an ``edgerl_`` prefix, base units
(seconds, bytes, hertz, watts, celsius), ratios from 0 to 1 instead of percentages, ``_total``
for what only grows. Training metrics carry a ``run`` label (the run's id on the page); the
board's load comes from the status of the trainer that wrote most recently, and is left out
while no trainer runs (a stopped trainer's last sample is no reading of the board now).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from edgerl.report.status import liveness
from edgerl.serve.runs import RunFiles, clean_load, finite

MIB = 1 << 20  # tegrastats' MB are MiB

# status.json field -> (metric, help, kind); kind "counter" metrics are exposed as <name>_total
RUN_FIELDS: list[tuple[str, str, str, str]] = [
    ("step", "edgerl_env_steps", "Environment steps taken by the run.", "counter"),
    ("total_steps", "edgerl_env_steps_target", "Environment steps the run trains for.", "gauge"),
    ("sps", "edgerl_env_steps_per_second", "Environment steps per second now.", "gauge"),
    ("episodes", "edgerl_episodes", "Episodes finished by the run.", "counter"),
    ("updates", "edgerl_updates", "Learning updates made.", "counter"),
    ("return_mean", "edgerl_training_return_mean",
     "Mean return of the last 100 training episodes (with exploration).", "gauge"),
    ("epsilon", "edgerl_epsilon", "Exploration rate of the actor now.", "gauge"),
    ("eval_return", "edgerl_eval_return_mean",
     "Mean return of the newest greedy evaluation.", "gauge"),
    ("eval_step", "edgerl_eval_step", "Environment step of the newest evaluation's weights.",
     "gauge"),
    ("eval_human_normalised", "edgerl_eval_human_normalised",
     "The newest evaluation's mean return, human-normalised (0: random play, 1: the human "
     "reference; Atari games with published scores only).", "gauge"),
    ("energy_j", "edgerl_energy_joules",
     "Energy the run took so far, from the power the machine reports (tegrastats' input rail on "
     "a Jetson, the GPU's board power from NVML on a desktop); absent where none is reported.",
     "counter"),
    ("cpu_gpu_ratio", "edgerl_cpu_gpu_ratio",
     "The learner's busy time over the environments' (above 1 they wait for the learner).",
     "gauge"),
    ("updated_unix", "edgerl_status_updated_timestamp_seconds",
     "When the trainer last wrote its status (Unix time).", "gauge"),
]  # fmt: skip

# load record field -> (metric, help, unit): the value is the field's times unit[0] over unit[1]
# (a division, not a multiplication by 0.01: 97 / 100 is the 0.97 a reader of status.json gets)
PERCENT, MHZ, MB = (1, 100), (1_000_000, 1), (MIB, 1)
BOARD_FIELDS: list[tuple[str, str, str, tuple[int, int]]] = [
    ("gr3d", "edgerl_gpu_busy_ratio", "GPU (GR3D) busy, 0 to 1.", PERCENT),
    ("gr3d_mhz", "edgerl_gpu_frequency_hertz", "GPU clock.", MHZ),
    ("emc", "edgerl_emc_busy_ratio", "Memory controller (EMC) busy, 0 to 1.", PERCENT),
    ("emc_mhz", "edgerl_emc_frequency_hertz", "Memory controller clock.", MHZ),
    ("ram_used_mb", "edgerl_memory_used_bytes", "RAM in use.", MB),
    ("ram_total_mb", "edgerl_memory_total_bytes", "RAM in all.", MB),
    ("swap_used_mb", "edgerl_swap_used_bytes", "Swap in use.", MB),
    ("swap_total_mb", "edgerl_swap_total_bytes", "Swap in all.", MB),
]


def _family(name: str, doc: str, kind: str, labels: list[str]) -> Metric:
    if kind == "counter":
        return CounterMetricFamily(name, doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


class RunsCollector(Collector):
    """The metrics of every run below the server's roots and of the board, read at each
    scrape; ``viewers`` gives the number of frame streams open now."""

    def __init__(self, files: RunFiles, viewers: Callable[[], int]) -> None:
        self.files = files
        self.viewers = viewers

    def describe(self) -> list[Metric]:
        return []  # nothing to read at registration: the runs are read at each scrape

    def collect(self) -> Iterator[Metric]:
        """The metric families of this scrape."""
        labels = ["run"]
        info = GaugeMetricFamily(
            "edgerl_run_info", "The run's game, learner and state (always 1).",
            labels=["run", "env", "learner", "state"],
        )  # fmt: skip
        readable = GaugeMetricFamily(
            "edgerl_status_readable", "1 when the run's status.json can be read, 0 when it is "
            "missing or damaged.", labels=labels,
        )  # fmt: skip
        running = GaugeMetricFamily(
            "edgerl_trainer_running", "1 while the run's trainer runs and writes its status.",
            labels=labels,
        )  # fmt: skip
        families = {
            field: _family(name, doc, kind, labels) for field, name, doc, kind in RUN_FIELDS
        }
        loss = GaugeMetricFamily(
            "edgerl_loss", "Training loss in the newest metrics row.", labels=labels
        )
        figures = GaugeMetricFamily(
            "edgerl_learner_figure", "The learner's own figures by name (a genetic algorithm's "
            "generation, elite_score, best_score, mean_score); absent where not known yet.",
            labels=["run", "name"],
        )  # fmt: skip
        best = GaugeMetricFamily(
            "edgerl_eval_return_best", "Best mean return of any evaluation so far.", labels=labels
        )
        board: tuple[float, dict[str, Any]] | None = None  # the freshest running trainer's
        for run_id, run_dir in self.files.runs().items():
            doc, _ = self.files.status(run_dir)
            algo, game = self.files.learner(run_dir)
            readable.add_metric([run_id], 0.0 if doc is None else 1.0)
            if (found := self.files.best_eval(run_dir)) is not None:
                best.add_metric([run_id], found["return_mean"])
            if (last := self.files.last_metrics(run_dir).get("loss")) is not None:
                loss.add_metric([run_id], last)
            if doc is None:
                info.add_metric([run_id, game or "", algo or "", "unknown"], 1.0)
                continue
            live = liveness(doc)
            alive = live.running and not live.stale
            env = str(doc.get("env") or game or "")
            info.add_metric([run_id, env, algo or "", str(doc.get("state") or "")], 1.0)
            running.add_metric([run_id], 1.0 if alive else 0.0)
            for field, family in families.items():
                value = finite(doc.get(field))
                if value is not None:
                    family.add_metric([run_id], value)
            for name, value in (doc.get("figures") or {}).items():
                if (number := finite(value)) is not None:
                    figures.add_metric([run_id, str(name)], number)
            updated = finite(doc.get("updated_unix")) or 0.0
            if alive and (board is None or updated > board[0]):
                load = clean_load(doc.get("load"))
                if load is not None:
                    board = (updated, load)
        yield from (info, readable, running, *families.values(), loss, best, figures)
        if board is not None:
            yield from board_metrics(board[1])
        yield GaugeMetricFamily(
            "edgerl_serve_viewers", "Frame streams this server sends now.", value=self.viewers()
        )


def board_metrics(load: dict[str, Any]) -> Iterator[Metric]:
    """The board's load (a checked record, see :func:`~edgerl.serve.runs.clean_load`)."""
    busy = GaugeMetricFamily("edgerl_cpu_busy_ratio", "CPU core busy, 0 to 1.", labels=["core"])
    clock = GaugeMetricFamily("edgerl_cpu_frequency_hertz", "CPU core clock.", labels=["core"])
    for core, value in enumerate(load["cpu"]):
        if value is not None:
            busy.add_metric([str(core)], value / 100)
    for core, value in enumerate(load["cpu_mhz"]):
        if value is not None:
            clock.add_metric([str(core)], value * 1_000_000)
    yield busy
    yield clock
    for field, name, doc, (times, over) in BOARD_FIELDS:
        if load[field] is not None:
            yield GaugeMetricFamily(name, doc, value=load[field] * times / over)
    temps = GaugeMetricFamily(
        "edgerl_temperature_celsius", "Sensor temperature.", labels=["sensor"]
    )
    for sensor, degrees in load["temps"].items():
        temps.add_metric([sensor], degrees)
    power = GaugeMetricFamily("edgerl_power_watts", "Power rail, now.", labels=["rail"])
    for rail, mw in load["power_mw"].items():
        power.add_metric([rail], mw / 1000)
    yield temps
    yield power


def metrics_text(collector: RunsCollector) -> bytes:
    """One scrape: the text exposition of everything ``collector`` reads now."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)
