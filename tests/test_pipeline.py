"""The learning pipelines (pipeline.py): the async replay ratio and lag bounds, sync determinism,
a learner thread's errors, and which pipeline `auto` picks."""

from __future__ import annotations

import pytest
import torch

from edgerl.learners.acting import EpsilonGreedy
from edgerl.learners.dqn import DQN
from edgerl.run.pipeline import resolve_pipeline
from edgerl.run.train import Trainer

from .helpers import CPU, GPU, pong_config


@pytest.mark.parametrize("num_envs", [4, 3])
def test_async_replay_ratio_is_exact_and_lag_bounded(tmp_path, num_envs):
    """The flow control's bounds, the balancer held still: on a slow or loaded machine the run
    lasts past its first measurement (20 s), and where the actor waits the balancer may double
    the lead (a run beside a busy machine saw 6 of a setting of 3)."""
    cfg = pong_config(
        tmp_path,
        "perf.pipeline=async",
        f"env.num_envs={num_envs}",
        "perf.max_policy_lag=2",
        "perf.max_ahead=3",
        "perf.balance=off",
    )
    with Trainer(cfg, quiet=True) as trainer:
        result = trainer.run()
        learning = trainer.learning
        assert learning.mode == "async"
        assert trainer.learner.updates == (result.step - 400) // 4  # exact, whatever num_envs
        assert 0 < learning.max_ahead_seen <= 3  # acting ran ahead, but never further
        # The weights that picked an action lagged at most max_policy_lag + max_ahead updates.
        assert 0 < learning.max_lag_seen <= 2 + 3
        assert result.step >= 1600 and result.step - 1600 < num_envs


def test_sync_mode_is_deterministic(tmp_path):
    from edgerl.files.checkpoint import load
    from edgerl.policies import newest_checkpoint

    weights = []
    for i in range(2):
        cfg = pong_config(tmp_path / str(i), "perf.pipeline=sync", "env.num_envs=2", steps=800)
        with Trainer(cfg, quiet=True) as trainer:
            trainer.run()
        state = load(newest_checkpoint(tmp_path / str(i) / "run"))
        weights.append(state.learner["q"])
        assert state.learner["updates"] == (800 - 400) // 4
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name


def test_a_learner_thread_error_reaches_the_caller(tmp_path, monkeypatch):
    original = DQN.learn

    def failing(self, replay, step, n=1):
        if self.updates >= 3:
            raise RuntimeError("simulated GPU fault")
        return original(self, replay, step, n)

    monkeypatch.setattr(DQN, "learn", failing)
    cfg = pong_config(tmp_path, "perf.pipeline=async", "env.num_envs=2")
    with pytest.raises(RuntimeError, match="simulated GPU fault"), Trainer(cfg, quiet=True) as t:
        t.run()


