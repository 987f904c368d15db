"""Full fine-tuning for sequence classification, single sentences or pairs
(BERT: Devlin et al. 2019 §4.1: the final [CLS] state feeds a new output layer), with stage chaining
(``init_from``) and the L2-SP penalty against catastrophic forgetting (Li et al. 2018)."""
from __future__ import annotations

from dataclasses import asdict
from typing import Iterator, Optional

import torch
from lightning.pytorch.trainer.states import TrainerFn

from ptm_app.adaptation.chaining import InitFrom, apply_init_from, as_init_from, freeze_prefixes
from ptm_app.adaptation.delta import DeltaSpec, apply_delta, as_delta_spec, delta_state_dict, trainable_report
from ptm_app.data.collators import PadCollator
from ptm_app.tasks.label_scores import LabelScoresMixin
from ptm_app.training.module import PtmModule
from ptm_app.training.optim import OptimConfig


class SequenceClassificationModule(LabelScoresMixin, PtmModule):
    """Fine-tune every weight of the backbone plus a fresh classification head.

    Logs ``val/acc``, ``val/f1_macro`` (and ``test/*``); ``predict`` yields labels and probabilities.

    Args:
        backbone: prepared name / local dir / exported run / hub id of the pretrained encoder.
        backbone_config: config overrides (e.g. ``classifier_dropout``), or a from-scratch config.
        labels: the label names in order; by default taken from the data module.
        optim: optimiser and schedule.
        l2_sp: α of the L2-SP penalty ``α/2·‖w − w⁰‖²`` (Li et al. 2018) pulling the pre-trained encoder
            weights (not the new head) towards w⁰, their values when the fit starts (after ``init_from``);
            logged as ``train/l2_sp`` and added to the loss (``train/loss`` stays the cross-entropy).
        init_from: start from an earlier stage's weights (see ``adaptation.chaining.InitFrom``).  Applied once,
            when a fit builds the module (before any restore: sharded strategies see the loaded weights); on
            ``--ckpt_path`` resume the restored checkpoint then replaces them (the source is still read, so it
            must exist), and ``load_from_checkpoint`` never applies it.  Its ``freeze`` always applies.
        delta: parameter-efficient tuning (``adaptation.delta.DeltaSpec``): bottleneck adapters (houlsby,
            pfeiffer, pals), lora, ia3, prefix, prompt, ptuning or bitfit; only the delta (+ head) trains.
        delta_only: checkpoints then hold only the delta weights; the frozen base is rebuilt from ``backbone``.
    """

    head = "sequence_classification"
    monitor = ("val/acc", "max")

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 labels: Optional[list[str]] = None, optim: OptimConfig = OptimConfig(lr=3e-5),
                 gradient_checkpointing: bool = False, l2_sp: float = 0.0, init_from: Optional[InitFrom] = None,
                 delta: Optional[DeltaSpec] = None, delta_only: bool = True):
        self.metrics: dict = {}
        self.delta, self.delta_only = as_delta_spec(delta), delta_only
        self.l2_sp, self.init_from = l2_sp, as_init_from(init_from)
        self._init_from_pending = self.init_from is not None
        self.l2_sp_anchor: Optional[WeightAnchor] = None
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)

    def can_build(self) -> bool:
        return super().can_build() and self.hparams.labels is not None

    def config_updates(self) -> dict:
        datamodule = self._datamodule()
        if self.hparams.labels is None and datamodule is not None:
            self.hparams.labels = datamodule.label_set()
        labels = list(self.hparams.labels or [])
        if not labels:
            from ptm_app.errors import PtmError

            raise PtmError("SequenceClassificationModule needs labels: set model.init_args.labels or use a TaskDataModule")
        return {**super().config_updates(), "num_labels": len(labels),
                "id2label": dict(enumerate(labels)), "label2id": {n: i for i, n in enumerate(labels)}}

    def configure_model(self) -> None:
        fresh = self.backbone is None
        super().configure_model()
        if fresh and self.delta is not None:
            self.backbone = apply_delta(self.backbone, self.delta, self.head)
            report = trainable_report(self.backbone)
            print(f"delta {self.delta.method}: {report['trainable']:,} of {report['total']:,} parameters trainable "
                  f"({report['percent']:.3f} %)")
        self.build_label_metrics(len(self.hparams.labels))
        fitting = self._trainer is not None and self._trainer.state.fn == TrainerFn.FITTING
        if self.init_from is not None:
            if self._init_from_pending and fitting:
                apply_init_from(self, self.init_from)
                self._init_from_pending = False
            else:
                freeze_prefixes(self.backbone, self.init_from.freeze)
        if self.l2_sp and fitting and self.l2_sp_anchor is None:
            encoder = {id(p) for p in self.backbone.base_model.parameters()}
            self.l2_sp_anchor = WeightAnchor({n: p for n, p in self.backbone.named_parameters()
                                              if id(p) in encoder and p.requires_grad})

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self._init_from_pending = False  # the weights come from the checkpoint
        if self.delta is not None and checkpoint.get("ptm_app", {}).get("delta_only"):
            base = {f"backbone.{k}": v for k, v in self.backbone.state_dict().items()}
            checkpoint["state_dict"] = {**base, **checkpoint["state_dict"]}  # frozen base + saved delta

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        hp = checkpoint["hyper_parameters"]
        if self.init_from is not None:  # plain data: checkpoints load with weights_only=True
            hp["init_from"] = asdict(self.init_from)
        if self.delta is None:
            return
        hp["delta"] = asdict(self.delta)
        if self.delta_only:  # the base is rebuilt from its source: keep only the delta (+ head) weights
            rest = {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith("backbone.")}
            delta = {f"backbone.{k}": v for k, v in delta_state_dict(self.backbone).items()}
            checkpoint["state_dict"] = {**rest, **delta}
            hp["backbone"], hp["backbone_config"] = self.hparams.backbone, self.hparams.backbone_config
            checkpoint["ptm_app"]["delta_only"] = True

    def l2_sp_penalty(self) -> torch.Tensor:
        """``α/2 · Σ ‖w − w⁰‖²`` over the anchored encoder weights (Li et al. 2018, L2-SP)."""
        params = dict(self.backbone.named_parameters())
        return 0.5 * self.l2_sp * sum(((params[n] - w0) ** 2).sum() for n, w0 in self.l2_sp_anchor.items())

    def make_collator(self, tokenizer, seed: int = 0) -> PadCollator:
        return PadCollator(pad_token_id=tokenizer.pad_token_id)

    def forward(self, batch: dict) -> torch.Tensor:
        return self.backbone(**self.model_inputs(batch)).logits

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = torch.nn.functional.cross_entropy(self(batch).float(), batch["labels"])
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch["labels"]))
        if self.l2_sp_anchor is not None:
            penalty = self.l2_sp_penalty()
            self.log("train/l2_sp", penalty, batch_size=len(batch["labels"]))
            loss = loss + penalty
        return loss


class WeightAnchor(torch.nn.Module):
    """Copies of weights as non-persistent buffers: they follow the module across devices, stay out of
    checkpoints and of the optimiser."""

    def __init__(self, weights: dict[str, torch.Tensor]):
        super().__init__()
        self.names = list(weights)
        for i, w in enumerate(weights.values()):
            self.register_buffer(f"w{i}", w.detach().clone(), persistent=False)

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        return zip(self.names, self.buffers())
