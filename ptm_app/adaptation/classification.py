"""Full fine-tuning for sequence classification, single sentences or pairs
(BERT: Devlin et al. 2019 §4.1: the final [CLS] state feeds a new output layer), with stage chaining
(``init_from``) and the L2-SP penalty against catastrophic forgetting (Li et al. 2018)."""
from __future__ import annotations

from dataclasses import asdict
from typing import Optional

import torch

from ptm_app.adaptation.chaining import InitFrom
from ptm_app.adaptation.task_module import TaskModule
from ptm_app.backbones.delta import DeltaSpec
from ptm_app.compression.early_exit_policy import ExitSpec
from ptm_app.compression.fake_quant import QATSpec
from ptm_app.compression.pruning_policy import PruneSpec
from ptm_app.compression.teacher_loss import Distillation
from ptm_app.compression.theseus_policy import TheseusSpec
from ptm_app.data.collators import PadCollator
from ptm_app.errors import PtmError
from ptm_app.task_kinds.label_scores import positive_index
from ptm_app.task_kinds.registry import task_kind
from ptm_app.training.adversarial import FreeLB
from ptm_app.training.optim import OptimConfig


class SequenceClassificationModule(TaskModule):
    """Fine-tune every weight of the backbone plus a fresh classification head.

    Logs ``val/acc``, ``val/f1_macro``, ``val/mcc`` and for two labels ``val/f1`` (the positive class's F1;
    GLUE's pair-task metric) and the same under ``test/``; ``predict`` yields labels and probabilities.

    Args:
        backbone: prepared name / local dir / exported run / hub id of the pretrained encoder.
        backbone_config: config overrides (e.g. ``classifier_dropout``), or a from-scratch config.
        labels: the label names in order; by default taken from the data module.
        positive_label: the positive class of a two-label task, for ``f1`` (default: the second label).
        optim: optimiser and schedule.
        l2_sp: α of the L2-SP penalty ``α/2·‖w − w⁰‖²`` (Li et al. 2018) pulling the pre-trained encoder
            weights (not the new head) towards w⁰, their values when the fit starts (after ``init_from``);
            logged as ``train/l2_sp`` and added to the loss (``train/loss`` stays the cross-entropy).
        init_from: start from an earlier stage's weights (see ``adaptation.chaining.InitFrom``).  Applied once,
            when a fit builds the module (before any restore: sharded strategies see the loaded weights); on
            ``--ckpt_path`` resume the restored checkpoint then replaces them (the source is still read, so it
            must exist), and ``load_from_checkpoint`` never applies it.  Its ``freeze`` always applies.
        delta: parameter-efficient tuning (``backbones.delta.DeltaSpec``): bottleneck adapters (houlsby,
            pfeiffer, pals), lora, ia3, prefix, prompt, ptuning or bitfit; only the delta (+ head) trains.
        delta_only: checkpoints then hold only the delta weights; the frozen base is rebuilt from ``backbone``.
        kind: the task kind (``task_kinds.registry``): ``sequence`` (one label per text, the default) or another
            kind of this model class (its entry gives the loss, metrics, best-checkpoint metric and predictions);
            it must be the data's kind.
        adversarial: FreeLB adversarial training in the word-embedding space (``training.adversarial.FreeLB``,
            Zhu et al. 2020): each step trains on K perturbed copies of the batch; the defence ``attack`` measures.
        distill: distil from a teacher of the same model class (``compression.teacher_loss.Distillation``: the
            teacher and the loss weights; Hinton et al. 2015 §2): its loss replaces the task's.
        qat: quantization-aware training (``compression.fake_quant.QATSpec``; Q8BERT), for ``main.py quantize``.
        pruning: layer dropping, iterative head pruning and magnitude pruning while fine-tuning
            (``compression.pruning_policy.PruneSpec``; Sajjad et al. 2020, Michel et al. 2019, Zhu & Gupta 2017).
        early_exit: off-ramps after every layer and inference that stops at the first confident one
            (``compression.early_exit_policy.ExitSpec``; DeeBERT, Xin et al. 2020; PABEE, Zhou et al. 2020).
        theseus: compress a fine-tuned ``predecessor`` of this model class by progressive module replacing
            (``compression.theseus_policy.TheseusSpec``; BERT-of-Theseus, Xu et al. 2020): the backbone is the
            successor, built from it.
    """

    model_class = "sequence_classification"
    task_kind = "sequence"
    needs_labels = True  # one logit per label (regression: one value)

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 labels: Optional[list[str]] = None, optim: OptimConfig = OptimConfig(lr=3e-5),
                 gradient_checkpointing: bool = False, l2_sp: float = 0.0, init_from: Optional[InitFrom] = None,
                 delta: Optional[DeltaSpec] = None, delta_only: bool = True, positive_label: Optional[str] = None,
                 kind: Optional[str] = None, adversarial: Optional[FreeLB] = None,
                 distill: Optional[Distillation] = None, qat: Optional[QATSpec] = None,
                 pruning: Optional[PruneSpec] = None, early_exit: Optional[ExitSpec] = None,
                 theseus: Optional[TheseusSpec] = None):
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)
        if adversarial is not None:  # checked now; a plain dict in the hparams (weights-only checkpoints)
            self.hparams["adversarial"] = asdict(adversarial if isinstance(adversarial, FreeLB)
                                                 else FreeLB(**adversarial))

    def can_build(self) -> bool:
        return super().can_build() and (self.hparams.get("labels") is not None or not self.needs_labels)

    def config_updates(self) -> dict:
        return {**super().config_updates(), **self.output_config()}

    def output_config(self) -> dict:
        """The transformers config of the output layer: one logit per label, named."""
        facts = self.data_facts
        if self.hparams.labels is None and facts is not None:
            self.hparams.labels = facts.labels()
        if facts is not None and facts.task == "regression":
            raise PtmError(f"{type(self).__name__} classifies, and data.task is regression; "
                           f"use model.class_path: SequenceRegressionModule")
        self.check_data_kind(facts)
        labels = list(self.hparams.labels or [])
        if not labels:
            raise PtmError("SequenceClassificationModule needs labels: set model.init_args.labels or use a TaskDataModule")
        problem = {"problem_type": self.kind.problem_type} if self.kind.problem_type else {}
        return {"num_labels": len(labels), "id2label": dict(enumerate(labels)),
                "label2id": {n: i for i, n in enumerate(labels)}, **problem}

    def check_data_kind(self, facts) -> None:
        """The data's task kind must be the one this module trains (``kind``): one line naming the setting."""
        # (frozen-feature modules build their own)
        if self.hparams.get("kind") and self.kind.model_class != self.model_class:
            raise PtmError(f"model.init_args.kind {self.kind.name}: {type(self).__name__} trains the kinds of a "
                           f"{self.model_class} model; for {self.kind.name} use the module of that kind")
        data_kind = getattr(facts, "kind", None)
        if facts is None or data_kind is None or task_kind(data_kind, "data").name == self.kind.name:
            return
        entry = task_kind(data_kind, "data")
        fix = (f"set model.init_args.kind: {entry.name}"
               if entry.model_class == self.model_class and "kind" in self.hparams else "use the module of that kind")
        raise PtmError(f"{type(self).__name__} trains the {self.kind.name} kind, and the data is of kind "
                       f"{entry.name}; {fix}")

    def build_metrics(self):
        labels = self.task_labels()
        return self.kind.build_metrics(labels, positive_index(labels, self.hparams.get("positive_label")))

    def make_collator(self, tokenizer, seed: int = 0) -> PadCollator:
        return PadCollator(pad_token_id=tokenizer.pad_token_id)

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        """The kind's scores: every label's probability (``training.callbacks.PredictionWriter`` writes the rows)."""
        outputs, extras = self.predicted_outputs(batch)
        return {"keys": batch["keys"], **self.kind.scores(outputs, self), **({"row_extras": extras} if extras else {})}


