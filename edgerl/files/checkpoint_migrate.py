"""Checkpoint payloads of older edgerl, brought up to the payload format this edgerl writes.

Each step from payload format N to N+1 is one function in :data:`MIGRATIONS`, taking the payload
dict of format N and returning one of format N+1 (new dicts; the tensors are shared, not copied).
A change to :class:`edgerl.files.checkpoint.Checkpoint` that older files cannot simply read raises
:data:`PAYLOAD_VERSION` and adds the function from the previous format here.

Formats:

1. edgerl 0.1 before typed checkpoints: a plain dict with no format number and no learner kind.
2. ``payload_version`` and ``kind`` (the learner's registry name) added.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgerl import __version__
from edgerl.errors import CheckpointError

PAYLOAD_VERSION = 2  # the payload format this edgerl writes
Payload = dict[str, Any]


class CheckpointTooNewError(CheckpointError):
    """A checkpoint in a payload format newer than this edgerl reads."""


# The learners a checkpoint of format 1 can hold (a file format's history, which files/ keeps:
# config/ sits above it), the first the one every run trained that named none.
FORMAT_1_LEARNERS = ("dqn", "pqn")


def _v1_to_v2(payload: Payload) -> Payload:
    """Format 1 named no learner kind: runs before PQN were DQN, and a PQN run says so in its
    config (``agent.algo``)."""
    config = payload.get("config")
    agent = config.get("agent") if isinstance(config, dict) else None
    algo = agent.get("algo") if isinstance(agent, dict) else None
    kind = algo if algo in FORMAT_1_LEARNERS else FORMAT_1_LEARNERS[0]
    return {**payload, "payload_version": 2, "kind": kind}


# payload format N -> the function that turns it into format N+1
MIGRATIONS: dict[int, Callable[[Payload], Payload]] = {
    1: _v1_to_v2,
}


def payload_version(payload: Payload, name: str) -> int:
    """The payload format of ``payload`` (1 when it names none); raises CheckpointError when the
    number is not one."""
    version = payload.get("payload_version", 1)
    if type(version) is not int or version < 1:
        raise CheckpointError(
            f"checkpoint {name} has a damaged payload format number ({version!r}); was it written "
            "by edgerl?"
        )
    return version


def migrate(payload: Payload, name: str) -> Payload:
    """``payload`` in format :data:`PAYLOAD_VERSION`, through each step from its own format.

    Raises CheckpointTooNewError when it was written in a newer format (by a newer edgerl), and
    CheckpointError when its format number is damaged.
    """
    version = payload_version(payload, name)
    if version > PAYLOAD_VERSION:
        written_by = payload.get("edgerl_version")
        by = f" ({written_by})" if isinstance(written_by, str) else ""
        raise CheckpointTooNewError(
            f"checkpoint {name} was written by a newer edgerl{by} in payload format {version}, "
            f"and this edgerl {__version__} reads formats up to {PAYLOAD_VERSION}; upgrade edgerl "
            "to use it"
        )
    while version < PAYLOAD_VERSION:
        payload = MIGRATIONS[version](payload)
        version += 1
    return payload
