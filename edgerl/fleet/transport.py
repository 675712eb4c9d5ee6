"""The fleet's transport: ``fleet.actors`` Ray actors (:class:`~edgerl.fleet.actor.RemoteActor`)
asked for batches by direct actor-method calls, each answer an object the learner gets.

**Backpressure.** The learner asks each actor for ``fleet.max_inflight`` batches and asks again
only for each batch it received, so an actor never collects more than that ahead of the learner
and nothing queues anywhere else. Ray runs one actor's calls in order, and the learner waits
only on each actor's oldest call, so an actor's batches arrive in the order they were collected.

**Weights** go to the object store once per :meth:`RayFleet.publish` (``ray.put``: numpy arrays,
read without a copy on each node) and ride along with the next call to each actor that has
older ones.

**Faults.** A call that fails (the actor's process or its node died, or its code raised) loses
that actor: it is named in the log with its node and why, its calls in flight are dropped
(nothing of them reached the replay) and training goes on with the others. A lost actor is
started again after a pause (longer after each failed start): Ray places it wherever the cluster
has room, and it waits there until a node with room joins (a node that comes back rejoins). When
no actor has ever delivered and every one has failed to start twice, the fleet cannot run at
all: FleetError, with the first actor's reason.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgerl.config import Config
from edgerl.config.fleet import parse_resource
from edgerl.config.learners import RemoteActors
from edgerl.envs import EnvSpec
from edgerl.errors import FleetError
from edgerl.fleet.actor import RemoteActor
from edgerl.fleet.cluster import Cluster, first_line
from edgerl.run.transport import Chunk, chunk_problem
from edgerl.words import plural

log = logging.getLogger(__name__)

RETRY_FIRST_S = 2.0  # a lost actor is started again after this, doubling after failed starts
RETRY_MAX_S = 60.0
WAITING_NOTE_S = 30.0  # an actor not started by then is said to be waiting for room
RATE_WINDOW_S = 10.0  # each actor's steps/s is measured over about this long
MAX_SEED = 2**31 - 1


@dataclass
class Slot:
    """One actor of the fleet through its restarts: its environments keep their replay rows."""

    index: int
    envs: np.ndarray  # the learner's ids of its environments
    handle: Any = None  # the Ray actor now, if any
    where: dict[str, Any] = field(default_factory=dict)  # where it ran last (where())
    where_ref: Any = None  # the ObjectRef of the running instance's where() call
    inflight: deque[Any] = field(default_factory=deque)  # ObjectRefs, oldest first
    state: str = "starting"  # starting, running, lost, restarting (after a loss)
    attempts: int = 0  # starts so far
    failed_starts: int = 0  # starts in a row that never delivered
    delivered: bool = False  # this instance delivered a batch
    damaged: bool = False  # its last loss was a damaged batch (it ran, and lied or broke)
    version: int = -1  # the weights version sent to it
    transitions: int = 0  # received from it, over its instances
    lost: str = ""  # why it was lost, the last time
    retry_at: float = 0.0
    launched_at: float = 0.0
    noted_waiting: bool = False
    rate: tuple[float, int, float] = (0.0, 0, 0.0)  # (window start, transitions then, steps/s)


class RayFleet:
    """The :class:`~edgerl.run.transport.Transport` over Ray; see the module docstring."""

    plays = RemoteActors.STEPS  # what its actors send: batches of steps for the memory
    actor_type: type = RemoteActor

    def __init__(self, cfg: Config, spec: EnvSpec, cluster: Cluster) -> None:
        self.cfg, self.spec, self.cluster = cfg, spec, cluster
        fleet = cfg.fleet
        self.ray = cluster.ray
        self.per_actor = cfg.env.num_envs
        self.num_envs = fleet.actors * self.per_actor
        self.slots = [
            Slot(i, np.arange(i * self.per_actor, (i + 1) * self.per_actor, dtype=np.int64))
            for i in range(fleet.actors)
        ]
        self.epsilons = np.ones(self.num_envs)
        self.version = -1
        self.weights: Any = None  # the ObjectRef of the newest weights
        self.seed = cfg.env.seed
        self.max_lag = 0  # weights versions behind the newest sent, largest seen
        self.received = 0
        self._owner: dict[Any, Slot] = {}  # each ObjectRef in flight -> its slot
        self._config, self._spec = cfg.to_dict(), spec.to_dict()
        if "env.pin_threads" not in cfg.explicit:  # each board decides by its own CPUs and GPU
            self._config["env"]["pin_threads"] = "auto"
        self._actor_class = self.ray.remote(
            num_cpus=fleet.cpus_per_actor,
            num_gpus=fleet.gpus_per_actor,
            resources=parse_resource(fleet.resource) or None,
            max_restarts=0,  # a lost actor is started again here, where it is named
            max_task_retries=0,
        )(self.actor_type)
        self._closed = False

    # -- the transport ---------------------------------------------------------------------

    def start(self, weights: dict[str, np.ndarray], version: int, seed: int) -> None:
        """Start every actor with ``weights``; see :class:`~edgerl.run.transport.Transport`."""
        self.seed = seed
        self.publish(weights, version)
        for slot in self.slots:
            self._launch(slot)
        log.info(
            "fleet: %s of %s each asked for, %s per batch",
            plural(len(self.slots), "remote actor"),
            plural(self.per_actor, "environment"),
            plural(self.cfg.fleet.batch_steps * self.per_actor, "transition"),
        )

    def publish(self, weights: dict[str, np.ndarray], version: int) -> None:
        """Newer weights for the actors' next batches (one copy in the object store)."""
        self.weights, self.version = self.ray.put(weights), version

    def set_exploration(self, epsilons: np.ndarray) -> None:
        """Each environment's exploration rate for the batches asked for from now on."""
        self.epsilons = np.asarray(epsilons, dtype=np.float64)

    def receive(self, timeout_s: float) -> list[Chunk]:
        """Batches that arrived (see :class:`~edgerl.run.transport.Transport`)."""
        chunks = []
        for slot, chunk in self._arrivals(timeout_s):
            steps = self.cfg.fleet.batch_steps
            problem = chunk_problem(chunk, self.spec, steps, self.per_actor, self.version)
            if problem is not None:  # nothing of it reaches the replay; the actor starts anew
                self._lose(slot, DamagedBatchError(problem))
                continue
            self._delivered(slot, chunk.steps)
            self.max_lag = max(self.max_lag, self.version - chunk.version)
            chunks.append(chunk._replace(actor=slot.index, envs=slot.envs))
            self._ask(slot)
        return chunks

    def _arrivals(self, timeout_s: float) -> list[tuple[Slot, Any]]:
        """The answers that arrived, each with its actor's slot, after waiting up to
        ``timeout_s`` for the first; an actor whose call failed is lost (named in the log)."""
        self._restart_lost()
        heads = [slot.inflight[0] for slot in self.slots if slot.inflight]
        if not heads:
            time.sleep(timeout_s)
            return []
        ray = self.ray
        ready, _ = ray.wait(heads, num_returns=1, timeout=timeout_s)
        if ready:
            ready, _ = ray.wait(heads, num_returns=len(heads), timeout=0)
        arrived = []
        for ref in ready:
            slot = self._owner.pop(ref)
            slot.inflight.popleft()
            try:
                arrived.append((slot, ray.get(ref)))
            except Exception as e:  # the actor, its process or its node is gone
                self._lose(slot, e)
        self._note_waiting()
        return arrived

    def status(self) -> dict[str, Any]:
        """JSON-ready state: each actor's, and the fleet's totals."""
        actors = []
        for slot in self.slots:
            where = slot.where
            actors.append(
                {
                    "id": slot.index,
                    "state": slot.state,
                    "node": where.get("ip"),
                    "node_id": where.get("node"),
                    "host": where.get("host"),
                    "pid": where.get("pid"),
                    "transitions": slot.transitions,
                    "sps": round(slot.rate[2], 1),
                    "restarts": max(slot.attempts - 1, 0),
                    "lost": slot.lost or None,
                }
            )
        running = sum(1 for slot in self.slots if slot.state == "running")
        return {
            "actors": actors,
            "running": running,
            "transitions": self.received,
            "weights_lag_max": self.max_lag,
            "address": self.cfg.fleet.address or "local",
        }

    def close(self) -> None:
        """Stop every actor, then leave the cluster (an instance started here stops)."""
        if self._closed:
            return
        self._closed = True
        for slot in self.slots:
            self._kill(slot)
        self._owner.clear()
        self.cluster.close()

    # -- the actors -----------------------------------------------------------------------

    def _launch(self, slot: Slot) -> None:
        """Start ``slot``'s actor (Ray places it where there is room, or it waits there) and
        ask it for its first batches."""
        n = len(self.slots)
        # Distinct seeds for every actor and every start of one (ALE seeds env i with seed + i).
        seed = (self.seed + self.per_actor * (slot.index + n * slot.attempts)) % (
            MAX_SEED - self.per_actor
        )
        slot.attempts += 1
        slot.handle = self._actor_class.remote(self._config, self._spec, seed)
        slot.where_ref = slot.handle.where.remote()
        slot.state = "restarting" if slot.lost else "starting"
        slot.delivered, slot.version = False, -1
        slot.launched_at, slot.noted_waiting = time.monotonic(), False
        self._first_asks(slot)

    def _first_asks(self, slot: Slot) -> None:
        """A new instance's ``fleet.max_inflight`` calls, made at once: Ray runs them when it
        has started (a batch asked of an instance that never starts holds nothing back)."""
        for _ in range(self.cfg.fleet.max_inflight):
            self._ask(slot)

    def _ask(self, slot: Slot) -> None:
        """One more batch of ``slot``'s actor, with the newest weights if it has older ones."""
        fresh = slot.version < self.version
        ref = slot.handle.collect.remote(
            self.cfg.fleet.batch_steps,
            self.epsilons[slot.envs],
            self.weights if fresh else None,
            self.version,
        )
        slot.version = self.version
        slot.inflight.append(ref)
        self._owner[ref] = slot

    def _delivered(self, slot: Slot, steps: int) -> None:
        """Book an answer of ``steps`` env steps from ``slot`` (the first of an instance: it
        runs, and where)."""
        now = time.monotonic()
        if not slot.delivered:
            slot.delivered, slot.failed_starts, slot.state = True, 0, "running"
            try:
                slot.where = self.ray.get(slot.where_ref, timeout=10)
            except Exception:  # where() ran before the batch; its answer is only for show
                slot.where = {}
            how = "rejoined" if slot.attempts > 1 else "running"
            log.info("fleet: actor %d %s on %s", slot.index, how, describe_where(slot.where))
            slot.rate = (now, slot.transitions, slot.rate[2])
        slot.transitions += steps
        self.received += steps
        start, before, _ = slot.rate
        if now - start >= RATE_WINDOW_S:
            slot.rate = (now, slot.transitions, (slot.transitions - before) / (now - start))

    def _lose(self, slot: Slot, error: BaseException) -> None:
        """``slot``'s actor is gone: name it and why, drop what it had in flight, and start it
        again after a pause. Raises FleetError when no actor of the fleet can start at all."""
        why = loss_reason(error)
        started = slot.delivered
        if not started:
            slot.failed_starts += 1
        where = describe_where(slot.where)
        self._kill(slot)
        slot.state, slot.lost = "lost", why
        running = sum(1 for s in self.slots if s.state == "running")
        if started:
            log.warning(
                "fleet: actor %d on %s was lost (%s); training goes on with %s of %d; it "
                "starts again where the cluster has room",
                slot.index,
                where,
                why,
                plural(running, "actor"),
                len(self.slots),
            )
        else:
            log.warning("fleet: actor %d could not start (%s)", slot.index, why)
        pause = min(RETRY_FIRST_S * 2 ** max(slot.failed_starts - 1, 0), RETRY_MAX_S)
        slot.retry_at = time.monotonic() + pause
        slot.damaged = isinstance(error, DamagedBatchError)
        if self.received == 0 and all(s.failed_starts >= 2 for s in self.slots):
            if all(s.damaged for s in self.slots):  # they started, and every answer was refused
                raise FleetError(
                    f"every remote actor sent damaged batches and none was kept (actor 0: "
                    f"{self.slots[0].lost}); training cannot go on with what the nodes send: "
                    "check their edgerl and their machines"
                )
            raise FleetError(
                f"no remote actor could start on the Ray cluster ({self.slots[0].lost}); "
                "every node needs edgerl[fleet] of the same version as the learner, and the "
                "game's ROM"
            )

    def _restart_lost(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.state == "lost" and now >= slot.retry_at:
                self._launch(slot)

    def _note_waiting(self) -> None:
        """Say once per start when an actor has not started for a while (no node has room)."""
        now = time.monotonic()
        for slot in self.slots:
            late = now - slot.launched_at >= WAITING_NOTE_S
            if slot.state in ("starting", "restarting") and late and not slot.noted_waiting:
                slot.noted_waiting = True
                fleet = self.cfg.fleet
                needs = {"CPU": fleet.cpus_per_actor, **parse_resource(fleet.resource)}
                if fleet.gpus_per_actor:
                    needs["GPU"] = fleet.gpus_per_actor
                log.warning(
                    "fleet: actor %d has not started after %.0f s: no node of the cluster has "
                    "%s free yet (it starts when one has)",
                    slot.index,
                    now - slot.launched_at,
                    ", ".join(f"{v:g} {k}" for k, v in needs.items()),
                )

    def _kill(self, slot: Slot) -> None:
        for ref in slot.inflight:
            self._owner.pop(ref, None)
        slot.inflight.clear()
        if slot.handle is not None:
            try:
                self.ray.kill(slot.handle, no_restart=True)
            except Exception:  # already gone with its node
                log.debug("actor %d was gone already", slot.index)
            slot.handle = None


def describe_where(where: dict[str, Any]) -> str:
    """``node 10.0.0.2 (board2), pid 1234``, or what of it is known."""
    if not where:
        return "an unknown node"
    text = f"node {where.get('ip')}"
    if where.get("host"):
        text += f" ({where['host']})"
    return text + (f", pid {where['pid']}" if where.get("pid") else "")


class DamagedBatchError(Exception):
    """An actor delivered a batch that must not reach the replay (see
    :func:`edgerl.run.transport.chunk_problem`)."""


def loss_reason(error: BaseException) -> str:
    """Why an actor call failed, in a few words."""
    if isinstance(error, DamagedBatchError):
        return f"it sent a damaged batch: {error}; none of it was kept"
    text = str(error)
    if "node has died" in text or "node is dead" in text:
        return "its node died"
    if "creation task" in text:
        cause = [line for line in text.splitlines() if "Error" in line]
        return f"it failed to start: {cause[-1].strip() if cause else first_line(error)}"
    if "unexpectedly" in text or "killed" in text:
        return "its process died"
    lines = [line for line in text.splitlines() if line.strip()]
    return f"it failed: {lines[-1].strip() if lines else type(error).__name__}"