class SequenceRegressionModule(SequenceClassificationModule):
    """Fine-tuning for a real-valued target (GLUE's STS-B: Wang et al. 2019 §3; BERT §4.1): one linear output
    on the [CLS] state, mean-squared error loss; logs ``val/pearson``, ``val/spearman``, ``val/mse`` (and
    ``test/*``); ``predict`` writes one value per example.  Takes every ``SequenceClassificationModule``
    option but the label set, ``distill`` (a value has no distribution to distil) and ``early_exit`` (nor an entropy
    or a class to exit by): delta tuning, ``init_from``, L2-SP, ``qat``, ``pruning``, ``theseus``.
    """

    task_kind = "regression"
    needs_labels = False

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(lr=3e-5), gradient_checkpointing: bool = False, l2_sp: float = 0.0,
                 init_from: Optional[InitFrom] = None, delta: Optional[DeltaSpec] = None, delta_only: bool = True,
                 qat: Optional[QATSpec] = None, pruning: Optional[PruneSpec] = None,
                 theseus: Optional[TheseusSpec] = None):
        super().__init__(backbone, backbone_config, None, optim, gradient_checkpointing, l2_sp, init_from, delta,
                         delta_only)

    def output_config(self) -> dict:
        """One real-valued output (mean-squared error)."""
        facts = self.data_facts
        if facts is not None and (facts.task or "regression") != "regression":
            raise PtmError("SequenceRegressionModule needs real-valued targets: set data.init_args.task: regression")
        return {"num_labels": 1, "problem_type": "regression"}

    def build_metrics(self):
        return self.kind.build_metrics(None)

    def forward(self, batch: dict) -> torch.Tensor:
        return super().forward(batch).float().squeeze(-1)

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        return {"keys": batch["keys"], "values": self(batch).cpu()}
