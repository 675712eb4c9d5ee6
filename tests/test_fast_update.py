"""The fast update (fast_update.py): the graph-shaped and CUDA-graph update compute the eager one,
and torch.compile changes speed only."""

from __future__ import annotations

import copy
import os

import pytest
import torch

from edgerl.config import AgentConfig, PerfConfig
from edgerl.learners.dqn import DQN
from edgerl.learners.nets import MLP, NatureCNN
from edgerl.memories.replay.sampling import Batch

from .helpers import CPU, CUDA, GPU, random_batch


def test_graph_shaped_update_equals_the_eager_update_on_the_cpu():
    """The captured body (static buffers, grads zeroed outside) computes the eager update."""
    torch.manual_seed(0)
    eager = DQN(NatureCNN(4, 6), AgentConfig(), CPU)
    static = copy.deepcopy(eager)
    buffers = Batch(*(torch.empty_like(t) for t in random_batch()))
    for step in range(3):
        batch = random_batch()
        batch = batch._replace(rewards=batch.rewards + step)
        loss_eager = eager.update(batch)
        for buf, fresh in zip(buffers, batch, strict=True):
            buf.copy_(fresh)
        static.optimizer.zero_grad(set_to_none=True)
        loss_static = static.update_step(buffers, zero_grad=False)
        assert torch.equal(loss_eager, loss_static)
    for a, b in zip(eager.q.parameters(), static.q.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.fixture
def deterministic_cuda():
    """cuDNN and cuBLAS without autotuning or TF32, for the duration of a test.

    Adam's first steps move every weight by about ``lr`` whatever the gradient's size, so a
    near-zero gradient whose sign differs between two algorithms (autotuning may pick different
    ones for the eager and the captured run) moves a weight by 2 x lr: exact comparisons need the
    same kernels on both sides.
    """
    backends = torch.backends
    saved = (
        backends.cudnn.benchmark,
        backends.cudnn.deterministic,
        backends.cudnn.allow_tf32,
        backends.cuda.matmul.allow_tf32,
    )
    backends.cudnn.benchmark, backends.cudnn.deterministic = False, True
    backends.cudnn.allow_tf32 = backends.cuda.matmul.allow_tf32 = False
    yield
    (
        backends.cudnn.benchmark,
        backends.cudnn.deterministic,
        backends.cudnn.allow_tf32,
        backends.cuda.matmul.allow_tf32,
    ) = saved


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_cuda_graph_update_equals_eager_on_the_gpu(deterministic_cuda):
    torch.manual_seed(0)
    eager = DQN(NatureCNN(4, 6), AgentConfig(), GPU, PerfConfig(amp="off", cuda_graphs="off"))
    graph = DQN(NatureCNN(4, 6), AgentConfig(), GPU, PerfConfig(amp="off", cuda_graphs="on"))
    graph.q.load_state_dict(eager.q.state_dict())
    graph.target.load_state_dict(eager.target.state_dict())
    graph.prepare(Batch(*(t.to(GPU) for t in random_batch())), remaining_updates=0)
    assert graph.fast.captured and graph.updates == 0
    for a, b in zip(eager.q.parameters(), graph.q.parameters(), strict=True):
        assert torch.equal(a, b)  # capturing changed nothing
    for step in range(6):
        batch = Batch(*(t.to(GPU) for t in random_batch()))
        batch = batch._replace(rewards=batch.rewards + step)
        loss_eager, loss_graph = eager.update(batch), graph.update(batch)
        # fused (eager) and capturable (graph) Adam round differently, nothing more
        assert torch.allclose(loss_eager, loss_graph, rtol=1e-5), step
    assert graph.updates == eager.updates == 6
    for a, b in zip(eager.q.parameters(), graph.q.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_compile_changes_speed_only(caplog):
    torch.manual_seed(0)
    learner = DQN(MLP(4, 2, (32, 32)), AgentConfig(), CPU, PerfConfig(compile="on"))
    before = copy.deepcopy(learner.q.state_dict())
    b = 32
    obs = torch.randn(b, 4)
    discounts, weights = torch.full((b,), 0.99), torch.ones(b)
    batch = Batch(obs, torch.randint(0, 2, (b,)), torch.randn(b), obs + 0.1, discounts, weights)
    reference = copy.deepcopy(learner)
    assert learner.fast.maybe_compile(10**6, batch)
    for k, v in learner.q.state_dict().items():
        assert torch.equal(v, before[k]), k  # compiling on a batch left the weights alone
    assert learner.updates == 0 and "torch.compile" in learner.describe()
    for _ in range(3):
        learner.update(batch)
        reference.update(batch)
    for a, r in zip(learner.q.parameters(), reference.q.parameters(), strict=True):
        assert torch.allclose(a, r, atol=1e-5)


def test_auto_compile_only_for_long_runs():
    learner = DQN(MLP(4, 2, (8,)), AgentConfig(), CPU, PerfConfig(compile="auto"))
    assert not learner.fast.maybe_compile(1000, random_batch())


def test_compiling_the_update_prints_no_profiler_warning():
    """Adam's step carries a profiler marker that dynamo warns about, through the progress bar."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from edgerl.learners.fast_update import quiet_profiler_notes\n"
        "quiet_profiler_notes()\n"
        "def f(x):\n"
        "    with torch.autograd.profiler.record_function('marker'):\n"
        "        return x * 2\n"
        "print(torch.compile(f, backend='eager')(torch.ones(3)).sum().item())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "6.0", r.stderr
    assert "Profiler" not in r.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_a_sampling_graph_makes_the_eager_updates_on_the_same_draws(deterministic_cuda):
    """The graph that samples its own batches, 4 updates per launch, against 4 eager updates
    that sample from the same replay with the same CUDA seed: the same losses and weights."""
    import numpy as np

    from edgerl.envs import EnvSpec
    from edgerl.memories.replay import ReplayBuffer
    from edgerl.memories.replay.sampling import example_batch

    spec = EnvSpec("ALE/Pong-v5", "frames", (4, 84, 84), "uint8", 6, ("NOOP",) * 6)
    replay = ReplayBuffer(spec, 4 * 512, 4, GPU, seed=0, n_step=3)
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, size=(16, 4, 4, 84, 84), dtype=np.uint8)
    replay.add_first(obs[0])
    none = np.zeros(4, dtype=bool)
    for i in range(1, 400):
        ended = rng.random(4) < 0.02
        replay.add(rng.integers(6, size=4), rng.normal(size=4), ended, none, obs[i % 16], obs[0])
    torch.manual_seed(0)
    agent = AgentConfig(batch_size=32)
    eager = DQN(NatureCNN(4, 6), agent, GPU, PerfConfig(amp="off", cuda_graphs="off"))
    graph = DQN(NatureCNN(4, 6), agent, GPU, PerfConfig(amp="off", cuda_graphs="on"))
    graph.q.load_state_dict(eager.q.state_dict())
    graph.target.load_state_dict(eager.target.state_dict())
    graph.prepare(example_batch(spec, 32, GPU), 0, replay, per_launch=4)
    assert graph.fast.sampling and graph.per_launch == 4
    for launch in range(3):
        torch.cuda.manual_seed(launch)
        eager.learn(replay, 0, 4)  # four eager updates, each sampling
        torch.cuda.manual_seed(launch)
        graph.learn(replay, 0, 4)  # one launch
    eager.losses.flush(), graph.losses.flush()
    assert graph.updates == eager.updates == 12
    assert graph.losses.take() == pytest.approx(eager.losses.take(), rel=1e-4)
    for a, b in zip(eager.q.parameters(), graph.q.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    with pytest.raises(RuntimeError, match="samples another replay"):
        graph.learn(object(), 0, 4)  # type: ignore[arg-type]  # never silently the captured one


def compile_free_learner() -> DQN:
    """A small CPU learner that compiles only when it pays (perf.compile=auto)."""
    return DQN(MLP(4, 2, (8,)), AgentConfig(), CPU, PerfConfig(compile="auto"))


def vector_batch(b: int = 16) -> Batch:
    torch.manual_seed(1)
    obs = torch.randn(b, 4)
    discounts, weights = torch.full((b,), 0.99), torch.ones(b)
    return Batch(obs, torch.randint(0, 2, (b,)), torch.randn(b), obs + 0.1, discounts, weights)


def test_a_compile_that_did_not_pay_is_not_compiled_again(tmp_path, monkeypatch, caplog):
    from edgerl.learners.decisions import CompileDecisions
    from edgerl.learners.fast_update import compile_key

    batch = vector_batch()
    learner = compile_free_learner()
    decisions = learner.fast.decisions = CompileDecisions(tmp_path)
    key = compile_key(learner.q, batch)
    # 10 us saved per update: 10 s over a million updates, less than 30 s of compiling
    decisions.put(key, {"eager_s": 0.010, "compiled_s": 0.00999, "compile_s": 30.0})

    def no_compile(*args, **kwargs):
        raise AssertionError("torch.compile was called")

    monkeypatch.setattr(torch, "compile", no_compile)
    with caplog.at_level("INFO"):
        assert not learner.fast.maybe_compile(10**6, batch)
    assert "not compiling the update: torch.compile measured" in caplog.text
    assert "torch.compile failed" not in caplog.text
    # A thousand times more updates left: the same figures repay compiling, so it compiles.
    with caplog.at_level("INFO"):
        learner.fast.maybe_compile(10**9, batch)
    assert "torch.compile failed (AssertionError: torch.compile was called)" in caplog.text
    assert "(once: it took 30 s when measured here;" in caplog.text  # not a guess


def test_a_decision_holds_whatever_thread_count_the_machine_s_load_chose():
    from edgerl.learners.fast_update import compile_key

    batch, learner = vector_batch(), compile_free_learner()
    before = torch.get_num_threads()
    try:
        keys = set()
        for threads in (1, 2):
            torch.set_num_threads(threads)  # what perf.threads=0 picks on an idle or a busy day
            keys.add(compile_key(learner.q, batch))
    finally:
        torch.set_num_threads(before)
    assert len(keys) == 1


def test_the_first_measurement_is_remembered_for_the_next_run(tmp_path):
    from edgerl.learners.decisions import CompileDecisions
    from edgerl.learners.fast_update import compile_key

    batch = vector_batch()
    learner = compile_free_learner()
    learner.fast.decisions = CompileDecisions(tmp_path)
    learner.fast.maybe_compile(10**6, batch)  # compiles and times both (real torch.compile)
    entry = CompileDecisions(tmp_path).get(compile_key(learner.q, batch))
    assert entry is not None and entry["compile_s"] > 0
    assert entry["eager_s"] > 0 and entry["compiled_s"] > 0


def test_a_damaged_decisions_file_is_reported_moved_aside_and_measured_again(tmp_path, caplog):
    from edgerl.learners.decisions import FILE_NAME, CompileDecisions

    (tmp_path / FILE_NAME).write_text('{"version": 1, "entries": ')  # cut short by a crash
    decisions = CompileDecisions(tmp_path)
    assert decisions.get("any") is None
    assert "is damaged" in caplog.text and (tmp_path / (FILE_NAME + ".damaged")).exists()
    decisions.put("k", {"eager_s": 1.0})
    assert CompileDecisions(tmp_path).get("k") == {"eager_s": 1.0}
    (tmp_path / FILE_NAME).write_bytes(b"\xff\xfe" + b"[" * 100_000)  # not text, nested
    assert CompileDecisions(tmp_path).get("k") is None
    os.mkfifo(tmp_path / FILE_NAME)  # replaced by a FIFO: read without waiting on it
    assert CompileDecisions(tmp_path).get("k") is None


def test_an_unwritable_cache_costs_only_a_warning(tmp_path, caplog):
    from edgerl.learners.decisions import CompileDecisions

    blocked = tmp_path / "file"
    blocked.write_text("")
    decisions = CompileDecisions(blocked / "edgerl")  # a directory below a file: never writable
    decisions.put("k", {"eager_s": 1.0})
    assert "the next run measures again" in caplog.text
    assert decisions.get("k") is None


def test_the_capture_warm_up_drops_only_the_capturable_optimizers_warning(monkeypatch):
    """Warm-up steps before a capture step a capturable optimizer uncaptured, and torch warns
    once about exactly that: expected there, it is dropped; any other warning goes on. Stand-ins:
    streams, graphs and the capture as fakes, a step that warns as torch's Adam does."""
    import warnings

    from .cuda_standins import fake_streams_and_graphs

    fake_streams_and_graphs(monkeypatch)
    learner = DQN(MLP(4, 2, (8,)), AgentConfig(), CPU)

    def step(zero_grad: bool = True) -> torch.Tensor:
        warnings.warn(
            "This instance was constructed with capturable=True or some of all the "
            "param_groups came with capturable=True, but step() is running without CUDA "
            "graph capture. If you never intend to graph-capture this instance, "
            "capturable=True can impair performance, and you should set capturable=False.",
            UserWarning,
            stacklevel=2,
        )
        warnings.warn("something else", UserWarning, stacklevel=2)
        return torch.zeros(())

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        learner.fast._capture_fn(step)
    messages = [str(w.message) for w in caught]
    assert messages.count("something else") == 4  # three warm-up steps and the capture
    assert sum("capturable=True" in m for m in messages) == 1  # the fake capture captures nothing


def test_a_compiler_failure_is_said_in_its_one_error_line():
    """A C++ compiler's failure inside torch.compile is dozens of lines; the warning keeps the
    one that says what went wrong (the rest is in the debug log)."""
    from edgerl.learners.fast_update import compile_error_line

    output = "\n".join(
        [
            "backend='inductor' raised:",
            "CppCompileError: C++ compile error",
            "Command:",
            "g++ /tmp/torchinductor_root/ab/cabc.cpp -D TORCH_INDUCTOR_CPP_WRAPPER -shared -fPIC",
            *[f"  context line {i}" for i in range(25)],
            "/tmp/torchinductor_root/ab/cabc.cpp:3:10: fatal error: Python.h: No such file",
            "compilation terminated.",
        ]
    )
    line = compile_error_line(RuntimeError(output))
    assert line == "/tmp/torchinductor_root/ab/cabc.cpp:3:10: fatal error: Python.h: No such file"
    assert compile_error_line(RuntimeError("out of memory")) == "out of memory"
    assert len(compile_error_line(RuntimeError("x" * 500))) == 200
