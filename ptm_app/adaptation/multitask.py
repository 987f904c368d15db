"""Multitask fine-tuning: one shared encoder, one small head per task (MT-DNN, Liu et al. 2019 §3: shared
lexicon and Transformer layers, task-specific output layers; each mini-batch from one task, its task's loss).

Tasks come from a ``MultitaskDataModule`` (sequence classification, regression, token classification,
extractive QA), mixed by T5's rates (Raffel et al. 2020 §3.5.2).  Metrics are logged per task
(``val/<task>/<metric>``) with their macro average over tasks (``val/macro``, the best-checkpoint monitor) of
each task's main metric: accuracy (classification, tagging), Pearson (regression), F1 (QA).  T5 (§3.5.3)
found multitask training then per-task fine-tuning best: start a single-task run from this checkpoint with
``init_from`` (the shared encoder loads by name; see ``configs/adapt/multitask_*.yaml``).

With ``delta:`` the encoder stays frozen and one shared delta (LoRA, Houlsby adapters ... see
``backbones.delta``) trains with the per-task heads: Stickland & Murray 2019 (PALs) §3 and Houlsby et al. 2019
§1 share one frozen model across tasks this way.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ptm_app.backbones.delta import DeltaSpec, prepended_tokens
from ptm_app.adaptation.delta_tuning import DeltaTuningMixin
from ptm_app.adaptation.qa import SPLITS, BestSpans, QuestionAnsweringModule, best_span, epoch_answers, squad_scores
from ptm_app.adaptation.token_classification import (TokenClassificationModule, compute_tagging_metrics,
                                                     tagging_metrics, update_tagging_metrics)
from ptm_app.data.collators import PadCollator
from ptm_app.data.token_tasks import QACollator, TokenLabelCollator
from ptm_app.data.tokenizer import is_bert_style
from ptm_app.errors import PtmError
from ptm_app.tasks.label_scores import label_metrics, regression_metrics
from ptm_app.training.module import PtmModule
from ptm_app.training.optim import OptimConfig

KINDS = ("sequence", "regression", "token", "qa")
MAIN_METRIC = {"sequence": "acc", "regression": "pearson", "token": "acc", "qa": "f1"}


def head_width(kind: str, labels: Optional[list[str]]) -> int:
    return {"regression": 1, "qa": 2}.get(kind) or len(labels or [])


class MultitaskModule(DeltaTuningMixin, PtmModule):
    """Shared backbone (``AutoModel``) + ``heads[task]`` (dropout + linear) for every task of the data module.

    Args:
        backbone / backbone_config: the shared encoder (pretrained name, exported run, or a config).
        tasks: task name → ``{kind, labels}``; by default taken from the ``MultitaskDataModule``.
        optim: optimiser and schedule (one optimiser over the encoder and all heads).
        dropout: dropout before each head.
        pooling: the sequence-level representation: ``first`` token ([CLS], BERT §3) or ``last`` real token
            (GPT-style decoders, Radford et al. 2018 §3.3); default ``first`` for BERT-style tokenizers.
        max_answer_length / n_best: QA span search (see ``adaptation.qa.best_span``).
        delta: one delta shared by all tasks (``backbones.delta.DeltaSpec``: houlsby, pfeiffer, pals, lora, ia3,
            prefix, prompt, ptuning, bitfit); the encoder stays frozen, the delta and every task head train.
        delta_only: checkpoints then hold only the delta and the heads; the frozen base is rebuilt from ``backbone``.
    """

    head = "base"
    monitor = ("val/macro", "max")

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 tasks: Optional[dict[str, dict]] = None, optim: OptimConfig = OptimConfig(lr=5e-5),
                 gradient_checkpointing: bool = False, dropout: float = 0.1, pooling: Optional[str] = None,
                 max_answer_length: int = 30, n_best: int = 20, delta: Optional[DeltaSpec] = None,
                 delta_only: bool = True):
        self.init_delta(delta, delta_only)
        self.heads: Optional[nn.ModuleDict] = None
        self.stage_metrics: Optional[nn.ModuleDict] = None
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)

    def can_build(self) -> bool:
        return super().can_build() and self.hparams.tasks is not None

    def style(self) -> str:
        return self.delta.method if self.delta is not None else PtmModule.style(self)

    @property
    def tasks(self) -> dict[str, dict]:
        if self.hparams.tasks is None:
            specs = self.data_facts.task_specs() if self.data_facts is not None else {}
            if not specs:
                raise PtmError("MultitaskModule needs tasks: use data.class_path: MultitaskDataModule")
            self.hparams.tasks = specs
        for name, spec in self.hparams.tasks.items():
            if spec.get("kind") not in KINDS:
                raise PtmError(f"multitask task '{name}': kind '{spec.get('kind')}' is not one of {', '.join(KINDS)}")
        return self.hparams.tasks

    def configure_model(self) -> None:
        super().configure_model()
        if self.hparams.pooling is None:
            self.hparams.pooling = "first" if self.tokenizer is None or is_bert_style(self.tokenizer) else "last"
        if self.heads is None:
            width = self.backbone.config.hidden_size
            self.heads = nn.ModuleDict({
                name: nn.Sequential(nn.Dropout(self.hparams.dropout), nn.Linear(width, head_width(s["kind"], s["labels"])))
                for name, s in self.tasks.items()})
            self.stage_metrics = nn.ModuleDict({stage: nn.ModuleDict({
                name: self._metrics(s["kind"], s["labels"]) for name, s in self.tasks.items()})
                for stage in ("val", "test")})

    @staticmethod
    def _metrics(kind: str, labels: Optional[list[str]]) -> nn.Module:
        if kind == "sequence":
            return label_metrics(len(labels))
        if kind == "regression":
            return regression_metrics()
        if kind == "token":
            return tagging_metrics(labels)
        return BestSpans()

    def task_collator(self, kind: str, tokenizer):
        """The collator a task of ``kind`` needs (asked for by ``MultitaskDataModule``)."""
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return {"token": TokenLabelCollator, "qa": QACollator}.get(kind, PadCollator)(pad_token_id=pad)

    def make_collator(self, tokenizer, seed: int = 0):
        raise PtmError("MultitaskModule trains on a MultitaskDataModule (data.class_path: MultitaskDataModule)")

    # -- forward and losses -------------------------------------------------------------------------
    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.hparams.pooling == "first":
            return hidden[:, 0]
        last = attention_mask.long().sum(-1) - 1  # right padding: the last real token
        return hidden[torch.arange(len(hidden), device=hidden.device), last]

    def forward(self, batch: dict):
        """The task's outputs: label scores [B, C], values [B], tag scores [B, T, C] or (start, end) logits."""
        task = batch["task"]
        hidden = self.backbone(**self.model_inputs(batch)).last_hidden_state
        hidden = hidden[:, prepended_tokens(self.backbone):]  # a soft prompt's positions have no labels
        kind, head = self.tasks[task]["kind"], self.heads[task]
        if kind in ("sequence", "regression"):
            out = head(self.pool(hidden, batch["attention_mask"])).float()
            return out.squeeze(-1) if kind == "regression" else out
        out = head(hidden).float()
        return out if kind == "token" else (out[..., 0], out[..., 1])

    def loss(self, kind: str, out, batch: dict) -> torch.Tensor:
        if kind == "sequence":
            return nn.functional.cross_entropy(out, batch["labels"])
        if kind == "regression":
            return nn.functional.mse_loss(out, batch["labels"].float())
        if kind == "token":
            return TokenClassificationModule.loss(out, batch["labels"])
        return QuestionAnsweringModule.loss(*out, batch)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        task = batch["task"]
        loss = self.loss(self.tasks[task]["kind"], self(batch), batch)
        n = len(batch["input_ids"])
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        self.log("train/task", float(list(self.tasks).index(task)), batch_size=n)  # which task this step trained
        self.log(f"train/{task}/loss", loss, batch_size=n)  # (Lightning repeats it on other tasks' steps)
        return loss

    # -- evaluation ---------------------------------------------------------------------------------
    def _eval_step(self, stage: str, batch: dict) -> None:
        task = batch["task"]
        kind, out = self.tasks[task]["kind"], self(batch)
        n = len(batch["input_ids"])
        self.log(f"{stage}/{task}/loss", self.loss(kind, out, batch), batch_size=n, add_dataloader_idx=False)
        metric = self.stage_metrics[stage][task]
        if kind == "sequence":
            metric.update(out.argmax(-1), batch["labels"])
        elif kind == "regression":
            metric.update(out, batch["labels"].float())
        elif kind == "token":
            update_tagging_metrics(metric, self.tasks[task]["labels"], out.argmax(-1), batch["labels"])
        else:
            spans = [best_span(s, e, o, self.hparams.n_best, self.hparams.max_answer_length)
                     for s, e, o in zip(*out, batch["offsets"])]
            score, start, end = (torch.tensor(v, device=self.device) for v in zip(*spans))
            metric.update(batch["examples"], score.float(), start, end)

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_step("val", batch)

    def test_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_step("test", batch)

    def _task_values(self, stage: str, task: str) -> dict[str, torch.Tensor]:
        kind, metric = self.tasks[task]["kind"], self.stage_metrics[stage][task]
        if kind == "token":
            return compute_tagging_metrics(metric)
        if kind == "qa":
            records = self.data_facts.task_records(task, SPLITS[stage])
            return squad_scores(epoch_answers(metric, records), records)
        values = metric.compute()
        metric.reset()
        return values

    def _log_metrics(self, stage: str) -> None:
        main = []
        for task, spec in self.tasks.items():
            values = self._task_values(stage, task)
            self.log_dict({f"{stage}/{task}/{k}": v for k, v in values.items()}, add_dataloader_idx=False)
            main.append(values[MAIN_METRIC[spec["kind"]]].float())
        self.log(f"{stage}/macro", torch.stack(main).mean(), prog_bar=(stage == "val"), add_dataloader_idx=False)

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val")

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test")
