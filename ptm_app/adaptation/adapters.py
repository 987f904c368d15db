"""Hand-written bottleneck adapters and PALs for BERT-family encoders (peft has none: survey T18).

- Houlsby et al. 2019 §2.1: a bottleneck adapter after the attention output projection and one after
  the FFN output projection of every layer, both before the residual LayerNorm.
- Pfeiffer et al. 2021 (AdapterFusion) §3: one adapter per layer, after the FFN output projection.
- Stickland & Murray 2019 §3 (PALs): ``TS(h) = V_D · MHA(V_E · h)``, a low-dimensional multi-head
  self-attention in parallel with each layer; V_E / V_D are shared by all layers and the per-layer
  attention is not. As in the authors' code, ``TS(h)`` of the layer input ``h`` joins the FFN output
  inside the layer's last residual LayerNorm: ``LN(h' + FFN(h') + TS(h))`` (h' = attention sub-layer
  output; for BERT it joins before the hidden dropout). The authors' extra GELU after V_D is omitted.
- Several named adapters live side by side and one is active (K-Adapter, Wang et al. 2021 §3):
  ``add_adapter`` / ``set_active_adapter`` / ``list_adapters`` / ``remove_adapter``.

All adapter weights live under ``model.delta_adapters.<name>``: the backbone's own state-dict keys
do not change. Forward hooks on each layer's output projections run the active adapter; inactive
adapters are never called (exact identity). ALBERT shares its layer weights across depth, and so
its adapters are shared too (one set per distinct layer module).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch import nn
from transformers.activations import ACT2FN

from ptm_app.errors import PtmError

ADAPTER_KINDS = ("houlsby", "pfeiffer", "pals")


class Layout(NamedTuple):
    """Where adapters go in one model family (paths are ``get_submodule`` names)."""

    layers: str  # the layer list, from the base model; "*" iterates a ModuleList
    attention: str  # in a layer: the self-attention block, called with (hidden_states, attention_mask)
    attn_out: str  # in a layer: the attention output projection
    ffn_out: str  # in a layer: the FFN output projection


_BERT_LAYOUT = Layout("encoder.layer", "attention", "attention.output.dense", "output.dense")
LAYOUTS: dict[str, Layout] = {
    "bert": _BERT_LAYOUT,  # also MiniLM
    "roberta": _BERT_LAYOUT,
    "xlm-roberta": _BERT_LAYOUT,
    "camembert": _BERT_LAYOUT,
    "electra": _BERT_LAYOUT,
    "albert": Layout("encoder.albert_layer_groups.*.albert_layers", "attention", "attention.dense", "ffn_output"),
    "distilbert": Layout("transformer.layer", "attention", "attention.out_lin", "ffn.lin2"),
}


class BottleneckAdapter(nn.Module):
    """``x + W_up · f(W_down · x)`` (Houlsby et al. 2019 §2.1, Fig. 2). ``W_up`` and its bias start at
    zero, so a new adapter is exactly the identity."""

    def __init__(self, hidden: int, bottleneck: int, activation: str = "relu", dropout: float = 0.0):
        super().__init__()
        self.down = nn.Linear(hidden, bottleneck)
        self.act = ACT2FN[activation]
        self.dropout = nn.Dropout(dropout)
        self.up = nn.Linear(bottleneck, hidden)
        nn.init.normal_(self.down.weight, std=1e-2)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.up(self.dropout(self.act(self.down(x))))


class ProjectedAttention(nn.Module):
    """Multi-head self-attention in the projected space, without an output matrix (V_D plays that
    role; Stickland & Murray 2019 §3.3)."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.query, self.key, self.value = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        batch, length, dim = x.shape
        split = lambda t: t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2)  # noqa: E731
        if mask is not None and mask.dtype != torch.bool:
            mask = mask.to(x.dtype)  # additive float mask (eager attention); bool masks come from sdpa
        out = nn.functional.scaled_dot_product_attention(
            split(self.query(x)), split(self.key(x)), split(self.value(x)), attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0)
        return out.transpose(1, 2).reshape(batch, length, dim)


