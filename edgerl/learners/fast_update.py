"""Making the learner's update fast without changing what it computes.

The update is one fixed-shape function over a batch of static shape (``DQN.update_step``), so:

* on CUDA it is captured once as a CUDA graph and replayed: a small network's update is bound by
  kernel launches, more so on a Jetson's ARM cores. When the replay lives on the GPU, the graph
  samples too (:mod:`edgerl.memories.replay.sampling` is fixed-shape and never reads back to the
  host) and holds ``perf.updates_per_launch`` sample-and-update steps, so one launch from the host
  makes several updates and nothing in between waits for the GPU. Capture happens before training
  (capturing later, on the learner thread, would collide with the actor thread's CUDA calls), on
  a side stream after a few warm-up steps, and the weights and optimizer state are put back
  afterwards;
* on the CPU ``torch.compile`` is tried only when the run is long enough to repay compiling
  (``perf.compile``), and kept only if it measurably does. What was measured is remembered per
  machine, torch and update shapes (:class:`Decisions`), so a resume does not compile again
  only to throw the result away.

Either way the weights and the Adam state after :meth:`FastUpdate.prepare` are exactly those
before it, so preparing changes speed, nothing else.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import time
import warnings
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn

from edgerl.hw.device import CUDA_GRAPH_WARMUP
from edgerl.memories.replay.sampling import Batch

log = logging.getLogger(__name__)

# Dynamo logs a warning for each profiler marker it skips (Adam's step carries one): it says
# nothing a user can act on, and on a terminal it cuts through the progress bar.
PROFILER_NOTE_LOGGERS = ("torch._dynamo.variables.torch", "torch._dynamo.variables.ctx_manager")


class _DropProfilerNotes(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Profiler ")


def quiet_profiler_notes() -> None:
    """Drop dynamo's "Profiler function ... will be ignored" warnings (idempotent)."""
    for name in PROFILER_NOTE_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropProfilerNotes) for f in logger.filters):
            logger.addFilter(_DropProfilerNotes())


# torch.compile of the CPU update took ~23 s and saved 0-3% on the 2-core x86 machine measured:
# "auto" only tries it for runs this long, then keeps it only if it measurably pays.
COMPILE_MIN_UPDATES = 125_000
COMPILE_TIMING_UPDATES = 20
# The start of torch's warning when a capturable optimizer steps outside a capture (2.3-2.13).
CAPTURABLE_UNCAPTURED = "This instance was constructed with capturable=True"

StepFn = Callable[..., torch.Tensor]  # (batch, zero_grad=True) -> detached loss

# The methods torch's optimizers mark "not to be compiled" (torch._disable_dynamo).
DYNAMO_MARKED = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def may_compile(setting: str, device: torch.device, updates: int) -> bool:
    """Whether :meth:`FastUpdate.maybe_compile` may compile a run of ``updates`` updates."""
    if device.type != "cpu" or setting == "off":
        return False
    return setting == "on" or updates >= COMPILE_MIN_UPDATES


def spare_dynamo_import() -> None:
    """Spare a process that compiles nothing the import of torch._dynamo (1-2 s of a 4 s
    start-up, more than anything of edgerl's own).

    torch's optimizers mark a few methods with ``torch._disable_dynamo``, which imports
    torch._dynamo the first time such a method runs and caches what it made on the function as
    ``__dynamo_disable``. With nothing compiled in the process the mark has nothing to act on, so
    the cache is filled with the plain function. Should torch compile something later after all,
    its compiler traces those methods instead of skipping them; should torch stop wrapping them
    this way, this does nothing.
    """
    for name in DYNAMO_MARKED:
        inner = getattr(getattr(torch.optim.Optimizer, name, None), "__wrapped__", None)
        if callable(inner) and getattr(inner, "__dynamo_disable", None) is None:
            inner.__dynamo_disable = inner  # type: ignore[attr-defined]


