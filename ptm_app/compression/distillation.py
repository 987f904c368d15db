"""Knowledge distillation for sequence classification: a student (any ``SequenceClassificationModule`` backbone,
or a smaller copy of the teacher) learns from a frozen teacher's soft targets (Hinton et al. 2015 §2), the gold
labels, and optionally its hidden states, attention scores and embeddings (TinyBERT, Jiao et al. 2020 §3.1;
PKD, Sun et al. 2019 §3.1), the DistilBERT cosine loss (Sanh et al. 2019 §3) and MiniLM's deep self-attention
distillation (Wang et al. 2020 §3.1–3.2)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, is_dataclass
from typing import Optional

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from ptm_app.adaptation.classification import SequenceClassificationModule
from ptm_app.adaptation.policies import FrozenFeatures
from ptm_app.backbones.build import max_positions
from ptm_app.checkpoints import CKPT_KEY
from ptm_app.compression import losses
from ptm_app.compression.layer_maps import LayerMap, layer_pairs
from ptm_app.compression.students import (SharedStudent, StudentLayers, as_shared_student, chosen_layers,
                                          copy_teacher_embeddings, shared_student, student_from_teacher)
from ptm_app.compression.teacher import (TeacherInputs, has_trained_head, load_teacher, resolve_teacher, same_vocabulary,
                                         size_facts)
from ptm_app.errors import PtmError
from ptm_app.training.optim import OptimConfig

TOKEN_LOSSES = ("hidden", "patient", "attention", "embedding", "cosine", "minilm")  # compare token positions: one vocabulary needed


@dataclass
class DistillSpec:
    """The loss weights (each term is logged as ``train/<name>``) and settings.

    Args:
        temperature: T of the soft targets.
        kd: weight of ``T²·KL(p_T ‖ p_S)`` (Hinton §2; with ``hard`` = α, Hinton's mix is ``kd: 1-α``).
        hard: weight α of the cross-entropy with the gold labels.
        logit_mse: weight of ``‖z_T − z_S‖²`` between the logits (Tang et al. 2019 §3.2, for a BiLSTM student).
        hidden: weight of the hidden-state MSE over ``layer_map`` (TinyBERT; PKD with ``skip`` / ``last``).
        patient: weight of PKD's patient loss on the normalised [CLS] states over ``layer_map`` (use it with
            ``skip`` or ``last``).
        attention: weight of the per-head attention-score MSE over ``layer_map`` (TinyBERT; BERT-style layers).
        embedding: weight of the embedding-layer MSE (TinyBERT).
        cosine: weight of ``1 − cos`` between the last hidden states (DistilBERT).
        minilm: weight of MiniLM's deep self-attention loss (Wang et al. 2020 §3.1–3.2): KL of the last layers'
            attention distributions + KL of their value relations, per head (same head count; BERT-style layers).
        layer_map: ``uniform``, ``skip``, ``last`` or ``[[student_layer, teacher_layer], ...]``
            (``compression.layer_maps``).
    """

    temperature: float = 2.0
    kd: float = 0.5
    hard: float = 0.5
    logit_mse: float = 0.0
    hidden: float = 0.0
    patient: float = 0.0
    attention: float = 0.0
    embedding: float = 0.0
    cosine: float = 0.0
    minilm: float = 0.0
    layer_map: LayerMap = "uniform"


def as_distill_spec(value) -> DistillSpec:
    if isinstance(value, DistillSpec):
        return value
    return DistillSpec(**(asdict(value) if is_dataclass(value) else (value or {})))


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
        self.logit_cache = None  # compression.logit_cache.TeacherLogitCache, opened at the first cached batch
        if cache_teacher_logits and any(getattr(self.spec, n) > 0 for n in TOKEN_LOSSES):
            raise PtmError("cache_teacher_logits keeps only the teacher's logits, and "
                           f"{', '.join(n for n in TOKEN_LOSSES if getattr(self.spec, n) > 0)} need(s) its hidden "
                           f"states every step; set cache_teacher_logits: false or keep only the kd / logit_mse / "
                           f"hard losses")
        self.shared_spec = as_shared_student(shared_student)
        chosen = [n for n, v in (("student_layers", student_layers), ("shared_student", shared_student),
                                 ("backbone", backbone)) if v]
        if len(chosen) > 1:
            raise PtmError(f"DistillationModule: {' and '.join(chosen)} each choose the student; give only one")
        if teacher_embeddings and (student_layers or shared_student):
            raise PtmError("teacher_embeddings copies the teacher's word embeddings into a student built from "
                           "backbone_config; student_layers already copies them and shared_student factorises "
                           "them: set teacher_embeddings: false")
        object.__setattr__(self, "_teacher", None)  # not a sub-module: never in state_dict, .train() or the optimiser
        self.teacher_tokenizer = None
        self.distill_projection = None
        super().__init__(backbone, backbone_config, labels, optim, gradient_checkpointing,
                         positive_label=positive_label)

    def default_style(self) -> str:
        return "distillation"

    # -- the teacher ------------------------------------------------------------------------------------------
    @property
    def teacher(self) -> nn.Module:
        if self._teacher is None:
            model, tokenizer = load_teacher(self.hparams.teacher)
            object.__setattr__(self, "_teacher", model)
            self.teacher_tokenizer = tokenizer
        return self._teacher

    def teacher_label_order(self) -> Optional[list[int]]:
        """Indices putting the teacher's logits in the student's label order (None: already the same)."""
        names = [self.teacher.config.id2label[i] for i in range(self.teacher.config.num_labels)]
        labels = list(self.hparams.labels)
        if names == labels:
            return None
        if sorted(names) != sorted(labels):
            raise PtmError(f"teacher '{self.hparams.teacher}' predicts labels {names} but the data's labels are "
                           f"{labels}; distil from a teacher fine-tuned on this label set, or set "
                           f"model.init_args.distill.kd and logit_mse to 0")
        return [names.index(label) for label in labels]

    def uses(self, name: str) -> bool:
        return getattr(self.spec, name) > 0

    def check_teacher(self) -> None:
        """Refuse, in one line, a teacher that cannot teach what the weights ask for."""
        logits = [n for n in ("kd", "logit_mse") if self.uses(n)]
        if logits and not has_trained_head(self.teacher):
            raise PtmError(f"teacher '{self.hparams.teacher}' has no trained classification head (a bare encoder); "
                           f"fine-tune it first, or set model.init_args.distill.{logits[0]}: 0")
        if logits:
            self.label_order = self.teacher_label_order()
        needs_vocab = [n for n in TOKEN_LOSSES if self.uses(n)]
        if self.hparams.student_layers:  # the teacher's embeddings are copied
            needs_vocab.append("student_layers")
        if self.hparams.teacher_embeddings:
            needs_vocab.append("teacher_embeddings")
        if self.shared_spec is not None:  # the ALBERT student takes the teacher's vocabulary
            needs_vocab.append("shared_student")
        if needs_vocab and self.tokenizer is not None and not same_vocabulary(self.tokenizer, self.teacher_tokenizer):
            size = len(self.teacher_tokenizer) if self.teacher_tokenizer is not None else "unknown"
            raise PtmError(f"teacher '{self.hparams.teacher}' and the student use different tokenizers (vocabularies "
                           f"of {size} and {len(self.tokenizer)} tokens), and {', '.join(needs_vocab)} compare(s) "
                           f"token positions; set data.init_args.tokenizer.pretrained to the teacher "
                           f"({self.hparams.teacher}), or keep only the kd and hard losses")

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
        fresh = self.backbone is None
        super().configure_model()
        if fresh:
            self.label_order = None
            self.check_teacher()
            mapped = any(self.uses(n) for n in ("hidden", "patient", "attention"))
            self.layer_pairs = layer_pairs(self.spec.layer_map, self.backbone.config.num_hidden_layers,
                                           self.teacher.config.num_hidden_layers) if mapped else []
            widths = (FrozenFeatures.width(self.backbone), FrozenFeatures.width(self.teacher))
            if widths[0] != widths[1] and any(self.uses(n) for n in ("hidden", "patient", "embedding", "cosine")):
                self.distill_projection = nn.Linear(*widths)  # TinyBERT's W_h (shared by its hidden losses)
            for loss in ("attention", "minilm"):
                if not self.uses(loss):
                    continue
                pairs = self.layer_pairs if loss == "attention" else [self.last_layers()]
                for student_layer, teacher_layer in pairs:
                    self.self_attention(self.backbone, student_layer, loss)
                    self.self_attention(self.teacher, teacher_layer, loss)
                heads = (self.backbone.config.num_attention_heads, self.teacher.config.num_attention_heads)
                if heads[0] != heads[1]:
                    raise PtmError(f"distill.{loss} compares heads one to one, but the student has {heads[0]} "
                                   f"and the teacher {heads[1]}; give the student {heads[1]} heads or set "
                                   f"distill.{loss}: 0")

    def make_collator(self, tokenizer, seed: int = 0):
        base = super().make_collator(tokenizer, seed)
        self.teacher  # loads the teacher and its tokenizer
        teacher_tok = self.teacher_tokenizer
        if same_vocabulary(tokenizer, teacher_tok):
            return base
        if teacher_tok is None:
            raise PtmError(f"teacher '{self.hparams.teacher}' has no tokenizer saved with it and the student's "
                           f"cannot be checked against it; give an exported directory or run directory of the teacher")
        facts = self.data_facts
        limit = [n for n in (max_positions(self.teacher), facts.max_length if facts else None) if n]
        return TeacherInputs(base, tokenizer, teacher_tok, min(limit) if limit else 512)

    # -- training -----------------------------------------------------------------------------------------------
    def teacher_inputs(self, batch: dict) -> dict:
        """The batch as the teacher reads it (its own tokens when its tokenizer is another)."""
        if "teacher_input_ids" in batch:
            return {k[len("teacher_"):]: v for k, v in batch.items() if k.startswith("teacher_")}
        return self.model_inputs(batch)

    def teacher_forward(self, batch: dict, hidden: bool):
        teacher = self.teacher
        if next(teacher.parameters()).device != self.device:
            teacher.to(self.device)
        with torch.no_grad():
            out = teacher(**self.teacher_inputs(batch), output_hidden_states=hidden)
        logits = out.logits if self.label_order is None else out.logits[:, self.label_order]
        return out, logits

    def cached_teacher_logits(self, batch: dict) -> tuple[torch.Tensor, float]:
        """The teacher's logits for a training batch from the cache, running the teacher only for examples it has
        not seen; also the share served from the cache."""
        from ptm_app.compression.logit_cache import TeacherLogitCache, autocast_precision, example_digests

        if self.logit_cache is None:
            self.logit_cache = TeacherLogitCache(resolve_teacher(self.hparams.teacher), self.teacher,
                                                 autocast_precision(self.device.type))
        digests = example_digests(self.teacher_inputs(batch))
        missing = [d for d in digests if self.logit_cache.get(d) is None]
        if missing:
            out, _ = self.teacher_forward(batch, hidden=False)
            for row, digest in enumerate(digests):
                self.logit_cache.put(digest, out.logits[row])
        logits = torch.stack([self.logit_cache.get(d) for d in digests]).to(self.device)
        logits = logits if self.label_order is None else logits[:, self.label_order]
        return logits, 1.0 - len(missing) / len(digests)

    def on_train_epoch_end(self) -> None:
        super().on_train_epoch_end()
        if self.logit_cache is not None:
            self.logit_cache.save()

    def on_train_end(self) -> None:
        super().on_train_end()
        if self.logit_cache is not None:
            self.logit_cache.save()

    def distill_losses(self, batch: dict) -> dict[str, torch.Tensor]:
        """Every loss with a weight above 0, unweighted, by name."""
        token_level = any(self.uses(n) for n in TOKEN_LOSSES)
        student = self.backbone(**self.model_inputs(batch), output_hidden_states=token_level)
        if self.hparams.get("cache_teacher_logits") and self.training:
            teacher = None
            teacher_logits, cached = self.cached_teacher_logits(batch)
            self.log("train/teacher_cached", cached, batch_size=self.batch_size(batch))
        else:
            teacher, teacher_logits = self.teacher_forward(batch, token_level)
        parts: dict[str, torch.Tensor] = {}
        if self.uses("kd"):
            parts["kd"] = losses.soft_target_loss(student.logits, teacher_logits, self.spec.temperature)
        if self.uses("hard"):
            parts["hard"] = self.kind.loss(student.logits, batch)
        if self.uses("logit_mse"):
            parts["logit_mse"] = losses.logit_mse(student.logits, teacher_logits)
        if not token_level:
            return parts
        mask = batch["attention_mask"]
        hs, ht = student.hidden_states, teacher.hidden_states
        project = self.distill_projection or (lambda h: h)
        if self.uses("embedding"):
            parts["embedding"] = losses.hidden_mse(project(hs[0]), ht[0], mask)
        if self.uses("hidden"):
            parts["hidden"] = sum(losses.hidden_mse(project(hs[s]), ht[t], mask)
                                  for s, t in self.layer_pairs) / len(self.layer_pairs)
        if self.uses("patient"):
            parts["patient"] = sum(losses.patient_loss(project(hs[s][:, 0]), ht[t][:, 0])
                                   for s, t in self.layer_pairs) / len(self.layer_pairs)
        if self.uses("attention"):
            parts["attention"] = sum(losses.attention_score_mse(self.layer_scores(self.backbone, hs, s),
                                                                self.layer_scores(self.teacher, ht, t), mask)
                                     for s, t in self.layer_pairs) / len(self.layer_pairs)
        if self.uses("cosine"):
            parts["cosine"] = losses.cosine_loss(project(hs[-1]), ht[-1], mask)
        if self.uses("minilm"):
            parts["minilm"] = self.self_attention_transfer(hs, ht, mask)
        return parts

    def last_layers(self) -> tuple[int, int]:
        return self.backbone.config.num_hidden_layers, self.teacher.config.num_hidden_layers

    def self_attention_transfer(self, hs: tuple, ht: tuple, mask: torch.Tensor) -> torch.Tensor:
        """MiniLM: KL of the last layers' attention distributions + KL of their value relations."""
        (s, t), relations = self.last_layers(), []
        for model, states, layer in ((self.backbone, hs, s), (self.teacher, ht, t)):
            attention = self.self_attention(model, layer, "minilm")
            heads = attention.num_attention_heads
            relations.append((losses.attention_scores(states[layer - 1], attention.query, attention.key, heads),
                              losses.value_relations(states[layer - 1], attention.value, heads)))
        (student_at, student_vr), (teacher_at, teacher_vr) = relations
        return losses.relation_kl(student_at, teacher_at, mask) + losses.relation_kl(student_vr, teacher_vr, mask)

    @staticmethod
    def self_attention(model: nn.Module, layer: int, loss: str = "attention") -> nn.Module:
        """Block ``layer``'s (1..L) BERT-style self-attention (``encoder.layer[i].attention.self``), or one line."""
        try:
            attention = model.base_model.encoder.layer[layer - 1].attention.self
            attention.query, attention.key, attention.value, attention.num_attention_heads
        except (AttributeError, IndexError, TypeError):
            raise PtmError(f"distill.{loss} reads BERT-style self-attention (encoder.layer[i].attention.self); "
                           f"{type(model).__name__} has none: set distill.{loss}: 0") from None
        return attention

    def layer_scores(self, model: nn.Module, hidden_states: tuple, layer: int) -> torch.Tensor:
        """Attention scores of block ``layer`` (1..L) from its input ``hidden_states[layer − 1]``."""
        attention = self.self_attention(model, layer)
        return losses.attention_scores(hidden_states[layer - 1], attention.query, attention.key,
                                       attention.num_attention_heads)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        parts = self.distill_losses(batch)
        total = sum(getattr(self.spec, name) * value for name, value in parts.items())
        return self.log_train_losses(total, parts, self.batch_size(batch))

    # -- the teacher's reference metrics --------------------------------------------------------------------------
    def validation_step(self, batch: dict, batch_idx: int) -> None:
        super().validation_step(batch, batch_idx)
        if self.teaching_reference():
            if getattr(self, "teacher_val_metrics", None) is None:
                object.__setattr__(self, "teacher_val_metrics", self.build_metrics().to(self.device))
            _, logits = self.teacher_forward(batch, hidden=False)
            self.kind.update(self.teacher_val_metrics, logits, batch, self.eval_settings())

    def teaching_reference(self) -> bool:
        logits = self.uses("kd") or self.uses("logit_mse")
        return (self.hparams.teacher_metrics and logits and not getattr(self, "teacher_logged", False)
                and self._trainer is not None and not self.trainer.sanity_checking)

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if self.teaching_reference() and getattr(self, "teacher_val_metrics", None) is not None:
            values = self.teacher_val_metrics.compute()
            self.log_dict({f"val/teacher_{k}": v for k, v in values.items()})
            object.__setattr__(self, "teacher_logged", True)

    def summary_facts(self) -> dict:
        """The student's and the teacher's parameter counts for ``summary.json`` (shared weights count once)."""
        return size_facts(self.backbone, self.teacher)

    # -- checkpoints: the teacher by name, never its weights ------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        hparams = checkpoint["hyper_parameters"]
        hparams["teacher"] = resolve_teacher(self.hparams.teacher)
        hparams["distill"] = asdict(self.spec)
        if self.shared_spec is not None:
            hparams["shared_student"] = asdict(self.shared_spec)
        checkpoint[CKPT_KEY]["training_only"] = ["distill_projection."]  # export leaves W_h out
        # a run resumed from a checkpoint written after the teacher's evaluation does not repeat it
        checkpoint[CKPT_KEY]["teacher_logged"] = bool(getattr(self, "teacher_logged", False))
        if self.logit_cache is not None:  # a run resumed from this checkpoint finds every logit computed so far
            self.logit_cache.save()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        object.__setattr__(self, "teacher_logged", bool(checkpoint.get(CKPT_KEY, {}).get("teacher_logged")))
