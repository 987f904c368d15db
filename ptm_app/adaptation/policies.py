"""Backbone policies: behaviours composed onto a module's freshly built backbone instead of stacked as mixins
(docs/design.md principle 10).

A module lists its policies (``PtmModule.make_policies``, from its settings); ``PtmModule.configure_model`` builds the
backbone, then runs each policy's ``apply`` in order, and every checkpoint save / load runs each policy's ``save`` /
``load``, so each policy saves and restores what it owns (the hooks: ``training.policy.BackbonePolicy``).  The
fine-tuning policies here:

* ``Delta``: parameter-efficient tuning (Ding et al. 2023 §3; ``backbones.delta``), with delta-only checkpoints
  (the frozen base is rebuilt from its source on load).
* ``FrozenFeatures``: a frozen backbone used as a feature extractor, its embedding layer, top layer or ELMo's
  scalar mix of all layers, under a task head of the module's task kind (Peters et al. 2018 §3.2–3.3; Qiu et al.
  2020 §5.2.2); checkpoints without the backbone.
* ``InitFrom``: stage chaining, weights (some sub-modules, optionally frozen) from an earlier stage, applied once
  when a fit builds the module (Howard & Ruder 2018 §3; ``adaptation.chaining``).
* ``L2SP``: the L2-SP penalty ``α/2·‖w − w⁰‖²`` pulling the pre-trained encoder towards its starting point
  against catastrophic forgetting (Li et al. 2018).

Compression's policies are ``compression.teacher_loss.TeacherLoss`` (knowledge distillation from a teacher) and
``compression.fake_quant.FakeQuant`` (Q8BERT's quantization-aware training).
"""
from __future__ import annotations

import logging

from dataclasses import asdict
from typing import Iterator, Optional

import torch
from torch import nn

from ptm_app.adaptation.chaining import InitFrom as InitFromSpec, apply_init_from, as_init_from, freeze_prefixes
from ptm_app.backbones.delta import (PROMPT_METHODS, DeltaSpec, apply_delta, as_delta_spec, delta_state_dict,
                                    trainable_report, transformers_model)
from ptm_app.backbones.layers import hidden_width
from ptm_app.backbones.scalar_mix import ScalarMix
from ptm_app.checkpoint_io.reading import CKPT_KEY, restore_frozen_base, strip_frozen_base
from ptm_app.errors import PtmError
from ptm_app.training.policy import BackbonePolicy


class Delta(BackbonePolicy):
    """Delta tuning: only the delta (+ head) trains.  ``delta_only`` checkpoints hold just those weights; a backbone
    built from a config alone (random weights) has no source to rebuild it from, so it keeps every weight."""

    def __init__(self, spec: DeltaSpec | dict, delta_only: bool = True, task_type: Optional[str] = None):
        """``task_type``: peft's task type when the module's model class has none of its own (``backbones.delta``'s
        ``backbones.model_classes.MODEL_CLASSES``), e.g. ``FEATURE_EXTRACTION`` for PET's masked LM, whose logits
        then cover the virtual positions too."""
        self.spec, self.delta_only, self.task_type = as_delta_spec(spec), delta_only, task_type

    def apply(self, module, fresh: bool, fitting: bool) -> None:
        if not fresh:
            return
        self.delta_only = self.delta_only and bool(module.hparams.backbone)
        module.backbone = apply_delta(module.backbone, self.spec, self.task_type or module.model_class)
        report = trainable_report(module.backbone)  # the console's model line shows the trainable share
        logging.getLogger(__name__).info(f"delta {self.spec.method}: {report['trainable']:,} of {report['total']:,} "
                                         f"parameters trainable ({report['percent']:.3f} %)")

    def virtual_positions(self) -> int:
        """Prefix, prompt and P-tuning put ``num_virtual_tokens`` before the input (Li & Liang 2021 §4.2; Lester et
        al. 2021 §2): they take position ids too, so they count against the backbone's limit."""
        return self.spec.num_virtual_tokens if self.spec.method in PROMPT_METHODS else 0

    def style(self) -> str:
        return self.spec.method

    def save(self, module, checkpoint: dict) -> None:
        # the module's own ``delta`` setting, or (derived from another setting: PET's soft_prompt_tokens) in the
        # checkpoint's ptm_app record, where export finds it (``backbones.from_checkpoint.checkpoint_delta``)
        owner = checkpoint["hyper_parameters"] if "delta" in module.hparams else checkpoint[CKPT_KEY]
        owner["delta"] = asdict(self.spec)
        if self.delta_only:  # the base is rebuilt from its source: keep only the delta (+ head) weights
            kept = {**fresh_state_dict(module.backbone), **delta_state_dict(module.backbone)}
            strip_frozen_base(checkpoint, kept, module.hparams.backbone, module.hparams.backbone_config)

    def load(self, module, checkpoint: dict) -> None:
        restore_frozen_base(checkpoint, module.backbone)  # frozen base + saved delta


