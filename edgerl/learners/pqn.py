"""The PQN learner: Q(lambda) without a replay memory or a target network (Gallici et al. 2024,
"Simplifying Deep Temporal Difference Learning"; reference code purejaxql, and CleanRL's
``pqn_atari_envpool.py``).

Many environments step together for ``pqn.rollout_steps`` steps (the rollout,
:mod:`edgerl.memories.rollout`); the learner then computes Q(lambda) returns over it with the
current network and makes ``pqn.epochs`` passes of ``pqn.minibatches`` minibatches each: the mean
squared error of Q(s, a) against the return, gradient clipping, RAdam. Then the next rollout starts.
LayerNorm in the network (:mod:`edgerl.learners.nets`) keeps this stable without a target network.
Memory is one rollout: for Pong at 128 environments 114 MiB, against 6.6 GiB for a replay of a
million transitions (a whole training process: 0.97 GiB against 7.0 GiB peak RSS, measured by
``scripts/bench_memory.py``), which makes PQN the learner for boards with little memory.

Where this differs from the reference, and why: truncated episodes bootstrap from their final
observation instead of counting as terminal (edgerl's environments hand that observation out);
the greedy values of the next observations are those the actor computed when it acted on them,
where the weights are still the same (all but the rollout's last step in the plain CPU loop), and
computed at learning time otherwise; and exploration decays over env steps, not updates, like
edgerl's DQN.

On a CUDA GPU (``perf.cuda_graphs``, auto: on) one pass over a rollout, all its minibatches, is
captured as one CUDA graph before training (:func:`prepare`): eagerly, each minibatch update
costs the host hundreds of kernel launches, about 7 ms of Python on the learner's thread (an
H100, 2026-11: 64 updates per rollout at 139 updates/s, the GPU 19% busy), and that thread
shares the GIL with the actor. Replayed, a pass is one launch; the rollout is copied into the
graph's fixed buffers once and each pass's minibatch order into its own.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edgerl.config import AgentConfig, Config, PerfConfig, PQNConfig
from edgerl.envs import EnvSpec
from edgerl.files.checkpoint import POLICY_KEY
from edgerl.hw.device import resolve_amp, resolve_cuda_graphs
from edgerl.learners.acting import EpsilonGreedy
from edgerl.learners.fast_update import FastUpdate
from edgerl.learners.kinds import Basics
from edgerl.learners.nets import NatureCNN, num_actions_of
from edgerl.learners.radam import FusedRAdam
from edgerl.learners.shared import (
    FORWARD_EQUIVALENTS_OF_A_GRADIENT_STEP,
    LossMeter,
    anneal_lr,
    autocast,
    epsilon_at,
    loadable_optimizer_state,
    rollouts_owed,
    rows_of,
)
from edgerl.memories import Memory
from edgerl.memories.rollout import RolloutBuffer, lambda_returns

log = logging.getLogger(__name__)

VALUE_CHUNK = 256  # observations per no-grad forward pass when computing greedy values


def make_radam(
    net: nn.Module, lr: float, eps: float, capturable: bool
) -> tuple[torch.optim.RAdam, bool]:
    """RAdam over ``net``'s parameters, and whether it can be captured in a CUDA graph.

    Captured, the optimizer must keep its step count on the GPU and read its learning rate from a
    tensor (which :func:`edgerl.learners.shared.anneal_lr` fills in place); a torch build whose
    RAdam cannot (older JetPack builds) keeps the eager update. Captured, it is the multi-tensor
    (``foreach``) step; not, :class:`~edgerl.learners.radam.FusedRAdam`, whose rectified steps on
    a CPU are one fused pass and whose others are that multi-tensor step (torch picks it by
    itself only on a GPU). On a 2-core Xeon a Pong update's RAdam step took 7.0 ms one tensor at
    a time, 4.4 ms multi-tensor (in the update, profiled); alone, the multi-tensor step took 2.93
    ms and the fused one 0.84 (docs/performance.md, "One pass for RAdam's step"). Each is the same
    formula computed in another order.
    """
    params = list(net.parameters())
    if capturable:
        try:
            lr_tensor = torch.tensor(lr, device=params[0].device)
            optimizer = torch.optim.RAdam(
                params, lr=lr_tensor, eps=eps, capturable=True, foreach=True
            )
        except (RuntimeError, TypeError, ValueError) as e:
            log.info("PQN's update stays eager: this torch's RAdam cannot be captured (%s)", e)
        else:
            return optimizer, True
    return FusedRAdam(params, lr=lr, eps=eps), False


def minibatch_shape(total: int, minibatches: int) -> tuple[int, int]:
    """(rows per minibatch, minibatches per pass) over a rollout of ``total`` transitions:
    ``minibatches`` of ``total // minibatches`` rows (the rows left over wait for the next pass's
    order), or one row each where the rollout is smaller than that."""
    size = max(1, total // minibatches)
    return size, min(minibatches, total // size)


class PQN:
    """The network, its optimizer and the schedules of learning, one rollout at a time.

    ``num_envs`` environments make a rollout of ``pqn.rollout_steps`` vector steps; one unit of
    learning (:meth:`learn`) is one rollout's epochs.
    """

    kind = "pqn"

    def __init__(
        self,
        q_net: nn.Module,
        cfg: AgentConfig,
        pqn: PQNConfig,
        num_envs: int,
        device: torch.device,
        perf: PerfConfig | None = None,
        total_steps: int = 0,
        seed: int = 0,
    ) -> None:
        perf = perf or PerfConfig(amp="off", cuda_graphs="off", compile="off")
        self.cfg = cfg
        self.pqn = pqn
        self.device = device
        self.total_steps = total_steps
        if isinstance(q_net, NatureCNN):
            q_net.use_channels_last()
        self.q = q_net.to(device)
        self._policy = KIND.acting_policy(self.q)  # its kind's: as on remote actors
        self.amp = resolve_amp(perf.amp, device, frames=isinstance(q_net, NatureCNN))
        graphs = resolve_cuda_graphs(perf.cuda_graphs, device, self.amp)
        self.optimizer, graphs = make_radam(self.q, cfg.lr, cfg.adam_eps, capturable=graphs)
        self.fast = FastUpdate(self.update_step, self.q, self.optimizer, graphs, "off")
        # The captured pass's fixed inputs (capture): the rollout's observations, actions and
        # returns, flattened, and the pass's minibatch order.
        self._graph_inputs: tuple[torch.Tensor, ...] | None = None
        self.losses = LossMeter(device)
        self.per_launch = 1
        self.steps_per_unit = pqn.rollout_steps * num_envs
        self.updates = 0  # gradient updates (minibatches)
        self.rollouts = 0  # rollouts learned from
        # (step, rollouts) a session counts from: its first rollout starts at its first step.
        self.learn_from = (0, 0)
        self.generator = torch.Generator().manual_seed(seed)  # minibatch order, on the CPU

    @property
    def cuda_graphs(self) -> bool:
        """The update runs as a CUDA graph (the actor may capture its forward pass too)."""
        return self.fast.cuda_graphs

    def describe(self) -> str:
        layout = "channels_last" if getattr(self.q, "channels_last", False) else "mlp"
        parts = [self.device.type, "PQN", layout]
        if self.amp is not None:
            parts.append(f"amp {str(self.amp).removeprefix('torch.')}")
        if self._graph_inputs is not None:
            parts.append("a pass per CUDA graph launch")
        return ", ".join(parts)

    # -- schedules ------------------------------------------------------------------------------

    def figures(self) -> dict[str, float]:
        """Its epochs over each rollout (the learning balance may move them)."""
        return {"epochs": float(self.pqn.epochs)}

    @property
    def ratio(self) -> int:
        """What the learning balance moves (the registry's ``ratio_key``): epochs a rollout."""
        return self.pqn.epochs

    def ratio_cost(self, epochs: int, values_reused: bool) -> float:
        """Forward-pass equivalents of learning per env step at ``epochs`` (the learning
        balance weighs the values by it): the greedy values of the next observations and the
        epochs' gradient steps."""
        return learning_forwards(self.pqn.rollout_steps, epochs, values_reused)

    def set_ratio(self, epochs: int) -> None:
        """Learn each rollout from here on with ``epochs`` passes (read once a rollout: a
        learner thread's rollout under way keeps its count)."""
        self.pqn = dataclasses.replace(self.pqn, epochs=int(epochs))

    def epsilon(self, step: int) -> float:
        """Exploration at ``step``: linear from eps_start to eps_end over eps_decay_steps (a
        rollout learner learns from its first rollout on: nothing to wait for)."""
        return epsilon_at(self.cfg, step, self.learn_from[0])

    @property
    def policy(self) -> EpsilonGreedy:
        """Epsilon-greedy on the network, for every environment, keeping each row's greedy
        value (the rollout's ``values``: the learner reuses those of its own weights)."""
        return self._policy

    def owed(self, step: int, memory: Memory | None = None) -> int:
        """Rollouts complete at env step ``step`` and not learned from yet (every environment
        steps together: the step alone says)."""
        return rollouts_owed(self.learn_from, self.rollouts, step, self.steps_per_unit)

    def resume_at(self, step: int, refill: int = 0) -> None:
        """Continue a resumed run at ``step``: the first rollout starts there (``refill`` is
        a replay's business, not PQN's)."""
        self.learn_from = (step, self.rollouts)

    # -- learning -------------------------------------------------------------------------------

    def learn(self, memory: RolloutBuffer, step: int, n: int = 1) -> None:
        """Learn from the full rollout in ``memory`` (``n`` is 1: one rollout at a time) and
        clear it for the next."""
        for _ in range(n):
            self._learn_rollout(memory, step)

    def _learn_rollout(self, memory: RolloutBuffer, step: int) -> None:
        if not memory.full:
            raise ValueError("PQN learns from a full rollout")
        a, p = self.cfg, self.pqn
        anneal_lr(self.optimizer, a, self.total_steps, step)
        steps, envs = memory.steps, memory.num_envs
        with torch.no_grad():
            next_values = self._next_values(memory)
            for t, rows, final in memory.finals:
                next_values[t, rows] = self._greedy_values(final)
            returns = lambda_returns(
                memory.rewards,
                memory.terminated,
                memory.truncated,
                next_values,
                a.gamma,
                p.lam,
            ).flatten()
        obs = memory.obs[:steps].flatten(0, 1)
        actions = memory.actions.flatten()
        total = steps * envs
        size, count = minibatch_shape(total, p.minibatches)
        graph = self._graph_inputs
        if graph is not None and graph[0].shape[0] == total:
            for static, fresh in zip(graph[:3], (obs, actions, returns), strict=True):
                static.copy_(fresh)  # device to device, in the stream's order
        else:
            graph = None
        for _ in range(p.epochs):
            order = torch.randperm(total, generator=self.generator).to(self.device)
            if graph is not None:
                graph[3].copy_(order)
                self.losses.add(self.fast.launch(), n=count)
                self.updates += count
                continue
            for i in range(count):
                rows = order[i * size : (i + 1) * size]
                self.losses.add(self.update_step(rows_of((obs, actions, returns), rows)))
                self.updates += 1
        memory.clear()
        self.rollouts += 1

    def capture(self, memory: RolloutBuffer) -> None:
        """Capture one pass over a rollout of ``memory``'s shape, all its minibatch updates, as
        one CUDA graph (:meth:`FastUpdate.prepare_sampling`: warm-up passes on zeros, then the
        weights and optimizer state put back)."""
        total = memory.steps * memory.num_envs
        size, count = minibatch_shape(total, self.pqn.minibatches)
        device = self.device
        obs = torch.zeros((total, *memory.obs.shape[2:]), dtype=memory.obs.dtype, device=device)
        actions = torch.zeros(total, dtype=torch.long, device=device)
        returns = torch.zeros(total, device=device)
        order = torch.arange(total, device=device)
        minibatch = itertools.count()

        def sample() -> tuple[torch.Tensor, ...]:
            i = next(minibatch) % count  # each captured call of the pass takes all of them
            return rows_of((obs, actions, returns), order[i * size : (i + 1) * size])

        self.fast.prepare_sampling(sample, count)
        self._graph_inputs = (obs, actions, returns, order)

    def _next_values(self, memory: RolloutBuffer) -> torch.Tensor:
        """max_a Q of every transition's next observation, (steps, envs): those the actor noted
        with the current weights (:meth:`RolloutBuffer.note_extras`) as they are, the rest
        computed here."""
        known = memory.values_version[1:] == self.updates
        if not known.any():
            steps, envs = memory.steps, memory.num_envs
            return self._greedy_values(memory.obs[1:].flatten(0, 1)).view(steps, envs)
        next_values = memory.values[1:].clone()
        for t in np.flatnonzero(~known):  # usually the last: the actor acts on it after learning
            next_values[t] = self._greedy_values(memory.obs[t + 1])
        return next_values

    def _greedy_values(self, obs: torch.Tensor) -> torch.Tensor:
        """max_a Q(obs, a), in chunks (no gradient)."""
        out = [
            self.q(obs[i : i + VALUE_CHUNK]).float().max(dim=1).values
            for i in range(0, len(obs), VALUE_CHUNK)
        ]
        return torch.cat(out)

    def update_step(self, batch: tuple[torch.Tensor, ...], zero_grad: bool = True) -> torch.Tensor:
        """One gradient step on (observations, actions, returns): mean squared error of Q(s, a)
        against the Q(lambda) return; returns the detached loss. A CUDA graph captures it with
        ``zero_grad=False`` (the graph's backward writes fresh gradients on every replay)."""
        obs, actions, returns = batch
        if zero_grad:
            self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.device, self.amp):
            q_taken = self.q(obs).float().gather(1, actions.unsqueeze(1)).squeeze(1)
            loss = F.mse_loss(q_taken, returns)
        loss.backward()
        if self.cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.q.parameters(), self.cfg.grad_clip, foreach=True)
        self.optimizer.step()
        return loss.detach()

    # -- state ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            POLICY_KEY: self.q.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
            "rollouts": self.rollouts,
            "generator": self.generator.get_state(),
            "epochs": self.pqn.epochs,  # as the learning balance left them
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._graph_inputs is not None:  # torch replaces the optimizer's state tensors,
            self._graph_inputs = None  # which the graph would no longer read: eager from here
            log.info("PQN's update is eager from here: its state was loaded after its capture")
        self.q.load_state_dict(state[POLICY_KEY])
        self.optimizer.load_state_dict(
            loadable_optimizer_state(state["optimizer"], self.optimizer, self.device)
        )
        self.updates = int(state["updates"])
        self.rollouts = int(state["rollouts"])
        self.generator.set_state(state["generator"])
        if "epochs" in state:  # checkpoints before the learning balance: the config's
            self.set_ratio(int(state["epochs"]))


