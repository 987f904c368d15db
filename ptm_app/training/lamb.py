"""LAMB: layer-wise adaptive moments for large-batch training (You et al. 2020, "Large batch optimization for deep
learning: training BERT in 76 minutes", Algorithm 2); ALBERT's optimiser (Lan et al. 2020 §4.1).

Per parameter tensor ``x`` (a "layer" in the paper) at step ``t``::

    m = β1·m + (1-β1)·g            v = β2·v + (1-β2)·g²
    m̂ = m / (1-β1^t)               v̂ = v / (1-β2^t)
    r = m̂ / (√v̂ + ε)               u = r + λ·x
    x ← x - η · (‖x‖ / ‖u‖) · u    (the trust ratio is 1 where ‖x‖ or ‖u‖ is 0)

``φ`` is the identity, as in the paper's experiments.  A group with ``adapt: False`` skips the trust ratio (a plain
AdamW-style step ``x ← x - η·u``): the reference BERT implementation excludes biases and LayerNorm weights from
layer adaptation as it does from weight decay (``exclude_from_layer_adaptation``), since a zero-initialised bias
has ``‖x‖ = 0`` and would otherwise barely move.  torch ships no LAMB; the maintained ones need CUDA (apex,
DeepSpeed) or torchvision (timm), so this is written here and tested against the equations above."""
from __future__ import annotations

import torch


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2020, Algorithm 2).  ``weight_decay`` is λ, added to the update before the trust ratio."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, adapt: bool = True):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"invalid LAMB settings: lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, adapt=adapt))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.float()
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                state["step"] += 1
                t = state["step"].item()
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                update = (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt_().add_(group["eps"]))
                x = p.float()
                if group["weight_decay"]:
                    update.add_(x, alpha=group["weight_decay"])
                ratio = 1.0
                if group["adapt"]:
                    x_norm, u_norm = x.norm(), update.norm()
                    ratio = torch.where((x_norm > 0) & (u_norm > 0), x_norm / u_norm, torch.ones_like(x_norm))
                p.copy_(x - group["lr"] * ratio * update)
        return loss
