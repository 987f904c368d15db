"""The base of every single-task adaptation module: the task's loss, metrics and evaluation come from its task kind
(``task_kinds.registry``: the same entries ``MultitaskModule`` uses), and the backbone's behaviours from policies,
not from mixins or subclasses: delta tuning, ``init_from``, L2-SP, frozen features (``adaptation.policies``), a
teacher's loss (``compression.teacher_loss``), quantization-aware training (``compression.fake_quant``), pruning
(``compression.pruning_policy``), off-ramps (``compression.early_exit_policy``) and module replacing
(``compression.theseus_policy``)."""
from __future__ import annotations

import re

from typing import Any, Optional

import torch
from torch import nn

from ptm_app.adaptation.policies import BackbonePolicy, FrozenFeatures, fine_tuning_policies
from ptm_app.backbones.delta import prepended_tokens
from ptm_app.compression.early_exit_policy import EarlyExit
from ptm_app.compression.fake_quant import FakeQuant
from ptm_app.compression.pruning_policy import Pruning
from ptm_app.compression.teacher_loss import TeacherLoss, as_distillation
from ptm_app.compression.theseus_policy import replacing
from ptm_app.task_kinds.spans import SPLITS
from ptm_app.checkpoint_io.reading import CKPT_KEY
from ptm_app.errors import PtmError
from ptm_app.task_kinds.registry import TaskKind, task_kind
from ptm_app.training.module import PtmModule


