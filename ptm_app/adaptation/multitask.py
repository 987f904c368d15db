"""Multitask fine-tuning: one shared encoder, one small head per task (MT-DNN, Liu et al. 2019 §3: shared
lexicon and Transformer layers, task-specific output layers; each mini-batch from one task, its task's loss).

Tasks come from a ``MultitaskDataModule`` (sequence classification, regression, token classification,
extractive QA, multiple choice), mixed by T5's rates (Raffel et al. 2020 §3.5.2).  Each task's head, loss and
metrics come from its task type (``task_kinds.registry.TASK_KINDS``).  Metrics are logged per task
(``val/<task>/<metric>``) with their macro average over tasks (``val/macro``, the best-checkpoint monitor) of
each task's main metric: accuracy (classification, tagging, multiple choice), Pearson (regression), F1 (QA).  T5 (§3.5.3)
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

from ptm_app.adaptation.policies import fine_tuning_policies
from ptm_app.backbones.delta import DeltaSpec, prepended_tokens
from ptm_app.data.tokenizer import is_bert_style
from ptm_app.errors import PtmError
from ptm_app.task_kinds.spans import SPLITS
from ptm_app.task_kinds.registry import TaskKind, task_kind
from ptm_app.training.module import PtmModule
from ptm_app.training.optim import OptimConfig


class MultitaskModule(PtmModule):
    """Shared backbone (``AutoModel``) + ``heads[task]`` (dropout + linear) for every task of the data module.

    Args:
        backbone / backbone_config: the shared encoder (pretrained name, exported run, or a config).
        tasks: task name → ``{kind, labels}`` (kind: a ``task_kinds.registry`` task kind); by default taken from the
            ``MultitaskDataModule``.
        optim: optimiser and schedule (one optimiser over the encoder and all heads).
        dropout: dropout before each head.
        pooling: the sequence-level representation: ``first`` token ([CLS], BERT §3) or ``last`` real token
            (GPT-style decoders, Radford et al. 2018 §3.3); default ``first`` for BERT-style tokenizers.
        max_answer_length / n_best: QA span search (see ``adaptation.qa.best_span``).
        delta: one delta shared by all tasks (``backbones.delta.DeltaSpec``: houlsby, pfeiffer, pals, lora, ia3,
            prefix, prompt, ptuning, bitfit); the encoder stays frozen, the delta and every task head train.
        delta_only: checkpoints then hold only the delta and the heads; the frozen base is rebuilt from ``backbone``.
    """

    model_class = "base"
    monitor = ("val/macro", "max")

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 tasks: Optional[dict[str, dict]] = None, optim: OptimConfig = OptimConfig(lr=5e-5),
                 gradient_checkpointing: bool = False, dropout: float = 0.1, pooling: Optional[str] = None,
                 max_answer_length: int = 30, n_best: int = 20, delta: Optional[DeltaSpec] = None,
                 delta_only: bool = True):
        self.heads: Optional[nn.ModuleDict] = None
        self.stage_metrics: Optional[nn.ModuleDict] = None
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)

    def can_build(self) -> bool:
        return super().can_build() and self.hparams.tasks is not None

    def make_policies(self) -> list:
        return fine_tuning_policies(self.hparams.delta, self.hparams.delta_only)

    @property
    def tasks(self) -> dict[str, dict]:
        if self.hparams.tasks is None:
            specs = self.data_facts.task_specs() if self.data_facts is not None else {}
            if not specs:
                raise PtmError("MultitaskModule needs tasks: use data.class_path: MultitaskDataModule")
            self.hparams.tasks = specs
        for name, spec in self.hparams.tasks.items():
            kind = task_kind(spec.get("kind"), f"multitask task '{name}'")
            if kind.head is None:
                raise PtmError(f"multitask task '{name}': kind '{kind.name}' has no task head (its module builds its "
                               f"own output); use a labelled kind")
        return self.hparams.tasks

    def kind_of_task(self, task: str) -> TaskKind:
        return task_kind(self.tasks[task]["kind"])

    def configure_model(self) -> None:
        super().configure_model()
        if self.hparams.pooling is None:
            self.hparams.pooling = "first" if self.tokenizer is None or is_bert_style(self.tokenizer) else "last"
        if self.heads is None:
            width = self.backbone.config.hidden_size
            self.heads = nn.ModuleDict({
                name: nn.Sequential(nn.Dropout(self.hparams.dropout),
                                    nn.Linear(width, self.kind_of_task(name).width(spec["labels"])))
                for name, spec in self.tasks.items()})
            self.stage_metrics = nn.ModuleDict({stage: nn.ModuleDict({
                name: self.kind_of_task(name).build_metrics(spec["labels"]) for name, spec in self.tasks.items()})
                for stage in ("val", "test")})

    def task_collator(self, kind: str, tokenizer):
        """The collator a task of ``kind`` needs (asked for by ``MultitaskDataModule``)."""
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return task_kind(kind).collator(pad_token_id=pad)

    def make_collator(self, tokenizer, seed: int = 0):
        raise PtmError("MultitaskModule trains on a MultitaskDataModule (data.class_path: MultitaskDataModule)")

    # -- forward and losses -------------------------------------------------------------------------
    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.hparams.pooling == "first":
            return hidden[:, 0]
        last = attention_mask.long().sum(-1) - 1  # right padding: the last real token
        return hidden[torch.arange(len(hidden), device=hidden.device), last]

    def forward(self, batch: dict):
        """The task's outputs (its task type's): label scores [B, C], values [B], tag scores [B, T, C],
        (start, end) logits or choice scores [B, choices]."""
        task = batch["task"]
        hidden = self.backbone(**self.model_inputs(batch)).last_hidden_state
        hidden = hidden[:, prepended_tokens(self.backbone):]  # a soft prompt's positions have no labels
        kind = self.kind_of_task(task)
        if kind.reads != "tokens":  # one pooled row per example, or per (question, choice) pair
            hidden = self.pool(hidden, batch["attention_mask"])
        return kind.outputs(self.heads[task](hidden).float(), batch)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        task = batch["task"]
        loss = self.kind_of_task(task).loss(self(batch), batch)
        n = len(batch["input_ids"])
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        self.log("train/task", float(list(self.tasks).index(task)), batch_size=n)  # which task this step trained
        self.log(f"train/{task}/loss", loss, batch_size=n)  # (Lightning repeats it on other tasks' steps)
        return loss

    # -- evaluation ---------------------------------------------------------------------------------
    def _eval_step(self, stage: str, batch: dict) -> None:
        task = batch["task"]
        kind, out = self.kind_of_task(task), self(batch)
        n = len(batch["input_ids"])
        self.log(f"{stage}/{task}/loss", kind.loss(out, batch), batch_size=n, add_dataloader_idx=False)
        settings = {"labels": self.tasks[task]["labels"], "n_best": self.hparams.n_best,
                    "max_answer_length": self.hparams.max_answer_length}
        kind.update(self.stage_metrics[stage][task], out, batch, settings)

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_step("val", batch)

    def test_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_step("test", batch)

    def _log_metrics(self, stage: str) -> None:
        main = []
        for task in self.tasks:
            kind = self.kind_of_task(task)
            values = kind.compute(self.stage_metrics[stage][task],
                                  lambda: self.data_facts.task_records(task, SPLITS[stage]),  # noqa: B023
                                  self.stage_metrics["val"][task] if "val" in self.stage_metrics else None)
            self.log_dict({f"{stage}/{task}/{k}": v for k, v in values.items()}, add_dataloader_idx=False)
            main.append(values[kind.main_metric].float())
        self.log(f"{stage}/macro", torch.stack(main).mean(), prog_bar=(stage == "val"), add_dataloader_idx=False)

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val")

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test")
