"""``SequenceClassificationModule`` with one compression policy preset, under the names and flat settings older
configs and checkpoints use: ``DistillationModule`` (``distill``, plus students built from the teacher),
``TheseusModule`` (``theseus``), ``EarlyExitModule`` (``early_exit``), ``PruningModule`` (``pruning``) and
``QuantAwareModule`` (``qat``).  The policies live in ``compression/`` and every task module carries them
(``adaptation.task_module``); these classes sit above both.  Checkpoints and exports written while they lived in
``compression/`` name them there: ``module_classes.RENAMED_MODULE_CLASSES`` maps those names here."""
from __future__ import annotations

from dataclasses import asdict
from typing import Literal, Optional

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from ptm_app.adaptation.classification import SequenceClassificationModule
from ptm_app.backbones.build import build_backbone, max_positions
from ptm_app.compression.early_exit_policy import EarlyExit, ExitSpec, exit_table, unit_facts
from ptm_app.compression.fake_quant import QATSpec
from ptm_app.compression.pruning_policy import PruneSpec, Pruning
from ptm_app.compression.students import (SharedStudent, StudentLayers, as_shared_student, chosen_layers,
                                          copy_teacher_embeddings, shared_student, student_from_teacher)
from ptm_app.compression.teacher import TeacherInputs, resolve_teacher, same_vocabulary
from ptm_app.compression.teacher_loss import Distillation, DistillSpec, TeacherLoss, as_distill_spec
from ptm_app.compression.theseus_policy import Theseus, TheseusSpec, replacement_rate, replacing
from ptm_app.errors import PtmError
from ptm_app.training.optim import OptimConfig

__all__ = ["DistillationModule", "EarlyExitModule", "PruningModule", "QuantAwareModule", "TheseusModule"]


def from_run(module: SequenceClassificationModule) -> nn.Module:
    """The backbone of ``PruningModule`` / ``QuantAwareModule`` whose ``backbone`` may name a run (looked up under
    the runs directory, like a teacher: ``compression.teacher.resolve_teacher``).  The RNG is left as it was: the first
    run from a checkpoint exports it (a random init, then its weights), and the next run must draw the same."""
    with torch.random.fork_rng(devices=[]):
        return build_backbone(module.model_class, resolve_teacher(module.hparams.backbone),
                              module.hparams.backbone_config, **module.config_updates())


