"""Attention heads removed physically from BERT-style encoders (transformers 5 has no ``prune_heads``): head h's
rows of the query, key and value projections and its columns of the attention output projection are sliced out, so
the model is smaller and faster.  ``config.pruned_heads`` (``{"layer": [original head ids]}``, layers 0-based, as
transformers 4 recorded it) makes every load rebuild the same shapes (``restructure`` in ``heads.from_config``,
``backbones.model_classes.load_pruned`` for ``save_pretrained`` directories).  Which heads to remove is ``compression.heads``' business.

Two families, both of whose attention infers its head count from the projection widths:

* BERT-style encoders (``encoder.layer[i].attention.self.{query,key,value}`` and ``attention.output.dense``: BERT,
  RoBERTa, ELECTRA, MiniLM): a unit is one head;
* Llama-style decoders (``layers[i].self_attn.{q,k,v,o}_proj``: Llama, SmolLM2, Mistral, Qwen2) with grouped-query
  attention (Ainslie et al. 2023): a unit is one key/value head with the ``num_key_value_groups`` query heads that
  share it, so every layer keeps the uniform grouping its attention assumes (for multi-head attention, one head).

``heads_per_layer``, ``pruned_heads`` and the importance gates all count these units.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ptm_app.errors import PtmError

PrunedHeads = dict[int, list[int]]


@dataclass
class AttentionLayout:
    """One layer's attention as prunable units: unit j is rows ``[j·w, (j+1)·w)`` of each ``per_query`` projection
    and columns ``[j·w, (j+1)·w)`` of ``output`` (``w = group · head size``), and rows ``[j·d, (j+1)·d)`` of each
    ``per_key`` projection (Llama's K and V under grouped-query attention)."""

    module: nn.Module
    per_query: tuple[nn.Linear, ...]
    per_key: tuple[nn.Linear, ...]
    output: nn.Linear
    group: int = 1


def attention_blocks(model: nn.Module) -> list[AttentionLayout]:
    """Each layer's attention (see ``AttentionLayout``); other families are one line."""
    base = model.base_model
    try:
        if hasattr(base, "encoder"):
            return [AttentionLayout(layer.attention, (layer.attention.self.query, layer.attention.self.key,
                                                      layer.attention.self.value), (), layer.attention.output.dense)
                    for layer in base.encoder.layer]
        return [AttentionLayout(layer.self_attn, (layer.self_attn.q_proj,),
                                (layer.self_attn.k_proj, layer.self_attn.v_proj), layer.self_attn.o_proj,
                                layer.self_attn.num_key_value_groups)
                for layer in base.layers]
    except (AttributeError, TypeError):
        raise PtmError(f"head pruning needs a BERT-style encoder (encoder.layer[i].attention.self) or a Llama-style "
                       f"decoder (layers[i].self_attn.q_proj); {type(model).__name__} has neither: use a "
                       f"bert/roberta/electra/minilm or llama/smollm2 backbone") from None


def head_size(model: nn.Module) -> int:
    return getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads


def unit_width(model: nn.Module) -> int:
    """The width of one prunable unit in the output projection's input (group · head size)."""
    return attention_blocks(model)[0].group * head_size(model)


def units_per_layer(model: nn.Module) -> int:
    """Prunable units of an unpruned layer: its heads, or its key/value heads under grouped-query attention."""
    return model.config.num_attention_heads // attention_blocks(model)[0].group


def heads_per_layer(model: nn.Module) -> list[int]:
    """The number of units (heads; key/value groups under grouped-query attention) each layer has now."""
    w = unit_width(model)
    return [block.output.in_features // w for block in attention_blocks(model)]


def recorded_pruned(model: nn.Module) -> PrunedHeads:
    """``config.pruned_heads`` with integer keys (original head ids removed so far, per 0-based layer)."""
    return {int(k): sorted(int(h) for h in v) for k, v in (getattr(model.config, "pruned_heads", None) or {}).items()}


def kept_heads(model: nn.Module) -> list[list[int]]:
    """The original ids of the heads each layer still has (position j of layer i = original head kept[i][j])."""
    pruned, total = recorded_pruned(model), units_per_layer(model)
    return [[h for h in range(total) if h not in pruned.get(i, [])] for i in range(len(attention_blocks(model)))]


# -- physical removal -------------------------------------------------------------------------------------------------
def _slice_(param: nn.Parameter, index: torch.Tensor, dim: int, on_slice: Callable | None) -> None:
    """Keep ``index`` along ``dim`` of ``param`` in place (the Parameter object stays: an optimiser keeps it);
    ``on_slice(param, index, dim)`` lets the caller slice state kept for it (an optimiser's moments)."""
    if on_slice is not None:
        on_slice(param, index, dim)
    param.data = param.data.index_select(dim, index.to(param.device)).contiguous()


def prune_heads(model: nn.Module, heads: dict[int, list[int]], on_slice: Callable | None = None) -> None:
    """Remove ``heads`` (``{layer (0-based): [positions in the layer's current order]}``) physically, and record
    their original ids in ``config.pruned_heads``.  Refuses a layer that does not exist, a head it does not have,
    and a layer left with no head."""
    blocks, d = attention_blocks(model), head_size(model)
    have, kept = heads_per_layer(model), kept_heads(model)
    for layer, positions in heads.items():
        if not 0 <= layer < len(blocks):
            raise PtmError(f"head pruning names layer {layer}, but the model has layers 0..{len(blocks) - 1}; "
                           f"name layers that exist")
        bad = [h for h in positions if not 0 <= h < have[layer]]
        if bad or len(set(positions)) >= have[layer]:
            raise PtmError(f"cannot prune heads {sorted(positions)} of layer {layer}: it has {have[layer]} heads "
                           f"(0..{have[layer] - 1}) and must keep at least one; prune fewer heads")
    recorded, w = recorded_pruned(model), unit_width(model)
    for layer, positions in heads.items():
        if not positions:
            continue
        keep = [j for j in range(have[layer]) if j not in set(positions)]
        wide = torch.cat([torch.arange(j * w, (j + 1) * w) for j in keep])
        narrow = torch.cat([torch.arange(j * d, (j + 1) * d) for j in keep])
        block = blocks[layer]
        for linears, index in ((block.per_query, wide), (block.per_key, narrow)):
            for linear in linears:
                _slice_(linear.weight, index, 0, on_slice)
                if linear.bias is not None:
                    _slice_(linear.bias, index, 0, on_slice)
                linear.out_features = len(index)
        _slice_(block.output.weight, wide, 1, on_slice)
        block.output.in_features = len(wide)
        if hasattr(block.module, "self"):  # BERT's attention keeps its head count
            block.module.self.num_attention_heads = len(keep)
            block.module.self.all_head_size = len(wide)
        recorded[layer] = sorted(recorded.get(layer, []) + [kept[layer][j] for j in positions])
    model.config.pruned_heads = {str(k): v for k, v in sorted(recorded.items()) if v}


def restructure(model: nn.Module, on_slice: Callable | None = None) -> nn.Module:
    """A model freshly built from a config with ``pruned_heads`` given the pruned shapes (its weights are then
    loaded); a no-op for a config without them or a model already pruned."""
    recorded = recorded_pruned(model)
    if not recorded or sum(heads_per_layer(model)) < units_per_layer(model) * len(attention_blocks(model)):
        return model
    model.config.pruned_heads = {}
    prune_heads(model, recorded, on_slice)
    return model


def is_head_pruned(directory) -> bool:
    """Does the ``save_pretrained`` directory's config.json record pruned heads?"""
    import json
    from pathlib import Path

    path = Path(directory) / "config.json"
    try:
        return bool(json.loads(path.read_text()).get("pruned_heads")) if path.is_file() else False
    except (OSError, ValueError):
        return False
