"""The genetic algorithm's remote actors without Ray (fleet/members.py, fleet/member_fleet.py,
the learner's jobs): an actor plays members from their seeds alone and answers in a few bytes,
drops jobs whose generation ended, and a damaged answer is refused. The Ray transport and a lost
actor are tested on a real Ray cluster (test_fleet.py)."""

from __future__ import annotations

import pickle
from collections import deque

import numpy as np
import pytest
import torch

from edgerl.config import build_layers, resolve
from edgerl.envs import probe
from edgerl.fleet.member_fleet import played_problem
from edgerl.fleet.members import MemberActor, Played, pack_genomes, unpack_genomes
from edgerl.learners.factory import policy_network
from edgerl.learners.ga import GeneticAlgorithm
from edgerl.learners.generation import finished


def config(*sets: str):
    base = ["hw.monitor=false", "display.enabled=false", "eval.every_steps=0", "agent.algo=ga"]
    return resolve(
        build_layers(
            None,
            [*base, "fleet.actors=2", "env.num_envs=4", "ga.population=12", *sets],
            {"env.id": "CartPole-v1"},
            use_system=False,
        )
    )


def learner_and_actor(*sets: str) -> tuple[GeneticAlgorithm, MemberActor]:
    cfg = config(*sets)
    spec = probe(cfg.env.id)
    ga = GeneticAlgorithm(policy_network(cfg, spec), cfg, torch.device("cpu"))
    return ga, MemberActor(cfg.to_dict(), spec.to_dict(), seed=5)


def call(ga: GeneticAlgorithm, n: int, wanted: int | None = None) -> tuple:
    """What the fleet sends for ``n`` jobs, answered after ``wanted`` episodes (``n``: all)
    (as MemberFleet._ask does)."""
    jobs = [ga.take() for _ in range(n)]
    tickets = np.array([t for t, _ in jobs], dtype=np.int64)
    version, parents = ga.kept_genomes()
    return (
        tickets,
        *pack_genomes([g for _, g in jobs]),
        ga.token,
        n if wanted is None else wanted,
        (version, *pack_genomes(parents)),
    )  # max_seconds: the actor's default, no limit


def settle_all(ga: GeneticAlgorithm, played: Played) -> None:
    episodes = (played.tickets.tolist(), played.scores.tolist(), played.lengths.tolist())
    for episode in zip(*episodes, strict=True):
        ga.settle(*episode)


def test_genomes_travel_as_four_bytes_a_seed():
    genomes = [(7,), (7, 123456789, 2**31 - 1), (0, 1)]
    seeds, lengths = pack_genomes(genomes)
    assert seeds.dtype == np.int32 and seeds.nbytes == 4 * 6
    assert unpack_genomes(seeds, lengths) == genomes


def test_a_remote_actor_plays_members_from_their_seeds_and_the_learner_scores_them():
    ga, actor = learner_and_actor()
    assert ga.policy is not None  # the loop builds it: no job goes to environments here
    assert not ga.playing
    args = call(ga, 8)
    played = actor.play(*args)
    assert played_problem(played, set(args[0].tolist()), actor.num_envs, 0) is None
    assert len(played.tickets) >= 8 and set(played.tickets.tolist()) <= set(args[0].tolist())
    assert (played.scores == played.lengths).all()  # CartPole: one point per step
    assert played.steps >= played.lengths.sum() and played.steps % actor.num_envs == 0
    # The actor built each member from its seeds alone: the learner's weights, bit for bit.
    for ticket in args[0][:3].tolist():
        genome = ga._genome(ga.playing[ticket][1])
        assert torch.equal(actor.genomes.weights(genome), ga.genomes.weights(genome))
    settle_all(ga, played)
    scored = [r for r in ga.generation.scores if finished(r)]
    assert len(scored) == len(played.tickets) and ga.episodes == len(played.tickets)
    # What crossed: about four bytes a seed out, about twenty back, per member (pickled).
    out = len(pickle.dumps(args, protocol=5)) / 8
    back = len(pickle.dumps(played, protocol=5)) / len(played.tickets)
    assert out < 300 and back < 200, (out, back)


@pytest.mark.parametrize("max_seconds", [float("inf"), 0.0])
def test_no_environment_waits_idle_when_the_fleet_asks_as_it_does(max_seconds):
    """An instance's first call brings a job for each environment and the spare ones, its
    second the spare ones, each later one as many as the last answer gave back, and a call
    returns after as many episodes as the spare jobs (or at its time limit: 0, a single step):
    each call starts with a job waiting for each episode it waits for, and no environment
    steps without a member."""
    ga, actor = learner_and_actor("ga.population=30")
    n, q = actor.num_envs, 1  # 4 environments: a call waits for one episode (MemberFleet.spare)
    # Two calls in flight (fleet.max_inflight): the instance's first two, then one per answer
    # with the jobs that answer gave back; the actor runs them in order.
    refills, answered = deque([n + q, q]), 0
    for _ in range(30 if max_seconds else 400):  # 0: one step a call
        played = actor.play(*call(ga, refills.popleft(), wanted=q), max_seconds)
        if max_seconds:
            assert len(played.tickets) >= q  # the episodes it waited for (more end together)
        settle_all(ga, played)
        refills.append(len(played.tickets) + len(played.dropped))
        answered += len(played.tickets)
        held = len(actor.queue) + int((actor.tickets >= 0).sum())
        assert held + sum(refills) == n + 2 * q  # with the call in flight: n and q twice
    assert actor.idle_steps == 0 and answered > 0