def test_auto_pipeline_is_async_on_a_gpu_and_sync_on_the_cpu():
    assert resolve_pipeline("auto", CPU) == "sync"
    assert resolve_pipeline("auto", GPU) == "async"
    assert resolve_pipeline("async", CPU) == "async"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_async_actor_never_waits_for_the_learners_gpu_work(tmp_path, monkeypatch):
    """Counts every host wait on the GPU made on the actor's thread while learning runs: the
    only ones allowed are the actor's reads of its own forward passes (sync-debug mode does not
    see event waits, so they are counted here)."""
    import threading

    from edgerl.report.hooks import Hook

    main = threading.main_thread()
    waits: list[str] = []
    window = {"on": False}

    def counting(name, original):
        def wrapper(*args, **kwargs):
            if window["on"] and threading.current_thread() is main:
                waits.append(name)
            return original(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(torch.cuda, "synchronize", counting("synchronize", torch.cuda.synchronize))
    monkeypatch.setattr(
        torch.cuda.Stream, "synchronize", counting("stream", torch.cuda.Stream.synchronize)
    )

    own: list = []  # the actor's event for its own forward passes

    class Window(Hook):
        def on_start(self, run):
            own.append(run.learning.actor._done)

        def on_step(self, run):
            window["on"] = 800 <= run.step < 3000

    original_event_sync = torch.cuda.Event.synchronize

    def event_sync(event):
        counted = window["on"] and threading.current_thread() is main
        if counted and not (own and event is own[0]):
            waits.append("event")
        return original_event_sync(event)

    monkeypatch.setattr(torch.cuda.Event, "synchronize", event_sync)
    cfg = pong_config(tmp_path, "perf.pipeline=async", "env.num_envs=8", steps=3200)
    with Trainer(cfg, quiet=True, hooks=[Window()]) as trainer:
        trainer.run()
        assert trainer.memory.host_waits == 0  # no staging buffer was still in flight
    assert waits == [], waits


def test_the_async_learners_captured_sampler_keeps_the_pipelines_guard(monkeypatch):
    """A CUDA graph that samples keeps the sampler's settings of its capture, so the guard gap
    the async pipeline reads by must be set before the learner is prepared: without it, an
    n-step window can see a slot flagged valid whose frames the actor has not written yet.
    Stand-ins: a CPU learner with CUDA graphs on, whose capture samples once as a real one
    would."""
    import numpy as np

    import edgerl.memories.replay.buffer as replay_module
    from edgerl.config import build_layers, resolve
    from edgerl.envs import EnvSpec
    from edgerl.learners.factory import build_learner, build_memory
    from edgerl.run.pipeline import build_learning

    cfg = resolve(
        build_layers(
            None,
            ["perf.pipeline=async", "replay.capacity=4000", "agent.n_step=3"],
            {"env.id": "CartPole-v1"},
            use_system=False,
        )
    )
    spec = EnvSpec("CartPole-v1", "vector", (4,), "float32", 2, ("l", "r"))
    memory = build_memory(cfg, spec, CPU)
    learner = build_learner(cfg, spec, CPU)
    learner.fast.cuda_graphs = True
    guards: list[int] = []
    sample = replay_module.sample

    def recording(storage, sample_spec, generator=None):
        guards.append(sample_spec.guard)
        return sample(storage, sample_spec, generator)

    monkeypatch.setattr(replay_module, "sample", recording)
    monkeypatch.setattr(learner.fast, "prepare_sampling", lambda draw, per_launch: draw())
    learning = build_learning(cfg, spec, learner, memory, np.random.default_rng(0), 100)
    assert learning.mode == "async"
    assert memory.guard > 0 and guards == [memory.guard]


def test_async_training_with_more_updates_per_launch_than_max_ahead_finishes(caplog):
    """The learner waits until a whole launch (K updates) is owed and the actor stops once more
    than ``perf.max_ahead`` are: with K=16 and max_ahead=8 each would wait for the other for
    ever. Acting may run one launch ahead instead, and says so. Stand-in: a CPU learner whose
    sampling graph (16 updates per launch) only counts its launches; a timer interrupts a
    deadlock so that it fails the test instead of hanging it."""
    import threading

    import numpy as np

    from edgerl.config import AgentConfig, PerfConfig
    from edgerl.envs import EnvSpec
    from edgerl.memories.replay import ReplayBuffer
    from edgerl.run.actor import Actor, ActorWeights
    from edgerl.run.pipeline import AsyncLearning

    from .cuda_standins import learner_with_sampling_graph

    spec = EnvSpec("CartPole-v1", "vector", (4,), "float32", 2, ("l", "r"))
    memory = ReplayBuffer(spec, 400, 1, "cpu")
    agent = AgentConfig(learning_starts=100, train_freq=4)
    learner, graph = learner_with_sampling_graph(16, memory, agent)
    policy = EpsilonGreedy(learner.q, 2)
    actor = Actor(
        ActorWeights(learner.q, True), policy, 1, np.random.default_rng(0), (4,), "float32", False
    )
    with caplog.at_level("INFO"):
        learning = AsyncLearning(learner, memory, actor, PerfConfig(pipeline="async", max_ahead=8))
    assert "acting may run 16 updates ahead" in caplog.text
    deadlocked = threading.Event()
    watchdog = threading.Timer(20, lambda: (deadlocked.set(), learning.interrupt()))
    watchdog.start()
    learning.start()
    try:
        for step in range(0, 100 + 4 * 200, 4):  # one update due per step: 200 in all
            learning.after_step(step)
    finally:
        watchdog.cancel()
        learning.finish(drain=False)
    assert not deadlocked.is_set()
    assert learner.updates == 16 * graph.replays >= 200 - 17  # whole launches, all but one
    assert 8 < learning.max_ahead_seen <= 16


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_drain_at_the_end_of_a_run_captures_no_second_graph(monkeypatch, mode):
    """The updates still due when a run ends (fewer than one launch) are one more launch of the
    graph that samples, never a second capture: that would make three real warm-up updates on
    the learner's thread and capture while the replay's save may be copying on the GPU.
    Stand-ins: a CPU learner whose graph (4 updates a launch) counts its launches, and a
    capture that fails the test."""
    import numpy as np

    from edgerl.config import AgentConfig, PerfConfig
    from edgerl.envs import EnvSpec
    from edgerl.memories.replay import ReplayBuffer
    from edgerl.run.actor import Actor, ActorWeights
    from edgerl.run.pipeline import AsyncLearning, SyncLearning

    from .cuda_standins import forbid_capture, learner_with_sampling_graph

    captures = forbid_capture(monkeypatch)
    spec = EnvSpec("CartPole-v1", "vector", (4,), "float32", 2, ("l", "r"))
    memory = ReplayBuffer(spec, 400, 1, "cpu")
    agent = AgentConfig(learning_starts=100, train_freq=4)
    learner, graph = learner_with_sampling_graph(4, memory, agent)
    rng = np.random.default_rng(0)
    memory.add_first(rng.normal(size=(1, 4)).astype(np.float32))
    no = np.zeros(1, dtype=bool)
    for _ in range(50):  # transitions to sample, should anything sample apart
        obs = rng.normal(size=(1, 4)).astype(np.float32)
        memory.add(np.zeros(1, np.int64), np.ones(1, np.float32), no, no, obs, None)
    weights, policy = ActorWeights(learner.q, mode == "async"), EpsilonGreedy(learner.q, 2)
    actor = Actor(weights, policy, 1, rng, (4,), "float32", False)
    perf = PerfConfig(pipeline=mode, max_ahead=8)
    learning = (
        AsyncLearning(learner, memory, actor, perf)
        if mode == "async"
        else SyncLearning(learner, memory, actor)
    )
    learning.start()
    for step in range(100, 100 + 4 * 10 + 1, 4):  # 10 updates due: 2 launches and 2 over
        learning.after_step(step)
    learning.finish(drain=True)
    assert captures == []
    assert graph.replays == 3 and learner.updates == 12 and learner.owed(140) == -2