class DistillationModule(SequenceClassificationModule):
    """A student classifier distilled from a frozen teacher; logs the task metrics (``val/acc`` …) for the student
    and, once (the first validation after the sanity check), the teacher's as ``val/teacher_acc`` ….

    Args:
        teacher: a run directory or ``.ckpt`` (e.g. ``checkpoints/minilm_full_bbc``, also looked up under the runs
            directory), an exported directory or a prepared model name.  Frozen, eval mode, not saved.
        student_layers: build the student from the teacher: ``every_other`` (DistilBERT) or a list of teacher
            layers (1..L) whose weights it starts from (with the teacher's embeddings, pooler and head).  Unset:
            the student is ``backbone`` / ``backbone_config`` (pretrained, or a from-scratch config).
        distill: loss weights, temperature and layer map (``DistillSpec``).
        teacher_metrics: evaluate the teacher once on the validation data for reference.
        teacher_embeddings: start a student built from ``backbone_config`` (the BiLSTM of Tang et al. 2019 §3, the
            CNN of Kim 2014) from the teacher's word embeddings (its ``embedding_dim`` defaults to the teacher's
            width; the tokenizer must be the teacher's).  Applied when the student is built, before any restore.
        shared_student: an ALBERT student (``compression.students.SharedStudent``: factorised embeddings and
            cross-layer sharing, Lan et al. 2020 §3.1) shaped by the teacher's config, trained from scratch.
            ``summary.json`` reports ``student_params``, ``teacher_params`` and ``compression`` (their ratio).
        cache_teacher_logits: compute the teacher's logits once per training example and reuse them afterwards
            (``compression.logit_cache``: a file on disk keyed by the teacher's path and weights and by each
            example's tokens), so later epochs, a resumed run, a second run and other students of the same teacher
            do not run it.  Logs ``train/teacher_cached`` (the batch's share served from the cache).  Only for the
            logit losses (kd, logit_mse): the others need the teacher's states.
    """


    def __init__(self, teacher: str, student_layers: Optional[StudentLayers] = None,
                 distill: DistillSpec = DistillSpec(), backbone: Optional[str] = None,
                 backbone_config: Optional[dict] = None, labels: Optional[list[str]] = None,
                 optim: OptimConfig = OptimConfig(lr=5e-5), gradient_checkpointing: bool = False,
                 positive_label: Optional[str] = None, teacher_metrics: bool = True,
                 teacher_embeddings: bool = False, shared_student: Optional[SharedStudent] = None,
                 cache_teacher_logits: bool = False):
        self.spec = as_distill_spec(distill)
        self.shared_spec = as_shared_student(shared_student)
        chosen = [n for n, v in (("student_layers", student_layers), ("shared_student", shared_student),
                                 ("backbone", backbone)) if v]
        if len(chosen) > 1:
            raise PtmError(f"DistillationModule: {' and '.join(chosen)} each choose the student; give only one")
        if teacher_embeddings and (student_layers or shared_student):
            raise PtmError("teacher_embeddings copies the teacher's word embeddings into a student built from "
                           "backbone_config; student_layers already copies them and shared_student factorises "
                           "them: set teacher_embeddings: false")
        self.teacher_tokenizer = None
        self.distill_projection = None
        super().__init__(backbone, backbone_config, labels, optim, gradient_checkpointing,
                         positive_label=positive_label)

    def make_policies(self) -> list:
        """The ``distill`` policy from this class's own settings (its ``distill`` holds only the weights)."""
        hp = self.hparams
        spec = Distillation(**asdict(as_distill_spec(hp.distill)), teacher=hp.teacher,
                            teacher_metrics=hp.teacher_metrics, cache_teacher_logits=hp.cache_teacher_logits)
        vocabulary = [name for name, on in (("student_layers", hp.student_layers),  # the teacher's embeddings
                                            ("teacher_embeddings", hp.teacher_embeddings),
                                            ("shared_student", hp.shared_student)) if on]  # ALBERT: its vocabulary
        return [TeacherLoss(spec, self.model_class, tuple(vocabulary))]

    def default_style(self) -> str:
        return "distillation"

    # -- the teacher (the policy's) ----------------------------------------------------------------------------
    @property
    def teaching(self) -> TeacherLoss:
        return self.policy(TeacherLoss)

    @property
    def teacher(self) -> nn.Module:
        return self.teaching.teacher

    @property
    def teacher_logged(self) -> bool:
        return self.teaching.logged

    def teacher_forward(self, batch: dict, hidden: bool):
        """``(the teacher's output, its logits in the student's label order)``."""
        return self.teaching.teacher_forward(self, batch, hidden)

    # -- building -----------------------------------------------------------------------------------------------
    def can_build(self) -> bool:
        from_teacher = bool(self.hparams.student_layers) or self.shared_spec is not None
        return self.hparams.labels is not None and (from_teacher or super().can_build())

    def config_updates(self) -> dict:
        updates = super().config_updates()
        if self.copies_embeddings() and "embedding_dim" not in (self.hparams.backbone_config or {}):
            updates["embedding_dim"] = self.teacher.get_input_embeddings().embedding_dim
        return updates

    def copies_embeddings(self) -> bool:
        return bool(self.hparams.get("teacher_embeddings")) and not self.hparams.student_layers

    def build_model(self):
        labels = ("num_labels", "id2label", "label2id")  # the rest of the config is the teacher's
        if self.shared_spec is not None:
            updates = {k: v for k, v in self.config_updates().items() if k in labels}
            return shared_student(self.teacher, self.shared_spec, **updates)
        if not self.hparams.student_layers:
            student = super().build_model()
            if self.copies_embeddings():
                copy_teacher_embeddings(student, self.teacher)
            return student
        layers = chosen_layers(self.hparams.student_layers, self.teacher.config.num_hidden_layers)
        updates = {k: v for k, v in self.config_updates().items() if k in labels}
        rank_zero_info(f"student: teacher layers {layers} of {self.teacher.config.num_hidden_layers}")
        return student_from_teacher(self.teacher, layers, **updates)

    def configure_model(self) -> None:
        """The teacher is checked whenever the student is built (its students are made from the teacher anyway)."""
        fresh = self.backbone is None
        super().configure_model()
        if fresh:
            self.teaching.check(self)

    def make_collator(self, tokenizer, seed: int = 0):
        """A teacher with another vocabulary reads each example again, tokenized its way (logit losses only)."""
        base = super().make_collator(tokenizer, seed)
        teacher_tok = self.teaching.frozen.tokenizer  # loads the teacher and its tokenizer
        self.teacher_tokenizer = teacher_tok
        if same_vocabulary(tokenizer, teacher_tok):
            return base
        if teacher_tok is None:
            raise PtmError(f"teacher '{self.hparams.teacher}' has no tokenizer saved with it and the student's "
                           f"cannot be checked against it; give an exported directory or run directory of the teacher")
        facts = self.data_facts
        limit = [n for n in (max_positions(self.teacher), facts.max_length if facts else None) if n]
        return TeacherInputs(base, tokenizer, teacher_tok, min(limit) if limit else 512)

    # -- checkpoints: the teacher by name, never its weights ------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        hparams = checkpoint["hyper_parameters"]
        hparams["teacher"] = hparams["distill"]["teacher"]  # resolved by the policy
        hparams["distill"] = asdict(self.spec)  # this class's distill: the weights alone
        if self.shared_spec is not None:
            hparams["shared_student"] = asdict(self.shared_spec)


