"""The training loop when the actors are elsewhere (``fleet.actors``): their batches go into the
learner's memory, the learning they owe is made, and weights and exploration rates go back. (A
population learner's actors play its members instead: :func:`run_members`.)

**The replay ratio stays exact.** The run's step counts the transitions received and written;
after each batch the pipeline makes exactly the learning the learner owes at that step
(:meth:`~edgerl.learners.Learner.owed`), whatever arrived when and from however many actors. An
actor asks for nothing: the transport asks each one for a few batches at a time
(``fleet.max_inflight``), so a learner that falls behind slows the actors instead of queueing
their steps.

**The replay is written as a local actor writes it.** A batch's first items (its actor started
or started again) begin its environments' rings (``add_first``); each of its steps is one
``add`` of the actor's rows with their environment ids, the newest frame of each observation
given as a stack of one (the replay keeps only that frame and rebuilds stacks itself). A batch in
flight when its actor was lost never arrives, so nothing half-written reaches the replay: the
environment's newest slot is then an observation whose step never came, like an episode's final
observation (no transition is drawn from it; an n-step window stops there, as at a truncation).

**Weights** go out as numpy arrays every ``fleet.weights_every`` updates, taken between updates;
a batch acted with weights at most that many updates old plus what was learned while it was in
flight (the status shows the largest lag seen).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from edgerl.config.learners import RemoteActors, learner_info
from edgerl.envs import Step, shown_action
from edgerl.learners.shared import epsilons_at
from edgerl.report.hooks import TICK_EVERY_S
from edgerl.run.acting import ActingRun
from edgerl.run.transport import Chunk, Transport, apex_epsilons

log = logging.getLogger(__name__)


def run_remote(run: ActingRun, transport: Transport, total: int) -> None:
    """Learn from ``transport``'s actors until ``total`` steps or a stop request."""
    if transport.plays is RemoteActors.MEMBERS:
        run_members(run, transport, total)
        return
    learner, learning, fleet = run.learner, run.learning, run.cfg.fleet
    assert learning is not None
    transport.start(weights_of(run), learner.updates, seed=run.cfg.env.seed + run.step)
    sent = learner.updates
    apex = apex_epsilons(transport.num_envs, fleet.apex_epsilon, fleet.apex_alpha)
    while run.step < total and not run.stop_requested:
        transport.set_exploration(exploration(run, apex))
        for chunk in transport.receive(TICK_EVERY_S):
            write_chunk(run, chunk, total)
            show(run, chunk)
            learning.after_step(run.step)
            if run.step >= total or run.stop_requested:
                break
        if learner.updates - sent >= fleet.weights_every:
            transport.publish(weights_of(run), learner.updates)
            sent = learner.updates
        run.tick()


def run_members(run: ActingRun, fleet: Any, total: int) -> None:
    """A population learner's loop (``fleet``: :class:`~edgerl.fleet.member_fleet.MemberFleet`):
    the actors take the learner's jobs (a member's seeds each) and send back each episode's
    score and length, which the fleet settles with the learner (a generation may end inside);
    the run counts every env step the actors took, their idle environments' too."""
    fleet.start_members(run.learner, seed=run.cfg.env.seed + run.step)
    while run.step < total and not run.stop_requested:
        for played in fleet.receive_members(TICK_EVERY_S):
            run.record_episodes(played.scores, played.lengths, played.envs, played.steps)
        run.tick()


def exploration(run: ActingRun, apex: np.ndarray) -> np.ndarray:
    """Each environment's exploration rate now: the learner's schedule (1 while the replay
    fills), then Ape-X's fixed rates where ``fleet.exploration = "apex"``. A learner that does
    not explore by epsilon (SAC: its policy's own noise) gives every environment its own rate,
    1 while the replay fills and 0 after, whatever ``fleet.exploration`` says."""
    if not learner_info(run.cfg.agent.algo).explores_by_epsilon:
        return np.full(len(apex), run.learner.epsilon(run.step))
    fixed = apex if run.cfg.fleet.exploration == "apex" else None
    return epsilons_at(run.cfg.agent, run.step, run.learner.learn_from[0], len(apex), fixed)


def weights_of(run: ActingRun) -> dict[str, np.ndarray]:
    """The policy network's weights as numpy arrays (CPU copies), taken between updates."""
    assert run.learning is not None
    with run.learning.paused():
        state = run.learner.q.state_dict()
        return {k: v.detach().to("cpu").contiguous().numpy().copy() for k, v in state.items()}


def write_chunk(run: ActingRun, chunk: Chunk, total: int) -> None:
    """Write ``chunk`` into the run's memory and episodes, step by step, stopping at ``total``
    steps (the rest of the batch is dropped: the run ends there)."""
    envs = chunk.envs
    if chunk.first is not None:
        run.memory.add_first(as_obs(run, chunk.first), envs=envs)
        run.episode_tally.restart(envs)
    at = 0  # the next of final_items
    for t in range(len(chunk.actions)):
        if run.step >= total:
            break
        done = chunk.terminated[t] | chunk.truncated[t]
        final = None
        ended = int(np.count_nonzero(done))
        if ended:
            final = np.zeros_like(chunk.items[t])
            final[done] = chunk.final_items[at : at + ended]
            at += ended
            final = as_obs(run, final)
        step = Step(
            as_obs(run, chunk.items[t]),
            chunk.rewards[t],
            chunk.terminated[t],
            chunk.truncated[t],
            final,
            envs,
        )
        run.record_step(chunk.actions[t], step, envs)


def show(run: ActingRun, chunk: Chunk) -> None:
    """Publish the shown environment's frames for `edgerl view` (the first environment of the
    first actor, each step when due, with its episode's return as of the batch's end)."""
    if chunk.actor != 0 or run.display is None or not run.spec.has_frames:
        return
    epsilon = run.learner.epsilon(run.step)
    for t in range(len(chunk.actions)):
        if run.display.due():
            action = shown_action(run.spec, chunk.actions[t][0])
            run.show_frame(chunk.items[t][:1], action, None, run.step, epsilon)


def as_obs(run: ActingRun, items: np.ndarray) -> np.ndarray:
    """Items as the observations the memory takes: a frame as a stack of one (the replay keeps
    an observation's newest frame), a vector as it is."""
    return items[:, None] if run.spec.has_frames else items
