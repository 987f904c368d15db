"""K-Adapter (Wang et al. 2021, Findings of ACL §3): knowledge-specific adapters on a frozen backbone, each trained
on its own task, combined for a downstream task by concatenating their outputs with the backbone's.

Here an adapter is one of ptm_app's named bottleneck adapters (``backbones.adapters``; Houlsby et al. 2019 §2.1),
trained by an ordinary delta-tuning run that names it: ``configs/knowledge/minilm_kadapter_factual_wordnet_kg.yaml`` (WordNet
relation classification between two entity mentions, ``wordnet_kg``) and ``minilm_kadapter_linguistic_brown_pos.yaml`` (Brown POS
tagging).  ``KAdapterModule`` loads those runs' adapters onto one frozen backbone; for each example it reads the
backbone's last hidden state with no adapter active and with each adapter active in turn (the adapters are
switchable, so one backbone serves all), and the task head reads ``[h; h_factual; h_linguistic]`` at [CLS]
(K-Adapter §3.2: "concatenate the output of the pre-trained model and the adapters").

Differs from the paper: its adapters are separate transformer stacks reading the hidden states of a few backbone
layers (0, 11, 23 of RoBERTa-large) and leaving the backbone's own pass untouched; ours sit inside every layer and
each costs a backbone pass.  Kept from the paper: the backbone is frozen while each adapter is trained alone on its
knowledge source (§3), and the downstream head sees the concatenation.  Downstream, the authors' scripts fine-tune
the backbone with the adapters frozen (``--freeze_bert="" --freeze_adapter=True``); here the backbone stays frozen
there too and only the head trains, so a K-Adapter run and its control (the same head on ``[h]`` alone) differ in
the adapters only.

A run's checkpoints hold the adapters and the head (the frozen base is rebuilt from its source); ``export`` writes
the base as a ``save_pretrained`` model and the adapters with the head as the module's own weights, so
``inference.export.load_exported_module`` (and ``predict --ckpt_path EXPORT``) rebuild the same model from the directory.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Optional

import torch
from torch import nn

from ptm_app.adaptation.chaining import resolve_path
from ptm_app.adaptation.task_module import TaskModule
from ptm_app.backbones.adapters import ADAPTER_KINDS, add_adapter, set_active_adapter
from ptm_app.backbones.delta import DeltaSpec, as_delta_spec
from ptm_app.checkpoint_io.reading import BACKBONE_PREFIX, CKPT_KEY, read_checkpoint, restore_frozen_base, strip_frozen_base
from ptm_app.data.collators import PadCollator
from ptm_app.errors import PtmError
from ptm_app.task_kinds.label_scores import label_metrics, positive_index
from ptm_app.training.optim import OptimConfig

PREFIX = "delta_adapters."


def trained_adapter(path: str, name: str) -> tuple[DeltaSpec, dict[str, torch.Tensor]]:
    """The spec and weights of adapter ``name`` trained by the run (or checkpoint) at ``path``."""
    where = resolve_path(path)
    ckpt = read_checkpoint(where)
    spec = as_delta_spec(ckpt.get("hyper_parameters", {}).get("delta"))
    if spec is None or spec.method not in ADAPTER_KINDS:
        raise PtmError(f"adapters.{name}: {where} was not trained with bottleneck adapters (delta.method "
                       f"{spec.method if spec else None}); train it with delta: {{method: houlsby, name: {name}}}")
    if spec.name != name:
        raise PtmError(f"adapters.{name}: no adapter named '{name}' in {where} (it has '{spec.name}'); use that "
                       f"name, or train the run with delta.name: {name}")
    key = f"{BACKBONE_PREFIX}{PREFIX}{name}."
    weights = {k[len(BACKBONE_PREFIX):]: v for k, v in ckpt["state_dict"].items() if k.startswith(key)}
    if not weights:
        raise PtmError(f"adapters.{name}: {where} holds no weights of adapter '{name}'")
    return spec, weights


class KAdapterModule(TaskModule):
    """Sequence classification over ``[backbone; adapter_1; ...]`` [CLS] states (see the module docstring).

    Args:
        backbone: the frozen backbone (the one the adapters were trained on, e.g. ``minilm``); backbone_config:
            overrides of its config (see ``PtmModule``).
        adapters: adapter name -> the run that trained it (a run name under the runs directory, a run directory
            or a ``.ckpt``); the run's ``delta.name`` must be that name.  In this order after the backbone's state.
        labels / positive_label / optim: as ``SequenceClassificationModule``.
        train_adapters: also fine-tune the loaded adapters (default: only the head learns).
        dropout: before the head.
        adapter_specs: filled in checkpoints (each adapter's ``DeltaSpec``), so a saved run rebuilds without the
            adapter runs; leave it null.
    """

    model_class = "base"
    task_kind = "sequence"

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 adapters: Optional[dict[str, str]] = None, labels: Optional[list[str]] = None, optim: OptimConfig = OptimConfig(lr=1e-3),
                 gradient_checkpointing: bool = False, train_adapters: bool = False, dropout: float = 0.1,
                 positive_label: Optional[str] = None, adapter_specs: Optional[dict[str, dict]] = None):
        if not adapters and not adapter_specs:
            raise PtmError("KAdapterModule needs model.init_args.adapters: {name: run that trained it, ...}")
        self.classifier = None
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)

    def can_build(self) -> bool:
        return super().can_build() and self.hparams.labels is not None

    def adapter_names(self) -> list[str]:
        return list(self.hparams.adapter_specs or self.hparams.adapters)

    def configure_model(self) -> None:
        fresh = self.backbone is None
        if fresh and self.hparams.labels is None and self.data_facts is not None:
            self.hparams.labels = self.data_facts.labels()
        super().configure_model()
        if not fresh:
            return
        self.backbone.requires_grad_(False)
        specs, self.specs = self.hparams.adapter_specs, {}
        for name in self.adapter_names():
            if specs:  # from a checkpoint: the weights come with its state dict
                spec, weights = as_delta_spec(specs[name]), None
            else:
                spec, weights = trained_adapter(self.hparams.adapters[name], name)
            add_adapter(self.backbone, name, spec.method, bottleneck=spec.bottleneck, reduction=spec.reduction,
                        activation=spec.activation, dropout=spec.dropout, heads=spec.heads)
            if weights is not None:
                missing, unexpected = self.backbone.load_state_dict(weights, strict=False)
                if unexpected or [k for k in missing if k.startswith(f"{PREFIX}{name}.")]:
                    raise PtmError(f"adapters.{name}: its weights do not fit this backbone; train it on the same "
                                   f"backbone ({self.hparams.backbone})")
            self.backbone.delta_adapters[name].requires_grad_(self.hparams.train_adapters)
            self.specs[name] = asdict(spec)
        set_active_adapter(self.backbone, None)
        labels = self.task_labels()
        if not labels:
            raise PtmError("KAdapterModule needs labels: set model.init_args.labels or use a TaskDataModule")
        hidden = self.backbone.config.hidden_size
        self.classifier = nn.Sequential(nn.Dropout(self.hparams.dropout),
                                        nn.Linear(hidden * (1 + len(self.adapter_names())), len(labels)))

    def build_metrics(self):
        labels = self.task_labels()
        return label_metrics(len(labels), positive_index(labels, self.hparams.get("positive_label")))

    def make_collator(self, tokenizer, seed: int = 0) -> PadCollator:
        return PadCollator(pad_token_id=tokenizer.pad_token_id)

    def features(self, batch: dict) -> torch.Tensor:
        """``[h; h_adapter...]``: the last layer's [CLS] state with no adapter, then with each adapter active."""
        inputs = self.model_inputs(batch)
        states = []
        try:
            for name in [None, *self.adapter_names()]:
                set_active_adapter(self.backbone, name)
                trains = name is not None and self.hparams.train_adapters and self.training
                with torch.set_grad_enabled(trains and torch.is_grad_enabled()):
                    states.append(self.backbone(**inputs).last_hidden_state[:, 0])
        finally:
            set_active_adapter(self.backbone, None)
        return torch.cat(states, dim=-1)

    def forward(self, batch: dict) -> torch.Tensor:
        return self.classifier(self.features(batch))

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        """Every label's probability, as ``SequenceClassificationModule`` (``predict`` writes the rows)."""
        return {"keys": batch["keys"], "probs": torch.softmax(self(batch).float(), dim=-1).cpu()}

    def train(self, mode: bool = True):
        super().train(mode)
        if self.backbone is not None and not self.hparams.train_adapters:
            self.backbone.eval()  # frozen: no dropout in its features
        return self

    # -- checkpoints: the adapters and the head, not the frozen base ------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["hyper_parameters"]["adapter_specs"] = self.specs
        kept = {k: v for k, v in self.backbone.state_dict().items() if k.startswith(PREFIX)}
        strip_frozen_base(checkpoint, kept, self.hparams.backbone, None)
        # export: the frozen base is the save_pretrained model; the adapters go with the head in the module's
        # own weights (export.save_module_weights), and export.load_exported_module rebuilds the whole module
        checkpoint[CKPT_KEY]["module_backbone_keys"] = [BACKBONE_PREFIX + PREFIX]

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        restore_frozen_base(checkpoint, self.backbone)
        super().on_load_checkpoint(checkpoint)
