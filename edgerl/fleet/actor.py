"""One actor of the fleet: a vector env and a copy of the policy, in a Ray actor process on any
node, collecting batches of steps when the learner asks.

:class:`RemoteActor` is a plain class (the transport makes it a Ray actor with the resources the
config asks for), so it runs in a test or a benchmark without Ray too. Its environments step in
lockstep (ALE's async mode is for a learner beside them); it acts with one batched forward pass on
its device (CPU, or the node's GPU with ``fleet.gpus_per_actor``) through the learner's acting
policy (the same :class:`~edgerl.run.actor.Actor` as the learner's own environments), each
environment exploring at its own rate, and sends only each observation's newest frame: the learner's
replay rebuilds the stacks.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import warnings
from typing import Any

import numpy as np

from edgerl.run.transport import Chunk

NO_ENVS = np.zeros(0, dtype=np.int64)


class RemoteActor:
    """``config`` and ``spec`` are the learner's (``Config.to_dict``, ``EnvSpec.to_dict``): the
    actor builds the same network and the same environments, ``env.num_envs`` of them, seeded
    from ``seed``. Raises what building them raises (an unknown game on this node, say)."""

    def __init__(self, config: dict[str, Any], spec: dict[str, Any], seed: int) -> None:
        import torch

        from edgerl.config import from_dict
        from edgerl.envs import EnvSpec, make_env
        from edgerl.learners.factory import remote_acting_policy
        from edgerl.run.actor import Actor, ActorWeights

        cfg = from_dict(config, "the learner's config")
        self.spec = EnvSpec.from_dict(spec)
        self.frames = self.spec.has_frames
        use_gpu = cfg.fleet.gpus_per_actor > 0 and torch.cuda.is_available()
        self.device = torch.device("cuda" if use_gpu else "cpu")
        # Ray gives an actor as many threads as CPUs it reserved; a small forward pass needs one.
        torch.set_num_threads(max(1, int(cfg.fleet.cpus_per_actor)))
        weighted, policy = remote_acting_policy(cfg, self.spec)
        self.net = policy.net.to(self.device).eval().requires_grad_(False)
        self.weighted = weighted.to(self.device)  # the learner's weights load into it
        self.env = make_env(actor_env_config(cfg, self.device), self.spec)
        self.num_envs = self.env.num_envs
        self.rng = np.random.default_rng(seed)
        s = self.spec
        self.actor = Actor(
            ActorWeights(self.net, False),
            policy,
            self.num_envs,
            self.rng,
            s.obs_shape,
            s.obs_dtype,
            use_graph=False,
        )
        self.obs = self.env.reset(seed=seed)
        self.started = True  # the next batch starts with the first observations
        self.version = -1  # the learner's update count of the weights held
        self.steps = 0
        self.busy_s = 0.0

    def where(self) -> dict[str, Any]:
        """Where this actor runs: Ray's node id, the host name, the node's address, the pid."""
        return where_am_i()

    def set_weights(self, weights: dict[str, np.ndarray], version: int) -> None:
        """Act with ``weights`` (numpy arrays by the policy network's state names) from now."""
        import torch

        with warnings.catch_warnings():
            # The arrays are the object store's, read-only; load_state_dict only reads them.
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            state = {k: torch.from_numpy(np.asarray(v)) for k, v in weights.items()}
            self.weighted.load_state_dict(state)
        self.version = version

    def collect(
        self,
        steps: int,
        epsilons: np.ndarray,
        weights: dict[str, np.ndarray] | None = None,
        version: int = -1,
    ) -> Chunk:
        """Step every environment ``steps`` times, environment ``i`` exploring at
        ``epsilons[i]``; ``weights`` (when given) replace the policy's first. Returns the batch,
        its actor and environment ids left for the transport to fill in."""
        started = time.perf_counter()
        if weights is not None:
            self.set_weights(weights, version)
        n, item = self.num_envs, self._item
        first = item(self.obs).copy() if self.started else None
        self.started = False
        items = np.empty((steps, n, *self.spec.item_shape), dtype=self.spec.obs_dtype)
        s = self.spec  # action ids, or a continuous game's float32 numbers
        actions = np.empty((steps, n, *s.action_shape), np.float32 if s.continuous else np.int64)
        rewards = np.empty((steps, n), dtype=np.float32)
        terminated = np.empty((steps, n), dtype=bool)
        truncated = np.empty((steps, n), dtype=bool)
        finals = []
        for t in range(steps):
            actions[t] = self.act(self.obs, epsilons)
            result = self.env.step(actions[t])
            items[t] = item(result.obs)
            rewards[t], terminated[t], truncated[t] = (
                result.rewards,
                result.terminated,
                result.truncated,
            )
            done = result.terminated | result.truncated
            if done.any():
                assert result.final_obs is not None
                finals.append(item(result.final_obs)[done])
            self.obs = result.obs
        final = np.concatenate(finals) if finals else items[:0, 0]
        self.steps += steps * n
        self.busy_s += time.perf_counter() - started
        return Chunk(
            -1, NO_ENVS, first, items, actions, rewards, terminated, truncated, final, self.version
        )

    def act(self, obs: np.ndarray, epsilons: np.ndarray) -> np.ndarray:
        """The learner's policy's actions, environment ``i`` exploring at ``epsilons[i]``
        (fully before the first weights arrive: no forward pass then)."""
        if self.version < 0:
            epsilons = np.ones(self.num_envs)
        return self.actor.act(obs, epsilons)[0]

    def _item(self, obs: np.ndarray) -> np.ndarray:
        """What the replay keeps of each observation: the newest frame, or the vector."""
        return obs[:, -1] if self.frames else obs

    def close(self) -> None:
        """Close the environments."""
        self.env.close()


def where_am_i() -> dict[str, Any]:
    """Where the calling Ray actor runs: Ray's node id, the host name, the node's address, the
    pid."""
    import ray

    context = ray.get_runtime_context()
    return {
        "node": context.get_node_id(),
        "host": socket.gethostname(),
        "ip": ray.util.get_node_ip_address(),
        "pid": os.getpid(),
    }


def actor_env_config(cfg: Any, device: Any) -> Any:
    """The learner's ``[env]`` as an actor on another board steps it: its environments in
    lockstep (ALE's async mode is for a learner beside them), its threads pinned by this
    board's CPUs and GPU (``env.pin_threads`` auto, unless the learner's config set it)."""
    from edgerl.hw.device import resolve_pin_threads

    pin = resolve_pin_threads(cfg.env.pin_threads, device)
    return dataclasses.replace(cfg.env, batch_size=0, pin_threads=pin)