def test_jobs_queued_when_their_generation_ends_are_dropped_unplayed_and_owed_again():
    ga, actor = learner_and_actor("ga.population=6", "ga.elite_episodes=2")
    first = call(ga, 6)  # every member's first episode
    more = call(ga, 8)  # played again: queued on the actor, behind its 4 environments
    played = actor.play(*first)
    settle_all(ga, played)
    assert ga.updates == 1  # every member's first episode is in: the generation ended
    actor.queue.extend(
        zip(more[0].tolist(), [more[3]] * 8, unpack_genomes(more[1], more[2]), strict=True)
    )
    queued = [job[0] for job in actor.queue]
    after = call(ga, 2)
    answer = actor.play(*after)
    assert sorted(answer.dropped.tolist()) == sorted(queued)
    for ticket in answer.dropped.tolist():
        ga.release(ticket)
    assert not set(queued) & set(ga.playing)


def test_a_job_released_by_a_lost_actor_is_the_next_one_handed_out():
    ga, _ = learner_and_actor("ga.population=6")
    taken = [ga.take() for _ in range(6)]  # every member's first episode handed out
    lost_ticket, lost_genome = taken[2]
    ga.release(lost_ticket)
    ticket, genome = ga.take()
    assert genome == lost_genome and ticket not in [t for t, _ in taken]
    ga.settle(lost_ticket, 99.0, 5)  # an answer of the lost actor arriving late counts for none
    assert not any(s == s for r in ga.generation.scores for s in r)  # all still under way
    assert ga.playing[ticket][2] == 0  # the new taker plays the lost one's place: the first


def test_a_slow_boards_first_episode_of_a_member_is_waited_for_not_stood_in_for():
    """Members are ranked over their first episodes: a replay of the slow board's member that
    ends elsewhere first (a short one) does not end the generation in its place."""
    ga, _ = learner_and_actor("ga.population=6")
    taken = [ga.take() for _ in range(6)]  # every member's first episode handed out
    for ticket, _ in taken[:4] + taken[5:]:
        ga.settle(ticket, 10.0, 10)  # all scored but member 4, whose board is slow
    replay, genome = ga.take()
    assert genome == taken[4][1] == ga._genome(ga.playing[replay][1])  # the one behind
    ga.settle(replay, 500.0, 500)
    assert ga.updates == 0  # its first episode is still under way on the slow board
    ga.settle(taken[4][0], 3.0, 3)
    assert ga.updates == 1 and ga.figures()["best_score"] == 10.0  # ranked by the 3, not 500


def good_answer() -> Played:
    return Played(
        np.array([10, 11]), np.array([3.0, 4.0]), np.array([3, 4]), np.array([0, 1]),
        np.array([12]), 16,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda p: {"scores": [1, 2]}, "not the episodes"),
        (lambda p: p._replace(scores=np.array([np.nan, 1.0])), "not finite"),
        (lambda p: p._replace(tickets=np.array([10, 99])), "not given"),
        (lambda p: p._replace(tickets=np.array([10, 10])), "not given"),
        (lambda p: p._replace(dropped=np.array([10])), "not given"),
        (lambda p: p._replace(envs=np.array([0, 4])), "does not have"),
        (lambda p: p._replace(lengths=np.array([0, 4])), "whole numbers of steps"),
        (lambda p: p._replace(scores=np.array([1.0])), "some episodes only"),
        (lambda p: p._replace(tickets=np.array([10.0, 11.0])), "not integers"),
        (lambda p: p._replace(steps=-4), "step count"),
        (lambda p: p._replace(steps=6), "step count"),  # not whole steps of its 4 environments
        (lambda p: p._replace(steps=True), "step count"),
        (lambda p: p._replace(lengths=np.array([3, 9])), "longer than all its steps"),
        (lambda p: p._replace(scores=np.zeros((2, 1))), "one-dimensional"),
        # A lying actor (issue 58): a masked array crashed the learner, scores of 1.7e308 made
        # the generation's mean infinite, 4e30 steps ended the run at once.
        (lambda p: p._replace(scores=np.ma.masked_array([3.0, 4.0], [0, 1])), "one-dimensional"),
        (lambda p: p._replace(scores=np.array([1.7e308, 4.0])), "beyond any game's"),
        (lambda p: p._replace(steps=4 * 10**30), "more than the episodes it was given"),
        (lambda p: p._replace(steps=4 * 501 * 4), "more than the episodes it was given"),
        (lambda p: p._replace(lengths=np.array([3, 501]), steps=4 * 600), "the game allows"),
    ],
)
def test_a_damaged_answer_is_refused_with_what_is_wrong(damage, words):
    outstanding, longest = {10, 11, 12}, 500  # CartPole's cap on an episode
    assert played_problem(good_answer(), outstanding, 4, 0, longest) is None
    assert (
        played_problem(good_answer()._replace(steps=4 * 500 * 4), outstanding, 4, 0, longest)
        is None
    )
    assert words in played_problem(damage(good_answer()), outstanding, 4, 0, longest)
