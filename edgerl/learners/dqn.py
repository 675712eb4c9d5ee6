"""The DQN learner: Double DQN n-step targets, Huber loss, Adam, gradient clipping, hard target
syncs.

The learner owns its schedules (as Stable-Baselines3's ``DQN.train`` does): how many updates the
replay ratio asks for at a step (one per ``agent.train_freq`` env steps, counted over all
environments), the exploration epsilon, the learning rate and the target-network syncs. One call
of :meth:`DQN.learn` makes the updates it is asked for: each samples a batch (n-step returns,
:mod:`edgerl.memories.replay.sampling`) and makes one gradient step; the learning rate follows its
schedule
and the target network is synced when due. How the steps are made fast (a CUDA graph that samples
and updates ``perf.updates_per_launch`` times per launch, ``torch.compile``) is
:mod:`edgerl.learners.fast_update`'s business; which precision and device,
:mod:`edgerl.hw.device`'s.
"""

from __future__ import annotations

import copy
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from edgerl.config import AgentConfig, Config, PerfConfig
from edgerl.envs import EnvSpec
from edgerl.files.checkpoint import POLICY_KEY
from edgerl.hw.device import (
    indexed,
    integrated_gpu,
    make_grad_scaler,
    resolve_amp,
    resolve_cuda_graphs,
    same_device,
)
from edgerl.learners.acting import ActingPolicy
from edgerl.learners.fast_update import Decisions, FastUpdate
from edgerl.learners.kinds import Basics
from edgerl.learners.nets import NatureCNN
from edgerl.learners.shared import (
    FORWARD_EQUIVALENTS_OF_A_GRADIENT_STEP,
    LossMeter,
    anneal_lr,
    autocast,
    epsilon_at,
    loadable_optimizer_state,
)
from edgerl.memories import Memory
from edgerl.memories.replay.sampling import Batch, example_batch


class Sampler(Protocol):
    """Where the learner draws its batches from: the replay."""

    device: torch.device  # where it samples (a CUDA graph can capture sampling there)

    def sample(self, batch_size: int) -> Batch:
        """A batch on the learner's device (checked: raises ValueError when empty)."""
        ...

    def sample_on_device(self, batch_size: int) -> Batch:
        """A batch on the sampler's own device, fixed shapes, no host synchronisation."""
        ...


def make_adam(
    net: nn.Module, lr: float, capturable: bool = False, eps: float = 1e-8
) -> torch.optim.Adam:
    """Adam, fused into one kernel where this torch build supports it on the net's device.

    The fused step was 3x faster than the default for the CartPole MLP on this CPU. For CUDA graph
    capture the optimizer must be capturable, with its learning rate a tensor: fused Adam keeps
    its step count on the device and takes a tensor learning rate (torch 2.2 and newer), so it is
    capturable as it is; older builds get the capturable multi-tensor Adam.
    """
    params = list(net.parameters())
    if capturable:
        lr_tensor = torch.tensor(lr, device=params[0].device)
        try:
            return torch.optim.Adam(params, lr=lr_tensor, eps=eps, capturable=True, fused=True)
        except (RuntimeError, TypeError, ValueError):
            return torch.optim.Adam(params, lr=lr_tensor, eps=eps, capturable=True, foreach=True)
    try:
        return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)
    except (RuntimeError, TypeError, ValueError):  # older torch, or a device without fused Adam
        return torch.optim.Adam(params, lr=lr, eps=eps)


