"""A rollout learner beside the actor (lagged.py): the lag is one rollout at every step, the
learner's rollout never changes under it, seeded runs repeat, and a run stopped mid-rollout
resumes."""

from __future__ import annotations

import hashlib
import time

import pytest
import torch

from edgerl.config import build_layers, resolve
from edgerl.learners.pqn import PQN
from edgerl.run.lagged import LaggedRollouts
from edgerl.run.train import Trainer


def pqn_config(tmp_path, *sets: str, game: str = "CartPole-v1", steps: int = 4096):
    """PQN with the lagged pipeline: CartPole (the loop steps, then learns: no overlap) or Pong
    with one ALE thread (the next step's actions are picked before the last one is stored)."""
    small = {
        "CartPole-v1": ["env.num_envs=8", "pqn.rollout_steps=16", "pqn.minibatches=4"],
        "ALE/Pong-v5": [
            "env.num_envs=4",
            "env.threads=1",
            "pqn.rollout_steps=16",
            "pqn.epochs=1",
            "pqn.minibatches=2",
            "agent.eps_decay_steps=64",
        ],
    }[game]
    return resolve(
        build_layers(
            None,
            [
                "agent.algo=pqn",
                "perf.pipeline=async",
                "hw.monitor=false",
                "display.enabled=false",
                "eval.every_steps=0",
                *small,
                *sets,
            ],
            {"env.id": game, "train.steps": steps, "train.run_dir": str(tmp_path / "run")},
            use_system=False,
        )
    )


GAMES = [
    "CartPole-v1",
    "ALE/Pong-v5",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
        ],
    ),
]


@pytest.mark.parametrize("game", GAMES)
def test_every_step_acts_with_the_weights_of_one_rollout_before(tmp_path, game):
    """Rollout r is acted with the weights after r-1 rollouts were learned, at every step,
    where the loop stores a step before picking the next actions (CartPole) and where it picks
    them first (Pong with a core to spare)."""
    device = "cuda" if game == "cuda" else "cpu"  # on a GPU: Pong, the learner on its stream
    game = "ALE/Pong-v5" if game == "cuda" else game
    steps = 4096 if game == "CartPole-v1" else 640
    cfg = pqn_config(tmp_path, f"perf.device={device}", game=game, steps=steps)
    with Trainer(cfg, quiet=True) as trainer:
        trainer.run()
        cfg = trainer.cfg  # with the presets
        learning = trainer.learning
        assert isinstance(learning, LaggedRollouts) and learning.mode == "async"
        per_rollout = cfg.env.num_envs * cfg.pqn.rollout_steps
        assert learning.lags_seen == {1}
        assert learning.acts == steps // cfg.env.num_envs
        # Every rollout was learned, the last one too, each with its epochs of minibatches.
        assert trainer.learner.rollouts == steps // per_rollout == learning.learned
        assert trainer.learner.updates == learning.learned * cfg.pqn.epochs * cfg.pqn.minibatches


def test_the_learner_never_sees_its_rollout_change(tmp_path, monkeypatch):
    """The learner takes its time over each rollout while the actor collects the next; what it
    learns from is the same at the end of its learning as at the start."""
    original = PQN.learn
    changed, overlapped = [], []
    acts = {"n": 0}

    def digest(memory) -> str:
        h = hashlib.sha256()
        for t in (memory.obs, memory.actions, memory.rewards, memory.terminated):
            h.update(t.cpu().numpy().tobytes())
        return h.hexdigest()

    def slow_learn(self, memory, step, n=1):
        before, acted = digest(memory), acts["n"]
        time.sleep(0.05)  # the actor goes on meanwhile
        changed.append(digest(memory) != before)
        overlapped.append(acts["n"] > acted)
        return original(self, memory, step, n)

    act = LaggedRollouts.act

    def counting_act(self, *args, **kwargs):
        acts["n"] += 1
        return act(self, *args, **kwargs)

    monkeypatch.setattr(PQN, "learn", slow_learn)
    monkeypatch.setattr(LaggedRollouts, "act", counting_act)
    with Trainer(pqn_config(tmp_path, steps=2048), quiet=True) as trainer:
        trainer.run()
    assert changed and not any(changed)
    assert any(overlapped)  # the actor did write meanwhile: the test could have failed


