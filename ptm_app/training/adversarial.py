"""FreeLB (Zhu et al. 2020, "FreeLB: Enhanced Adversarial Training for Natural Language Understanding", Alg. 1):
adversarial training in the word-embedding space, the defence ``attack`` measures against.

Each training step starts from a random perturbation ``δ_0 = U(-1, 1) · σ / √(L·d)`` of the word embeddings (L: the
example's tokens, d: the width; padding never perturbed), then takes K ascent steps
``δ_t = δ_{t-1} + α · g / ‖g‖_F`` (g = ∇_δ L(X + δ_{t-1}), per example; projected onto ‖δ‖_F ≤ ε when ε > 0).
The parameters' gradient is the mean over the K steps of ``∇_θ L(X + δ_{t-1})`` — the "free" accumulation of
Alg. 1 — so the loss returned is ``(1/K) Σ_t L(X + δ_{t-1})`` with each δ held fixed.  A step costs K forward and
backward passes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ptm_app.errors import PtmError


@dataclass
class FreeLB:
    """FreeLB's settings (Zhu et al. 2020 §3; their GLUE values: K 2-3, α 1e-1, σ 1e-1 to 6e-1).

    Args:
        steps: K, ascent steps (and forward/backward passes) per training step.
        step_size: α, the ascent step's Frobenius norm per example.
        init_mag: σ, the random start's magnitude (0: start at δ = 0).
        max_norm: ε, the largest ‖δ‖_F per example (0: unbounded, as FreeLB's GLUE runs).
    """

    steps: int = 2
    step_size: float = 0.1
    init_mag: float = 0.1
    max_norm: float = 0.0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.step_size <= 0 or self.init_mag < 0 or self.max_norm < 0:
            raise PtmError(f"adversarial: steps must be >= 1, step_size > 0, init_mag and max_norm >= 0 (got {self})")


def _project(delta: torch.Tensor, max_norm: float) -> torch.Tensor:
    norm = delta.flatten(1).norm(dim=1).clamp_min(1e-12)
    return delta * (max_norm / norm).clamp(max=1.0)[:, None, None]


def freelb_loss(cfg: FreeLB, embeddings: torch.nn.Module, batch: dict,
                loss_of: Callable[[dict], torch.Tensor]) -> torch.Tensor:
    """The FreeLB training loss of one batch; ``loss_of(batch)`` runs the model on ``batch["inputs_embeds"]``."""
    word = embeddings(batch["input_ids"])
    mask = batch["attention_mask"].to(word.dtype)[..., None] if "attention_mask" in batch \
        else torch.ones_like(word[..., :1])
    dims = mask.sum((1, 2)) * word.shape[-1]
    delta = torch.empty_like(word).uniform_(-1, 1) * mask * (cfg.init_mag / dims.clamp_min(1).sqrt())[:, None, None]
    if cfg.max_norm > 0:
        delta = _project(delta, cfg.max_norm)
    total = word.new_zeros(())
    for t in range(cfg.steps):
        delta.requires_grad_(True)
        inputs = {k: v for k, v in batch.items() if k != "input_ids"}
        loss = loss_of({**inputs, "inputs_embeds": word + delta}) / cfg.steps
        total = total + loss
        if t == cfg.steps - 1:
            break
        (grad,) = torch.autograd.grad(loss, delta, retain_graph=True)
        norm = grad.flatten(1).norm(dim=1).clamp_min(1e-12)
        delta = (delta + cfg.step_size * grad / norm[:, None, None]).detach() * mask
        if cfg.max_norm > 0:
            delta = _project(delta, cfg.max_norm)
    return total