class DQN:
    """Online and target Q-networks, their optimizer and the schedules of learning.

    ``total_steps`` (``train.steps``) is where an annealed learning rate ends. A
    :class:`~edgerl.learners.Learner` whose unit of learning is one gradient update.
    """

    kind = "dqn"

    def __init__(
        self,
        q_net: nn.Module,
        cfg: AgentConfig,
        device: torch.device,
        perf: PerfConfig | None = None,
        total_steps: int = 0,
    ) -> None:
        perf = perf or PerfConfig(amp="off", cuda_graphs="off", compile="off")
        self.cfg = cfg
        self.device = indexed(device)  # as the replay's: a graph samples where both are one
        self.total_steps = total_steps
        if isinstance(q_net, NatureCNN):
            q_net.use_channels_last()
        self.q = q_net.to(device)
        self.target = copy.deepcopy(self.q).eval()
        self.target.requires_grad_(False)
        self._policy = KIND.acting_policy(self.q)  # its kind's: as on remote actors
        self.amp = resolve_amp(perf.amp, device, frames=isinstance(q_net, NatureCNN))
        cuda_graphs = resolve_cuda_graphs(perf.cuda_graphs, device, self.amp)
        self.optimizer = make_adam(self.q, cfg.lr, capturable=cuda_graphs, eps=cfg.adam_eps)
        fp16_scaled = self.amp is torch.float16 and not cuda_graphs
        self.scaler = make_grad_scaler() if fp16_scaled else None
        self.fast = FastUpdate(self.update_step, self.q, self.optimizer, cuda_graphs, perf.compile)
        self.losses = LossMeter(device)
        # Double DQN's online pass over next_obs joins the one over obs on a GPU of its own,
        # where a small batch is bound by kernel launches; on a CPU the joint backward would
        # cost more than the second forward saves, and so on a Jetson's integrated GPU, which
        # its compute bounds at these batches (the reasoning; not measured on a board).
        self.joint_forward = cfg.double and device.type == "cuda" and not integrated_gpu(device)
        self.per_launch = 1  # updates per call of the learner's CUDA graph (see prepare)
        self.captured_from: Sampler | None = None  # the replay a sampling graph samples
        self.steps_per_unit = self.cfg.train_freq  # one update per train_freq env steps
        self.updates = 0
        # (step, updates) the replay ratio counts from: learning starts after learning_starts.
        self.learn_from = (cfg.learning_starts, 0)

    def describe(self) -> str:
        if isinstance(self.q, NatureCNN):
            layout = "channels_last" if self.q.channels_last else "NCHW"
        else:
            layout = "mlp"
        parts = [self.device.type, layout]
        if self.amp is not None:
            parts.append(f"amp {str(self.amp).removeprefix('torch.')}")
        if self.fast.cuda_graphs:
            parts.append("CUDA graph")
        if self.fast.compiled:
            parts.append("torch.compile")
        return ", ".join(parts)

    # -- schedules ------------------------------------------------------------------------------

    def figures(self) -> dict[str, float]:
        return {}  # its loss is the interface's own

    def epsilon(self, step: int) -> float:
        """Exploration at ``step``: 1 until learning starts (the replay fills), then linear."""
        return epsilon_at(self.cfg, step, self.learn_from[0])

    @property
    def cuda_graphs(self) -> bool:
        return self.fast.cuda_graphs

    @property
    def policy(self) -> ActingPolicy:
        """Epsilon-greedy on the online network, for every environment."""
        return self._policy

    def owed(self, step: int, memory: Memory | None = None) -> int:
        """Updates due at ``step`` and not made yet (the replay ratio: the step alone says)."""
        return self.updates_due(step) - self.updates

    def updates_due(self, step: int) -> int:
        """Updates the replay ratio asks for by ``step`` (one per train_freq env steps)."""
        start_step, start_updates = self.learn_from
        if step < start_step:
            return self.updates
        return start_updates + (step - start_step) // self.cfg.train_freq

    def resume_at(self, step: int, refill: int) -> None:
        """Continue a resumed run at ``step``: learning waits ``refill`` steps (0 when the
        replay was restored), and never starts before learning_starts."""
        self.learn_from = (max(step + refill, self.cfg.learning_starts), self.updates)

    # -- learning -------------------------------------------------------------------------------

    @property
    def target_period(self) -> int:
        """Updates between target-network syncs."""
        return max(1, self.cfg.target_update // self.cfg.train_freq)

    def learn(self, replay: Sampler, step: int, n: int = 1) -> None:
        """Make ``n`` updates at env step ``step``: the learning rate of that step, then sample
        and step, :attr:`per_launch` updates per launch of the CUDA graph that samples where one
        was captured, and a target sync after each update (or launch) that crosses a multiple
        of :attr:`target_period`.

        Where :meth:`prepare` captured a graph that samples, it samples the replay it was
        captured with (:attr:`captured_from`), which must be ``replay``: another replay passed
        here raises instead of being silently ignored.

        With that graph a remainder below :attr:`per_launch` (the last updates of a run) is one
        whole launch, up to ``per_launch - 1`` updates more than asked: made apart, it would
        capture a second graph on the learner's thread at the end of the run (three real
        warm-up updates, and a capture while the replay's save may be copying on the GPU)."""
        a = self.cfg
        if self.fast.sampling and replay is not self.captured_from:
            raise RuntimeError("DQN.learn: this learner's CUDA graph samples another replay")
        anneal_lr(self.optimizer, a, self.total_steps, step)
        period = self.target_period
        while n > 0:
            if self.fast.sampling:
                loss, k = self.fast.launch(), self.per_launch
            else:
                loss, k = self.fast(replay.sample(a.batch_size)), 1
            before = self.updates
            self.updates += k
            n -= k
            self.losses.add(loss, k)
            if self.updates // period > before // period:
                self.sync_target()

    def update(self, batch: Batch) -> torch.Tensor:
        """One gradient step on ``batch``; returns the (detached) Huber loss."""
        loss = self.fast(batch)
        self.updates += 1
        return loss

    def prepare(
        self,
        example: Batch,
        remaining_updates: int,
        replay: Sampler | None = None,
        per_launch: int = 1,
    ) -> None:
        """Make the update fast before training (a CUDA graph, maybe torch.compile); changes
        nothing else. ``example`` is a batch of the training shape. With ``replay`` on the
        learner's device and CUDA graphs on, the graph samples from it too, ``per_launch``
        updates per launch."""
        if self.fast.cuda_graphs and replay is not None and same_device(replay.device, self.device):
            self.per_launch = per_launch
            b = self.cfg.batch_size
            self.fast.prepare_sampling(lambda: replay.sample_on_device(b), per_launch)
            self.captured_from = replay
            return
        self.per_launch = 1
        self.fast.prepare(example, remaining_updates)

    def update_step(self, b: Batch, zero_grad: bool = True) -> torch.Tensor:
        """One gradient step on a batch of fixed shape; returns the detached loss.

        This is the function a CUDA graph captures (with ``zero_grad=False``: the graph's backward
        writes fresh gradients on every replay).
        """
        if zero_grad:
            self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(b)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        else:
            loss.backward()
        if self.cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.q.parameters(), self.cfg.grad_clip, foreach=True)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        return loss.detach()

    def loss(self, b: Batch) -> torch.Tensor:
        """Huber loss of Q(s, a) against the n-step target R + gamma^m * Q_target(s', a*)
        (``b.discounts`` is gamma^m, 0 where the episode terminated), averaged over the rows of
        weight 1.

        Under mixed precision the convolutions run in bf16/fp16; the networks' output layers,
        and so the Q-values and the TD target, stay in fp32 (see :mod:`edgerl.learners.nets`).
        """
        batch = len(b.obs)
        with autocast(self.device, self.amp):
            if self.joint_forward:
                both = self.q(torch.cat([b.obs, b.next_obs])).float()
                q_values, next_q_online = both[:batch], both[batch:].detach()
            else:
                q_values = self.q(b.obs).float()
                next_q_online = None
            with torch.no_grad():
                next_q_target = self.target(b.next_obs).float()
                if self.cfg.double:
                    if next_q_online is None:
                        next_q_online = self.q(b.next_obs)
                    next_actions = next_q_online.argmax(dim=1, keepdim=True)
                    next_value = next_q_target.gather(1, next_actions).squeeze(1)
                else:
                    next_value = next_q_target.max(dim=1).values
                td_target = b.rewards + b.discounts * next_value
            q_taken = q_values.gather(1, b.actions.unsqueeze(1)).squeeze(1)
            losses = F.smooth_l1_loss(q_taken, td_target, reduction="none")
            return (losses * b.weights).sum() / b.weights.sum().clamp(min=1.0)

    def sync_target(self) -> None:
        with torch.no_grad():
            for t, q in zip(self.target.parameters(), self.q.parameters(), strict=True):
                t.copy_(q)  # in place: a captured graph keeps reading the same tensors

    # -- state ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            POLICY_KEY: self.q.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q.load_state_dict(state[POLICY_KEY])
        self.target.load_state_dict(state["target"])
        saved = loadable_optimizer_state(state["optimizer"], self.optimizer, self.device)
        self.optimizer.load_state_dict(saved)
        self.updates = int(state["updates"])


