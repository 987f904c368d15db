"""Knowledge distillation into a sequence classifier with a student made from the teacher (DistilBERT's every other
layer, Sanh et al. 2019 §3; an ALBERT-shaped student, Lan et al. 2020 §3.1) or from a config whose embeddings are the
teacher's (Tang et al. 2019 §3).  The losses and the teacher are the ``distill`` policy every task module carries
(``compression.teacher_loss.TeacherLoss``: Hinton et al. 2015 §2, TinyBERT, PKD, DistilBERT, MiniLM); this class
adds the students built from the teacher and keeps the name and settings older configs and checkpoints use."""
from __future__ import annotations

from dataclasses import asdict
from typing import Optional

from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from ptm_app.adaptation.classification import SequenceClassificationModule
from ptm_app.backbones.build import max_positions
from ptm_app.compression.students import (SharedStudent, StudentLayers, as_shared_student, chosen_layers,
                                          copy_teacher_embeddings, shared_student, student_from_teacher)
from ptm_app.compression.teacher import TeacherInputs, same_vocabulary
from ptm_app.compression.teacher_loss import (TOKEN_LOSSES, Distillation, DistillSpec,  # noqa: F401 (older imports)
                                              TeacherLoss, as_distill_spec)
from ptm_app.errors import PtmError
from ptm_app.training.optim import OptimConfig


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
