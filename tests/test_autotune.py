"""Autotune (autotune.py): the fewest environments that keep the learner busy, alone and in the
trainer."""

from __future__ import annotations

import pytest

from edgerl.run.autotune import ActorMeasurement, choose, predict
from edgerl.run.train import Trainer

from .helpers import pong_config


def m(n: int, threads: int, sps: float) -> ActorMeasurement:
    return ActorMeasurement(n, threads, sps)


def test_autotune_picks_the_fewest_envs_that_keep_the_learner_busy():
    fake = [m(1, 1, 900), m(2, 2, 1400), m(4, 2, 2600), m(8, 2, 3000), m(16, 2, 3100)]
    # learner: 500 updates/s x 4 = 2000 steps/s needed; 4 envs give 2600 (async: min(...))
    choice = choose(fake, 500, 4, "async")
    assert (choice.num_envs, choice.threads) == (4, 2)
    assert choice.limit_steps_per_s == 2000 and "learner is the limit" in choice.reason
    # a slow learner: one env is already enough
    assert choose(fake, 30, 4, "async").num_envs == 1


def test_autotune_says_when_the_actor_is_the_limit():
    fake = [m(1, 1, 300), m(4, 2, 800), m(8, 2, 820)]
    choice = choose(fake, 500, 4, "async")
    # 8 envs are only 2.5% faster than 4: four are enough, and the actor limits either way
    assert choice.num_envs == 4 and "the actor is the limit" in choice.reason


def test_sync_prediction_rewards_a_faster_actor_less():
    assert predict(1000, 1000, "async") == 1000
    assert predict(1000, 1000, "sync") == 500
    fake = [m(1, 1, 1300), m(4, 2, 2600), m(8, 2, 2700)]
    assert choose(fake, 31, 4, "sync").num_envs == 1  # 124 steps/s limit: the actor hardly counts


@pytest.mark.slow
def test_autotune_in_the_trainer_writes_its_choice(tmp_path, caplog):
    import tomllib

    cfg = pong_config(tmp_path, "perf.autotune=true", steps=500)
    with caplog.at_level("INFO"), Trainer(cfg, quiet=True) as trainer:
        trainer.run()
        chosen = trainer.autotune
    assert chosen is not None and "autotune: env.num_envs=" in caplog.text
    written = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    assert written["env"]["num_envs"] == chosen.num_envs
    assert written["env"]["threads"] == chosen.threads