AUTO_PER_LAUNCH = 4  # a CUDA-graph launch costs the host tens of microseconds: share it


def resolve_updates_per_launch(
    setting: int, graph_samples: bool, target_period: int, max_ahead: int
) -> int:
    """``perf.updates_per_launch``: auto is :data:`AUTO_PER_LAUNCH` where the learner's CUDA
    graph samples its own batches (the largest number up to it that divides the target period,
    so target syncs fall between launches, and that ``perf.max_ahead`` allows), else 1."""
    if setting > 0:
        return setting
    if not graph_samples:
        return 1
    k = min(AUTO_PER_LAUNCH, max_ahead)
    while k > 1 and target_period % k:
        k -= 1
    return k


class DQNKind(Basics):
    """DQN's kind (its registry line's ``KIND``): a Q-network, epsilon-greedy acting, an update
    made fast before training."""

    update_modes = True

    def build(self, net: nn.Module, cfg: Config, device: torch.device) -> DQN:
        return DQN(net, cfg.agent, device, cfg.perf, total_steps=cfg.train.steps)

    def prepare(  # type: ignore[override]
        self,
        learner: DQN,
        cfg: Config,
        spec: EnvSpec,
        memory: Sampler,
        remaining_updates: int,
        decisions: Decisions | None = None,
    ) -> None:
        """A CUDA graph that samples ``perf.updates_per_launch`` batches per launch from the
        replay (``memory``) where it lives on the learner's device, or torch.compile where it
        pays (``decisions`` remembers the measurements)."""
        learner.fast.decisions = decisions
        graph_samples = learner.fast.cuda_graphs and same_device(memory.device, learner.device)
        per_launch = resolve_updates_per_launch(
            cfg.perf.updates_per_launch, graph_samples, learner.target_period, cfg.perf.max_ahead
        )
        example = example_batch(spec, cfg.agent.batch_size, learner.device)  # zeros: no RNG
        learner.prepare(example, remaining_updates, memory, per_launch)

    def forwards_per_env_step(self, cfg: Config, values_reused: bool) -> dict[str, float]:
        """Its share of the updates, each ``batch_size`` transitions through the target (and
        the Double-DQN online) pass and a gradient step; ``values_reused`` does not apply."""
        per_update = cfg.agent.batch_size / cfg.agent.train_freq  # transitions per env step
        targets = per_update * (2.0 if cfg.agent.double else 1.0)
        gradients = per_update * FORWARD_EQUIVALENTS_OF_A_GRADIENT_STEP
        return {"act": 1.0, "values": 0.0, "targets": targets, "gradients": gradients}

    def forwards_per_update(self, cfg: Config) -> float:
        """Its targets and its gradient step."""
        fwd = self.forwards_per_env_step(cfg, values_reused=False)
        return (fwd["targets"] + fwd["gradients"]) * cfg.agent.train_freq


KIND = DQNKind()