def fresh_state_dict(backbone: nn.Module) -> dict[str, torch.Tensor]:
    """The backbone's tensors its source's files did not have (``ptm_missing_keys``: e.g. MiniLM's MLM head,
    initialised at random when built), by ``state_dict`` name: a rebuild from the source would draw them anew, so a
    delta-only checkpoint keeps them even when they are frozen."""
    model = transformers_model(backbone)
    missing = getattr(model, "ptm_missing_keys", ())
    if not missing:
        return {}
    prefix = next(name for name, sub in backbone.named_modules() if sub is model)
    state = backbone.state_dict()
    names = [f"{prefix}.{key}" if prefix else key for key in missing]
    return {name: state[name].detach().clone() for name in names if name in state}


REPRESENTATIONS = ("embedding", "top", "scalar_mix")
POOLINGS = ("cls", "mean")


class FrozenFeatures(BackbonePolicy):
    """Feature extraction on any task module: a frozen backbone (``requires_grad=False``, always in eval mode, run
    without gradients, built as the plain encoder ``base``) gives the embedding layer, the top layer or ELMo's scalar
    mix ``γ Σ s_j h_j`` (``module.mix``), and a task model on top (``module.task_head``: a linear layer, or a
    one-hidden-layer ReLU MLP with ``head_hidden``) gives the task kind's outputs (Peters et al. 2018 §3.2–3.3; Qiu
    et al. 2020 §5.2.2–5.2.3).  The head's width and what it reads come from the module's task kind
    (``task_kinds.parts``: the pooled sequence, ``pooling`` ``cls`` or ``mean`` over the real tokens, or every token);
    the mix and the head are the only parts that learn.  A backbone loaded from a source is not stored in
    checkpoints but rebuilt from it on load; one built from ``backbone_config`` alone (random weights) is kept."""

    model_class = "base"
    backbone_without_grad = True

    def __init__(self, representation: str = "scalar_mix", include_layer0: bool = True, do_layer_norm: bool = False,
                 pooling: str = "mean", head_hidden: Optional[int] = None, dropout: float = 0.1):
        if representation not in REPRESENTATIONS:
            raise PtmError(f"representation '{representation}' is unknown; use one of {', '.join(REPRESENTATIONS)}")
        if pooling not in POOLINGS:
            raise PtmError(f"pooling '{pooling}' is unknown; use cls or mean")
        self.representation, self.include_layer0, self.do_layer_norm = representation, include_layer0, do_layer_norm
        self.pooling, self.head_hidden, self.dropout = pooling, head_hidden, dropout

    @classmethod
    def from_settings(cls, hparams) -> Optional["FrozenFeatures"]:
        """The policy a module's ``representation`` / ``include_layer0`` / ``do_layer_norm`` / ``pooling`` /
        ``head_hidden`` / ``dropout`` settings ask for (None without ``representation``)."""
        if hparams.get("representation") is None:
            return None
        return cls(hparams["representation"], hparams.get("include_layer0", True), hparams.get("do_layer_norm", False),
                   hparams.get("pooling", "mean"), hparams.get("head_hidden"), hparams.get("dropout", 0.1))

    def apply(self, module, fresh: bool, fitting: bool) -> None:
        module.hparams.setdefault("gradient_checkpointing", False)  # not a setting: no gradients flow in the backbone
        module.backbone.requires_grad_(False)
        module.backbone.eval()
        if getattr(module, "mix", None) is None:
            layers = module.backbone.config.num_hidden_layers + 1
            module.mix = (ScalarMix(layers, self.include_layer0, self.do_layer_norm)
                          if self.representation == "scalar_mix" else None)
        if getattr(module, "task_head", None) is None:
            module.task_head = task_head(self.width(module.backbone), module.kind.width(module.task_labels()),
                                         self.head_hidden, self.dropout)

    def train_mode(self, module, mode: bool) -> None:
        if module.backbone is not None:
            module.backbone.eval()  # only the task model switches modes

    @staticmethod
    def width(backbone) -> int:
        """The feature width (``backbones.layers.hidden_width``)."""
        return hidden_width(backbone)

    def token_features(self, module, batch: dict) -> torch.Tensor:
        """Per-token features [B, T, D] of the chosen representation (gradients reach only the mix).  An
        encoder–decoder (BART, T5, MASS) gives its encoder's layers: the features of its input text."""
        model, inputs = module.backbone, module.model_inputs(batch)
        if getattr(model.config, "is_encoder_decoder", False):
            model = model.get_encoder()
            inputs.pop("token_type_ids", None)
        with torch.no_grad():
            out = model(**inputs, output_hidden_states=self.representation != "top")
        if self.representation == "embedding":
            return out.hidden_states[0]
        if self.representation == "top":
            return out.last_hidden_state
        return module.mix(out.hidden_states, batch["attention_mask"])

    def pooled(self, states: torch.Tensor, batch: dict) -> torch.Tensor:
        """Features [B, D] of each sequence: its first token's (``cls``) or the mean over its real tokens."""
        if self.pooling == "cls":
            return states[:, 0]
        keep = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
        return (states * keep).sum(1) / keep.sum(1).clamp(min=1)

    def forward(self, module, batch: dict):
        """The kind's outputs from the task head on the features: label scores, tag scores, or (start, end) logits
        (in fp32, as ``QuestionAnsweringModule``'s)."""
        kind = module.kind
        states = self.token_features(module, batch)
        if kind.reads != "tokens":
            states = self.pooled(states, batch)
        out = kind.outputs(module.task_head(states), batch)
        return tuple(o.float() for o in out) if isinstance(out, tuple) else out

    def style(self) -> str:
        layer0 = "" if self.representation != "scalar_mix" else (" incl. layer 0" if self.include_layer0 else " excl. layer 0")
        return f"frozen features: {self.representation.replace('_', ' ')}{layer0}"

    def save(self, module, checkpoint: dict) -> None:
        if module.hparams.backbone:  # random weights from a config have nothing to be rebuilt from
            strip_frozen_base(checkpoint, {}, module.hparams.backbone, module.hparams.backbone_config)

    def load(self, module, checkpoint: dict) -> None:
        restore_frozen_base(checkpoint, module.backbone)  # rebuilt frozen base + saved head


