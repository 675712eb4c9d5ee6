"""FusedRAdam: torch's RAdam, its rectified CPU steps made by the fused Adam kernel."""

from __future__ import annotations

import copy

import pytest
import torch

from edgerl.learners.nets import MLP
from edgerl.learners.radam import FusedRAdam

# The CPU kernel came with torch 2.4; the torch this project pins has it.
TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
UNRECTIFIED = 5  # steps with rho_t <= 5 at beta2 = 0.999: RAdam's momentum-only steps


def _nets(seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(seed)
    net = MLP(6, 3, (32, 32), layer_norm=True)
    return net, copy.deepcopy(net)


def _train(
    pairs, steps: int, x: torch.Tensor, skip_bias_at: int = -1, relayout: bool = False
) -> None:
    """``steps`` steps of each (net, optimizer) on the same loss; at step ``skip_bias_at`` the
    output layer's bias gets no gradient; ``relayout``: each matrix's gradient is stored
    column-major (the same values, the parameter's memory walked in another order)."""
    for i in range(steps):
        for net, opt in pairs:
            opt.zero_grad(set_to_none=True)
            net(x).square().mean().backward()
            if i == skip_bias_at:
                net.last.bias.grad = None
            if relayout:
                for p in net.parameters():
                    if p.dim() == 2:
                        p.grad = p.grad.t().contiguous().t()
            opt.step()


def _assert_same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_the_fused_steps_move_the_weights_as_torchs_radam_does():
    if TORCH >= (2, 4):
        assert FusedRAdam([torch.nn.Parameter(torch.zeros(1))]).fused_on_cpu
    fused_net, plain_net = _nets()
    start = copy.deepcopy(fused_net)
    fused = FusedRAdam(fused_net.parameters(), lr=1e-3, eps=1e-5)
    plain = torch.optim.RAdam(plain_net.parameters(), lr=1e-3, eps=1e-5, foreach=False)
    x = torch.randn(64, 6, generator=torch.Generator().manual_seed(7))
    _train([(fused_net, fused), (plain_net, plain)], UNRECTIFIED, x)
    assert fused.fused_steps == 0  # the first steps are torch's own
    _train([(fused_net, fused), (plain_net, plain)], 40, x)
    assert fused.fused_steps == (40 if fused.fused_on_cpu else 0)
    _assert_same(fused_net, plain_net)
    assert all(
        not torch.equal(p, q)
        for p, q in zip(fused_net.parameters(), start.parameters(), strict=True)
    )
    state = fused.state_dict()["state"][0]
    assert set(state) == {"step", "exp_avg", "exp_avg_sq"} and float(state["step"]) == 45


def test_its_state_and_torchs_load_in_each_other():
    """A checkpoint written by either optimizer resumes in the other, and the two go on alike."""
    x = torch.randn(64, 6, generator=torch.Generator().manual_seed(7))
    a_net, b_net = _nets(1)
    a = torch.optim.RAdam(a_net.parameters(), lr=1e-3, foreach=True)
    b = FusedRAdam(b_net.parameters(), lr=1e-3)
    _train([(a_net, a), (b_net, b)], 12, x)
    c_net, d_net = copy.deepcopy(a_net), copy.deepcopy(b_net)
    c = FusedRAdam(c_net.parameters(), lr=1e-3)
    # Copies, as a checkpoint read from a file is: torch keeps the very tensors it is given.
    c.load_state_dict(copy.deepcopy(a.state_dict()))  # torch's state, resumed fused
    d = torch.optim.RAdam(d_net.parameters(), lr=1e-3, foreach=True)
    d.load_state_dict(copy.deepcopy(b.state_dict()))  # the fused state, resumed by torch
    _train([(a_net, a), (b_net, b), (c_net, c), (d_net, d)], 10, x)
    assert c.fused_steps == (10 if c.fused_on_cpu else 0)
    for net in (b_net, c_net, d_net):
        _assert_same(a_net, net)


@pytest.mark.parametrize(
    "case", ["weight decay", "a skipped gradient", "maximize", "a gradient in another layout"]
)
def test_what_the_kernel_does_not_compute_takes_torchs_step(case):
    x = torch.randn(64, 6, generator=torch.Generator().manual_seed(7))
    fused_net, plain_net = _nets(2)
    options = {"weight decay": {"weight_decay": 0.01}, "maximize": {"maximize": True}}
    fused = FusedRAdam(fused_net.parameters(), lr=1e-3)
    plain = torch.optim.RAdam(plain_net.parameters(), lr=1e-3, **options.get(case, {}))
    fused.param_groups[0].update(options.get(case, {}))
    skip = 3 if case == "a skipped gradient" else -1
    relayout = case == "a gradient in another layout"
    _train([(fused_net, fused), (plain_net, plain)], 20, x, skip, relayout)
    # A parameter that missed a step is one step behind the rest: each its own rectification.
    assert fused.fused_steps == 0
    _assert_same(fused_net, plain_net)
