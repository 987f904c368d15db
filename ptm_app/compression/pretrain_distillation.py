"""Pre-training distillation (DistilBERT, Sanh et al. 2019 §2–3): on the MLM corpus, a student initialised from one
teacher layer out of two learns ``α_ce·L_ce + α_mlm·L_mlm + α_cos·L_cos``: the teacher's soft targets over the
vocabulary at the masked positions (``T²·KL``, Hinton et al. 2015 §2), the student's own masked-LM loss, and the
cosine between the last hidden states of student and teacher (DistilBERT used α = 5, 2, 1 and T = 2)."""
from __future__ import annotations

from typing import Literal, Optional

import torch
from lightning.pytorch.utilities import rank_zero_info
from torchmetrics import MeanMetric

from ptm_app.checkpoint_io.reading import CKPT_KEY
from ptm_app.compression import losses
from ptm_app.compression.students import StudentLayers, chosen_layers, student_from_teacher
from ptm_app.compression.teacher import FrozenTeacher, resolve_teacher, size_facts
from ptm_app.errors import PtmError
from ptm_app.objectives.heads import masked_lm_forward
from ptm_app.objectives.mlm import MaskedLMModule
from ptm_app.objectives.targets import MaskedLM
from ptm_app.training.module import weighted_mean_update
from ptm_app.training.optim import OptimConfig


class PretrainDistillationModule(MaskedLMModule):
    """A masked-LM student distilled from a frozen masked-LM teacher; logs ``train/ce``, ``train/mlm``,
    ``train/cosine`` and the student's ``val/loss`` / ``val/ppl`` (its MLM loss), and once the teacher's as
    ``val/teacher_loss`` / ``val/teacher_ppl`` on the same batches.

    Args:
        teacher: a masked-LM run directory or ``.ckpt``, an exported directory or a prepared model, with a trained
            MLM head (a bare encoder such as the prepared ``minilm`` has none: one line says how to give it one).
        student_layers: ``every_other`` (DistilBERT §3) or a list of teacher layers (1..L) the student starts
            from; ``null``: the student is ``backbone`` / ``backbone_config`` (it must have the teacher's width
            for the cosine loss).
        temperature / alpha_ce / alpha_mlm / alpha_cos: T and the three weights.
        mlm_probability / mask_ratio / random_ratio / masking: the masking recipe (``MaskedLMModule``).
    """

    def __init__(self, teacher: str, student_layers: Optional[StudentLayers] = "every_other",
                 temperature: float = 2.0, alpha_ce: float = 5.0, alpha_mlm: float = 2.0, alpha_cos: float = 1.0,
                 backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(lr=5e-4), gradient_checkpointing: bool = False,
                 mlm_probability: float = 0.15, mask_ratio: float = 0.8, random_ratio: float = 0.1,
                 masking: Literal["token", "whole_word", "span"] = "token"):
        user_config = backbone_config and "vocab_size" not in backbone_config  # a checkpoint's saved config: ok
        if student_layers and (backbone or user_config):
            raise PtmError("PretrainDistillationModule: student_layers builds the student from the teacher; set "
                           "student_layers: null to use backbone / backbone_config instead")
        self.frozen_teacher = FrozenTeacher(teacher, "masked_lm")
        self.teacher_logged = False
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing,
                         targets=[MaskedLM(mlm_probability, mask_ratio, random_ratio, masking)])
        self.weights = {"ce": alpha_ce, "mlm": alpha_mlm, "cosine": alpha_cos}

    def default_style(self) -> str:
        return "pre-training distillation"

    @property
    def teacher(self):
        return self.frozen_teacher.model

    def can_build(self) -> bool:
        return bool(self.hparams.student_layers) or super().can_build()

    def build_model(self):
        fresh = self.frozen_teacher.fresh_weights()
        if fresh and self.hparams.alpha_ce > 0:
            raise PtmError(f"teacher '{self.hparams.teacher}' has no trained masked-LM head ({fresh[0]} … were "
                           f"initialised at random: a bare encoder); give it one first, e.g. python main.py fit "
                           f"--config configs/demo/minilm_mlm_bbc.yaml, then teacher: checkpoints/demo_mlm")
        if not self.hparams.student_layers:
            return super().build_model()
        layers = chosen_layers(self.hparams.student_layers, self.teacher.config.num_hidden_layers)
        rank_zero_info(f"student: teacher layers {layers} of {self.teacher.config.num_hidden_layers}")
        return student_from_teacher(self.teacher, layers)

    def configure_model(self) -> None:
        super().configure_model()
        widths = (self.backbone.config.hidden_size, self.teacher.config.hidden_size)
        if self.hparams.alpha_cos > 0 and widths[0] != widths[1]:
            raise PtmError(f"alpha_cos compares hidden states, but the student is {widths[0]} wide and the teacher "
                           f"{widths[1]}; give the student the teacher's hidden_size or set alpha_cos: 0")

    def make_collator(self, tokenizer, seed: int = 0):
        self.frozen_teacher.check_vocabulary(tokenizer, "the soft-target loss over the vocabulary")
        return super().make_collator(tokenizer, seed)

    def _forward_both(self, batch: dict):
        inputs, labels, hidden = self.model_inputs(batch), batch["labels"], self.hparams.alpha_cos > 0
        student = masked_lm_forward(self.backbone, inputs, labels, sparse=self.mlm.sparse_prediction, hidden=hidden)
        with torch.no_grad():
            teacher = masked_lm_forward(self.frozen_teacher.on(self.device), inputs, labels,
                                        sparse=self.mlm.sparse_prediction, hidden=hidden)
        return student, teacher

    def _losses(self, batch: dict) -> dict[str, torch.Tensor]:
        student, teacher = self._forward_both(batch)
        parts = {"mlm": student.loss}
        if self.hparams.alpha_ce > 0:
            parts["ce"] = losses.soft_target_loss(student.logits, teacher.logits, self.hparams.temperature)
        if self.hparams.alpha_cos > 0:
            parts["cosine"] = losses.cosine_loss(student.hidden, teacher.hidden, batch["attention_mask"])
        return parts

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        parts = self._losses(batch)
        return self.log_train_losses(self._total(parts), parts, self.count_targets(batch["labels"]))

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        super().validation_step(batch, batch_idx)
        if not self.teacher_logged and not self.trainer.sanity_checking:
            with torch.no_grad():
                loss = masked_lm_forward(self.frozen_teacher.on(self.device), self.model_inputs(batch),
                                         batch["labels"], sparse=self.mlm.sparse_prediction).loss
            if getattr(self, "teacher_val_loss", None) is None:  # not a sub-module: not in the checkpoint
                object.__setattr__(self, "teacher_val_loss", MeanMetric().to(self.device))
            weighted_mean_update(self.teacher_val_loss, loss, self.count_targets(batch["labels"]))

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        metric = getattr(self, "teacher_val_loss", None)
        if metric is not None and not self.teacher_logged and metric.update_called:
            value = metric.compute()
            self.log_dict({"val/teacher_loss": value, "val/teacher_ppl": torch.exp(value.clamp(max=50))})
            self.teacher_logged = True

    def summary_facts(self) -> dict:
        return size_facts(self.backbone, self.teacher)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["hyper_parameters"]["teacher"] = resolve_teacher(self.hparams.teacher)
        checkpoint[CKPT_KEY]["teacher_logged"] = self.teacher_logged

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self.teacher_logged = bool(checkpoint.get(CKPT_KEY, {}).get("teacher_logged"))
