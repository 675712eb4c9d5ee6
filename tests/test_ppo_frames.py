"""PPO right for frames (issue 68): learned against the weights that acted where the loop
overlaps emulation (the sync loop and the lagged pipeline), its learning rate's horizon a key of
its own, CleanRL's value-loss clipping and orthogonal initial weights as keys (on in the frames
preset), its figures in metrics.csv, and evaluations and ``play`` that sample a sampling
policy's actions."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch

from edgerl.config import AgentConfig, Config, EvalConfig, PPOConfig
from edgerl.envs import EnvSpec
from edgerl.learners.nets import MLP, NatureCNN
from edgerl.learners.ppo import FIGURES, PPO, explained_variance
from edgerl.memories.rollout import RolloutBuffer

VEC = EnvSpec("CartPole-v1", "vector", (4,), "float32", 2, ("l", "r"))
CPU = torch.device("cpu")


def pong_sets(tmp_path, pipeline: str, *more: str) -> list[str]:
    """PPO on Pong with one ALE thread and a core to spare: the loop picks the next actions
    before it stores the step before (it overlaps emulation)."""
    return [
        "env.id=ALE/Pong-v5",
        "agent.algo=ppo",
        "env.num_envs=4",
        "env.threads=1",
        "ppo.rollout_steps=16",
        "ppo.epochs=1",
        "ppo.minibatches=2",
        "train.steps=256",
        f"perf.pipeline={pipeline}",
        f"train.run_dir={tmp_path / 'run'}",
        "hw.monitor=false",
        "display.enabled=false",
        "eval.every_steps=0",
        *more,
    ]


OVERLAPPING = [
    "sync",
    "async",  # the lagged pipeline: rollout r acted with the weights of rollout r-1
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
        ],
    ),
]


@pytest.mark.parametrize("pipeline", OVERLAPPING)
def test_ppo_learns_against_the_weights_that_acted_where_acting_overlaps(
    tmp_path, monkeypatch, pipeline
):
    """Where the loop picks a step's actions before it stores the step before (Pong with a core
    to spare; every GPU learner), the log-probabilities a rollout is learned against (the
    probability ratio's denominator) and its values are those the acting weights gave, step by
    step, in the sync loop and in the lagged pipeline: none is recomputed from the learner's
    weights but the value of a run's very last observation."""
    from edgerl.config import build_layers, resolve
    from edgerl.envs.batches import overlaps_emulation
    from edgerl.run.actor import Actor
    from edgerl.run.train import Trainer

    device = "cuda" if pipeline == "cuda" else "cpu"
    mode = "async" if pipeline == "cuda" else pipeline
    cfg = resolve(
        build_layers(None, pong_sets(tmp_path, mode, f"perf.device={device}"), use_system=False)
    )
    if not overlaps_emulation(cfg.env, True, torch.device(device)):
        pytest.skip("one usable core: the loop does not overlap emulation here")
    acted: list[dict[str, np.ndarray]] = []
    learned: list[tuple[torch.Tensor, torch.Tensor]] = []
    act, noted = Actor.act, PPO._noted

    def acting(self, obs, *args, **kwargs):
        out = act(self, obs, *args, **kwargs)
        acted.append({name: rows.copy() for name, rows in self.extras.items()})
        return out

    def learning(self, memory):
        values, logp = noted(self, memory)
        learned.append((values.cpu().clone(), logp.cpu().clone()))
        return values, logp

    monkeypatch.setattr(Actor, "act", acting)
    monkeypatch.setattr(PPO, "_noted", learning)
    with Trainer(cfg, quiet=True) as trainer:
        trainer.run()
        learner = trainer.learner
        steps = learner.ppo.rollout_steps
        assert learner.rollouts == len(learned) == 4 and len(acted) == 4 * steps
        for r, (values, logp) in enumerate(learned):
            rows = acted[r * steps : (r + 1) * steps]
            old_logp = torch.from_numpy(np.stack([row["logp"] for row in rows]))
            torch.testing.assert_close(logp[:steps], old_logp, rtol=0, atol=0)
            if r + 1 < len(learned):  # the next rollout's first step: acted on already
                rows = [*rows, acted[(r + 1) * steps]]
            acted_values = torch.from_numpy(np.stack([row["value"] for row in rows]))
            torch.testing.assert_close(values[: len(rows)], acted_values, rtol=0, atol=0)
        assert learner.recomputed == 0


def full_rollout(num_envs: int = 3, steps: int = 4, seed: int = 0) -> RolloutBuffer:
    """A CartPole-shaped rollout of random observations, actions and rewards, nothing noted."""
    buffer = RolloutBuffer(VEC, num_envs, steps, CPU)
    rng = np.random.default_rng(seed)
    buffer.add_first(rng.normal(size=(num_envs, 4)).astype(np.float32))
    for _ in range(steps):
        done = np.zeros(num_envs, bool)
        nxt = rng.normal(size=(num_envs, 4)).astype(np.float32)
        buffer.add(rng.integers(0, 2, num_envs), rng.normal(size=num_envs), done, done, nxt, None)
    return buffer


@pytest.mark.parametrize(("anneal_steps", "lr"), [(0, 0.5e-3), (1000, 0.95e-3)])
def test_the_learning_rate_anneals_over_ppo_anneal_steps_else_train_steps(anneal_steps, lr):
    """agent.lr 1e-3 to 0: at step 50 of a run of 100 steps, half way with the key at 0 (the
    run's steps), a twentieth of the way over 1,000 steps."""
    ppo = PPOConfig(rollout_steps=4, epochs=1, minibatches=1, anneal_steps=anneal_steps)
    agent = AgentConfig(lr=1e-3, lr_end=0.0)
    learner = PPO(MLP(4, 2, (8,)), agent, ppo, 3, CPU, total_steps=100)
    learner.learn(full_rollout(), 50)
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(lr)


def test_orthogonal_init_is_cleanrls_layer_init_on_the_nature_cnn_and_its_value_head():
    """Every weight matrix orthogonal (its rows, the smaller side here, orthonormal times the
    gain): sqrt(2) for the convolutions and the hidden layer, 0.01 for the logits, 1 for the
    value; biases 0. Off, PyTorch's own initial weights stay."""
    torch.manual_seed(0)
    learner = PPO(NatureCNN(4, 6), AgentConfig(), PPOConfig(orthogonal_init=True), 2, CPU)
    policy, value = learner.q, learner.value_head
    layers = [*policy.features, *policy.head]
    gains = [math.sqrt(2.0)] * 4 + [0.01]
    weighted = [m for m in layers if isinstance(m, torch.nn.Linear | torch.nn.Conv2d)]
    for layer, gain in zip([*weighted, value], [*gains, 1.0], strict=True):
        w = layer.weight.detach().reshape(layer.weight.shape[0], -1)
        eye = torch.eye(w.shape[0])
        torch.testing.assert_close(w @ w.T, gain**2 * eye, atol=1e-4, rtol=1e-4)
        assert not layer.bias.detach().any()
    plain = PPO(NatureCNN(4, 6), AgentConfig(), PPOConfig(), 2, CPU)
    assert plain.q.last.bias.detach().any()


def test_orthogonal_init_reaches_a_value_network_of_its_own_on_vectors():
    learner = PPO(MLP(4, 2, (64, 64)), AgentConfig(), PPOConfig(orthogonal_init=True), 2, CPU)
    value = [m for m in learner.value_head.modules() if isinstance(m, torch.nn.Linear)]
    for layer, gain in zip(value, [math.sqrt(2.0), math.sqrt(2.0), 1.0], strict=True):
        w = layer.weight.detach()
        small = min(w.shape)
        gram = w @ w.T if w.shape[0] == small else w.T @ w
        torch.testing.assert_close(gram, gain**2 * torch.eye(small), atol=1e-4, rtol=1e-4)


def value_loss_of(learner: PPO, batch: tuple[torch.Tensor, ...], clip_value: bool) -> float:
    """The loss of one update step written out (the reference's formulas), before the step."""
    obs, actions, old_logp, advantages, returns, old_values = batch
    p = learner.ppo
    with torch.no_grad():
        out = learner.acting(obs)
        logp_all = torch.log_softmax(out[:, :-1], dim=1)
        logp = logp_all.gather(1, actions.unsqueeze(1)).squeeze(1)
        adv = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        ratio = (logp - old_logp).exp()
        surrogate = torch.min(ratio * adv, ratio.clamp(1 - p.clip, 1 + p.clip) * adv)
        value = out[:, -1]
        error = (value - returns) ** 2
        if clip_value:
            moved = old_values + (value - old_values).clamp(-p.clip, p.clip)
            error = torch.max(error, (moved - returns) ** 2)
        entropy = -(logp_all.exp() * logp_all).sum(dim=1).mean()
        loss = -surrogate.mean() + p.vf_coef * 0.5 * error.mean() - p.ent_coef * entropy
    return float(loss)


@pytest.mark.parametrize("clip_value", [False, True])
def test_the_value_loss_is_clipped_as_the_references_clip_vloss(clip_value):
    """Values noted far from the network's (a step away from them counts at most ppo.clip):
    with ppo.clip_value the larger of the two errors, without it the plain one."""
    torch.manual_seed(0)
    ppo = PPOConfig(clip=0.2, clip_value=clip_value)
    learner = PPO(MLP(4, 2, (8,)), AgentConfig(grad_clip=0.0), ppo, 8, CPU)
    obs = torch.randn(8, 4)
    actions = torch.randint(0, 2, (8,))
    with torch.no_grad():
        old_logp = torch.log_softmax(learner.acting(obs)[:, :-1], dim=1)[torch.arange(8), actions]
    returns = torch.randn(8) * 3
    old_values = returns + torch.where(torch.arange(8) % 2 == 0, 2.0, -2.0)
    batch = (obs, actions, old_logp, torch.randn(8), returns, old_values)
    expected = value_loss_of(learner, batch, clip_value)
    assert expected != pytest.approx(value_loss_of(learner, batch, not clip_value))
    loss, approx_kl, clip_fraction = learner.update_step(batch)
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    assert float(approx_kl) == pytest.approx(0.0, abs=1e-6) and float(clip_fraction) == 0.0


def test_explained_variance_by_hand():
    returns = torch.tensor([1.0, 2.0, 3.0, 6.0])
    assert float(explained_variance(returns, returns)) == 1.0
    assert float(explained_variance(torch.full((4,), 3.0), returns)) == pytest.approx(0.0)
    half = returns.mean() + 0.5 * (returns - returns.mean())  # a quarter of the variance left
    assert float(explained_variance(half, returns)) == pytest.approx(0.75)
    assert math.isnan(float(explained_variance(returns, torch.full((4,), 2.0))))


def test_a_ppo_run_writes_its_figures_to_metrics_csv(tmp_path):
    """approx_kl, the fraction clipped and the explained variance of the last rollout: NaN
    before the first, the same names every call, a column each in metrics.csv."""
    from edgerl.config import build_layers, resolve
    from edgerl.run.train import Trainer

    sets = [
        "env.id=CartPole-v1",
        "agent.algo=ppo",
        "env.num_envs=4",
        "ppo.rollout_steps=16",
        "train.steps=640",
        f"train.run_dir={tmp_path / 'run'}",
        "hw.monitor=false",
        "display.enabled=false",
        "eval.every_steps=0",
    ]
    with Trainer(resolve(build_layers(None, sets, use_system=False)), quiet=True) as trainer:
        before = trainer.learner.figures()
        assert tuple(before) == FIGURES and all(math.isnan(v) for v in before.values())
        trainer.run()
        figures = trainer.learner.figures()
    assert tuple(figures) == FIGURES
    assert -1e-6 <= figures["approx_kl"] < 1.0 and 0.0 <= figures["clip_fraction"] <= 1.0
    assert -10.0 < figures["explained_variance"] <= 1.0
    with (tmp_path / "run" / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and set(FIGURES) <= set(rows[0])
    assert float(rows[-1]["clip_fraction"]) == pytest.approx(figures["clip_fraction"])


def test_the_frames_preset_turns_on_cleanrls_defaults_and_the_keys_alone_do_not():
    """[ppo]'s defaults keep the runs on record before the keys (value clipping and orthogonal
    weights off); PPO's frames preset is CleanRL's ppo_atari.py, with both on; its vector
    preset leaves them off."""
    from edgerl.config import build_layers, resolve
    from edgerl.config.learners import learner_info
    from edgerl.config.presets import apply_presets

    assert not PPOConfig().clip_value and not PPOConfig().orthogonal_init
    assert PPOConfig().anneal_steps == 0
    layers = build_layers(None, ["agent.algo=ppo"], use_system=False)
    frames = apply_presets(resolve(layers), "frames")
    assert frames.ppo.clip_value and frames.ppo.orthogonal_init
    vector = apply_presets(resolve(layers), "vector")
    assert not vector.ppo.clip_value and not vector.ppo.orthogonal_init
    keys = learner_info("ppo").sample_keys
    assert {"ppo.anneal_steps", "ppo.clip_value", "ppo.orthogonal_init"} <= set(keys)


def test_sampled_actions_follow_the_softmax_of_the_outputs_and_repeat_with_the_seed():
    from edgerl.play.loop import sampled_actions

    logits = np.log(np.array([[0.2, 0.3, 0.5]])).repeat(20_000, axis=0) + 7.0
    picks = sampled_actions(logits, np.random.default_rng(0))
    assert picks.dtype == np.int64
    np.testing.assert_allclose(
        np.bincount(picks, minlength=3) / len(picks), [0.2, 0.3, 0.5], atol=0.01
    )
    again = sampled_actions(logits, np.random.default_rng(0))
    np.testing.assert_array_equal(picks, again)


def coin_flipper():
    """A CartPole PPO policy snapshot whose logits are even, a hair above for pushing left:
    greedy, it pushes left every step; sampled, it pushes either way at random."""
    from edgerl.envs import probe
    from edgerl.files.checkpoint import POLICY_KEY, Checkpoint
    from edgerl.learners.nets import build_q_network

    spec = probe("CartPole-v1")
    cfg = Config()
    cfg.env.id, cfg.agent.algo, cfg.agent.hidden = "CartPole-v1", "ppo", (8,)
    net = build_q_network(spec, cfg.agent.hidden)
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net.net[-1].bias[0] = 1e-3
    return Checkpoint(
        kind="ppo",
        step=0,
        env=spec.to_dict(),
        config=cfg.to_dict(),
        learner={POLICY_KEY: net.state_dict()},
    )


def test_an_evaluation_that_samples_draws_from_the_policy_and_repeats_with_its_seed():
    """The same snapshot and seed: greedy, the pole falls within a dozen steps every time;
    sampled, the pushes go both ways and some episodes last longer, the same ones again with
    the seed; ``play`` (one environment, as ``edgerl play``) samples too."""
    from edgerl.play import PlayOptions, play
    from edgerl.policies.torch import TorchPolicy
    from edgerl.report.evaluate import evaluate

    snapshot = coin_flipper()
    settings = EvalConfig(episodes=10, epsilon=0.0)
    greedy = evaluate(snapshot, settings, seed=1)
    assert max(greedy.lengths) <= 12
    sampled = evaluate(snapshot, settings, seed=1, sample=True)
    assert max(sampled.lengths) > 12
    assert evaluate(snapshot, settings, seed=1, sample=True).lengths == sampled.lengths
    policy = TorchPolicy(snapshot, "cpu")
    alone = [play(policy, PlayOptions(episodes=5, seed=s, sample=True)).lengths for s in (3, 3)]
    assert alone[0] == alone[1] and max(alone[0]) > 12
    assert max(play(policy, PlayOptions(episodes=5, seed=3)).lengths) <= 12