class ProjectedAttentionLayers(nn.Module):
    """PALs for every layer: shared ``encoder`` (V_E) and ``decoder`` (V_D, zero-initialised, so the
    parallel path starts at 0) and one ``ProjectedAttention`` per layer (Stickland & Murray 2019 §3.3)."""

    def __init__(self, hidden: int, dim: int, heads: int, num_layers: int, dropout: float = 0.0):
        super().__init__()
        self.encoder = nn.Linear(hidden, dim)
        self.attention = nn.ModuleList(ProjectedAttention(dim, heads, dropout) for _ in range(num_layers))
        self.decoder = nn.Linear(dim, hidden)
        nn.init.zeros_(self.decoder.weight)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, layer: int, hidden: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        return self.decoder(self.attention[layer](self.encoder(hidden), mask))


class AdapterSet(nn.Module):
    """One named adapter: ``attn``/``ffn`` bottleneck adapters per layer, or ``pals``."""

    def __init__(self, kind: str, hidden: int, num_layers: int, bottleneck: int, activation: str,
                 dropout: float, heads: int):
        super().__init__()
        self.kind = kind
        make = lambda: nn.ModuleList(BottleneckAdapter(hidden, bottleneck, activation, dropout)  # noqa: E731
                                     for _ in range(num_layers))
        self.attn = make() if kind == "houlsby" else None
        self.ffn = make() if kind in ("houlsby", "pfeiffer") else None
        self.pals = ProjectedAttentionLayers(hidden, bottleneck, heads, num_layers, dropout) if kind == "pals" else None


class AdapterBank(nn.ModuleDict):
    """All named adapters of one backbone (``model.delta_adapters``) and the hooks that run the active one."""

    def __init__(self, layers: list[nn.Module], layout: Layout):
        super().__init__()
        self.active: Optional[str] = None
        # the layer input (hidden, mask) for PALs, taken from the attention block's call: inside the
        # layer's forward, so activation checkpointing's recompute captures it again
        self._pal_input: Optional[tuple] = None
        self._handles = []
        for i, layer in enumerate(layers):
            self._handles += [
                layer.get_submodule(layout.attention).register_forward_pre_hook(_Hook(self, "capture", i),
                                                                                with_kwargs=True),
                layer.get_submodule(layout.attn_out).register_forward_hook(_Hook(self, "after_attention", i)),
                layer.get_submodule(layout.ffn_out).register_forward_hook(_Hook(self, "after_ffn", i)),
            ]

    def current(self) -> Optional[AdapterSet]:
        return self[self.active] if self.active is not None else None

    def capture(self, i: int, module: nn.Module, args: tuple, kwargs: dict) -> None:
        current = self.current()
        if current is not None and current.pals is not None:
            hidden = args[0] if args else kwargs["hidden_states"]
            mask = args[1] if len(args) > 1 else kwargs.get("attention_mask")
            self._pal_input = (hidden, mask)

    def after_attention(self, i: int, module: nn.Module, args: tuple, output: torch.Tensor):
        current = self.current()
        return current.attn[i](output) if current is not None and current.attn is not None else None

    def after_ffn(self, i: int, module: nn.Module, args: tuple, output: torch.Tensor):
        current = self.current()
        if current is None:
            return None
        if current.ffn is not None:
            output = current.ffn[i](output)
        if current.pals is not None:
            (hidden, mask), self._pal_input = self._pal_input, None
            output = output + current.pals(i, hidden, mask)
        return output

    def remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()


class _Hook:
    """A picklable, deep-copyable hook: ``bank.<method>(layer, ...)``."""

    def __init__(self, bank: AdapterBank, method: str, layer: int):
        self.bank, self.method, self.layer = bank, method, layer

    def __call__(self, *args):
        return getattr(self.bank, self.method)(self.layer, *args)


def _layers(base: nn.Module, path: str) -> list[nn.Module]:
    found = [base]
    for part in path.split("."):
        found = [child for module in found for child in module] if part == "*" else \
                [module.get_submodule(part) for module in found]
    return [layer for container in found for layer in container]


