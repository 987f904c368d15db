"""Layer index of every parameter, for layer-wise learning rates and (un)freezing schedules
(ULMFiT, Howard & Ruder 2018 §3.2–3.3).

Index 0 = the embeddings, k+1 = encoder block k, L+1 = everything else (pooler, task head, and any
module of a LightningModule outside its ``.backbone``).  Works for transformers encoders/decoders whose
blocks sit in one ``nn.ModuleList`` of ``config.num_hidden_layers`` entries (bert, roberta, electra,
distilbert, gpt2, xlnet, the ELMo BiLSTM) and for ALBERT's shared layer groups.
"""
from __future__ import annotations

from torch import nn

from ptm_app.errors import PtmError


def _backbone(model: nn.Module) -> tuple[nn.Module, str]:
    """The transformers model and its name prefix inside ``model`` (a LightningModule or the model itself)."""
    backbone = getattr(model, "backbone", None)
    return (backbone, "backbone.") if isinstance(backbone, nn.Module) else (model, "")


def hidden_width(model: nn.Module) -> int:
    """The width of a transformers model's hidden states (the BiLSTM's ``[h→; h←]`` is ``output_dim``)."""
    return getattr(model.config, "output_dim", None) or model.config.hidden_size


def num_layers(model: nn.Module) -> int:
    """L, the number of blocks (``config.num_hidden_layers``) of ``model`` or of its ``.backbone``."""
    backbone, _ = _backbone(model)
    n = getattr(getattr(backbone, "config", None), "num_hidden_layers", None)
    if not isinstance(n, int) or n < 1:
        raise PtmError(f"{type(backbone).__name__} has no config.num_hidden_layers: layer-wise learning rates and "
                       f"unfreezing need a transformers backbone")
    return n


def block_paths(backbone: nn.Module, n: int) -> dict[str, int]:
    """Module path of every block → its layer index (1..L): the entries of each ``nn.ModuleList`` of L modules
    (XLM keeps four such lists, one per sub-layer kind), and ALBERT's shared layer groups; {} if none."""
    blocks: dict[str, int] = {}
    for path, module in backbone.named_modules():
        if not isinstance(module, nn.ModuleList) or any(path.startswith(b + ".") for b in blocks):
            continue
        if path.endswith("albert_layer_groups"):  # ALBERT's shared groups: group g serves layers up to (g+1)·L/G
            blocks.update({f"{path}.{g}": (g + 1) * n // len(module) for g in range(len(module))})
        elif len(module) == n:
            blocks.update({f"{path}.{k}": k + 1 for k in range(n)})
    return blocks


def _blocks(backbone: nn.Module, n: int) -> dict[str, int]:
    blocks = block_paths(backbone, n)
    if not blocks:
        raise PtmError(f"cannot find the {n} layers of {type(backbone).__name__}; layer-wise learning rates and "
                       f"unfreezing support bert/roberta/electra/albert/distilbert/gpt2/xlnet/ptm_bilstm_lm backbones")
    return blocks


def _is_embedding(name: str) -> bool:
    return any("emb" in part or part in ("wte", "wpe") for part in name.split("."))


def layer_ids(model: nn.Module) -> dict[str, int]:
    """``{parameter name: layer index}`` over ``model.named_parameters()`` (tied weights appear once)."""
    backbone, prefix = _backbone(model)
    n = num_layers(model)
    blocks = _blocks(backbone, n)
    ids = {}
    for name, _ in model.named_parameters():
        if not name.startswith(prefix):
            ids[name] = n + 1
            continue
        inner = name[len(prefix):]
        block = next((i for path, i in blocks.items() if inner.startswith(path + ".")), None)
        ids[name] = block if block is not None else 0 if _is_embedding(inner) else n + 1
    return ids