def _values_forwards(rollout_steps: int, values_reused: bool) -> float:
    """The greedy values of the next observations, per env step: only each rollout's last
    where the actor's (of the learner's own weights) are reused, else every one."""
    return 1.0 / rollout_steps if values_reused else 1.0


def learning_forwards(rollout_steps: int, epochs: int, values_reused: bool) -> float:
    """Forward-pass equivalents the learner spends per env step (the act aside)."""
    return _values_forwards(rollout_steps, values_reused) + (
        epochs * FORWARD_EQUIVALENTS_OF_A_GRADIENT_STEP
    )


class PQNKind(Basics):
    """PQN's kind (its registry line's ``KIND``): a Q-network with LayerNorm, epsilon-greedy
    acting that keeps each row's greedy value, a pass of the update captured where graphs are
    on."""

    layer_norm = True

    def acting_policy(self, net: nn.Module) -> EpsilonGreedy:
        """Epsilon-greedy on ``net``, keeping each row's greedy value (the rollout's
        ``values``: the learner reuses those of its own weights)."""
        return EpsilonGreedy(net, num_actions_of(net), keep_values=True)

    def build(self, net: nn.Module, cfg: Config, device: torch.device) -> PQN:
        """Around ``net``; its minibatch order draws from a generator of its own, seeded from
        ``env.seed``."""
        n = cfg.env.num_envs
        return PQN(net, cfg.agent, cfg.pqn, n, device, cfg.perf, cfg.train.steps, cfg.env.seed + 1)

    def prepare(  # type: ignore[override]
        self,
        learner: PQN,
        cfg: Config,
        spec: EnvSpec,
        memory: RolloutBuffer,
        remaining_updates: int,
        decisions: object = None,
    ) -> None:
        """Capture a pass of the update as a CUDA graph where graphs are on (nothing to do on a
        CPU, where PQN's minibatches of hundreds are not launch-bound)."""
        if learner.cuda_graphs:
            learner.capture(memory)

    def forwards_per_env_step(self, cfg: Config, values_reused: bool) -> dict[str, float]:
        """The greedy values of the next observations (only each rollout's last when the
        actor's are reused) and ``pqn.epochs`` gradient steps over it."""
        values = _values_forwards(cfg.pqn.rollout_steps, values_reused)
        gradients = cfg.pqn.epochs * FORWARD_EQUIVALENTS_OF_A_GRADIENT_STEP
        return {"act": 1.0, "values": values, "targets": 0.0, "gradients": gradients}

    def forwards_per_update(self, cfg: Config) -> float:
        """One minibatch update, its share of computing the rollout's values included (the
        bench's learner-alone measurement reuses none)."""
        batch = cfg.pqn.rollout_steps * cfg.env.num_envs // cfg.pqn.minibatches
        values = _values_forwards(cfg.pqn.rollout_steps, values_reused=False)
        return batch * (values / cfg.pqn.epochs + FORWARD_EQUIVALENTS_OF_A_GRADIENT_STEP)


KIND = PQNKind()
