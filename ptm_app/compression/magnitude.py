"""Unstructured magnitude pruning (Han et al. 2015; Zhu & Gupta 2017, "To prune, or not to prune", §3).

The smallest-magnitude weights of the encoder's linear layers are set to zero, either ``global`` (one threshold over
all of them) or per ``layer`` (each weight matrix to the same sparsity), in one shot or gradually with Zhu & Gupta's
cubic schedule ``s_t = s_f + (s_i − s_f)(1 − (t − t0)/(nΔt))³`` for ``t ∈ {t0, t0+Δt, …, t0+nΔt}``.  The masks are
plain 0/1 tensors (kept as buffers by ``adaptation.compressed.PruningModule``, so a resumed run continues exactly);
pruned weights are zero in the weights themselves, so an export is permanently sparse.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ptm_app.errors import PtmError


@dataclass
class MagnitudeSpec:
    """Args:
        sparsity: s_f, the final fraction of prunable weights set to zero, in [0, 1).
        scope: ``global`` (one threshold over every prunable weight) or ``layer`` (each matrix to ``sparsity``).
        schedule: ``one_shot`` (prune to s_f at ``start_step``) or ``cubic`` (Zhu & Gupta over ``steps`` updates).
        initial_sparsity: s_i of the cubic schedule.
        start_step: t0, the global step of the first pruning.
        steps: n, the number of pruning updates after t0 (cubic).
        every: Δt, training steps between updates (cubic).
    """

    sparsity: float = 0.5
    scope: Literal["global", "layer"] = "global"
    schedule: Literal["one_shot", "cubic"] = "one_shot"
    initial_sparsity: float = 0.0
    start_step: int = 0
    steps: int = 10
    every: int = 10

    def __post_init__(self):
        for name in ("sparsity", "initial_sparsity"):
            value = getattr(self, name)
            if not 0.0 <= float(value) < 1.0:
                raise PtmError(f"pruning.magnitude.{name}={value} is outside [0, 1); give a fraction of weights to "
                               f"zero such as 0.5 or 0.9")
        if self.scope not in ("global", "layer"):
            raise PtmError(f"pruning.magnitude.scope={self.scope!r}: use 'global' or 'layer'")
        if self.schedule not in ("one_shot", "cubic"):
            raise PtmError(f"pruning.magnitude.schedule={self.schedule!r}: use 'one_shot' or 'cubic'")
        if self.schedule == "cubic" and (self.steps < 1 or self.every < 1):
            raise PtmError("pruning.magnitude: a cubic schedule needs steps >= 1 and every >= 1")

    def update_steps(self) -> list[int]:
        """The global steps at which the masks are recomputed."""
        if self.schedule == "one_shot":
            return [self.start_step]
        return [self.start_step + k * self.every for k in range(self.steps + 1)]

    def sparsity_at(self, step: int) -> float:
        """The sparsity the schedule asks for at global ``step`` (0 before ``start_step``)."""
        if step < self.start_step:
            return 0.0
        if self.schedule == "one_shot":
            return self.sparsity
        return cubic_sparsity(step, self.initial_sparsity, self.sparsity, self.start_step, self.steps, self.every)


def cubic_sparsity(step: int, initial: float, final: float, start: int, n: int, every: int) -> float:
    """Zhu & Gupta 2017 eq. (1) at the last update step ``t ≤ step`` of the grid ``t0 + kΔt`` (k = 0..n)."""
    if step < start:
        return 0.0
    k = min((step - start) // every, n)
    return final + (initial - final) * (1.0 - k / n) ** 3


def prunable_weights(model: nn.Module) -> dict[str, nn.Parameter]:
    """``{name: weight}`` of every ``nn.Linear`` inside the model's transformer blocks (embeddings, pooler and the
    task head stay dense, as in Zhu & Gupta's and nn-pruning's BERT recipes)."""
    from ptm_app.compression.students import layer_list_path

    prefix = layer_list_path(model) + "."
    found = {f"{name}.weight": module.weight for name, module in model.named_modules()
             if isinstance(module, nn.Linear) and name.startswith(prefix)}
    if not found:
        raise PtmError(f"magnitude pruning found no linear layer in {type(model).__name__}'s blocks")
    return found


def magnitude_masks(weights: dict[str, torch.Tensor], sparsity: float, scope: str) -> dict[str, torch.Tensor]:
    """0/1 masks zeroing exactly ``round(sparsity · count)`` smallest-|w| entries, over all weights (``global``)
    or in each weight (``layer``); ties are broken by position, so the count is exact."""
    def lowest(values: torch.Tensor, count: int) -> torch.Tensor:
        mask = torch.ones(values.numel(), dtype=torch.bool)
        if count > 0:
            mask[torch.argsort(values.flatten(), stable=True)[:count]] = False
        return mask

    if scope == "layer":
        return {name: lowest(w.detach().abs().float().cpu(), round(sparsity * w.numel())).view(w.shape).to(w.dtype)
                for name, w in weights.items()}
    flat = torch.cat([w.detach().abs().float().cpu().flatten() for w in weights.values()])
    keep = lowest(flat, round(sparsity * flat.numel()))
    masks, offset = {}, 0
    for name, w in weights.items():
        masks[name] = keep[offset:offset + w.numel()].view(w.shape).to(w.dtype)
        offset += w.numel()
    return masks


def sparsity_of(tensors) -> float:
    """The fraction of exact zeros over ``tensors``."""
    tensors = list(tensors)
    total = sum(t.numel() for t in tensors)
    return float(sum(int((t == 0).sum()) for t in tensors)) / max(total, 1)