class TheseusModule(SequenceClassificationModule):
    """Compress a fine-tuned classifier by progressive module replacing; logs ``train/replace_rate`` (p_t) and
    ``train/replaced`` (the fraction of modules replaced at that step) next to ``train/loss``.

    Args: ``predecessor``, ``compress_ratio``, ``successor_init``, ``curriculum_k``, ``curriculum_b``, ``seed``:
    those of ``compression.theseus_policy.TheseusSpec`` (``theseus`` of any task module).  ``backbone`` /
    ``backbone_config``: written by the checkpoint (the successor's config); leave them unset, the successor is built
    from the predecessor.
    """

    def __init__(self, predecessor: str, compress_ratio: int = 2, successor_init: Optional[list[int]] = None,
                 curriculum_k: float = 1e-3, curriculum_b: float = 0.3, labels: Optional[list[str]] = None,
                 optim: OptimConfig = OptimConfig(lr=2e-5), positive_label: Optional[str] = None, seed: int = 0,
                 backbone: Optional[str] = None, backbone_config: Optional[dict] = None):
        super().__init__(None, backbone_config, labels, optim, positive_label=positive_label)

    def make_policies(self) -> list:
        """The ``theseus`` policy from this class's flat settings."""
        hp = self.hparams
        spec = TheseusSpec(hp.predecessor, hp.compress_ratio, hp.successor_init, hp.curriculum_k, hp.curriculum_b,
                           hp.seed)
        return [replacing(spec, hp, self.model_class)]

    @property
    def replacing(self) -> Theseus:
        return self.policy(Theseus)

    @property
    def predecessor(self) -> nn.Module:
        return self.replacing.predecessor

    def predecessor_blocks(self) -> nn.ModuleList:
        return self.replacing.predecessor_blocks()

    def replace_rate(self, step: int) -> float:
        return replacement_rate(step, self.hparams.curriculum_k, self.hparams.curriculum_b)

    def mixed_blocks(self, replaced: torch.Tensor) -> list[nn.Module]:
        return self.replacing.mixed_blocks(self, replaced)

    def mixed_logits(self, batch: dict, replaced: torch.Tensor) -> torch.Tensor:
        return self.replacing.mixed_outputs(self, batch, replaced)


