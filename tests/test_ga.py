"""The genetic algorithm (edgerl/learners/ga.py): genomes rebuilt exactly from their seeds, the
members' forward passes batched, selection and the elite, resuming mid-generation, and training
through every command."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from edgerl.config import Config, with_values
from edgerl.learners.ga import GeneticAlgorithm
from edgerl.learners.nets import MLP, NatureCNN
from edgerl.learners.population import Genomes, Population, flat_parameters
from edgerl.memories.episodes import EpisodeScores


def test_a_genome_rebuilds_the_same_bits_from_its_seeds_with_or_without_its_parents_kept():
    net = NatureCNN(4, 6)
    kept = Genomes(net, sigma=0.002)
    line = [(11,), (11, 5), (11, 5, 907), (11, 5, 907, 3)]
    for parent in line[:-1]:  # generation by generation, as the search keeps its parents
        kept.keep([parent])
    child = kept.weights(line[-1])
    fresh = Genomes(NatureCNN(4, 6), sigma=0.002).weights(line[-1])  # from the seeds alone
    assert child.dtype == torch.float32 and child.numel() == kept.size
    assert torch.equal(child, fresh)
    assert not torch.equal(child, kept.weights((11, 5, 907, 4)))  # another seed, another child
    assert not torch.equal(kept.weights((12,)), kept.weights((11,)))
    # A mutation adds sigma times a standard normal draw: the difference has its scale.
    step = (child - kept.weights(line[-2])) / 0.002
    assert abs(float(step.std()) - 1.0) < 0.01 and abs(float(step.mean())) < 0.01


def test_the_initial_weights_of_a_seed_are_pytorchs_own_initialisation_under_that_seed():
    torch.manual_seed(42)
    reference = flat_parameters(MLP(4, 2, (16,)))
    assert torch.equal(Genomes(MLP(4, 2, (16,)), 0.1).initial(42), reference)
    genomes = Genomes(MLP(4, 2, (16,)), 0.1)
    before = torch.random.get_rng_state()
    genomes.initial(7)
    assert torch.equal(torch.random.get_rng_state(), before)  # torch's own generator untouched


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_one_batched_call_gives_each_row_the_values_of_its_own_member(kind):
    net = MLP(4, 2, (32, 32)) if kind == "mlp" else NatureCNN(4, 6)
    obs_shape, dtype = ((4,), torch.float32) if kind == "mlp" else ((4, 84, 84), torch.uint8)
    population = Population(net, num_envs=5, device=torch.device("cpu"))
    genomes = Genomes(net, sigma=0.01)
    for env in range(5):
        population.assign(env, genomes.weights((100 + env,)))
    gen = torch.Generator().manual_seed(0)
    obs = (torch.rand((5, *obs_shape), generator=gen) * 255).to(dtype)
    with torch.no_grad():
        every = torch.arange(5)
        batched = population(obs, every)
        each = population.forward_each(obs, every)
        # Some environments, out of order (ALE's async batches): the weights are gathered.
        some = torch.tensor([3, 0, 4])
        gathered = population(obs[:3], some)
    torch.testing.assert_close(batched, each, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gathered, population.forward_each(obs[:3], some))
    # Each row is the member's own network, as a plain module computes it.
    for env in (0, 4):
        alone = type(net)(*((4, 2, (32, 32)) if kind == "mlp" else (4, 6)))
        torch.nn.utils.vector_to_parameters(genomes.weights((100 + env,)), alone.parameters())
        with torch.no_grad():
            torch.testing.assert_close(batched[env], alone(obs[env : env + 1])[0])
    assert not torch.allclose(batched[0], batched[1])


def small(**ga: float) -> Config:
    values = {
        "env.id": "CartPole-v1",
        "env.num_envs": 3,
        "agent.hidden": (8,),
        "ga.population": 6,
        "ga.truncation": 2,
        "ga.sigma": 0.1,
        "ga.elite_candidates": 2,
        "ga.elite_episodes": 2,
    }
    return with_values(Config(), {**values, **{f"ga.{k}": v for k, v in ga.items()}})


def score_of(ga: GeneticAlgorithm, env: int) -> float:
    """A made-up game: the score is a function of the weights the environment plays."""
    return float(ga.population.slots[env].sum()) * 10


class Script:
    """Plays ``ga`` against the made-up game: each call ends the episode of one environment,
    in turn, with its member's score."""

    def __init__(self, ga: GeneticAlgorithm) -> None:
        self.ga = ga
        assert ga.policy is not None  # as the loop does: every environment gets a job
        self.memory = EpisodeScores(ga.num_envs)
        self.turn = 0
        # (env, (token, job, place), score)
        self.log: list[tuple[int, tuple[int, int, int], float]] = []

    def episode(self) -> None:
        env = self.turn % self.ga.num_envs
        self.turn += 1
        self.end(env, score_of(self.ga, env))

    def end(self, env: int, score: float) -> None:
        """End environment ``env``'s episode with ``score``, as the loop would."""
        self.log.append((env, self.ga.playing[env], score))
        self.memory.add_first(np.zeros((3, 4)), np.array([env]))
        self.memory.score[env] = score
        done = np.array([True])
        self.memory.add(np.zeros(1), np.zeros(1), done, ~done, None, None, np.array([env]))
        assert self.ga.owed(0, self.memory) == 1
        self.ga.learn(self.memory, 0, 1)
        assert self.ga.owed(0, self.memory) == 0

    def until_generation(self, n: int) -> None:
        while self.ga.updates < n:
            self.episode()


