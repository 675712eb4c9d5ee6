"""The Nature CNN's channels-last path computes what its NCHW path computes, from the same
bytes, copied the way it copies them."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from edgerl.learners.nets import NatureCNN, channels_last_copy, nhwc_layer_norm
from edgerl.learners.shared import rows_of


def perturbed(layer_norm: bool) -> NatureCNN:
    """A network whose LayerNorm weights are not all ones and zeros (as after training), so a
    weight permuted the wrong way would show."""
    torch.manual_seed(0)
    net = NatureCNN(4, 6, layer_norm=layer_norm)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return net


@pytest.mark.parametrize("layer_norm", [True, False])
def test_channels_last_matches_nchw(layer_norm: bool) -> None:
    nchw = perturbed(layer_norm)
    nhwc = copy.deepcopy(nchw).use_channels_last()
    obs = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)
    q_nchw, q_nhwc = nchw(obs), nhwc(obs)
    torch.testing.assert_close(q_nhwc, q_nchw, rtol=1e-5, atol=1e-5)
    q_nchw.square().sum().backward()
    q_nhwc.square().sum().backward()
    for (name, a), b in zip(nchw.named_parameters(), nhwc.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None, name
        scale = a.grad.abs().max().item()
        torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=1e-5 * scale, msg=name)


def test_float_frames_are_not_written() -> None:
    """The channels-last path divides its own copy in place: a float stack handed to it (an
    export's trace, a test) is left as it was."""
    net = perturbed(True).use_channels_last()
    frames = torch.randint(0, 256, (2, 4, 84, 84)).float()
    before = frames.clone()
    with torch.no_grad():
        q_float = net(frames)
        q_bytes = net(frames.to(torch.uint8))
    assert torch.equal(frames, before)
    torch.testing.assert_close(q_float, q_bytes, rtol=0, atol=0)


def test_nhwc_layer_norm_is_the_layer_norm() -> None:
    norm = nn.LayerNorm((32, 20, 20))
    with torch.no_grad():
        norm.weight.copy_(torch.rand(32, 20, 20) + 0.5)
        norm.bias.copy_(torch.randn(32, 20, 20))
    x = torch.randn(3, 32, 20, 20).contiguous(memory_format=torch.channels_last)
    y = nhwc_layer_norm(norm, x)
    torch.testing.assert_close(y, norm(x), rtol=1e-5, atol=1e-5)
    assert y.is_contiguous(memory_format=torch.channels_last)  # no copy back to NCHW


def test_nhwc_layer_norm_without_weights() -> None:
    norm = nn.LayerNorm((8, 5, 6), elementwise_affine=False)
    x = torch.randn(2, 8, 5, 6).contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(nhwc_layer_norm(norm, x), norm(x), rtol=1e-5, atol=1e-5)


def test_channels_last_under_bf16_autocast_matches_nchw() -> None:
    """Under CPU autocast (perf.amp=bf16) the two paths differ by bf16's rounding only."""
    nchw = perturbed(True)
    nhwc = copy.deepcopy(nchw).use_channels_last()
    obs = torch.randint(0, 256, (4, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        q_nchw, q_nhwc = nchw(obs).float(), nhwc(obs).float()
    torch.testing.assert_close(q_nhwc, q_nchw, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_channels_last_copy_is_the_layout_change(dtype: torch.dtype) -> None:
    """The plane-by-plane copy holds the same values in the channels-last layout torch's own
    makes, from a plain tensor and from strided views (slices)."""
    torch.manual_seed(0)
    stacks = torch.randint(0, 256, (10, 4, 84, 84)).to(dtype)
    for obs in (stacks, stacks[1::3], stacks[:, :, 2:, 3:]):
        copied = channels_last_copy(obs)
        assert copied.is_contiguous(memory_format=torch.channels_last)
        assert copied.shape == obs.shape and copied.dtype == dtype
        assert torch.equal(copied, obs.contiguous(memory_format=torch.channels_last))
    already = stacks.contiguous(memory_format=torch.channels_last)
    assert channels_last_copy(already) is already  # nothing copied where nothing need be


def test_rows_of_are_the_indexed_rows() -> None:
    """A minibatch by ``index_select`` is the same rows, order and repeats kept, of every
    tensor: frames, actions, continuous actions."""
    torch.manual_seed(0)
    frames = torch.randint(0, 256, (12, 4, 6, 6), dtype=torch.uint8)
    actions = torch.randint(0, 5, (12,))
    numbers = torch.randn(12, 3)
    rows = torch.tensor([7, 0, 11, 7, 3])
    got = rows_of((frames, actions, numbers), rows)
    for a, b in zip(got, (frames[rows], actions[rows], numbers[rows]), strict=True):
        assert torch.equal(a, b)
