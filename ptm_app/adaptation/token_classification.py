"""Full fine-tuning for token classification (tagging: POS, NER, chunking).

BERT (Devlin et al. 2019 §4.3, NER): each word is represented by the final state of its *first* sub-token,
fed to a new linear output layer, with no CRF; the other sub-tokens carry no label.  Logs token accuracy
(``val/acc``) and, for BIO/IOB2 tag sets, exact-match entity-level precision/recall/F1 (``val/entity_f1``;
seqeval's default mode, see ``task_kinds.metrics``).  ``predict`` writes one tag per word to
``<run dir>/predictions.jsonl``.
"""
from __future__ import annotations

from typing import Optional

import torch

from ptm_app.adaptation.task_module import TaskModule
from ptm_app.backbones.delta import DeltaSpec
from ptm_app.compression.early_exit_policy import ExitSpec
from ptm_app.compression.fake_quant import QATSpec
from ptm_app.compression.pruning_policy import PruneSpec
from ptm_app.compression.teacher_loss import Distillation
from ptm_app.compression.theseus_policy import TheseusSpec
from ptm_app.data.datasets import _index
from ptm_app.data.collators import TokenLabelCollator
from ptm_app.errors import PtmError
from ptm_app.task_kinds.tagging import tags_by_word, word_tags
from ptm_app.training.callbacks import write_predictions
from ptm_app.training.optim import OptimConfig


class TokenClassificationModule(TaskModule):
    """Fine-tune every weight of the backbone plus a fresh per-token classification layer.

    Args:
        backbone: prepared name / local dir / exported run / hub id of the pretrained encoder.
        backbone_config: config overrides (e.g. ``classifier_dropout``), or a from-scratch config.
        labels: the tag names in order; by default taken from the data module (``TokenTaskDataModule``).
        optim: optimiser and schedule.
        delta: parameter-efficient tuning instead of full fine-tuning (``backbones.delta.DeltaSpec``:
            adapters, lora, ia3, prefix, prompt, ptuning, bitfit); only the delta (+ head) trains.  The
            outputs at prompt / P-tuning's virtual tokens are dropped, so logits line up with the labels.
        delta_only: checkpoints then hold only the delta weights; the frozen base is rebuilt from ``backbone``.
        distill: distil from a teacher of the same model class (``compression.teacher_loss.Distillation``: the
            teacher and the loss weights; Hinton et al. 2015 §2): its loss replaces the task's; the soft targets are
            per labelled token (each word's first sub-token).
        qat: quantization-aware training (``compression.fake_quant.QATSpec``; Q8BERT), for ``main.py quantize``.
        pruning: layer dropping, iterative head pruning and magnitude pruning while fine-tuning
            (``compression.pruning_policy.PruneSpec``; Sajjad et al. 2020, Michel et al. 2019, Zhu & Gupta 2017).        early_exit: off-ramps after every layer (``compression.early_exit_policy.ExitSpec``; DeeBERT, PABEE): one
            tag layer per layer; a sentence exits when its least confident tag is confident enough (entropy) or its
            tags have stayed unchanged ``patience`` layers; prediction rows get their ``exit_layer``.
        theseus: compress a fine-tuned ``predecessor`` of this model class by progressive module replacing
            (``compression.theseus_policy.TheseusSpec``; BERT-of-Theseus, Xu et al. 2020): the backbone is the
            successor, built from it.
    """

    model_class = "token_classification"
    task_kind = "token"

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 labels: Optional[list[str]] = None, optim: OptimConfig = OptimConfig(lr=5e-5),
                 gradient_checkpointing: bool = False, delta: Optional[DeltaSpec] = None, delta_only: bool = True,
                 distill: Optional[Distillation] = None, qat: Optional[QATSpec] = None,
                 pruning: Optional[PruneSpec] = None, early_exit: Optional[ExitSpec] = None,
                 theseus: Optional[TheseusSpec] = None):
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)
        self.predictions: list[dict] = []

    def can_build(self) -> bool:
        return super().can_build() and self.hparams.labels is not None

    def config_updates(self) -> dict:
        if self.hparams.labels is None and self.data_facts is not None:
            self.hparams.labels = self.data_facts.labels()
        labels = list(self.hparams.labels or [])
        if not labels:
            raise PtmError("TokenClassificationModule needs labels: set model.init_args.labels or use a "
                           "TokenTaskDataModule")
        return {**super().config_updates(), "num_labels": len(labels),
                "id2label": dict(enumerate(labels)), "label2id": {n: i for i, n in enumerate(labels)}}

    def make_collator(self, tokenizer, seed: int = 0) -> TokenLabelCollator:
        return TokenLabelCollator(pad_token_id=tokenizer.pad_token_id)

    def outputs(self, model_output, virtual: int = 0) -> torch.Tensor:
        """Tag logits [B, T, labels], one per input token (prompt / P-tuning's virtual tokens dropped)."""
        return model_output.logits[:, virtual:]

    def word_tags(self, ids: torch.Tensor, where: torch.Tensor) -> list[list[str]]:
        return word_tags(self.hparams.labels, ids, where)

    def on_predict_epoch_start(self) -> None:
        self.predictions = []

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        """One predicted tag per word (from its first sub-token); ``None`` for words cut by ``max_length``."""
        outputs, extras = self.predicted_outputs(batch)
        preds = outputs.argmax(-1).cpu()
        records = self.data_facts.records("test")
        labels = self.hparams.labels
        rows = []
        for n, (key, row, words) in enumerate(zip(batch["keys"], preds, batch["word_index"].cpu())):
            i = _index(key)
            tags = tags_by_word(labels, row, words, len(records["words"][i]))
            rows.append({"id": records["ids"][i], "words": records["words"][i], "tags": tags,
                         **(extras[n] if extras else {})})
        self.predictions.extend(rows)
        return {"keys": batch["keys"], "tags": [r["tags"] for r in rows]}

    def on_predict_epoch_end(self) -> None:
        write_predictions(self.trainer, self.predictions)