def test_truncation_selection_and_an_elite_chosen_over_its_own_episodes():
    ga = GeneticAlgorithm(MLP(4, 2, (8,)), small(), torch.device("cpu"))
    script = Script(ga)
    first = list(ga.generation.members)
    assert len(first) == 6 and all(len(g) == 1 for g in first)  # an initial seed each
    script.until_generation(1)
    fitness = {first[job]: s for (env, (token, job, place), s) in script.log}
    ranked = sorted(fitness, key=lambda g: -fitness[g])
    g = ga.generation
    assert g.candidates == ranked[:2]  # the two best single episodes play for the elite
    # The next generation plays at once: children of the best two, the elite's place open.
    assert g.members[0] is None and len(set(g.members[1:])) == 5  # a seed of its own each
    assert all(child[:-1] in ranked[:2] and len(child) == 2 for child in g.members[1:])
    while ga.generation.choosing:
        script.episode()
    # Children were under way while the candidates played: nobody waited for the elite.
    assert any(0 < job < 6 for token, job, _ in ga.playing.values() if token == ga.token)
    elite = g.members[0]
    assert elite in ranked[:2] and ga.elite == elite
    assert torch.equal(flat_parameters(ga.q), ga.genomes.weights(elite))  # the policy
    figures = ga.figures()
    assert figures["generation"] == 1 and figures["best_score"] == fitness[ranked[0]]
    assert figures["mean_score"] == pytest.approx(np.mean(list(fitness.values())))
    # The made-up game is deterministic, so the elite's mean is its one score.
    assert figures["elite_score"] == pytest.approx(fitness[elite], rel=1e-6)
    assert g.scores[0] == g.trials[g.candidates.index(elite)]  # its fitness: those episodes
    # In the next generation the elite is among the candidates even when beaten.
    script.until_generation(2)
    assert elite in ga.generation.candidates


def test_free_environments_play_more_episodes_and_late_ones_count_for_nobody():
    ga = GeneticAlgorithm(MLP(4, 2, (8,)), small(population=4), torch.device("cpu"))
    script = Script(ga)
    script.episode()  # 3 environments, 4 members: env 0's next job is the last new one
    assert ga.playing[0] == (ga.token, 3, 0) and not ga.pending
    script.episode()
    # Env 1 comes free with every member played or under way once: it plays member 0 again
    # (the first of the fewest), it does not wait idle for the generation's last episodes.
    assert ga.playing[1] == (ga.token, 0, 1)
    script.until_generation(1)
    late = [env for env, (token, _, _) in ga.playing.items() if token != ga.token]
    assert late  # episodes of generation 0 still under way
    wasted = ga.wasted_steps
    while script.turn % ga.num_envs != late[0]:
        script.episode()
    done = episodes_in(ga)
    script.episode()  # a late episode ends: generation 1's results are as before
    assert ga.wasted_steps == wasted + 1
    assert episodes_in(ga) == done


def episodes_in(ga: GeneticAlgorithm) -> list[list[tuple[int, float]]]:
    """Each job's finished episodes, with their places among its episodes."""
    g = ga.generation
    return [[(i, v) for i, v in enumerate(r) if v == v] for r in g.scores + g.trials]


def test_the_elite_stays_a_parent_when_every_child_scores_above_its_mean():
    """Such et al.'s Algorithm 1: the elite is among the parents of the next generation
    whatever the children's single episodes scored (a lucky episode of a child is not a
    better network)."""
    cfg = small(population=40, truncation=3, elite_episodes=2)
    ga = GeneticAlgorithm(
        MLP(4, 2, (8,)), with_values(cfg, {"env.num_envs": 4}), torch.device("cpu")
    )
    script = Script(ga)
    while ga.updates < 1:  # generation 0: member m scores m
        env = script.turn % ga.num_envs
        script.turn += 1
        script.end(env, float(ga.playing[env][1]))
    while ga.updates < 2:  # the elite plays for 1 (its candidate episodes), every child for 50
        env = script.turn % ga.num_envs
        script.turn += 1
        _, job, _ = ga.playing[env]
        script.end(env, 1.0 if job >= len(ga.generation.members) else 50.0)
    elite = ga.elite
    assert elite is not None and ga.generation.number == 2
    parents = {child[:-1] for child in ga.generation.members[1:]}
    assert elite in parents  # 39 children of 3 parents: every parent has some
    assert len(parents) == 3
    assert elite in ga.generation.candidates  # and it plays again for the next elite


