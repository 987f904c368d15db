"""Hand-written bottleneck adapters and PALs for encoders, decoders and encoder-decoders (peft has none:
survey T18).

- Houlsby et al. 2019 §2.1: a bottleneck adapter on the output of the attention projection and one on the
  output of the FFN projection of every layer, before the skip connection is added (for BERT: before the
  residual LayerNorm; for the pre-LN GPT-2 / Llama / T5: before ``residual + sublayer(LN(x))``).
- Pfeiffer et al. 2021 (AdapterFusion) §3: one adapter per layer, after the FFN output projection.
- Stickland & Murray 2019 §3 (PALs): ``TS(h) = V_D · MHA(V_E · h)``, a low-dimensional multi-head
  self-attention in parallel with each layer; V_E / V_D are shared by all layers and the per-layer
  attention is not. As in the authors' code, ``TS(h)`` of the layer input ``h`` joins the FFN output
  inside the layer's last residual: ``LN(h' + FFN(h') + TS(h))`` (h' = attention sub-layer output; for BERT
  it joins before the hidden dropout). In a pre-LN layer ``h`` is the normalised input the self-attention
  reads: ``h' + FFN(LN(h')) + TS(LN(h))``. The authors' extra GELU after V_D is omitted. In a decoder stack
  the PAL is causal (position t sees positions <= t) and has no KV cache: generate with ``use_cache=False``.
- Several named adapters live side by side and one is active (K-Adapter, Wang et al. 2021 §3):
  ``add_adapter`` / ``set_active_adapter`` / ``list_adapters`` / ``remove_adapter``.

All adapter weights live under ``model.delta_adapters.<name>``: the backbone's own state-dict keys
do not change. Forward hooks on each layer's output projections run the active adapter; inactive
adapters are never called (exact identity). ALBERT shares its layer weights across depth, and so
its adapters are shared too (one set per distinct layer module). An encoder-decoder gets adapters in
every layer of both stacks (self-attention and FFN; cross-attention is left alone), and a warm-started
``EncoderDecoderModel`` (BERT2BERT, Rothe et al. 2020) takes the layouts of its two halves.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch import nn
from transformers.activations import ACT2FN

from ptm_app.errors import PtmError

ADAPTER_KINDS = ("houlsby", "pfeiffer", "pals")


class Stack(NamedTuple):
    """One stack of layers in one model family (paths are ``get_submodule`` names)."""

    layers: str  # the layer list, from the base model; "*" iterates a ModuleList
    attention: str  # in a layer: the self-attention block; its call carries (hidden_states, mask)
    attn_out: str  # in a layer: the self-attention output projection
    ffn_out: str  # in a layer: the FFN output projection
    causal: bool = False  # a decoder stack (also any stack of a model whose config.is_decoder is set)
    mask: str = "attention_mask"  # the self-attention block's mask keyword


_BERT = (Stack("encoder.layer", "attention", "attention.output.dense", "output.dense"),)
_LLAMA = (Stack("layers", "self_attn", "self_attn.o_proj", "mlp.down_proj", causal=True),)
_T5_ATTENTION = ("layer.0.SelfAttention", "layer.0.SelfAttention.o")
LAYOUTS: dict[str, tuple[Stack, ...]] = {
    "bert": _BERT,  # also MiniLM
    "roberta": _BERT,
    "xlm-roberta": _BERT,
    "camembert": _BERT,
    "electra": _BERT,
    "albert": (Stack("encoder.albert_layer_groups.*.albert_layers", "attention", "attention.dense", "ffn_output"),),
    "distilbert": (Stack("transformer.layer", "attention", "attention.out_lin", "ffn.lin2"),),
    "gpt2": (Stack("h", "attn", "attn.c_proj", "mlp.c_proj", causal=True),),  # Conv1D projections
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "bart": (Stack("encoder.layers", "self_attn", "self_attn.out_proj", "fc2"),
             Stack("decoder.layers", "self_attn", "self_attn.out_proj", "fc2", causal=True)),
    "t5": (Stack("encoder.block", *_T5_ATTENTION, "layer.1.DenseReluDense.wo", mask="mask"),
           Stack("decoder.block", *_T5_ATTENTION, "layer.2.DenseReluDense.wo", causal=True, mask="mask")),
}
ENCODER_DECODER = "encoder-decoder"  # transformers' EncoderDecoderModel: the layouts of its two halves


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

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor], causal: bool = False) -> torch.Tensor:
        batch, length, dim = x.shape
        split = lambda t: t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2)  # noqa: E731
        if causal:
            mask = causal_mask(mask, length, x.device)
        elif mask is not None and mask.dtype != torch.bool:
            mask = mask.to(x.dtype)  # additive float mask (eager attention); bool masks come from sdpa
        out = nn.functional.scaled_dot_product_attention(
            split(self.query(x)), split(self.key(x)), split(self.value(x)), attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0)
        return out.transpose(1, 2).reshape(batch, length, dim)


def causal_mask(mask: Optional[torch.Tensor], length: int, device) -> torch.Tensor:
    """Boolean ``[.., length, length]``: position t sees the positions <= t that the layer's own mask allows
    (None, boolean, or additive float; 2-D or 4-D), and always itself, so a left-padding position attends to
    itself rather than to nothing (which would give NaN)."""
    allowed = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise PtmError("PALs need a tensor attention mask; load the backbone with attn_implementation "
                           "'sdpa' or 'eager'")
        keep = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
        keep = keep[:, None, None, :] if keep.dim() == 2 else keep
        allowed = allowed & keep[..., -length:, -length:]
    return allowed | torch.eye(length, dtype=torch.bool, device=device)


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

    def forward(self, layer: int, hidden: torch.Tensor, mask: Optional[torch.Tensor],
                causal: bool = False) -> torch.Tensor:
        return self.decoder(self.attention[layer](self.encoder(hidden), mask, causal))


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

    def __init__(self, layers: list[tuple[nn.Module, Stack, int]]):
        super().__init__()
        self.active: Optional[str] = None
        self.stacks = [(stack, local) for _, stack, local in layers]  # per global layer index
        # the layer input (hidden, mask, causal) for PALs, taken from the attention block's call: inside the
        # layer's forward, so activation checkpointing's recompute captures it again
        self._pal_input: Optional[tuple] = None
        self._handles = []
        for i, (layer, stack, _) in enumerate(layers):
            self._handles += [
                layer.get_submodule(stack.attention).register_forward_pre_hook(_Hook(self, "capture", i),
                                                                               with_kwargs=True),
                layer.get_submodule(stack.attn_out).register_forward_hook(_Hook(self, "after_attention", i)),
                layer.get_submodule(stack.ffn_out).register_forward_hook(_Hook(self, "after_ffn", i)),
            ]

    def current(self) -> Optional[AdapterSet]:
        return self[self.active] if self.active is not None else None

    def capture(self, i: int, module: nn.Module, args: tuple, kwargs: dict) -> None:
        current = self.current()
        if current is not None and current.pals is not None:
            stack, local = self.stacks[i]
            hidden = args[0] if args else kwargs["hidden_states"]
            mask = args[1] if len(args) > 1 else kwargs.get(stack.mask)
            cache = kwargs.get("past_key_values")
            if stack.causal and cache is not None and cache.get_seq_length(local) > 0:
                raise PtmError("PALs in a decoder keep no KV cache: call generate(..., use_cache=False)")
            self._pal_input = (hidden, mask, stack.causal)

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
            (hidden, mask, causal), self._pal_input = self._pal_input, None
            output = output + current.pals(i, hidden, mask, causal)
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


def _model_type(model: nn.Module) -> str:
    return getattr(getattr(model, "config", None), "model_type", type(model).__name__)


def _check_supported(model: nn.Module) -> None:
    model_type = _model_type(model)
    if model_type == ENCODER_DECODER:
        for half in (model.encoder, model.decoder):
            _check_supported(half)
    elif model_type not in LAYOUTS:
        raise PtmError(f"bottleneck adapters / PALs support model types {', '.join(LAYOUTS)} and "
                       f"{ENCODER_DECODER} models of them, not '{model_type}'; "
                       "use delta method lora, ia3, prefix, prompt, ptuning or bitfit for it")


def adapter_layers(model: nn.Module) -> list[tuple[nn.Module, Stack, int]]:
    """Every layer that gets adapters, with its stack (``causal`` resolved) and its index in the stack."""
    _check_supported(model)
    if _model_type(model) == ENCODER_DECODER:
        return adapter_layers(model.encoder) + adapter_layers(model.decoder)
    decoder = bool(getattr(model.config, "is_decoder", False))  # e.g. the decoder half of BERT2BERT
    return [(layer, stack._replace(causal=stack.causal or decoder), local)
            for stack in LAYOUTS[_model_type(model)]
            for local, layer in enumerate(_layers(model.base_model, stack.layers))]


def _bank(model: nn.Module, create: bool = False) -> Optional[AdapterBank]:
    bank = getattr(model, "delta_adapters", None)
    if bank is not None or not create:
        return bank
    model.delta_adapters = AdapterBank(adapter_layers(model))
    return model.delta_adapters


def _configs(model: nn.Module) -> list:
    config = model.config
    return [config.encoder, config.decoder] if config.model_type == ENCODER_DECODER else [config]


def add_adapter(model: nn.Module, name: str, kind: str = "houlsby", *, bottleneck: int = 64,
                reduction: Optional[int] = None, activation: str = "relu", dropout: float = 0.0,
                heads: Optional[int] = None) -> AdapterSet:
    """Add adapter ``name`` of ``kind`` (houlsby | pfeiffer | pals) to a model of a ``LAYOUTS`` family (or an
    ``EncoderDecoderModel`` of two) and make it active. ``reduction`` (hidden / bottleneck, Pfeiffer et al. §3)
    overrides ``bottleneck``; for PALs ``bottleneck`` is the projected size and ``heads`` defaults to
    gcd(bottleneck, backbone heads) (the paper: 204 dims, 12 heads). Parameters are left trainable;
    ``delta.apply_delta`` freezes the rest."""
    if kind not in ADAPTER_KINDS:
        raise PtmError(f"adapter kind '{kind}' is unknown; use one of {', '.join(ADAPTER_KINDS)}")
    if activation not in ACT2FN:
        raise PtmError(f"adapter activation '{activation}' is unknown; use one of {', '.join(ACT2FN)}")
    _check_supported(model)
    configs = _configs(model)
    hidden = configs[0].hidden_size
    if any(c.hidden_size != hidden for c in configs):
        raise PtmError(f"adapters need one hidden size, and this encoder-decoder has {configs[0].hidden_size} / "
                       f"{configs[1].hidden_size}; use delta method lora instead")
    size = hidden // reduction if reduction else bottleneck
    if size < 1:
        raise PtmError(f"adapter bottleneck must be >= 1 (got {size}); lower 'reduction' or raise 'bottleneck'")
    heads = heads or math.gcd(size, configs[0].num_attention_heads)
    if kind == "pals" and size % heads:
        raise PtmError(f"PALs: bottleneck {size} is not divisible by heads={heads}; change one of them")
    if kind == "pals" and any(getattr(c, "chunk_size_feed_forward", 0) for c in configs):
        raise PtmError("PALs need the whole FFN output at once; set the backbone's chunk_size_feed_forward to 0")
    bank = _bank(model, create=True)
    if name in bank:
        raise PtmError(f"adapter '{name}' already exists; pick another name or remove_adapter it first")
    reference = next(model.parameters())
    adapter = AdapterSet(kind, hidden, len(bank.stacks), size, activation, dropout, heads)
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
