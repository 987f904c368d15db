"""Attention-head importance (Michel et al. 2019 §4.1): ``I_h = E_x |∂L(x)/∂ξ_h|`` for a gate ``ξ_h = 1``
multiplying head h's output, accumulated over held-out batches (the absolute value is taken per batch, as in the
authors' code), then normalised per layer by the ℓ2 norm (§4.2).  The chosen heads are removed physically by
``backbones.pruned_heads`` (re-exported here)."""
from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Iterator

import torch
from torch import nn

from ptm_app.backbones.model_classes import load_pruned  # noqa: F401
from ptm_app.backbones.pruned_heads import (PrunedHeads, attention_blocks, head_size, heads_per_layer,  # noqa: F401
                                            is_head_pruned, kept_heads, prune_heads, recorded_pruned, restructure,
                                            unit_width)

__all__ = ["PrunedHeads", "attention_blocks", "head_size", "heads_per_layer", "is_head_pruned", "kept_heads",
           "load_pruned", "prune_heads", "recorded_pruned", "restructure", "unit_width", "head_gates",
           "michel_scores", "heads_to_prune"]


# -- gates and Michel et al.'s importance ------------------------------------------------------------------------------
@contextlib.contextmanager
def head_gates(model: nn.Module, gates: list[torch.Tensor]) -> Iterator[None]:
    """Multiply head h of layer i by ``gates[i][h]`` (Michel et al.'s ξ): the input of the attention output
    projection (the heads' concatenated outputs) is scaled per head (per key/value group of query heads under
    grouped-query attention: the unit ``prune_heads`` removes) while the context is active."""
    d = unit_width(model)

    def hook_for(gate: torch.Tensor) -> Callable:
        def scale(module, args):
            x = args[0]
            shape = x.shape
            return (x.reshape(*shape[:-1], -1, d) * gate.to(x.dtype)[:, None]).reshape(shape),
        return scale

    handles = [block.output.register_forward_pre_hook(hook_for(gate))
               for block, gate in zip(attention_blocks(model), gates)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def michel_scores(model: nn.Module, batches: Iterable[dict], loss_fn: Callable[[nn.Module, dict], torch.Tensor],
                  normalize: bool = True) -> list[torch.Tensor]:
    """``I_h = Σ_batches |∂L/∂ξ_h|`` per layer (a list of [heads_i] tensors), ℓ2-normalised per layer if
    ``normalize`` (Michel et al. 2019 §4.2).  Only the gates' gradients are computed (``torch.autograd.grad``):
    the model's own ``.grad`` fields are left untouched.  ``loss_fn(model, batch)`` returns the task loss."""
    gates = [torch.ones(n, requires_grad=True) for n in heads_per_layer(model)]
    scores = [torch.zeros(n) for n in heads_per_layer(model)]
    with head_gates(model, gates):
        for batch in batches:
            grads = torch.autograd.grad(loss_fn(model, batch), gates, allow_unused=True)
            for score, grad in zip(scores, grads):
                if grad is not None:
                    score += grad.detach().abs().float()
    if normalize:
        scores = [s / (s.norm() + 1e-20) for s in scores]
    return scores


def heads_to_prune(scores: list[torch.Tensor], count: int) -> dict[int, list[int]]:
    """The ``count`` lowest-scoring heads over all layers, never a layer's last head, as ``{layer: [positions]}``
    (positions in the layer's current head order); ties broken by layer then position."""
    ranked = sorted((float(s), i, j) for i, layer in enumerate(scores) for j, s in enumerate(layer))
    left = [len(layer) for layer in scores]
    chosen: dict[int, list[int]] = {}
    for _, i, j in ranked:
        if sum(len(v) for v in chosen.values()) >= count:
            break
        if left[i] > 1:
            chosen.setdefault(i, []).append(j)
            left[i] -= 1
    return {i: sorted(v) for i, v in chosen.items()}


