"""Small stand-ins for the CUDA-only pieces of the fast loop, so that the logic around them (which
graph is captured, when, what it samples, how the pipeline waits) runs on a CPU.

No GPU has been at hand when most of the CUDA path was written; these fakes let a CPU test fail
where the code around a CUDA call is wrong. They stand in for the calls, never for what a GPU
computes: the tests marked ``gpu`` check that.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

from edgerl.config import AgentConfig, PerfConfig
from edgerl.learners.dqn import DQN
from edgerl.learners.fast_update import FastUpdate
from edgerl.learners.nets import MLP


class FakeGraph:
    """A captured CUDA graph: counts its replays."""

    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


def forbid_capture(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every CUDA graph capture of :class:`FastUpdate` fail the test; returns the list
    each attempted capture is named in (for a test that would rather count them)."""
    attempts: list[str] = []

    def capture(self: FastUpdate, fn: Any) -> Any:
        attempts.append("capture")
        raise AssertionError("a CUDA graph was captured (warm-up updates and a global capture)")

    monkeypatch.setattr(FastUpdate, "_capture_fn", capture)
    return attempts


def learner_with_sampling_graph(
    per_launch: int,
    replay: Any,
    agent: AgentConfig | None = None,
    perf: PerfConfig | None = None,
) -> tuple[DQN, FakeGraph]:
    """A CPU DQN learner for CartPole-sized observations whose update is, as on a GPU, a graph
    that samples ``replay`` and makes ``per_launch`` updates per launch (a :class:`FakeGraph`:
    each launch counts, nothing is computed). Returns the learner and its graph."""
    perf = perf or PerfConfig(amp="off", cuda_graphs="off", compile="off")
    learner = DQN(MLP(4, 2, (8,)), agent or AgentConfig(), torch.device("cpu"), perf)
    graph = FakeGraph()
    learner.fast.cuda_graphs = True
    learner.fast._sampling_graph = graph  # type: ignore[assignment]
    learner.fast._sampling_loss = torch.zeros(())
    learner.per_launch = per_launch
    learner.captured_from = replay
    return learner, graph


class FakeStream:
    """A CUDA stream: records the streams it was told to wait for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.waited: list[Any] = []

    def wait_stream(self, other: Any) -> None:
        self.waited.append(other)

    def wait_event(self, event: Any) -> None:
        self.waited.append(event)

    def synchronize(self) -> None:
        pass


def fake_streams_and_graphs(monkeypatch: pytest.MonkeyPatch) -> FakeStream:
    """Streams, the current stream, graphs and capture as fakes (what
    ``FastUpdate._capture_fn`` calls); the body runs eagerly on the CPU, "captured" included.
    Returns the default stream."""
    default = FakeStream()
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: default)
    monkeypatch.setattr(torch.cuda, "stream", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    return default