def test_members_are_ranked_over_their_first_episodes_not_the_first_to_end():
    """A spare environment replays member 0; the replay is short and lucky and ends before
    member 0's first episode, which scores little. Member 0's fitness is its first episode:
    a short replay ending first does not stand in for a long one still under way, and members
    are ranked over as many episodes each."""
    cfg = small(population=2, truncation=1, elite_candidates=1, elite_episodes=1)
    ga = GeneticAlgorithm(MLP(4, 2, (8,)), cfg, torch.device("cpu"))
    first = list(ga.generation.members)
    script = Script(ga)
    assert [ga.playing[e] for e in range(3)] == [(1, 0, 0), (1, 1, 0), (1, 0, 1)]
    script.end(2, 100.0)  # member 0's replay: short and lucky
    script.end(1, 5.0)  # member 1's only episode
    assert ga.updates == 0  # member 0's first episode is still under way: not yet ranked
    script.end(0, 1.0)
    assert ga.updates == 1
    assert ga.generation.candidates == [first[1]]
    assert ga.figures()["best_score"] == 5.0
    assert ga.figures()["mean_score"] == 3.0  # one episode each: (1 + 5) / 2


def test_a_resumed_search_goes_on_as_if_never_stopped_and_loses_no_finished_episode():
    cfg = small()
    whole = GeneticAlgorithm(MLP(4, 2, (8,)), cfg, torch.device("cpu"))
    Script(whole).until_generation(3)

    stopped = GeneticAlgorithm(MLP(4, 2, (8,)), cfg, torch.device("cpu"))
    script = Script(stopped)
    script.until_generation(1)
    for _ in range(4):  # mid-generation: some members scored, some under way
        script.episode()
    scored = episodes_in(stopped)
    assert 0 < sum(map(len, scored)) < 6 + 2 * 2
    buffer = io.BytesIO()
    torch.save(stopped.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)  # what checkpoints load: plain data only
    resumed = GeneticAlgorithm(
        MLP(4, 2, (8,)), with_values(cfg, {"env.seed": 99}), torch.device("cpu")
    )
    resumed.load_state_dict(state)
    assert episodes_in(resumed) == scored  # nothing finished played again
    Script(resumed).until_generation(3)
    assert resumed.generation.members == whole.generation.members
    assert resumed.elite == whole.elite
    assert torch.equal(flat_parameters(resumed.q), flat_parameters(whole.q))
    # The parents came back from the seeds alone: the checkpoint holds no member's weights.
    assert state["ga"]["members"] and all(
        not isinstance(v, torch.Tensor) for k, v in state["ga"].items()
    )


def test_a_checkpoint_holds_seeds_a_few_bytes_per_member_per_generation():
    ga = GeneticAlgorithm(NatureCNN(4, 6), small(), torch.device("cpu"))
    Script(ga).until_generation(2)
    seeds = sum(len(m) for m in ga.state_dict()["ga"]["members"])
    assert seeds <= 6 * 3  # at most one seed per generation and member
    assert max(max(m) for m in ga.generation.members if m) < 2**31  # int32 seeds


def test_cartpole_is_learned_to_500_by_evolution_alone(cli, tmp_path):
    run = tmp_path / "ga"
    args = ["--env", "CartPole-v1", "--set", "agent.algo=ga", "--run-dir", run]
    args += ["--set", "eval.episodes=10", "--set", "eval.every_steps=20000", "--quiet"]
    r = cli("train", *args, "--steps", "200000")
    assert r.code == 0, r.err[-3000:]
    assert "a population of 128" in r.err  # the vector preset
    rows = (run / "eval.csv").read_text().splitlines()
    header = rows[0].split(",")
    returns = [float(row.split(",")[header.index("return_mean")]) for row in rows[1:]]
    assert max(returns) == 500.0, returns  # greedy, over 10 episodes
    metrics = (run / "metrics.csv").read_text().splitlines()
    assert metrics[0].endswith("generation,elite_score,best_score,mean_score")
    status = json.loads((run / "status.json").read_text())
    assert status["figures"]["generation"] >= 2 and status["figures"]["elite_score"] > 100
    r = cli("status", "--run-dir", run)
    assert "learner: generation" in r.out, r.out
    pytest.importorskip("prometheus_client")
    from edgerl.serve.exporter import RunsCollector, metrics_text
    from edgerl.serve.runs import RunFiles

    scraped = metrics_text(RunsCollector(RunFiles([tmp_path]), lambda: 0)).decode()
    elite = status["figures"]["elite_score"]
    assert f'edgerl_learner_figure{{name="elite_score",run="ga"}} {elite}' in scraped, scraped
    # It resumes from its checkpoint (the search's seeds) and goes on.
    r = cli("train", *args, "--steps", "220000")
    assert r.code == 0 and "step 220,000/220,000" in r.err, r.err[-3000:]
    from tests.test_adding_a_learner import plays_and_exports

    plays_and_exports(cli, run)


