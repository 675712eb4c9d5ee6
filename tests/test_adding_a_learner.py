"""A learner added as docs/development.md says (one module, one registry entry) works with every
command: it trains, keeps its best policy, resumes, plays and exports, and nothing outside the
registry names it."""

from __future__ import annotations

import json

import pytest

from edgerl.config.learners import LEARNERS, LearnerInfo, Schedule

TOY = ["--env", "CartPole-v1", "--set", "agent.algo=toy", "--set", "env.num_envs=4"]
SMALL = ["--set", "pqn.rollout_steps=16", "--set", "eval.every_steps=1000"]


def toy_info(module: str, memory: str) -> LearnerInfo:
    """The registry line of a toy learner: its module, its memory's kind, learning in the loop."""
    return LearnerInfo(module, memory=memory, schedule=Schedule.IN_LOOP)


def plays_and_exports(cli, run) -> None:  # type: ignore[no-untyped-def]
    """The run's policy plays an episode and exports to ONNX (where onnx is installed)."""
    r = cli("play", "--run-dir", run, "--episodes", "1", "--json")
    assert r.code == 0 and '"episodes"' in r.out, r.err
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    r = cli("export", "--run-dir", run, "--onnx")
    assert r.code == 0 and ".onnx" in r.out, r.err[-3000:]


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setitem(
        LEARNERS,
        "toy",
        toy_info("tests.toy_learner", "rollout"),
    )


def test_a_learner_registered_in_one_line_trains_resumes_plays_and_exports(
    toy_registered, cli, tmp_path
):
    run = tmp_path / "toy"
    r = cli("train", *TOY, *SMALL, "--run-dir", run, "--steps", "2000", "--quiet")
    assert r.code == 0, r.err[-3000:]
    assert "one-step Q" in r.err  # the factory built it: the log says how it learns
    assert (run / "checkpoints" / "best.ckpt").is_file()  # evaluated, its best kept
    r = cli("train", *TOY, *SMALL, "--run-dir", run, "--steps", "3000", "--quiet")
    assert r.code == 0 and "step 3,000/3,000" in r.err, r.err[-3000:]
    plays_and_exports(cli, run)


def test_the_bench_measures_a_registered_learner(toy_registered, cli):
    """`edgerl bench` times the configured learner alone and in the whole loop: the toy's own
    update, not another learner's (DQN's update modes are labelled as DQN's)."""
    r = cli(
        "bench", *TOY, *SMALL, "--seconds", "1", "--envs", "1", "--actor-envs", "",
        "--loop-envs", "4",
    )  # fmt: skip
    assert r.code == 0, r.err[-3000:]
    alone = next(line for line in r.out.splitlines() if line.startswith("learner alone:"))
    assert "one-step Q" in alone and "updates/s" in alone
    assert "loop sync" in r.out


def test_an_unregistered_learner_is_refused_with_the_ones_there_are(cli, tmp_path):
    r = cli("train", *TOY, "--run-dir", tmp_path / "x", "--steps", "100")
    assert r.code == 2 and "agent.algo" in r.err and "dqn, pqn, ppo, sac, ga" in r.err, r.err


def test_a_new_kind_of_memory_is_a_class_and_a_registry_line(monkeypatch, cli, tmp_path):
    """A learner's memory comes from its kind (edgerl/memories/kinds.py): a kind registered in
    one line is planned, checked and built by everything that trains, and nothing else asks
    which kind it is."""
    from edgerl.memories.kinds import MEMORY_KINDS, RolloutKind

    built: list[int] = []

    class CountingRollouts(RolloutKind):
        def build(self, cfg, spec, device, available, num_envs):  # type: ignore[no-untyped-def]
            built.append(num_envs)
            return super().build(cfg, spec, device, available, num_envs)

        def fix(self, cfg, plan):  # type: ignore[no-untyped-def]
            return "make the counting rollout smaller"

    monkeypatch.setitem(MEMORY_KINDS, "counting", CountingRollouts())
    monkeypatch.setitem(
        LEARNERS,
        "toy",
        toy_info("tests.toy_learner", "counting"),
    )
    r = cli("train", *TOY, *SMALL, "--run-dir", tmp_path / "toy", "--steps", "500", "--quiet")
    assert r.code == 0, r.err[-3000:]
    assert built == [4]  # the trainer's memory, for its 4 environments
    r = cli("doctor", "--json", "--set", "agent.algo=toy", "--set", "env.id=CartPole-v1")
    checks = {c["name"]: c for c in json.loads(r.out)["checks"]}
    assert "a rollout of 32 steps" in checks["replay memory"]["found"]  # planned by the kind


def test_a_population_learner_acts_per_environment_and_learns_from_finished_episodes(
    monkeypatch, cli, tmp_path
):
    """The seams a genetic algorithm needs (tests/toy_population.py): its acting network takes
    each row's environment, so environments act with different members in one forward pass; it
    is owed work when its memory holds finished episodes, which only it and its memory (a kind
    registered in one line) know about; the best member is the policy that resumes, plays and
    exports."""
    import torch

    from edgerl.files.checkpoint import load
    from edgerl.memories.kinds import MEMORY_KINDS
    from edgerl.policies import newest_checkpoint
    from tests import toy_population

    monkeypatch.setitem(MEMORY_KINDS, "episodes", toy_population.EpisodesKind())
    monkeypatch.setitem(
        LEARNERS,
        "toy-pop",
        toy_info("tests.toy_population", "episodes"),
    )
    toy_population.FORWARDS.clear()
    run = tmp_path / "pop"
    args = ["--env", "CartPole-v1", "--set", "agent.algo=toy-pop", "--set", "env.num_envs=4"]
    args += ["--set", "eval.every_steps=1000", "--run-dir", run, "--quiet"]
    r = cli("train", *args, "--steps", "3000")
    assert r.code == 0, r.err[-3000:]
    assert "a population of 6" in r.err
    # Every acting pass had all four environments, several members among them.
    assert toy_population.FORWARDS and all(len(f) == 4 for f in toy_population.FORWARDS)
    assert any(len(set(f)) > 1 for f in toy_population.FORWARDS)
    assert len({m for f in toy_population.FORWARDS for m in f}) == toy_population.MEMBERS
    first = load(newest_checkpoint(run))
    generations = first.learner["updates"]
    assert generations >= 2  # each member played an episode, more than once
    assert torch.equal(  # the policy is the best member, which the next generation starts from
        first.learner["q"]["net.0.weight"], first.learner["population"]["members.0.net.0.weight"]
    )
    r = cli("train", *args, "--steps", "4000")
    assert r.code == 0 and "step 4,000/4,000" in r.err, r.err[-3000:]
    assert load(newest_checkpoint(run)).learner["updates"] > generations
    plays_and_exports(cli, run)