def _bank(model: nn.Module, create: bool = False) -> Optional[AdapterBank]:
    bank = getattr(model, "delta_adapters", None)
    if bank is not None or not create:
        return bank
    model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    if model_type not in LAYOUTS:
        raise PtmError(f"bottleneck adapters / PALs support model types {', '.join(LAYOUTS)}, not '{model_type}'; "
                       "use delta method lora, ia3, prefix, prompt, ptuning or bitfit for it")
    layout = LAYOUTS[model_type]
    model.delta_adapters = AdapterBank(_layers(model.base_model, layout.layers), layout)
    return model.delta_adapters


def add_adapter(model: nn.Module, name: str, kind: str = "houlsby", *, bottleneck: int = 64,
                reduction: Optional[int] = None, activation: str = "relu", dropout: float = 0.0,
                heads: Optional[int] = None) -> AdapterSet:
    """Add adapter ``name`` of ``kind`` (houlsby | pfeiffer | pals) to a BERT-family model and make it
    active. ``reduction`` (hidden / bottleneck, Pfeiffer et al. §3) overrides ``bottleneck``; for PALs
    ``bottleneck`` is the projected size and ``heads`` defaults to gcd(bottleneck, backbone heads)
    (the paper: 204 dims, 12 heads). Parameters are left trainable; ``delta.apply_delta`` freezes the rest."""
    if kind not in ADAPTER_KINDS:
        raise PtmError(f"adapter kind '{kind}' is unknown; use one of {', '.join(ADAPTER_KINDS)}")
    if activation not in ACT2FN:
        raise PtmError(f"adapter activation '{activation}' is unknown; use one of {', '.join(ACT2FN)}")
    bank = _bank(model, create=True)
    if name in bank:
        raise PtmError(f"adapter '{name}' already exists; pick another name or remove_adapter it first")
    config = model.config
    hidden = config.hidden_size
    size = hidden // reduction if reduction else bottleneck
    if size < 1:
        raise PtmError(f"adapter bottleneck must be >= 1 (got {size}); lower 'reduction' or raise 'bottleneck'")
    heads = heads or math.gcd(size, config.num_attention_heads)
    if kind == "pals" and size % heads:
        raise PtmError(f"PALs: bottleneck {size} is not divisible by heads={heads}; change one of them")
    if kind == "pals" and getattr(config, "chunk_size_feed_forward", 0):
        raise PtmError("PALs need the whole FFN output at once; set the backbone's chunk_size_feed_forward to 0")
    num_layers = len(_layers(model.base_model, LAYOUTS[config.model_type].layers))
    reference = next(model.parameters())
    adapter = AdapterSet(kind, hidden, num_layers, size, activation, dropout, heads)
    bank[name] = adapter.to(device=reference.device, dtype=reference.dtype).train(model.training)
    bank.active = name
    return adapter


def set_active_adapter(model: nn.Module, name: Optional[str]) -> None:
    """Run adapter ``name`` from now on; ``None`` runs none (the plain backbone)."""
    bank = _bank(model)
    if name is not None and (bank is None or name not in bank):
        raise PtmError(f"no adapter named '{name}'; this model has {sorted(bank) if bank is not None else 'none'}")
    if bank is not None:
        bank.active = name


def list_adapters(model: nn.Module) -> dict[str, str]:
    """``{name: kind}`` of the model's adapters (the active one is ``model.delta_adapters.active``)."""
    bank = _bank(model)
    return {name: adapter.kind for name, adapter in bank.items()} if bank is not None else {}


def remove_adapter(model: nn.Module, name: str) -> None:
    """Delete adapter ``name``; removing the last one restores the plain model (no hooks, no extra keys)."""
    bank = _bank(model)
    if bank is None or name not in bank:
        raise PtmError(f"no adapter named '{name}'; this model has {sorted(bank) if bank is not None else 'none'}")
    del bank[name]
    if bank.active == name:
        bank.active = None
    if not len(bank):
        bank.remove_hooks()
        del model.delta_adapters
