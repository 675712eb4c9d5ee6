"""ALE's threads as the training loop meets them: whether its host work overlaps emulation, and
ALE's async mode (``env.batch_size`` below ``env.num_envs``).

Overlap: the loop can start a step and then do the host work of the one before while ALE's
threads emulate. That pays with a GPU learner (its updates run meanwhile) or a core to spare;
where ALE's threads take every core it only takes CPU from them (measured on 2 cores, 8 Pong
environments, 2 threads: 60 us of work per step before sending, 3,373-3,727 steps/s; the same
work overlapped, 2,909-3,320), so there it runs before the next step starts.

Each ``recv()`` returns the first environments to finish, named by ``Step.env_ids``. Right after
the reset some of those rows are an environment's first observation, not a step: they start its
ring in the replay and count no env step. :class:`Batches` keeps track of which environments have
been seen and splits a batch into the two kinds.
"""

from __future__ import annotations

import numpy as np
import torch

from edgerl.config import EnvConfig
from edgerl.envs import Step, ale_game
from edgerl.hw.cpus import usable_cpus


def overlaps_emulation(env: EnvConfig, frames: bool, device: torch.device) -> bool:
    """Whether the loop's host work should overlap emulation (see the module docstring)."""
    if not frames or ale_game(env.id) is None:
        return False  # gymnasium's environments step in the loop's own thread
    if device.type == "cuda":
        return True
    cpus = usable_cpus()
    return cpus > (env.threads or min(env.num_envs, cpus))


def row_of(ids: np.ndarray, env: int) -> int | None:
    """The row of environment ``env`` in a batch of ``ids`` (None when it is not there)."""
    rows = np.flatnonzero(ids == env)
    return int(rows[0]) if len(rows) else None


class Batches:
    """Which environments have shown their first observation since the reset."""

    def __init__(self, num_envs: int, reset_ids: np.ndarray | None) -> None:
        self.seen = np.zeros(num_envs, dtype=bool)
        self.seen[slice(None) if reset_ids is None else reset_ids] = True

    def steps_in(self, result: Step) -> int:
        """Env steps ``result`` holds: its rows, less the first observations."""
        if result.env_ids is None:
            return len(result.rewards)
        return int(np.count_nonzero(self.seen[result.env_ids]))

    def split(
        self, result: Step, actions: np.ndarray
    ) -> tuple[tuple[np.ndarray, np.ndarray] | None, Step | None, np.ndarray]:
        """``(first, stepped, stepped_actions)``: the first observations and their env ids (None
        when there are none), the rows that are steps (None when none is), and the action that
        led to each of those (``actions`` has one per row of ``result``)."""
        ids = result.env_ids
        assert ids is not None
        first = ~self.seen[ids]
        if not first.any():
            return None, result, actions
        self.seen[ids[first]] = True
        stepped = ~first
        if not stepped.any():
            return (result.obs[first], ids[first]), None, actions[:0]
        final = result.final_obs[stepped] if result.final_obs is not None else None
        rows = Step(*(a[stepped] for a in result[:4]), final, ids[stepped])
        return (result.obs[first], ids[first]), rows, actions[stepped]
