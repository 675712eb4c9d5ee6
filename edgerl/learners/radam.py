"""RAdam (Liu et al. 2020) whose rectified steps on a CPU are made by torch's fused Adam kernel.

Once RAdam's variance estimate is trusted (rho_t > 5: from the sixth step with the usual betas),
its step is Adam's with two numbers changed:

    RAdam:  p -= lr * rect / bc1 * m * sqrt(bc2) / (sqrt(v) + eps)
    Adam:   p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)

(bc1, bc2 the bias corrections 1 - beta^t, rect the variance rectification): the two are equal
with Adam's learning rate ``lr * rect`` and its epsilon ``eps / sqrt(bc2)``, scalars known before
the step. Torch's fused Adam makes the whole step in one pass over the parameters, moments and
gradients; its multi-tensor RAdam makes about eight. On a 2-core Xeon the step for Pong's Nature
CNN took 0.84 ms against 2.93, and PQN's update 41.8 ms against 44.5 (docs/performance.md, "One
pass for RAdam's step"). The values are the same formula computed in another order; the state
(``step``, ``exp_avg``, ``exp_avg_sq``) is torch's RAdam's, so checkpoints of either load in the
other. The first steps, and what is left to torch (weight decay, maximize, a GPU, parameters whose
layouts or step counts differ, a torch without the CPU kernel), take torch's own RAdam step.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


def _fused_adam_on_cpu() -> bool:
    """Whether this torch has the fused Adam kernel for CPU tensors (torch 2.4 and newer)."""
    fused = getattr(torch, "_fused_adam_", None)
    if fused is None:
        return False
    one = torch.zeros(1)
    try:
        fused(
            [one.clone()],
            [one.clone()],
            [one.clone()],
            [one.clone()],
            [],
            [torch.ones(())],
            lr=0.0,
            beta1=0.9,
            beta2=0.999,
            weight_decay=0.0,
            eps=1e-8,
            amsgrad=False,
            maximize=False,
        )
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True


class FusedRAdam(torch.optim.RAdam):
    """``torch.optim.RAdam`` (multi-tensor), each rectified step on CPU float32 parameters made
    by torch's fused Adam kernel."""

    def __init__(self, params, lr: float = 1e-3, eps: float = 1e-8) -> None:
        super().__init__(params, lr=lr, eps=eps, foreach=True)
        self.fused_on_cpu = _fused_adam_on_cpu()
        self.fused_steps = 0  # how many steps the fused kernel made (tests read it)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        plans = [self._fused_plan(group) for group in self.param_groups] if closure is None else []
        if not plans or any(plan is None for plan in plans):
            return super().step(closure)  # nothing was changed by the planning
        for plan in plans:
            tensors, scalars = plan
            steps = tensors[-1]
            torch._foreach_add_(steps, 1)
            torch._fused_adam_(*tensors[:4], [], steps, **scalars)
        self.fused_steps += 1
        return None

    def _fused_plan(self, group: dict) -> tuple[list[list[torch.Tensor]], dict] | None:
        """The fused kernel's tensors and scalars for ``group``'s next step, or None where torch's
        RAdam step must make it: a setting left to torch (weight decay, maximize, capturable,
        differentiable, a tensor learning rate), a tensor that is not a dense CPU float32 one,
        tensors of one parameter in different layouts (the kernel walks their memory in step),
        a first step (no state yet), steps not yet rectified, parameters whose step counts
        differ (one that got no gradient in some step keeps every later step with torch:
        slower, not wrong)."""
        if not self.fused_on_cpu or group["weight_decay"] != 0 or group.get("maximize"):
            return None
        if group.get("differentiable") or group.get("capturable"):
            return None
        if isinstance(group["lr"], torch.Tensor):
            return None
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state.get(p)
            if not state or p.grad.is_sparse or p.device.type != "cpu":
                return None
            if p.dtype != torch.float32 or p.grad.dtype != torch.float32:
                return None
            layouts = {t.stride() for t in (p, p.grad, state["exp_avg"], state["exp_avg_sq"])}
            if len(layouts) != 1:
                return None
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        if not params:
            return None
        done = {float(s) for s in steps}
        if len(done) != 1:  # parameters that skipped steps: each its own rectification
            return None
        t = done.pop() + 1
        beta1, beta2 = group["betas"]
        bias_correction2 = 1 - beta2**t
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * t * beta2**t / bias_correction2
        if rho_t <= 5.0:  # RAdam's unrectified step (momentum alone): torch's
            return None
        rect = math.sqrt(
            (rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)
        )
        scalars = dict(
            lr=group["lr"] * rect,
            beta1=beta1,
            beta2=beta2,
            weight_decay=0.0,
            eps=group["eps"] / math.sqrt(bias_correction2),
            amsgrad=False,
            maximize=False,
        )
        return [params, grads, exp_avgs, exp_avg_sqs, steps], scalars
