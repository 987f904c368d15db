"""Causal-LM distillation: word-level knowledge distillation (Kim & Rush 2016 §3, "Sequence-level knowledge
distillation"; the soft targets of Hinton et al. 2015 §2) from a frozen decoder (the prepared SmolLM2-135M) into a
small decoder that shares its tokenizer: ``α_kd·T²·KL(p_T ‖ p_S)`` over the vocabulary at every next-token position
plus ``α_lm·`` the student's own next-token cross-entropy."""
from __future__ import annotations

from typing import Optional

import torch
from torchmetrics import MeanMetric

from ptm_app.compression import losses
from ptm_app.data import IGNORE_INDEX
from ptm_app.compression.teacher import FrozenTeacher, resolve_teacher, size_facts
from ptm_app.objectives.clm import CausalLMModule
from ptm_app.training.module import weighted_mean_update
from ptm_app.training.optim import OptimConfig


class CausalDistillationModule(CausalLMModule):
    """A causal-LM student distilled from a frozen causal-LM teacher.  Logs ``train/kd`` and ``train/lm``; in every
    validation the student's ``val/loss`` / ``val/ppl`` and the teacher's ``val/teacher_loss`` /
    ``val/teacher_ppl`` on the same batches.

    Args:
        teacher: a causal-LM run directory or ``.ckpt``, an exported directory or a prepared model (``smollm2``).
        backbone / backbone_config: the student (a from-scratch config such as a tiny Llama; its vocabulary is the
            data's tokenizer, which must be the teacher's).
        temperature / alpha_kd / alpha_lm: T and the two weights.
    """

    def __init__(self, teacher: str = "smollm2", temperature: float = 2.0, alpha_kd: float = 1.0,
                 alpha_lm: float = 1.0, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(lr=1e-3), gradient_checkpointing: bool = False):
        self.frozen_teacher = FrozenTeacher(teacher, "causal_lm")
        self.vocab = None  # the shared tokenizer's size: logits beyond it (embedding padding) are left out
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)
        self.teacher_val_loss = MeanMetric()

    def default_style(self) -> str:
        return "causal-LM distillation"

    @property
    def teacher(self):
        return self.frozen_teacher.model

    def make_collator(self, tokenizer, seed: int = 0):
        self.frozen_teacher.check_vocabulary(tokenizer, "word-level KL over the vocabulary")
        self.vocab = len(tokenizer)
        return super().make_collator(tokenizer, seed)

    def _logits(self, model, batch: dict) -> torch.Tensor:
        logits = model(**self.model_inputs(batch)).logits
        return logits[..., : self.vocab] if self.vocab else logits

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        labels, hp = batch["labels"], self.hparams
        student = self._logits(self.backbone, batch)
        with torch.no_grad():
            teacher = self._logits(self.frozen_teacher.on(self.device), batch)
        parts = {"kd": losses.next_token_kd_loss(student, teacher, labels, hp.temperature),
                 "lm": next_token_cross_entropy(student, labels)}
        total = hp.alpha_kd * parts["kd"] + hp.alpha_lm * parts["lm"]
        return self.log_train_losses(total, parts, self.count_targets(labels))

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        labels, n = batch["labels"], self.count_targets(batch["labels"])
        weighted_mean_update(self.val_loss, next_token_cross_entropy(self._logits(self.backbone, batch), labels), n)
        with torch.no_grad():
            teacher = self._logits(self.frozen_teacher.on(self.device), batch)
        weighted_mean_update(self.teacher_val_loss, next_token_cross_entropy(teacher, labels), n)

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if self.teacher_val_loss.update_called:
            value = self.teacher_val_loss.compute()
            self.log_dict({"val/teacher_loss": value, "val/teacher_ppl": torch.exp(value.clamp(max=50))})
            self.teacher_val_loss.reset()

    def summary_facts(self) -> dict:
        return size_facts(self.backbone, self.teacher)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["hyper_parameters"]["teacher"] = resolve_teacher(self.hparams.teacher)


def next_token_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits[:, t]`` against ``labels[:, t+1]`` over the real targets."""
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(),
                                             ignore_index=IGNORE_INDEX)
