"""The learning pipelines (pipeline.py): the async replay ratio and lag bounds, sync determinism,
a learner thread's errors, and which pipeline `auto` picks."""

from __future__ import annotations

import pytest
import torch

from edgerl.dqn import DQN
from edgerl.pipeline import resolve_pipeline
from edgerl.train import Trainer

from .helpers import CPU, GPU, pong_config


@pytest.mark.parametrize("num_envs", [4, 3])
def test_async_replay_ratio_is_exact_and_lag_bounded(tmp_path, num_envs):
    cfg = pong_config(
        tmp_path,
        "perf.pipeline=async",
        f"env.num_envs={num_envs}",
        "perf.max_policy_lag=2",
        "perf.max_ahead=3",
    )
    with Trainer(cfg, quiet=True) as trainer:
        result = trainer.run()
        learning = trainer.learning
        assert learning.mode == "async"
        assert trainer.learner.updates == (result.step - 400) // 4  # exact, whatever num_envs
        assert 0 < learning.max_ahead_seen <= 3  # acting ran ahead, but never further
        assert learning.max_lag_seen <= 2  # the actor's weights lagged at most 2 updates
        assert result.step >= 1600 and result.step - 1600 < num_envs


def test_sync_mode_is_deterministic(tmp_path):
    from edgerl.checkpoint import load
    from edgerl.play import newest_checkpoint

    weights = []
    for i in range(2):
        cfg = pong_config(tmp_path / str(i), "perf.pipeline=sync", "env.num_envs=2", steps=800)
        with Trainer(cfg, quiet=True) as trainer:
            trainer.run()
        state = load(newest_checkpoint(tmp_path / str(i) / "run"))
        weights.append(state["learner"]["q"])
        assert state["learner"]["updates"] == (800 - 400) // 4
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name


def test_a_learner_thread_error_reaches_the_caller(tmp_path, monkeypatch):
    original = DQN.update

    def failing(self, batch):
        if self.updates >= 3:
            raise RuntimeError("simulated GPU fault")
        return original(self, batch)

    monkeypatch.setattr(DQN, "update", failing)
    cfg = pong_config(tmp_path, "perf.pipeline=async", "env.num_envs=2")
    with pytest.raises(RuntimeError, match="simulated GPU fault"), Trainer(cfg, quiet=True) as t:
        t.run()


def test_auto_pipeline_is_async_on_a_gpu_and_sync_on_the_cpu():
    assert resolve_pipeline("auto", CPU) == "sync"
    assert resolve_pipeline("auto", GPU) == "async"
    assert resolve_pipeline("async", CPU) == "async"