class Decisions(Protocol):
    """Where compile measurements are remembered between runs (:mod:`edgerl.learners.decisions`)."""

    def get(self, key: str) -> dict[str, Any] | None: ...

    def put(self, key: str, value: dict[str, Any]) -> None: ...


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model", "Hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def compile_key(net: nn.Module, example: Batch) -> str:
    """What the compile decision depends on: the machine (its processor and how many), torch,
    the update's network and batch shapes (hashed: the key of a :class:`Decisions` entry).

    Not torch's thread count: with ``perf.threads = 0`` it follows the machine's load, and a key
    that changed with it would measure again (20-50 s) on the same machine and run.
    """
    what = {
        "cpu": _cpu_model(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "net": type(net).__name__,
        "params": [list(p.shape) for p in net.parameters()],
        "batch": [[list(t.shape), str(t.dtype)] for t in example],
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]


def _pays(measured: dict[str, Any], remaining: int, log_it: bool = False) -> bool:
    """Whether the compiled update's gain over ``remaining`` updates repays compiling, from
    ``measured`` seconds: ``eager_s`` and ``compiled_s`` per update, ``compile_s`` once."""
    eager_s, compiled_s = float(measured["eager_s"]), float(measured["compiled_s"])
    compile_s = float(measured["compile_s"])
    saved = (eager_s - compiled_s) * remaining
    keep = saved > compile_s
    if log_it:
        log.info(
            "torch.compile: %.1f ms per update against %.1f ms eager; over %s updates %s: %s",
            compiled_s * 1e3,
            eager_s * 1e3,
            f"{remaining:,}",
            f"it would save {saved:.0f} s for {compile_s:.0f} s of compiling"
            if saved > 0
            else f"it would be {-saved:.0f} s slower, after {compile_s:.0f} s of compiling",
            "keeping it" if keep else "using the eager update",
        )
    return keep


class FastUpdate:
    """Runs one update step, eagerly, as a replayed CUDA graph, or compiled.

    ``step`` is the update body; ``net`` and ``optimizer`` are what it changes (snapshotted and
    restored around capture and compilation).
    """

    def __init__(
        self,
        step: StepFn,
        net: nn.Module,
        optimizer: torch.optim.Optimizer,
        cuda_graphs: bool,
        compile_setting: str,
    ) -> None:
        self.step = step
        self.net = net
        self.optimizer = optimizer
        self.cuda_graphs = cuda_graphs
        self.compile_setting = compile_setting
        self.compiled = False
        self.decisions: Decisions | None = None  # set to remember compile measurements
        self._fn: StepFn = step
        self._static: Batch | None = None  # the graph's fixed input buffers
        self._graph: torch.cuda.CUDAGraph | None = None
        self._graph_loss: torch.Tensor | None = None
        self._sampling_graph: torch.cuda.CUDAGraph | None = None  # samples and updates K times
        self._sampling_loss: torch.Tensor | None = None  # the sum of its K losses

    @property
    def captured(self) -> bool:
        return self._graph is not None or self._sampling_graph is not None

    @property
    def sampling(self) -> bool:
        """A graph that samples its own batches was captured (:meth:`launch`)."""
        return self._sampling_graph is not None

    def launch(self) -> torch.Tensor:
        """Replay the sampling graph: its K updates; returns the sum of their losses."""
        assert self._sampling_graph is not None and self._sampling_loss is not None
        self._sampling_graph.replay()
        return self._sampling_loss.clone()  # the next replay overwrites the graph's own

    def prepare_sampling(self, sample: Callable[[], Any], per_launch: int) -> None:
        """Capture ``per_launch`` steps, each on a fresh ``sample()``, as one CUDA graph.

        The warm-up steps draw real batches (an empty replay gives batches of weight 0); the
        weights and Adam state are put back afterwards, as for :meth:`prepare`.
        """
        snapshot = self._snapshot()

        def steps(zero_grad: bool = True) -> torch.Tensor:
            total = self.step(sample(), zero_grad=zero_grad)
            for _ in range(per_launch - 1):
                # Zeroed in place: inside the graph the later backwards add to the gradients
                # the first one wrote.
                self.optimizer.zero_grad(set_to_none=False)
                total = total + self.step(sample(), zero_grad=False)
            return total

        graph, loss = self._capture_fn(steps)
        self._sampling_graph, self._sampling_loss = graph, loss
        self._restore(*snapshot, clear_grads=False)
        torch.cuda.synchronize()
        log.info("update captured as a CUDA graph: %d sampled updates per launch", per_launch)

    def __call__(self, batch: Batch) -> torch.Tensor:
        """One update step on ``batch``; returns the detached loss."""
        if not self.cuda_graphs:
            return self._fn(batch)
        if self._graph is None:
            self.prepare(batch, remaining_updates=0)
        assert self._static is not None and self._graph_loss is not None
        for static, fresh in zip(self._static, batch, strict=True):
            static.copy_(fresh, non_blocking=True)  # device to device
        self._graph.replay()
        return self._graph_loss.clone()

    def prepare(self, example: Batch, remaining_updates: int) -> None:
        """Make the update fast now, on ``example`` (a batch of the training shape).

        CUDA: capture the graph. CPU: maybe ``torch.compile`` (see :meth:`maybe_compile`).
        """
        if not self.cuda_graphs:
            self.maybe_compile(remaining_updates, example)
            return
        snapshot = self._snapshot()
        static = self._static = Batch(*(t.clone() for t in example))
        self._graph, self._graph_loss = self._capture_fn(
            lambda zero_grad=True: self.step(static, zero_grad=zero_grad)
        )
        self._restore(*snapshot, clear_grads=False)  # the graph owns its gradients
        torch.cuda.synchronize()
        log.info("update captured as a CUDA graph")

    def _capture_fn(
        self, fn: Callable[..., torch.Tensor]
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Warm up ``fn`` on a side stream (real steps), then capture one call of it."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), warnings.catch_warnings():
            # A capturable optimizer warns once that it steps uncaptured: here it must.
            warnings.filterwarnings("ignore", message=CAPTURABLE_UNCAPTURED)
            for _ in range(CUDA_GRAPH_WARMUP):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        self.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            # The graph's backward writes fresh gradients on every replay: no zero_grad inside.
            loss = fn(zero_grad=False)
        return graph, loss

    def maybe_compile(self, remaining_updates: int, example: Batch) -> bool:
        """``torch.compile`` the CPU update when asked, or when the run is long enough (auto).

        Compiling happens here, before training, on ``example``; weights and optimizer state are
        restored afterwards. On failure the eager update stays, with a warning. Returns whether
        it compiled.
        """
        setting = self.compile_setting
        if self.cuda_graphs or setting == "off":
            return False
        if next(self.net.parameters()).device.type != "cpu":
            return False
        if setting == "auto" and remaining_updates < COMPILE_MIN_UPDATES:
            log.debug("not compiling: %d updates left < %d", remaining_updates, COMPILE_MIN_UPDATES)
            return False
        key = compile_key(self.net, example) if self.decisions is not None else ""
        known = self.decisions.get(key) if self.decisions is not None else None
        if setting == "auto" and known is not None:
            try:
                keep = _pays(known, remaining_updates)
            except (KeyError, TypeError, ValueError):
                known = None  # an entry of another shape: measure again
            else:
                if not keep:
                    log.info(
                        "not compiling the update: torch.compile measured %.1f ms per update "
                        "against %.1f ms eager on this machine with these shapes (%s), which does "
                        "not repay %.0f s of compiling over %s updates; perf.compile=on compiles "
                        "anyway",
                        known["compiled_s"] * 1e3,
                        known["eager_s"] * 1e3,
                        known.get("measured_at", "earlier"),
                        known["compile_s"],
                        f"{remaining_updates:,}",
                    )
                    return False
        took = (
            f"it took {float(known['compile_s']):.0f} s when measured here"
            if known is not None and isinstance(known.get("compile_s"), (int, float))
            else "it takes about 20-50 s on a CPU"
        )
        log.info(
            "compiling the update with torch.compile (once: %s; perf.compile=off skips it)", took
        )
        snapshot = self._snapshot()
        started = time.monotonic()
        try:
            quiet_profiler_notes()
            compiled = torch.compile(self.step)
            compiled(example)
        except Exception as e:  # a compiler problem must not stop training
            log.warning(
                "torch.compile failed (%s: %s); using the eager update (the compiler's whole "
                "output: --debug)",
                type(e).__name__,
                compile_error_line(e),
            )
            log.debug("torch.compile's failure", exc_info=True)
            return False
        finally:
            self._restore(*snapshot)
        compile_s = time.monotonic() - started
        if setting == "auto" and known is None:
            eager_s, compiled_s = self._time_both(compiled, example)
            measured = {"eager_s": eager_s, "compiled_s": compiled_s, "compile_s": compile_s}
            if self.decisions is not None:
                measured["measured_at"] = time.strftime("%Y-%m-%d")
                self.decisions.put(key, measured)
            if not _pays(measured, remaining_updates, log_it=True):
                return False
        self._fn = compiled
        self.compiled = True
        log.info("update compiled in %.0f s", compile_s)
        return True

    def _time_both(self, compiled: StepFn, example: Batch) -> tuple[float, float]:
        """Seconds per update, eager and compiled, on ``example`` (weights restored after)."""
        snapshot = self._snapshot()

        def per_update(fn: StepFn) -> float:
            for _ in range(3):
                fn(example)
            started = time.perf_counter()
            for _ in range(COMPILE_TIMING_UPDATES):
                fn(example)
            return (time.perf_counter() - started) / COMPILE_TIMING_UPDATES

        try:
            return per_update(self.step), per_update(compiled)
        finally:
            self._restore(*snapshot)

    def _snapshot(self) -> tuple[list[torch.Tensor], list[torch.Tensor], dict[Any, Any]]:
        """Copies of the weights and Adam state, for :meth:`_restore`."""
        params = list(self.net.parameters())
        saved_params = [p.detach().clone() for p in params]
        saved_state = {
            p: {k: v.clone() for k, v in self.optimizer.state[p].items() if torch.is_tensor(v)}
            for p in params
            if p in self.optimizer.state
        }
        return params, saved_params, saved_state

    def _restore(
        self,
        params: list[torch.Tensor],
        saved_params: list[torch.Tensor],
        saved_state: dict[Any, dict[str, torch.Tensor]],
        clear_grads: bool = True,
    ) -> None:
        """Put weights and Adam state back without replacing tensors (compiled code and the
        graph keep their references; zeroed moments with step 0 are exactly a fresh Adam)."""
        with torch.no_grad():
            for p, value in zip(params, saved_params, strict=True):
                p.copy_(value)
                if clear_grads:
                    p.grad = None
                for key, tensor in self.optimizer.state.get(p, {}).items():
                    if not torch.is_tensor(tensor):
                        continue
                    previous = saved_state.get(p, {}).get(key)
                    if previous is not None:
                        tensor.copy_(previous)
                    else:
                        tensor.zero_()


def compile_error_line(error: BaseException) -> str:
    """The line of a compiler failure that says what went wrong: a C++ compiler's output holds
    dozens of lines of command and context around its one ``error:`` line (that line, else the
    first non-empty one, at most 200 characters)."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    compiler = re.compile(r"(?:^|[\s:])(?:fatal )?error:", re.IGNORECASE)  # gcc's, not a name
    said = next((ln for ln in lines if compiler.search(ln)), lines[0] if lines else "")
    return said if len(said) <= 200 else said[:199] + "…"
