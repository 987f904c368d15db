"""Attention heads removed physically from BERT-style encoders (transformers 5 has no ``prune_heads``): head h's
rows of the query, key and value projections and its columns of the attention output projection are sliced out, so
the model is smaller and faster.  ``config.pruned_heads`` (``{"layer": [original head ids]}``, layers 0-based, as
transformers 4 recorded it) makes every load rebuild the same shapes (``restructure`` in ``heads.from_config``,
``load_pruned`` for ``save_pretrained`` directories).  Which heads to remove is ``compression.heads``' business.

BERT-style encoders only (``encoder.layer[i].attention.self.{query,key,value}`` and ``attention.output.dense``:
BERT, RoBERTa, ELECTRA, MiniLM), whose attention infers its head count from the projection width.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ptm_app.errors import PtmError

PrunedHeads = dict[int, list[int]]


def attention_blocks(model: nn.Module) -> list[nn.Module]:
    """Each layer's ``attention`` module (``.self`` holds Q/K/V, ``.output.dense`` the output projection)."""
    try:
        layers = model.base_model.encoder.layer
        blocks = [layer.attention for layer in layers]
        for block in blocks:
            block.self.query, block.self.key, block.self.value, block.output.dense
    except (AttributeError, TypeError):
        raise PtmError(f"head pruning needs a BERT-style encoder (encoder.layer[i].attention.self); "
                       f"{type(model).__name__} has none: use a bert/roberta/electra/minilm backbone") from None
    return blocks


def head_size(model: nn.Module) -> int:
    return model.config.hidden_size // model.config.num_attention_heads


def heads_per_layer(model: nn.Module) -> list[int]:
    """The number of heads each layer has now."""
    d = head_size(model)
    return [block.self.query.out_features // d for block in attention_blocks(model)]


def recorded_pruned(model: nn.Module) -> PrunedHeads:
    """``config.pruned_heads`` with integer keys (original head ids removed so far, per 0-based layer)."""
    return {int(k): sorted(int(h) for h in v) for k, v in (getattr(model.config, "pruned_heads", None) or {}).items()}


def kept_heads(model: nn.Module) -> list[list[int]]:
    """The original ids of the heads each layer still has (position j of layer i = original head kept[i][j])."""
    pruned, total = recorded_pruned(model), model.config.num_attention_heads
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
    recorded = recorded_pruned(model)
    for layer, positions in heads.items():
        if not positions:
            continue
        keep = [j for j in range(have[layer]) if j not in set(positions)]
        index = torch.cat([torch.arange(j * d, (j + 1) * d) for j in keep])
        attention = blocks[layer].self
        for linear in (attention.query, attention.key, attention.value):
            _slice_(linear.weight, index, 0, on_slice)
            if linear.bias is not None:
                _slice_(linear.bias, index, 0, on_slice)
            linear.out_features = len(index)
        dense = blocks[layer].output.dense
        _slice_(dense.weight, index, 1, on_slice)
        dense.in_features = len(index)
        attention.num_attention_heads = len(keep)
        attention.all_head_size = len(index)
        recorded[layer] = sorted(recorded.get(layer, []) + [kept[layer][j] for j in positions])
    model.config.pruned_heads = {str(k): v for k, v in sorted(recorded.items()) if v}


def restructure(model: nn.Module, on_slice: Callable | None = None) -> nn.Module:
    """A model freshly built from a config with ``pruned_heads`` given the pruned shapes (its weights are then
    loaded); a no-op for a config without them or a model already pruned."""
    recorded = recorded_pruned(model)
    if not recorded or sum(heads_per_layer(model)) < model.config.num_attention_heads * len(attention_blocks(model)):
        return model
    model.config.pruned_heads = {}
    prune_heads(model, recorded, on_slice)
    return model


def load_pruned(auto, directory, **kwargs) -> nn.Module:
    """``auto.from_pretrained(directory)`` for a head-pruned ``save_pretrained`` directory: the model is built from
    its config, restructured to the pruned shapes, and its safetensors weights loaded strictly."""
    import transformers
    from safetensors.torch import load_file
    from pathlib import Path

    config = transformers.AutoConfig.from_pretrained(directory, **kwargs)
    model = restructure(auto.from_config(config) if hasattr(auto, "from_config") else auto._from_config(config))
    state = {}
    for file in sorted(Path(directory).glob("*.safetensors")):
        if file.name.startswith("model"):
            state.update(load_file(str(file)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise PtmError(f"{directory}: weights do not fit the pruned config (missing {missing[:3]}, "
                       f"unexpected {unexpected[:3]}); export the run again")
    return model.eval()


def is_head_pruned(directory) -> bool:
    """Does the ``save_pretrained`` directory's config.json record pruned heads?"""
    import json
    from pathlib import Path

    path = Path(directory) / "config.json"
    try:
        return bool(json.loads(path.read_text()).get("pruned_heads")) if path.is_file() else False
    except (OSError, ValueError):
        return False
