"""The actor's side of acting: one batched forward pass for all environments, the actions
picked by the learner's acting policy (:mod:`edgerl.learners.acting`: epsilon-greedy for DQN,
PQN and the GA).

:class:`Actor` turns a batch of observations into actions, the policy's extras of each row (such
as the greedy values PQN's rollout keeps) and the per-action figures of the environment the
viewer shows. Where the policy's noise alone picks the actions (epsilon 1, the replay still
filling) no forward pass runs at all.

* On the CPU: an eager forward on the observations as they are (no copy); the policy picks the
  actions from it and the noise it drew from the actor's numpy generator, so a run with a fixed
  seed repeats exactly.
* On CUDA: the observations, and each row's noise (drawn on the host from the same numpy
  generator: where each environment explores), go through pinned buffers to static device
  tensors, and the forward pass and the policy's choice run as one captured CUDA graph on the
  actor's own stream (at high priority, so it never queues behind the learner's updates); the
  actions, the extras and the shown figures come back in one small copy. The actor waits only
  for that copy of its own work.

  The graph draws no random numbers on the GPU: the learner's graph, replayed on another
  thread, draws its samples from the default CUDA generator, and graphs that share a generator
  (torch 2.4-2.12) refill one seed/offset pair on each replaying thread's stream without a lock,
  so the two threads' draws could repeat or correlate. On the host they cost the same few
  microseconds as on the CPU, and a seeded run explores as it does on the CPU.

The actor acts with :class:`ActorWeights`: the learner's acting network (the sync pipeline), or two
copies of it that the learner refreshes in turn (the async pipeline): the learner writes the copy
the actor is not using, after the actor's last forward pass on it (a wait on the GPU, not on the
host), and the actor switches to it once the copy is done, which it checks with an event query.
Neither side ever blocks the other.

Where the policy says ``per_env`` (a population learner's: each environment acts with a member of
its own) its network is called with the rows' environment ids as well, ``net(obs, envs)``; on CUDA
the ids are staged into a static tensor like the observations, and the graph captures the call.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from typing import Any

import numpy as np
import torch
from torch import nn

from edgerl.hw.device import CUDA_GRAPH_WARMUP, host_event
from edgerl.learners.acting import ActingPolicy, action_width


def _copy_weights(dst: nn.Module, src: nn.Module) -> None:
    """The parameters and the buffers (a per-environment network may keep its assignment of
    environments to members in one)."""
    with torch.no_grad():
        for d, s in zip(dst.parameters(), src.parameters(), strict=True):
            d.copy_(s)
        for d, s in zip(dst.buffers(), src.buffers(), strict=True):
            d.copy_(s)


class ActorWeights:
    """The network(s) the actor acts with; see the module docstring.

    ``double`` makes two copies of ``net`` that :meth:`publish` refreshes in turn; otherwise the
    actor uses ``net`` itself.
    """

    def __init__(self, net: nn.Module, double: bool) -> None:
        self.source = net
        self.double = double
        if double:
            self.nets = [copy.deepcopy(net).eval().requires_grad_(False) for _ in range(2)]
        else:
            self.nets = [net]
        self.active = 0
        self.version = 0  # the learner's update count the active weights come from
        self._pending: int | None = None  # a copy written, not yet switched to
        self._pending_version = 0
        self._lock = threading.Lock()  # guards the three fields above, never held across a wait
        self.cuda = next(net.parameters()).device.type == "cuda"
        if self.cuda:
            self.published = [torch.cuda.Event() for _ in self.nets]
            self.read = [torch.cuda.Event() for _ in self.nets]  # the actor's last forward on it
            self._read_recorded = [False] * len(self.nets)

    def publish(self, updates: int) -> bool:
        """Copy the learner's weights into the copy the actor is not using (the learner's
        thread and stream); returns False when the previous copy has not been switched to yet
        (the next call tries again)."""
        if not self.double:
            return True
        with self._lock:
            if self._pending is not None:
                return False
            target = 1 - self.active
        if self.cuda:
            stream = torch.cuda.current_stream()
            if self._read_recorded[target]:
                stream.wait_event(self.read[target])  # a GPU-side wait: the host goes on
        _copy_weights(self.nets[target], self.source)
        if self.cuda:
            self.published[target].record()
        with self._lock:
            self._pending, self._pending_version = target, updates
        return True

    def current(self) -> tuple[int, nn.Module]:
        """The copy to act with now (the actor's thread): the newest one whose copy is done."""
        with self._lock:
            pending = self._pending
            if pending is not None and (not self.cuda or self.published[pending].query()):
                self.active, self.version = pending, self._pending_version
                self._pending = None
            return self.active, self.nets[self.active]

    def used(self, index: int) -> None:
        """The actor has queued a forward pass on copy ``index`` (on its current stream)."""
        if self.cuda and self.double:
            self.read[index].record()
            self._read_recorded[index] = True

    def adopt(self, updates: int) -> None:
        """Make the learner's weights now the ones the actor acts with from its next forward
        pass (the actor's thread, on its stream, while the learner changes nothing: the lagged
        rollout pipeline's switch at a rollout's boundary). The copy written is the one not in
        use; on CUDA the actor's stream orders it before the next forward pass."""
        if not self.double:
            return
        with self._lock:
            target = 1 - self.active
        _copy_weights(self.nets[target], self.source)
        with self._lock:
            self.active, self.version, self._pending = target, updates, None

    def sync(self, updates: int) -> None:
        """Make every copy the learner's weights now (the learner is stopped)."""
        if self.double:
            for net in self.nets:
                _copy_weights(net, self.source)
        with self._lock:
            self._pending, self.version = None, updates


class Actor:
    """The actions of ``num_envs`` observations with one forward pass, picked by ``policy``
    (whose network ``weights`` holds, or copies of it)."""

    def __init__(
        self,
        weights: ActorWeights,
        policy: ActingPolicy,
        num_envs: int,
        rng: np.random.Generator,
        obs_shape: tuple[int, ...],
        obs_dtype: str,
        use_graph: bool,
    ) -> None:
        self.weights = weights
        self.policy = policy
        self.num_actions = policy.num_actions
        self.num_envs = num_envs
        self.rng = rng
        self.device = next(weights.source.parameters()).device
        self.cuda = self.device.type == "cuda"
        self.per_env = policy.per_env  # net(obs, envs)
        self.waits = 0  # host waits for its own forward passes (CUDA): one per forward
        # The policy's extras of each row of the last forward pass, by name (empty: none ran):
        # a rollout learner reuses the greedy values instead of computing them again.
        self.extras: dict[str, np.ndarray] = {}
        self._action_width = action_width(policy)  # an id's one column, or a vector's numbers
        self._width = self._action_width + len(policy.extras)  # the columns of its choice
        self._graphs: list[Any] = []
        if self.cuda:
            self._open_device(obs_shape, obs_dtype, use_graph)

    def _open_device(self, obs_shape: tuple[int, ...], obs_dtype: str, use_graph: bool) -> None:
        """The actor's stream, its static buffers and (``use_graph``) one graph per weights
        copy."""
        self.stream = torch.cuda.Stream(priority=-1)  # higher than the learner's
        self._make_buffers(obs_shape, obs_dtype, pin=self.cuda)
        self._done = host_event()  # waited on every step: sleeps on an integrated GPU
        # The buffers and the weights' copies were written on the default stream, which the
        # actor's stream does not follow by itself: the graphs' warm-up, or an actor that acts
        # without graphs at once (a resume past the random phase), would read them unwritten.
        self.stream.wait_stream(torch.cuda.current_stream())
        if use_graph:
            self._graphs = [self._capture(net) for net in self.weights.nets]

    def _make_buffers(self, obs_shape: tuple[int, ...], obs_dtype: str, pin: bool) -> None:
        """The static tensors the graph reads and writes, and their host sides (pinned: the
        copies are asynchronous)."""
        dtype, n, device = getattr(torch, obs_dtype), self.num_envs, self.device
        self._obs_host = torch.empty((n, *obs_shape), dtype=dtype, pin_memory=pin)
        self._obs = torch.zeros((n, *obs_shape), dtype=dtype, device=device)
        noise = getattr(torch, self.policy.noise_dtype)
        shape = (n, *self.policy.noise_shape)
        self._noise_host = torch.zeros(shape, dtype=noise, pin_memory=pin)
        self._noise = torch.zeros(shape, dtype=noise, device=device)
        self._envs_host = torch.arange(n, dtype=torch.int64, pin_memory=pin)
        self._envs = torch.arange(n, dtype=torch.int64, device=device)
        self._shown = torch.zeros((), dtype=torch.long, device=device)
        # the policy's choice, a row per environment (the action as float32, exact for any
        # action id, or a vector's numbers; then the extras), then the shown environment's
        # per-action figures
        size = n * self._width + self.num_actions
        self._out = torch.zeros(size, device=device)
        self._out_host = torch.zeros(size, pin_memory=pin)

    def _stage(
        self,
        obs: np.ndarray,
        epsilon: float,
        shown: int | None,
        envs: np.ndarray | None = None,
    ) -> None:
        """Put one step's input on the device: the observations, each row's noise (drawn here
        by the policy, from the actor's generator), the environment shown and, for a network
        per environment, the rows' environment ids."""
        self._obs_host.numpy()[...] = obs
        self._obs.copy_(self._obs_host, non_blocking=True)
        if self.per_env:
            self._envs_host.numpy()[...] = np.arange(len(obs)) if envs is None else envs
            self._envs.copy_(self._envs_host, non_blocking=True)
        self._noise_host.numpy()[...] = self.policy.draw(epsilon, self.num_envs, self.rng)
        self._noise.copy_(self._noise_host, non_blocking=True)
        self._shown.fill_(0 if shown is None else shown)

    def _body(self, net: nn.Module) -> None:
        """Forward and the policy's choice on the static tensors (what a graph captures; it
        draws no random numbers)."""
        with torch.no_grad():
            out = net(self._obs, self._envs) if self.per_env else net(self._obs)
            rows = self.num_envs * self._width
            self._out[:rows].copy_(self.policy.choose(out, self._noise).view(-1))
            shown = self.policy.per_action(out).index_select(0, self._shown.view(1))
            self._out[rows:].copy_(shown.view(-1))

    def _capture(self, net: nn.Module) -> Any:
        with torch.cuda.stream(self.stream):
            for _ in range(CUDA_GRAPH_WARMUP):
                self._body(net)
        self.stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream):
            self._body(net)
        return graph

    def context(self) -> Any:
        """The CUDA stream the actor's work (and the replay writes of its thread) runs on."""
        return torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext()

    def act(
        self,
        obs: np.ndarray,
        epsilon: float | np.ndarray,
        shown: int | None = None,
        envs: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Actions for ``obs`` (the rows of environments ``envs``; None: all, in order) at
        exploration rate ``epsilon`` (one, or one per row) and the per-action figures of row
        ``shown`` (None when not asked for, or where no forward pass runs); the rows' extras
        are left in :attr:`extras`."""
        n = len(obs)
        policy = self.policy
        self.extras = {}
        if not policy.needs_forward(epsilon):
            return policy.draw(epsilon, n, self.rng), None
        index, net = self.weights.current()
        if not self.cuda:
            with torch.no_grad():
                x = torch.from_numpy(obs)
                if self.per_env:
                    ids = np.arange(n) if envs is None else np.asarray(envs, dtype=np.int64)
                    out = net(x, torch.from_numpy(ids))
                else:
                    out = net(x)
                noise = torch.from_numpy(policy.draw(epsilon, n, self.rng))
                chosen = policy.choose(out, noise).numpy()
                figures = None if shown is None else policy.per_action(out)[shown].numpy()
            return self._unpack(chosen, n), figures
        with torch.cuda.stream(self.stream):
            self._stage(obs, epsilon, shown, envs)
            if self._graphs:
                self._graphs[index].replay()
            else:
                self._body(net)
            self.weights.used(index)
            self._out_host.copy_(self._out, non_blocking=True)
            self._done.record()
        self._done.synchronize()  # our own forward pass: the actions are needed now
        self.waits += 1
        out = self._out_host.numpy()
        rows = n * self._width
        chosen = out[:rows].reshape(n, self._width)
        return self._unpack(chosen, n), (None if shown is None else out[rows:].copy())

    def _unpack(self, chosen: np.ndarray, n: int) -> np.ndarray:
        """The actions of the policy's choice (action ids as int64, or a continuous game's
        float32 vectors); its extras go to :attr:`extras` (copies)."""
        width = self._action_width
        for i, name in enumerate(self.policy.extras, start=width):
            self.extras[name] = chosen[:n, i].copy()
        if self.policy.action_shape:
            return chosen[:n, :width].reshape(n, *self.policy.action_shape).copy()
        return chosen[:n, 0].astype(np.int64)