def assert_two_seeded_runs_end_alike(tmp_path) -> None:
    """Two seeded lagged runs of CartPole end with the same weights, bit for bit."""
    weights = []
    for i in range(2):
        cfg = pqn_config(tmp_path / str(i), "perf.threads=1", steps=2048)
        with Trainer(cfg, quiet=True) as trainer:
            trainer.run()
            weights.append({k: v.clone() for k, v in trainer.learner.q.state_dict().items()})
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name


def test_seeded_lagged_runs_repeat_exactly(tmp_path):
    assert_two_seeded_runs_end_alike(tmp_path)


def test_a_run_stopped_mid_rollout_resumes_and_learns_every_rollout(tmp_path, monkeypatch, caplog):
    """A stop while the learner learns: its rollout is finished before the checkpoint, and the
    same command resumes from there."""
    cfg = pqn_config(tmp_path, steps=4096)
    with Trainer(cfg, quiet=True) as trainer:
        original = LaggedRollouts._hand_over

        def stop_at_third(self, step):
            original(self, step)
            if self.handed == 3:
                trainer.request_stop("test")

        monkeypatch.setattr(LaggedRollouts, "_hand_over", stop_at_third)
        result = trainer.run()
        assert result.stopped and trainer.learner.rollouts == 3 == trainer.learning.learned
    monkeypatch.undo()
    caplog.set_level("INFO", logger="edgerl.run.checkpointer")
    with Trainer(cfg, quiet=True) as trainer:
        # PQN has no replay to refill: it says it goes on at once, not "after 0 steps"
        assert "learning continues at once" in caplog.text and "after 0 steps" not in caplog.text
        assert trainer.step == result.step and trainer.learner.rollouts == 3
        result = trainer.run()
        assert not result.stopped and result.step == 4096
        # The resumed session's first rollout starts at its first step: the rollouts learned
        # after it are whole ones.
        per_rollout = cfg.env.num_envs * cfg.pqn.rollout_steps
        assert trainer.learner.rollouts == 3 + (4096 - trainer.learner.learn_from[0]) // per_rollout


def slow_emulator(monkeypatch, seconds: float = 0.004) -> None:
    """Each vector step of CartPole takes ``seconds`` (as ALE's step can on a CPU): the learner
    then finishes its rollout while the actor is still collecting the next one."""
    from edgerl.envs.gym_vector import GymVecEnv

    recv = GymVecEnv.recv

    def slow_recv(self):
        time.sleep(seconds)
        return recv(self)

    monkeypatch.setattr(GymVecEnv, "recv", slow_recv)


def test_no_value_of_older_weights_is_learned_as_the_learners_own(tmp_path, monkeypatch):
    """With an emulator slower than the learner, the actor acts on after the learner has
    finished its rollout, with the older weights it adopted at the rollout's start: those
    values are not the learner's, and the learner must not reuse them as its own."""
    slow_emulator(monkeypatch)
    original = PQN._next_values
    checked, stale = [], []

    def checking(self, memory):
        used = original(self, memory)
        steps, envs = memory.steps, memory.num_envs
        own = self._greedy_values(memory.obs[1:].flatten(0, 1)).view(steps, envs)
        checked.append(bool((memory.values_version[1:] >= 0).any()))
        stale.append(float((used - own).abs().max()))
        return used

    monkeypatch.setattr(PQN, "_next_values", checking)
    with Trainer(pqn_config(tmp_path, "perf.threads=1", steps=2048), quiet=True) as trainer:
        trainer.run()
    assert any(checked)  # values were noted: the test could have failed
    assert max(stale) < 1e-4, stale


def test_seeded_lagged_runs_repeat_exactly_with_a_slow_emulator(tmp_path, monkeypatch):
    """The learner's targets do not depend on when the actor's steps land against its
    learning: two seeded runs end with the same weights, bit for bit."""
    slow_emulator(monkeypatch)
    assert_two_seeded_runs_end_alike(tmp_path)