class TaskModule(PtmModule):
    """A ``PtmModule`` for one labelled task of kind ``task_kind``.

    ``forward(batch)`` returns the kind's outputs (label scores, values, tag scores, span logits or choice scores);
    training, ``val/*`` and ``test/*`` logging follow from the task kind's entry, and so do ``predict --text``'s rows
    (``predicts_rows = False``: a module whose ``predict_step`` is its own, e.g. prompting's label scoring).  The
    settings ``delta``, ``delta_only``, ``init_from``, ``l2_sp``, ``pruning`` (``compression.pruning_policy
    .PruneSpec``), ``distill`` (``compression.teacher_loss.Distillation``), ``qat``
    (``compression.fake_quant.QATSpec``), ``early_exit`` (``compression.early_exit_policy.ExitSpec``), ``theseus``
    (``compression.theseus_policy.TheseusSpec``) and ``representation`` with its settings (frozen features:
    ``adaptation.policies.FrozenFeatures``), where a subclass takes them, become policies.

    ``forward(batch)`` is ``outputs(backbone(**backbone_inputs(batch)))``: a subclass says how its batch feeds the
    model and how the model's output becomes the kind's, so a teacher of the same model class is read the same way.
    """

    task_kind: str = "sequence"
    predicts_rows: bool = True
    metric_stages: tuple[str, ...] = ("val", "test")

    def make_policies(self) -> list[BackbonePolicy]:
        hp = self.hparams
        pruning = Pruning(hp.pruning) if hp.get("pruning") is not None else None
        if pruning is not None and pruning.spec.heads is not None and hp.get("qat") is not None:
            raise PtmError("pruning.heads replaces the attention's linear layers, which qat has made fake-quantized; "
                           "prune first, then train the pruned run with qat")
        policies = fine_tuning_policies(hp.get("delta"), hp.get("delta_only", True), hp.get("init_from"),
                                        hp.get("l2_sp", 0.0), (pruning,) if pruning is not None else ())
        distill = as_distillation(hp.get("distill"))
        if distill is not None:
            if hp.get("adversarial"):
                raise PtmError("adversarial (FreeLB) and distill each replace the training loss; give only one")
            policies.append(TeacherLoss(distill, self.model_class))
        replaces = [name for name in ("distill", "early_exit", "theseus", "adversarial") if hp.get(name) is not None]
        if len(replaces) > 1:
            raise PtmError(f"{' and '.join(replaces)} each replace the training loss; give only one")
        if hp.get("early_exit") is not None:
            if hp.get("delta") is not None:
                raise PtmError("early_exit puts off-ramps on the backbone's own layers, which a delta wraps; tune "
                               "the full model with early_exit, or remove model.init_args.delta")
            policies.append(EarlyExit(hp.early_exit, self.kind_name()))
        if hp.get("theseus") is not None:
            reshaping = [name for name in ("delta", "pruning", "init_from") if hp.get(name) is not None]
            if reshaping:
                raise PtmError(f"theseus builds the successor from its predecessor and swaps its blocks, which "
                               f"{reshaping[0]} also changes; remove model.init_args.{reshaping[0]} (prune or tune "
                               f"the exported successor afterwards)")
            policies.append(replacing(hp.theseus, hp, self.model_class))
        if hp.get("qat") is not None:
            policies.append(FakeQuant(hp.qat))
        features = FrozenFeatures.from_settings(hp)
        if features is not None:
            policies.append(features)
        return policies

    def predicted_outputs(self, batch: dict) -> tuple[Any, Optional[list[dict]]]:
        """``(outputs, per-example extras or None)`` at prediction: a policy's (an early exit's, with each exit
        layer), else the forward's."""
        for policy in self.policies:
            found = policy.predict_outputs(self, batch)
            if found is not None:
                return found
        return self(batch), None

    # -- the model's inputs and outputs ----------------------------------------------------------------------------
    def backbone_inputs(self, batch: dict) -> dict:
        """The backbone's keyword inputs for ``batch``."""
        return self.model_inputs(batch)

    def outputs(self, model_output: Any, virtual: int = 0) -> Any:
        """The kind's outputs from the backbone's output (``virtual``: soft-prompt positions to drop)."""
        return model_output.logits

    def forward(self, batch: dict) -> Any:
        for policy in self.policies:  # frozen features: the task head on the frozen backbone's features
            out = policy.forward(self, batch)
            if out is not None:
                return out
        return self.outputs(self.backbone(**self.backbone_inputs(batch)), prepended_tokens(self.backbone))

    def default_style(self) -> str:
        return "full fine-tuning"

    def kind_name(self) -> str:
        """The task kind this module trains: its class's ``task_kind``, or the one its data chose (``kind``)."""
        return self.hparams.get("kind") or self.task_kind

    @property
    def kind(self) -> TaskKind:
        return task_kind(self.kind_name())

    @property
    def monitor(self) -> tuple[str, str]:
        """The best checkpoint's metric: the kind's main one on validation (higher is better)."""
        return f"val/{self.kind.main_metric}", "max"

    def task_labels(self) -> Optional[list[str]]:
        """The label names the metrics need (None for regression and QA)."""
        labels = self.hparams.get("labels")
        return list(labels) if labels is not None else None

    def eval_settings(self) -> dict[str, Any]:
        """What the task type's metric update needs besides outputs and batch."""
        return {"labels": self.task_labels(), "n_best": self.hparams.get("n_best", 20),
                "max_answer_length": self.hparams.get("max_answer_length", 30)}

    def build_metrics(self) -> nn.Module:
        return self.kind.build_metrics(self.task_labels())

    def configure_model(self) -> None:
        fresh = self.backbone is None
        super().configure_model()
        if fresh and self.kind.initial_bias is not None and self.data_facts is not None:
            bias = self.kind.initial_bias(self.data_facts)  # a checkpoint's weights replace it on load / resume
            if bias is not None:
                output_layer(self.backbone, bias.numel()).bias.data.copy_(bias)
        if getattr(self, "stage_metrics", None) is None:
            self.stage_metrics = nn.ModuleDict({stage: self.build_metrics() for stage in self.metric_stages})
            for stage, metric in self.stage_metrics.items():
                if stage != "val":
                    keep_tuned_values_out(metric)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        state = checkpoint.get("state_dict") or {}
        for key in [k for k in state if TUNED_OUTSIDE_VAL.fullmatch(k)]:  # saved by every stage before 2026-11-27
            del state[key]

    @staticmethod
    def batch_size(batch: dict) -> int:
        return len(batch["labels"] if "labels" in batch else batch["input_ids"])

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        n = self.batch_size(batch)
        for policy in self.policies:  # a teacher's loss replaces the task's
            replaced = policy.training_loss(self, batch)
            if replaced is not None:
                return self.add_penalties(self.log_train_losses(*replaced, n), n)
        adversarial = self.hparams.get("adversarial")
        if adversarial:  # FreeLB: the mean loss over K perturbed copies of the embeddings (training.adversarial)
            from ptm_app.training.adversarial import FreeLB, freelb_loss

            loss = freelb_loss(FreeLB(**adversarial), self.backbone.get_input_embeddings(), batch,
                               lambda inputs: self.kind.loss(self(inputs), batch))
        else:
            loss = self.kind.loss(self(batch), batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        return self.add_penalties(loss, n)

    def _eval_step(self, stage: str, batch: dict) -> Any:
        out = self(batch)
        self.log(f"{stage}/loss", self.kind.loss(out, batch), batch_size=self.batch_size(batch))
        self.kind.update(self.stage_metrics[stage], out, batch, self.eval_settings())
        for policy in self.policies:
            policy.eval_step(self, stage, batch, out)
        return out

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("val", batch)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("test", batch)

    def _log_metrics(self, stage: str) -> None:
        values = self.kind.compute(self.stage_metrics[stage], lambda: self.data_facts.records(SPLITS[stage]),
                                   self.stage_metrics["val"] if "val" in self.stage_metrics else None)
        self.log_dict({f"{stage}/{k}": v for k, v in values.items()}, prog_bar=(stage == "val"))

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val")
        self.policies_epoch_end("val")

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test")
        self.policies_epoch_end("test")

    def on_train_batch_start(self, batch: dict, batch_idx: int) -> None:
        for policy in self.policies:
            policy.train_batch_start(self)

    def optimizer_step(self, *args, **kwargs) -> None:
        super().optimizer_step(*args, **kwargs)
        for policy in self.policies:
            policy.optimizer_stepped(self)

    def summary_facts(self) -> dict:
        """Every policy's facts for ``summary.json`` (a student's and its teacher's sizes, a pruned model's ...)."""
        facts: dict = {}
        for policy in self.policies:
            facts.update(policy.summary(self))
        return facts

    def on_train_epoch_end(self) -> None:
        self.policies_epoch_end("train")

    def on_train_end(self) -> None:
        self.policies_epoch_end("train")

    def policies_epoch_end(self, stage: str) -> None:
        for policy in self.policies:
            policy.epoch_end(self, stage)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[CKPT_KEY]["task_kind"] = self.kind_name()  # the model card's intended use (task_kinds.registry)


def output_layer(model: nn.Module, width: int) -> nn.Linear:
    """The task head's last linear layer: the last ``nn.Linear`` of ``model`` with ``width`` outputs and a bias."""
    found = [m for m in model.modules() if isinstance(m, nn.Linear) and m.out_features == width and m.bias is not None]
    if not found:
        raise PtmError(f"{type(model).__name__} has no output layer of {width} features with a bias to initialise")
    return found[-1]


# Values tuned on validation and read there by every stage (``BestSpans.null_threshold``, ``LabelSetScores.thresholds``)
TUNED_OUTSIDE_VAL = re.compile(r"stage_metrics\.(?!val\.)\w+\.(null_threshold|thresholds)")


def keep_tuned_values_out(metric: nn.Module) -> None:
    """A stage other than validation keeps its metric's tuned buffers out of checkpoints: the values are tuned on
    validation and read from that stage's metric, so saving them per stage only duplicated them."""
    for module in metric.modules():
        if getattr(module, "tuned_on_validation", False):
            for name, buffer in list(module.named_buffers(recurse=False)):
                module.register_buffer(name, buffer, persistent=False)