class EarlyExitModule(SequenceClassificationModule):
    """A BERT-style classifier with an off-ramp after each of its first L−1 layers (layer L is its own head).

    Logs the final layer's ``val/acc`` … as usual and, for every entropy threshold S and patience t,
    ``val/entropy_S/acc``, ``val/entropy_S/exit_layer``, ``val/entropy_S/speedup`` and ``val/patience_t/...``
    (and ``test/...``); ``summary.json`` gets the table as ``early_exit``.

    Args: ``method``, ``final_steps``, ``entropy_thresholds``, ``patiences``, ``predict_exit``: those of
    ``compression.early_exit_policy.ExitSpec`` (``early_exit`` of a ``SequenceClassificationModule``).
    """

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 labels: Optional[list[str]] = None, optim: OptimConfig = OptimConfig(lr=3e-5),
                 method: Literal["deebert", "pabee"] = "pabee", final_steps: int = 0,
                 entropy_thresholds: list[float] = (0.1, 0.3, 0.6), patiences: list[int] = (1, 2, 3),
                 positive_label: Optional[str] = None, predict_exit: Optional[str] = None):
        super().__init__(backbone, backbone_config, labels, optim, positive_label=positive_label)

    def make_policies(self) -> list:
        """The ``early_exit`` policy from this class's flat settings."""
        hp = self.hparams
        spec = ExitSpec(method=hp.method, final_steps=hp.final_steps, entropy_thresholds=list(hp.entropy_thresholds),
                        patiences=list(hp.patiences), predict_exit=hp.predict_exit)
        return [EarlyExit(spec, self.kind_name())]

    @property
    def exiting(self) -> EarlyExit:
        return self.policy(EarlyExit)

    def layer_logits(self, batch: dict, backbone_grad: bool = True) -> list[torch.Tensor]:
        """Logits of the classifier after every layer 1..L (layer L: the model's own pooler and head)."""
        return self.exiting.layer_logits(self, batch, backbone_grad)

    def exit_table(self, layer_logits: torch.Tensor, labels: torch.Tensor) -> list[dict]:
        """One row per criterion: accuracy at the exit, mean exit layer, layer speed-up."""
        spec = self.exiting.spec
        return exit_table(unit_facts(layer_logits, labels), spec.entropy_thresholds, spec.patiences)

    def exit_forward(self, batch: dict, rule: Optional[tuple[str, float]] = None):
        """``EarlyExit.exit_forward``: the forward that stops once every example has exited."""
        return self.exiting.exit_forward(self, batch, rule)


class PruningModule(SequenceClassificationModule):
    """Fine-tuning with pruning; every ``SequenceClassificationModule`` setting applies, and ``backbone`` may name a
    run (looked up under the runs directory, like a teacher).

    Args:
        pruning: ``layers`` (``LayerDropSpec``), ``heads`` (``HeadPruningSpec``), ``magnitude``
            (``compression.magnitude.MagnitudeSpec``); each optional.
    """

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 labels: Optional[list[str]] = None, optim: OptimConfig = OptimConfig(lr=3e-5),
                 gradient_checkpointing: bool = False, pruning: PruneSpec = PruneSpec(),
                 positive_label: Optional[str] = None):
        super().__init__(backbone, backbone_config, labels, optim, gradient_checkpointing,
                         positive_label=positive_label)

    @property
    def spec(self) -> PruneSpec:
        return self.policy(Pruning).spec

    def build_model(self):
        return from_run(self) if self.hparams.backbone else super().build_model()


class QuantAwareModule(SequenceClassificationModule):
    """A sequence classifier fine-tuned quantization-aware (Q8BERT): ``SequenceClassificationModule`` with the
    ``qat`` policy always on (``compression.fake_quant.FakeQuant``), the name older configs and checkpoints use.
    ``backbone`` may name a run (looked up under the runs directory).  Then ``python main.py quantize --ckpt_path
    RUN --output_dir DIR`` converts it to int8.

    Args:
        qat: ``QATSpec`` (EMA decay of the activation ranges; activations on/off).
    """

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 labels: Optional[list[str]] = None, optim: OptimConfig = OptimConfig(lr=3e-5),
                 gradient_checkpointing: bool = False, qat: QATSpec = QATSpec(),
                 positive_label: Optional[str] = None):
        super().__init__(backbone, backbone_config, labels, optim, gradient_checkpointing,
                         positive_label=positive_label)

    def build_model(self):
        return from_run(self) if self.hparams.backbone else super().build_model()