def test_an_atari_game_is_scored_in_game_points_not_clipped_rewards(cli, tmp_path):
    """Fitness is the game's score: SpaceInvaders pays 5 to 30 points an alien, which learning's
    clipping would make 1. The members' Nature CNNs run in one batched call per step."""
    from edgerl.files.checkpoint import load
    from edgerl.policies import newest_checkpoint

    run = tmp_path / "si"
    args = ["--env", "ALE/SpaceInvaders-v5", "--set", "agent.algo=ga", "--run-dir", run]
    args += ["--set", "env.num_envs=4", "--set", "env.max_episode_frames=1200"]
    args += ["--set", "ga.population=6", "--set", "ga.elite_candidates=2"]
    args += ["--set", "ga.elite_episodes=1", "--set", "eval.every_steps=0"]
    args += ["--set", "display.enabled=false", "--quiet"]
    r = cli("train", *args, "--steps", "4000")
    assert r.code == 0, r.err[-3000:]
    state = load(newest_checkpoint(run)).learner["ga"]
    lines = (run / "episodes.csv").read_text().splitlines()
    returns = {float(line.split(",")[3]) for line in lines[1:]}
    # The scores of the generation under way (NaN: an episode under way), and the elite's (its
    # one candidate episode).
    fitness = {s for r in state["scores"] + state["trials"] for s in r if s == s}
    if np.isfinite(elite := state["figures"]["elite"]):
        fitness.add(elite)
    assert fitness and fitness <= returns  # each score is an episode's return in game points
    # In game points (5 to 30 an alien); clipped rewards would sum to the aliens hit.
    assert max(fitness) > 0 and all(f % 5 == 0 for f in fitness), fitness


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_on_a_gpu_the_batched_call_matches_one_member_at_a_time_for_any_rows():
    net = NatureCNN(4, 18)
    device = torch.device("cuda")
    population = Population(net, num_envs=8, device=device)
    genomes = Genomes(net, sigma=0.01)
    for env in range(8):
        population.assign(env, genomes.weights((200 + env,)).to(device))
    obs = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8, device=device)
    with torch.no_grad():
        for envs in (torch.arange(8), torch.tensor([5, 1, 6])):
            envs = envs.to(device)
            rows = obs[: len(envs)]
            torch.testing.assert_close(
                population(rows, envs), population.forward_each(rows, envs), rtol=1e-4, atol=1e-4
            )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_a_search_on_a_gpu_trains_resumes_and_plays(cli, tmp_path):
    run = tmp_path / "ga-gpu"
    args = ["--env", "ALE/SpaceInvaders-v5", "--set", "agent.algo=ga", "--run-dir", run]
    args += ["--set", "env.num_envs=16", "--set", "env.max_episode_frames=1200"]
    args += ["--set", "ga.population=20", "--set", "ga.elite_candidates=4"]
    args += ["--set", "ga.elite_episodes=2", "--set", "perf.device=cuda"]
    args += ["--set", "eval.every_steps=6000", "--quiet"]
    r = cli("train", *args, "--steps", "12000")
    assert r.code == 0 and "cuda" in r.err, r.err[-3000:]
    # A generation: 20 members and 8 candidates' episodes of at most 300 steps on 16
    # environments, about 15,000 steps.
    r = cli("train", *args, "--steps", "24000")
    assert r.code == 0 and "step 24,000/24,000" in r.err, r.err[-3000:]
    status = json.loads((run / "status.json").read_text())
    assert status["figures"]["generation"] >= 1, status["figures"]


def test_autotune_is_refused_for_it_and_doctor_deep_says_what_it_skips(cli, tmp_path):
    args = ["--env", "CartPole-v1", "--set", "agent.algo=ga"]
    r = cli("train", *args, "--set", "perf.autotune=true", "--run-dir", tmp_path / "x")
    assert r.code == 2 and "perf.autotune" in r.err and "Traceback" not in r.err, r.err
    r = cli("doctor", "--deep", "--json", "--set", "agent.algo=ga", "--set", "env.id=CartPole-v1")
    checks = {c["name"]: c for c in json.loads(r.out)["checks"]}
    assert checks["learner"]["status"] == "skip", checks["learner"]
    assert not [c for c in checks.values() if c["status"] == "fail"], checks
