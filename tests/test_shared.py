"""shared.py: the loss meter counts every update's loss once, and on a GPU never waits for a copy
still on its way (the learner holds a lock the actor may need while it adds); the learning-rate
schedule."""

from __future__ import annotations

import math
import random

import pytest
import torch

from edgerl.config import AgentConfig
from edgerl.learners.shared import LOSS_READ_EVERY, LossMeter, anneal_lr, linear_schedule


class SlowCopy:
    """A GPU copy's event that lands only after ``polls`` queries (the GPU is not here)."""

    def __init__(self, polls: int) -> None:
        self.polls = polls
        self.waited = False

    def query(self) -> bool:
        self.polls -= 1
        return self.polls < 0

    def synchronize(self) -> None:
        self.waited = True


class GpuLikeMeter(LossMeter):
    """The CUDA path of LossMeter with the copy to pinned memory stood in for."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__(torch.device("cpu"))
        self._cuda = True
        self.rng = rng
        self.events: list[SlowCopy] = []

    def _start_copy(self, device_sum: torch.Tensor) -> tuple[torch.Tensor, SlowCopy]:
        event = SlowCopy(self.rng.randrange(0, 40))
        self.events.append(event)
        return device_sum.clone(), event


def test_every_loss_is_counted_once_however_late_the_copies_land():
    rng = random.Random(0)
    for _ in range(50):
        meter = GpuLikeMeter(rng)
        losses = [rng.random() for _ in range(rng.randrange(1, 300))]
        taken = []
        for loss in losses:
            meter.add(torch.tensor(loss))
            if rng.random() < 0.05:  # a metrics row reads the mean now and then
                taken.append((meter._n, meter.take()))
        meter.flush()
        total = sum(n * mean for n, mean in taken if n) + meter._sum
        assert meter._n + sum(n for n, _ in taken) == len(losses)
        assert abs(total - sum(losses)) < 1e-3


def test_adding_never_waits_for_a_copy_that_has_not_landed():
    meter = GpuLikeMeter(random.Random(1))
    for _ in range(5 * LOSS_READ_EVERY):
        meter.add(torch.tensor(1.0))
    assert len(meter.events) > 1 and not any(e.waited for e in meter.events)
    meter.flush()  # the end of a run may wait
    assert meter.take() == 1.0


def test_on_the_cpu_each_loss_is_counted_at_once():
    meter = LossMeter(torch.device("cpu"))
    for loss in (1.0, 2.0, 3.0):
        meter.add(torch.tensor(loss))
    assert meter.peek() == 2.0 and meter.take() == 2.0
    assert math.isnan(meter.take())  # nothing since the last take


def test_the_learning_rate_is_annealed_in_place_for_a_captured_optimizer():
    """A capturable Adam holds its learning rate as a tensor that the CUDA graph reads: the
    schedule fills that tensor (a new float would leave the graph at the old rate)."""
    weight = torch.nn.Parameter(torch.zeros(2))
    captured = torch.optim.Adam([weight], lr=torch.tensor(1e-3))
    plain = torch.optim.Adam([weight], lr=1e-3)
    rate = captured.param_groups[0]["lr"]
    cfg = AgentConfig(lr=1e-3, lr_end=0.0)
    for optimizer in (captured, plain):
        anneal_lr(optimizer, cfg, total_steps=100, step=50)
    assert captured.param_groups[0]["lr"] is rate and float(rate) == pytest.approx(5e-4)
    assert plain.param_groups[0]["lr"] == pytest.approx(5e-4)
    anneal_lr(plain, AgentConfig(lr=1e-3, lr_end=-1.0), total_steps=100, step=99)  # constant
    assert plain.param_groups[0]["lr"] == pytest.approx(5e-4)


def test_linear_schedule():
    assert linear_schedule(1.0, 0.1, 100, 0) == 1.0
    assert linear_schedule(1.0, 0.1, 100, 50) == 0.55
    assert linear_schedule(1.0, 0.1, 100, 1000) == 0.1
