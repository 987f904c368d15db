"""Full fine-tuning for extractive question answering (SQuAD v1.1 style).

BERT (Devlin et al. 2019 §4.2): a start vector S and an end vector E are the only new parameters; the
probability of token i starting the answer is a softmax of S·T_i over the window, likewise for the end, the
loss is the mean of the two cross-entropies, and a span (i, j) scores S·T_i + E·T_j with j ≥ i.  Long
contexts come as overlapping windows (``QADataModule``); every window's best span is kept and the best
over an example's windows, mapped back to characters through the offsets, is its answer, scored with
SQuAD EM/F1 (``val/em``, ``val/f1``; ``test/*``) once the epoch has seen all windows.
"""
from __future__ import annotations

from typing import Optional

import torch

from ptm_app.adaptation.task_module import TaskModule
from ptm_app.backbones.delta import DeltaSpec, prepended_tokens
from ptm_app.data.collators import QACollator
from ptm_app.task_kinds.spans import SPLITS, epoch_answers
from ptm_app.training.callbacks import write_predictions
from ptm_app.training.optim import OptimConfig


class QuestionAnsweringModule(TaskModule):
    """Fine-tune every weight of the backbone plus a fresh start/end span layer.

    Args:
        backbone: prepared name / local dir / exported run / hub id of the pretrained encoder.
        backbone_config: config overrides, or a from-scratch config.
        optim: optimiser and schedule.
        delta: parameter-efficient tuning instead of full fine-tuning (``backbones.delta.DeltaSpec``:
            adapters, lora, ia3, prefix, prompt, ptuning, bitfit); only the delta (+ head) trains.  The
            outputs at prompt / P-tuning's virtual tokens are dropped, so spans index the window's tokens.
        delta_only: checkpoints then hold only the delta weights; the frozen base is rebuilt from ``backbone``.
        max_answer_length: longest answer considered, in tokens.
        n_best: start and end candidates per window.
    """

    head = "question_answering"
    task_kind = "qa"
    metric_stages = ("val", "test", "predict")  # predict collects spans too

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(lr=5e-5), gradient_checkpointing: bool = False,
                 max_answer_length: int = 30, n_best: int = 20, delta: Optional[DeltaSpec] = None,
                 delta_only: bool = True):
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)

    def make_collator(self, tokenizer, seed: int = 0) -> QACollator:
        return QACollator(pad_token_id=tokenizer.pad_token_id)

    def forward(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Start and end logits [B, T] over the input tokens (prompt / P-tuning's virtual tokens dropped)."""
        out, virtual = self.backbone(**self.model_inputs(batch)), prepended_tokens(self.backbone)
        return out.start_logits[:, virtual:].float(), out.end_logits[:, virtual:].float()

    def answers(self, stage: str) -> dict[int, tuple[float, int, int, str]]:
        return epoch_answers(self.stage_metrics[stage], self.data_facts.records(SPLITS[stage]))

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        self.kind.update(self.stage_metrics["predict"], self(batch), batch, self.eval_settings())
        return {"keys": batch["keys"], "examples": batch["examples"].tolist()}

    def on_predict_epoch_end(self) -> None:
        examples = self.data_facts.records(SPLITS["predict"])
        questions, contexts = examples.fields["question"], examples.fields["context"]
        rows = [{"id": examples.ids[e], "question": questions[e], "context": contexts[e],
                 "answer": text, "answer_start": start, "answer_end": end,
                 "score": round(score, 4) if start >= 0 else None}
                for e, (score, start, end, text) in self.answers("predict").items()]
        write_predictions(self.trainer, rows)
