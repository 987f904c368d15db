"""Full fine-tuning for extractive question answering (SQuAD v1.1 style).

BERT (Devlin et al. 2019 §4.2): a start vector S and an end vector E are the only new parameters; the
probability of token i starting the answer is a softmax of S·T_i over the window, likewise for the end, the
loss is the mean of the two cross-entropies, and a span (i, j) scores S·T_i + E·T_j with j ≥ i.  Long
contexts come as overlapping windows (``QADataModule``); every window's best span is kept and the best
over an example's windows, mapped back to characters through the offsets, is its answer, scored with
SQuAD EM/F1 (``val/em``, ``val/f1``; ``test/*``) once the epoch has seen all windows.

``null_answer`` (SQuAD 2.0, BERT §4.3): a question may have no answer in its context.  Its start and end are
[CLS] in every window, "no answer" is predicted when the best span's score exceeds ``s_null`` by at most a threshold
tuned on validation to maximise F1, and the metrics add ``has_ans_em``, ``has_ans_f1``, ``no_ans_acc`` and
``null_threshold`` (``task_kinds.spans``).  The data must allow such questions (``QADataModule(unanswerable=true)``).
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
from ptm_app.data.collators import QACollator
from ptm_app.errors import PtmError
from ptm_app.task_kinds.spans import SPLITS, Answer, BestSpans, answer_row, epoch_answers
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
        null_answer: questions may have no answer (SQuAD 2.0): "no answer" below a threshold tuned on validation.
        distill: distil from a teacher of the same model class (``compression.teacher_loss.Distillation``: the
            teacher and the loss weights; Hinton et al. 2015 §2): its loss replaces the task's; the soft targets are
            the start and the end distributions over each window's real tokens.
        qat: quantization-aware training (``compression.fake_quant.QATSpec``; Q8BERT), for ``main.py quantize``.
        pruning: layer dropping, iterative head pruning and magnitude pruning while fine-tuning
            (``compression.pruning_policy.PruneSpec``; Sajjad et al. 2020, Michel et al. 2019, Zhu & Gupta 2017).        early_exit: refused in one line: a span has no per-layer label to exit by (``compression.early_exit_policy``).
        theseus: compress a fine-tuned ``predecessor`` of this model class by progressive module replacing
            (``compression.theseus_policy.TheseusSpec``; BERT-of-Theseus, Xu et al. 2020): the backbone is the
            successor, built from it.
    """

    model_class = "question_answering"
    task_kind = "qa"
    metric_stages = ("val", "test", "predict")  # predict collects spans too

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(lr=5e-5), gradient_checkpointing: bool = False,
                 max_answer_length: int = 30, n_best: int = 20, delta: Optional[DeltaSpec] = None,
                 delta_only: bool = True, null_answer: bool = False, distill: Optional[Distillation] = None,
                 qat: Optional[QATSpec] = None, pruning: Optional[PruneSpec] = None,
                 early_exit: Optional[ExitSpec] = None, theseus: Optional[TheseusSpec] = None):
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)

    def connect_data(self, facts) -> None:
        super().connect_data(facts)
        if getattr(facts, "unanswerable", False) and not self.hparams.null_answer:
            raise PtmError("the QA data allows unanswerable questions (data.unanswerable: true) but the model cannot "
                           "answer 'no answer'; set model.init_args.null_answer: true")

    def build_metrics(self) -> BestSpans:
        return BestSpans(null_answer=self.hparams.get("null_answer", False))

    def make_collator(self, tokenizer, seed: int = 0) -> QACollator:
        return QACollator(pad_token_id=tokenizer.pad_token_id)

    def outputs(self, model_output, virtual: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Start and end logits [B, T] over the input tokens (prompt / P-tuning's virtual tokens dropped)."""
        return model_output.start_logits[:, virtual:].float(), model_output.end_logits[:, virtual:].float()

    def null_threshold(self) -> Optional[float]:
        """τ tuned on validation (None: the model always answers with a span)."""
        metrics = getattr(self, "stage_metrics", None)
        val = metrics["val"] if metrics is not None and "val" in metrics else None
        return float(val.null_threshold) if getattr(val, "null_answer", False) else None

    def answers(self, stage: str) -> dict[int, Answer]:
        return epoch_answers(self.stage_metrics[stage], self.data_facts.records(SPLITS[stage]), self.null_threshold())

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        self.kind.update(self.stage_metrics["predict"], self(batch), batch, self.eval_settings())
        return {"keys": batch["keys"], "examples": batch["examples"].tolist()}

    def on_predict_epoch_end(self) -> None:
        examples = self.data_facts.records(SPLITS["predict"])
        questions, contexts = examples.fields["question"], examples.fields["context"]
        null = self.null_threshold() is not None
        rows = [{"id": examples.ids[e], "question": questions[e], "context": contexts[e], **answer_row(a, null)}
                for e, a in self.answers("predict").items()]
        write_predictions(self.trainer, rows)
