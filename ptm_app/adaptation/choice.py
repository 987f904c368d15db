"""Fine-tuning for multiple choice (SWAG-style, Devlin et al. 2019 §4.4): each (question, choice) pair is
encoded as a sentence pair, the [CLS] state of each goes through one new vector (transformers'
``*ForMultipleChoice``: pooler, dropout, a linear layer to one score), and the scores of a question's choices are
soft-maxed; the loss is their cross-entropy.  Logs ``val/acc`` (``test/acc``); ``predict`` writes each question's
chosen index with every choice's probability.  Loss and accuracy are the ``choice`` task type's
(``task_kinds.registry``), the same as a multitask ``choice`` head's.
"""
from __future__ import annotations

from typing import Optional

import torch

from ptm_app.adaptation.task_module import TaskModule
from ptm_app.backbones.delta import DeltaSpec
from ptm_app.compression.fake_quant import QATSpec
from ptm_app.compression.pruning_policy import PruneSpec
from ptm_app.compression.teacher_loss import Distillation
from ptm_app.compression.theseus_policy import TheseusSpec
from ptm_app.data.collators import ChoiceCollator
from ptm_app.errors import PtmError
from ptm_app.training.optim import OptimConfig


class MultipleChoiceModule(TaskModule):
    """A ``*ForMultipleChoice`` head on the backbone, every weight trained (or only ``delta``).

    Args:
        backbone / backbone_config: the encoder (a prepared name such as ``minilm``, an export, or a config).
        num_choices: choices per question; by default the data module's.
        optim: optimiser and schedule.
        delta / delta_only: parameter-efficient tuning (``backbones.delta.DeltaSpec``), as for classification.
        distill: distil from a teacher of the same model class (``compression.teacher_loss.Distillation``: the
            teacher and the loss weights; Hinton et al. 2015 §2): its loss replaces the task's; the soft targets are
            the distribution over each question's choices.
        qat: quantization-aware training (``compression.fake_quant.QATSpec``; Q8BERT), for ``main.py quantize``.
        pruning: layer dropping, iterative head pruning and magnitude pruning while fine-tuning
            (``compression.pruning_policy.PruneSpec``; Sajjad et al. 2020, Michel et al. 2019, Zhu & Gupta 2017).        theseus: compress a fine-tuned ``predecessor`` of this model class by progressive module replacing
            (``compression.theseus_policy.TheseusSpec``; BERT-of-Theseus, Xu et al. 2020): the backbone is the
            successor, built from it.
    """

    model_class = "multiple_choice"
    task_kind = "choice"

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 num_choices: Optional[int] = None, optim: OptimConfig = OptimConfig(lr=3e-5),
                 gradient_checkpointing: bool = False, delta: Optional[DeltaSpec] = None, delta_only: bool = True,
                 distill: Optional[Distillation] = None, qat: Optional[QATSpec] = None,
                 pruning: Optional[PruneSpec] = None, theseus: Optional[TheseusSpec] = None):
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)

    def can_build(self) -> bool:
        return super().can_build() and self.hparams.num_choices is not None

    def configure_model(self) -> None:
        if self.hparams.num_choices is None:
            labels = self.data_facts.labels() if self.data_facts is not None else None
            if not labels:
                raise PtmError("MultipleChoiceModule needs num_choices: set model.init_args.num_choices or use a "
                               "MultipleChoiceDataModule")
            self.hparams.num_choices = len(labels)
        super().configure_model()

    def task_labels(self) -> list[str]:
        """The choice positions ``0 .. num_choices-1`` are the labels."""
        return [str(i) for i in range(self.hparams.num_choices)]

    def make_collator(self, tokenizer, seed: int = 0) -> ChoiceCollator:
        return ChoiceCollator(pad_token_id=tokenizer.pad_token_id)

    def backbone_inputs(self, batch: dict) -> dict:
        """The collator's [B·num_choices, L] pairs as [B, num_choices, L] (the model gives choice scores
        [B, num_choices])."""
        n = self.hparams.num_choices
        return {k: v.view(-1, n, v.shape[-1]) for k, v in self.model_inputs(batch).items()}

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        """Every choice's probability (``training.callbacks.PredictionWriter`` writes the rows)."""
        return {"keys": batch["keys"], "probs": torch.softmax(self(batch).float(), dim=-1).cpu(),
                "labels": self.task_labels()}