def task_head(width: int, outputs: int, hidden: Optional[int], dropout: float) -> nn.Sequential:
    """Linear layer, or a one-hidden-layer ReLU MLP when ``hidden`` is set."""
    if hidden is None:
        return nn.Sequential(nn.Dropout(dropout), nn.Linear(width, outputs))
    return nn.Sequential(nn.Dropout(dropout), nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(hidden, outputs))


class InitFrom(BackbonePolicy):
    """Start from an earlier stage's weights (``adaptation.chaining.InitFrom``).  Applied once, when a fit builds the
    module (before any restore: sharded strategies see the loaded weights); on ``--ckpt_path`` resume the restored
    checkpoint then replaces them, and ``load_from_checkpoint`` never applies it.  Its ``freeze`` always applies."""

    def __init__(self, spec: InitFromSpec | dict):
        self.spec = as_init_from(spec)
        self.pending = True

    def apply(self, module, fresh: bool, fitting: bool) -> None:
        if self.pending and fitting:
            apply_init_from(module, self.spec)
            self.pending = False
        else:
            freeze_prefixes(module.backbone, self.spec.freeze)

    def save(self, module, checkpoint: dict) -> None:
        checkpoint["hyper_parameters"]["init_from"] = asdict(self.spec)

    def load(self, module, checkpoint: dict) -> None:
        self.pending = False  # the weights come from the checkpoint


class L2SP(BackbonePolicy):
    """``α/2 · Σ ‖w − w⁰‖²`` over the trainable pre-trained encoder weights (not the new head), w⁰ their values when
    the fit starts (after ``InitFrom``, so list it after that policy); logged as ``train/l2_sp``."""

    def __init__(self, alpha: float):
        self.alpha = alpha

    def apply(self, module, fresh: bool, fitting: bool) -> None:
        if fitting and getattr(module, "l2_sp_anchor", None) is None:
            encoder = {id(p) for p in module.backbone.base_model.parameters()}
            module.l2_sp_anchor = WeightAnchor({n: p for n, p in module.backbone.named_parameters()
                                                if id(p) in encoder and p.requires_grad})

    def penalty(self, module) -> Optional[tuple[str, torch.Tensor]]:
        anchor = getattr(module, "l2_sp_anchor", None)
        if anchor is None:
            return None
        params = dict(module.backbone.named_parameters())
        return "l2_sp", 0.5 * self.alpha * sum(((params[n] - w0) ** 2).sum() for n, w0 in anchor.items())


class WeightAnchor(nn.Module):
    """Copies of weights as non-persistent buffers: they follow the module across devices, stay out of
    checkpoints and of the optimiser."""

    def __init__(self, weights: dict[str, torch.Tensor]):
        super().__init__()
        self.names = list(weights)
        for i, w in enumerate(weights.values()):
            self.register_buffer(f"w{i}", w.detach().clone(), persistent=False)

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        return zip(self.names, self.buffers())


def fine_tuning_policies(delta: Optional[DeltaSpec | dict] = None, delta_only: bool = True,
                         init_from: Optional[InitFromSpec | dict] = None, l2_sp: float = 0.0,
                         reshaping: tuple[BackbonePolicy, ...] = ()) -> list[BackbonePolicy]:
    """The policies a fine-tuning module's ``delta`` / ``delta_only`` / ``init_from`` / ``l2_sp`` settings ask for,
    in the order they apply: the delta on the fresh backbone, the earlier stage's weights, the policies that reshape
    the model (``reshaping``: pruning drops layers of the loaded weights), then the anchor of what trains."""
    policies: list[BackbonePolicy] = []
    if delta is not None:
        policies.append(Delta(delta, delta_only))
    if init_from is not None:
        policies.append(InitFrom(init_from))
    policies.extend(reshaping)
    if l2_sp:
        policies.append(L2SP(l2_sp))
    return policies
