"""A population's weights and forward passes: :class:`Genomes` rebuilds a member's weights from
its seeds (the same bits on the same kind of CPU and torch), :class:`Population` runs every
environment's member in one batched call (``torch.func.vmap`` over ``functional_call``: the
convolutions become grouped ones), and :func:`forward_rates` measures that call against one
member at a time. The genetic algorithm that evolves them is :mod:`edgerl.learners.ga`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call, vmap

from edgerl.envs import EnvSpec

Genome = tuple[int, ...]  # the seed of the initial weights, then one seed per mutation


class Genomes:
    """Weights from seeds: a member's flat float32 weights (on the CPU) from its genome, the same
    bits every time. ``keep`` holds the weights of the genomes that will be asked again (the
    parents, the elite candidates), so a child is one draw of noise away."""

    def __init__(self, template: nn.Module, sigma: float) -> None:
        self.template = copy.deepcopy(template).cpu().requires_grad_(False)
        self.size = sum(p.numel() for p in self.template.parameters())
        self.sigma = sigma
        self.kept: dict[Genome, torch.Tensor] = {}

    def initial(self, seed: int) -> torch.Tensor:
        """The initial weights seed ``seed`` draws (PyTorch's own initialisation of each layer)."""
        net = copy.deepcopy(self.template)
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)  # the CPU's alone: CUDA's stay as they are
            for module in net.modules():
                if module is not net and hasattr(module, "reset_parameters"):
                    module.reset_parameters()
        return flat_parameters(net)

    def noise(self, seed: int) -> torch.Tensor:
        return torch.randn(self.size, generator=torch.Generator().manual_seed(seed))

    def weights(self, genome: Genome) -> torch.Tensor:
        """The flat weights of ``genome``, from its longest kept beginning."""
        start = len(genome)
        while start > 0 and genome[:start] not in self.kept:
            start -= 1
        flat = self.kept[genome[:start]] if start else self.initial(genome[0])
        for seed in genome[max(start, 1) :]:
            flat = flat + self.sigma * self.noise(seed)
        return flat

    def keep(self, genomes: list[Genome]) -> None:
        """Keep the weights of ``genomes`` (computed from what is kept now), and only those."""
        self.kept = {g: self.weights(g) for g in dict.fromkeys(genomes)}


def flat_parameters(net: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).float().cpu() for p in net.parameters()])


def load_flat(net: nn.Module, flat: torch.Tensor) -> None:
    """Write flat weights (in ``net.parameters()`` order) into ``net``."""
    with torch.no_grad():
        offset = 0
        for p in net.parameters():
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


class Population(nn.Module):
    """The acting network: row ``i`` acts with the member environment ``envs[i]`` plays, all
    rows in one batched call. The members' weights are ``slots`` (one row of flat
    weights per environment); the network's code is ``template``'s. Called as
    ``forward(obs, envs)``: its acting policy says ``per_env``."""

    def __init__(self, template: nn.Module, num_envs: int, device: torch.device) -> None:
        super().__init__()
        net = copy.deepcopy(template).to(device).requires_grad_(False)
        self._template = [net]  # not a submodule: its own weights are never used
        self.layout = [(name, p.shape, p.numel()) for name, p in net.named_parameters()]
        size = sum(n for _, _, n in self.layout)
        self.slots = nn.Parameter(torch.zeros(num_envs, size, device=device), requires_grad=False)
        self.register_buffer("every_env", torch.arange(num_envs, device=device))

    def assign(self, env: int, flat: torch.Tensor) -> None:
        """Environment ``env`` plays the member of weights ``flat`` from its next step."""
        self.slots[env].copy_(flat)

    def _params(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        out, offset = {}, 0
        for name, shape, n in self.layout:
            out[name] = flat[..., offset : offset + n].reshape(*flat.shape[:-1], *shape)
            offset += n
        return out

    def _one(self, params: dict[str, torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
        return functional_call(self._template[0], params, (obs.unsqueeze(0),)).squeeze(0)

    def forward(self, obs: torch.Tensor, envs: torch.Tensor) -> torch.Tensor:
        n = len(self.every_env)
        if obs.device.type == "cuda":
            # Every member runs, the rows' observations in their environments' places: no copy
            # of the weights (a gather of 64 Nature CNNs moves 430 MB), no look at the ids on
            # the host (a graph captures this), and the GPU has the compute to spare.
            placed = obs.new_zeros((n, *obs.shape[1:])).index_copy_(0, envs, obs)
            return vmap(self._one)(self._params(self.slots), placed).index_select(0, envs)
        if len(envs) == n and torch.equal(envs, self.every_env):
            return vmap(self._one)(self._params(self.slots), obs)  # all, in order: no copy
        return vmap(self._one)(self._params(self.slots.index_select(0, envs)), obs)

    def forward_each(self, obs: torch.Tensor, envs: torch.Tensor) -> torch.Tensor:
        """The same values as :meth:`forward`, one member's forward pass at a time (what
        batching is measured against)."""
        rows = [
            self._one(self._params(self.slots[int(e)]), o) for o, e in zip(obs, envs, strict=True)
        ]
        return torch.stack(rows)


def forward_rates(
    net: nn.Module, spec: EnvSpec, rows: int, device: torch.device, seconds: float
) -> dict[str, float]:
    """Rows (env steps) per second of ``rows`` environments each playing a member of its own:
    in one batched call, and one member's forward pass at a time; each measured about
    ``seconds`` (after a warm-up), the device's work waited for."""
    population = Population(net, rows, device)
    with torch.no_grad():
        population.slots.normal_(0.0, 0.05)  # the values do not change the time
    high = 256 if spec.has_frames else 1
    obs = torch.randint(0, high, (rows, *spec.obs_shape)).to(getattr(torch, spec.obs_dtype))
    obs, envs = obs.to(device), torch.arange(rows, device=device)
    wait = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def rate(forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> float:
        with torch.no_grad():
            for _ in range(2):
                forward(obs, envs)  # warm-up: allocations, kernel choice
            wait()
            calls, start = 0, time.perf_counter()
            while calls < 3 or time.perf_counter() - start < seconds:
                forward(obs, envs)
                calls += 1
            wait()
            return calls * rows / (time.perf_counter() - start)

    batched, each = rate(population.forward), rate(population.forward_each)
    return {"rows": rows, "batched_rows_per_s": batched, "each_rows_per_s": each,
            "speedup": batched / each}  # fmt: skip
