"""Knowledge distillation as a policy any task module carries (``model.init_args.distill: {teacher: ..., ...}``):
the student trains on a frozen teacher's soft targets (Hinton et al. 2015 §2: ``T²·KL(softmax(z_T/T) ‖
softmax(z_S/T))``), the gold labels, and optionally the teacher's hidden states, attention scores and embeddings
(TinyBERT, Jiao et al. 2020 §3.1; PKD, Sun et al. 2019 §3.1), DistilBERT's cosine loss (Sanh et al. 2019 §3) and
MiniLM's deep self-attention distillation (Wang et al. 2020 §3.1–3.2).  The losses are ``compression.losses``.

The soft targets line up per task kind (its registry entry's ``soft_targets``, ``task_kinds.parts``): one
distribution per example (sequence over its labels, choice over its choices), one per labelled token (token
classification: the first sub-token of each word, never padding or ``-100`` positions), and the answer's start and
end distributions over a window's real tokens (QA).  The teacher is a run of the same model class
(``compression.teacher``), frozen, never saved with the student (the checkpoint names it)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, is_dataclass
from typing import Any, Optional

import torch
from torch import nn

from ptm_app.backbones.delta import prepended_tokens
from ptm_app.backbones.layers import hidden_width
from ptm_app.checkpoint_io.reading import CKPT_KEY
from ptm_app.compression import losses
from ptm_app.compression.layer_maps import LayerMap, layer_pairs
from ptm_app.compression.teacher import FrozenTeacher, resolve_teacher, same_vocabulary, size_facts
from ptm_app.errors import PtmError
from ptm_app.task_kinds.parts import SoftTargets
from ptm_app.training.policy import BackbonePolicy

TOKEN_LOSSES = ("hidden", "patient", "attention", "embedding", "cosine", "minilm")  # compare token positions: one vocabulary needed
LOGIT_LOSSES = ("kd", "logit_mse")


@dataclass
class DistillSpec:
    """The loss weights (each term is logged as ``train/<name>``) and settings.

    Args:
        temperature: T of the soft targets.
        kd: weight of ``T²·KL(p_T ‖ p_S)`` (Hinton §2; with ``hard`` = α, Hinton's mix is ``kd: 1-α``).
        hard: weight α of the task's own loss with the gold labels.
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
        return DistillSpec(**{f.name: getattr(value, f.name) for f in fields(DistillSpec)})
    value = asdict(value) if is_dataclass(value) else dict(value or {})
    return DistillSpec(**{k: v for k, v in value.items() if k in {f.name for f in fields(DistillSpec)}})


@dataclass
class Distillation(DistillSpec):
    """A task module's ``distill`` setting: the teacher and ``DistillSpec``'s weights.

    Args:
        teacher: a run directory or ``.ckpt`` of the same kind of model (e.g. ``checkpoints/minilm_full_brown_pos``, also
            looked up under the runs directory), an exported directory or a prepared model name.
        teacher_metrics: evaluate the teacher once on the validation data for reference (``val/teacher_<metric>``).
        cache_teacher_logits: compute the teacher's logits once per training example and reuse them
            (``compression.logit_cache``; logs ``train/teacher_cached``); sequence classification only, and only for
            the logit losses (kd, logit_mse): the others need the teacher's states.
    """

    teacher: Optional[str] = None
    teacher_metrics: bool = True
    cache_teacher_logits: bool = False

    def __post_init__(self):
        if not self.teacher:
            raise PtmError("distill.teacher is not set: name the teacher's run directory, export or prepared model, "
                           "e.g. distill: {teacher: checkpoints/minilm_full_brown_pos}")
        token = [n for n in TOKEN_LOSSES if getattr(self, n) > 0]
        if self.cache_teacher_logits and token:
            raise PtmError(f"cache_teacher_logits keeps only the teacher's logits, and {', '.join(token)} need(s) its "
                           f"hidden states every step; set cache_teacher_logits: false or keep only the kd / "
                           f"logit_mse / hard losses")


def as_distillation(value) -> Optional[Distillation]:
    if value is None or isinstance(value, Distillation):
        return value
    return Distillation(**(asdict(value) if is_dataclass(value) else value))


class TeacherLoss(BackbonePolicy):
    """The distillation loss ``Σ_name weight · term`` replaces the task's training loss; the teacher's reference
    metrics are logged once (the first validation after the sanity check) as ``val/teacher_<metric>``.

    ``same_vocabulary_for``: settings of the module beyond the losses that need the teacher's vocabulary (named in
    the refusal).  The teacher is loaded and checked when a fit builds the student, else on its first use: a
    distilled student predicts, exports and serves without it."""

    def __init__(self, spec: Distillation, model_class: str, same_vocabulary_for: tuple[str, ...] = ()):
        self.spec = spec
        self.frozen = FrozenTeacher(spec.teacher, model_class)
        self.same_vocabulary_for = tuple(same_vocabulary_for)
        self.checked = False
        self.label_order: Optional[list[int]] = None
        self.layer_pairs: list[tuple[int, int]] = []
        self.logit_cache = None  # compression.logit_cache.TeacherLogitCache, opened at the first cached batch
        self.logged = False  # the teacher's reference metrics were logged (kept in checkpoints)
        self.reference: Optional[nn.Module] = None

    @property
    def teacher(self) -> nn.Module:
        return self.frozen.model

    def uses(self, name: str) -> bool:
        return getattr(self.spec, name) > 0

    def token_level(self) -> bool:
        return any(self.uses(n) for n in TOKEN_LOSSES)

    # -- building and checking ------------------------------------------------------------------------------------
    def apply(self, module, fresh: bool, fitting: bool) -> None:
        if fresh:
            self.checked = False
            if fitting:
                self.check(module)

    def check(self, module) -> None:
        """Refuse, in one line, a teacher that cannot teach what the weights ask for; then the label order, the
        layer pairs and TinyBERT's projection ``W_h`` (a sub-module of the student: trained, checkpointed)."""
        if self.checked:
            return
        self.checked = True
        kind, teacher = module.kind, self.teacher
        logits = [n for n in LOGIT_LOSSES if self.uses(n)]
        if logits and kind.soft_targets is None:
            raise PtmError(f"distill.{logits[0]}: the {kind.name} kind has no soft targets to distil (distillation "
                           f"covers sequence, token, qa and choice); set distill.{logits[0]}: 0")
        if logits and self.frozen.fresh_weights():
            head = module.model_class.removeprefix("sequence_").replace("_", " ")
            raise PtmError(f"teacher '{self.spec.teacher}' has no trained {head} head (a bare encoder); fine-tune "
                           f"it first, or set model.init_args.distill.{logits[0]}: 0")
        self.label_order = self.teacher_label_order(module) if logits and kind.soft_targets.by_label else None
        self.check_vocabulary(module)
        if self.token_level() and module.virtual_positions():
            raise PtmError("distill's hidden-state losses compare token positions, and the delta's virtual tokens shift "
                           "the student's; use a delta without virtual tokens or keep only the kd / hard losses")
        student = module.backbone
        mapped = any(self.uses(n) for n in ("hidden", "patient", "attention"))
        self.layer_pairs = layer_pairs(self.spec.layer_map, student.config.num_hidden_layers,
                                       teacher.config.num_hidden_layers) if mapped else []
        widths = (hidden_width(student), hidden_width(teacher))
        if widths[0] != widths[1] and any(self.uses(n) for n in ("hidden", "patient", "embedding", "cosine")):
            if getattr(module, "distill_projection", None) is None:
                module.distill_projection = nn.Linear(*widths)  # TinyBERT's W_h (shared by its hidden losses)
        for loss in ("attention", "minilm"):
            if not self.uses(loss):
                continue
            pairs = self.layer_pairs if loss == "attention" else [self.last_layers(module)]
            for student_layer, teacher_layer in pairs:
                self_attention(student, student_layer, loss)
                self_attention(teacher, teacher_layer, loss)
            heads = (student.config.num_attention_heads, teacher.config.num_attention_heads)
            if heads[0] != heads[1]:
                raise PtmError(f"distill.{loss} compares heads one to one, but the student has {heads[0]} "
                               f"and the teacher {heads[1]}; give the student {heads[1]} heads or set "
                               f"distill.{loss}: 0")

    def teacher_label_order(self, module) -> Optional[list[int]]:
        """Indices putting the teacher's logits in the student's label order (None: already the same)."""
        config = self.teacher.config
        names = [config.id2label[i] for i in range(config.num_labels)]
        labels = module.task_labels()
        if labels is None or names == list(labels):
            return None
        if sorted(names) != sorted(labels):
            raise PtmError(f"teacher '{self.spec.teacher}' predicts labels {names} but the data's labels are "
                           f"{list(labels)}; distil from a teacher fine-tuned on this label set, or set "
                           f"model.init_args.distill.kd and logit_mse to 0")
        return [names.index(label) for label in labels]

    def check_vocabulary(self, module) -> None:
        """Token losses, and outputs per token (tags, spans), need the teacher to read the student's tokens."""
        needs = [n for n in TOKEN_LOSSES if self.uses(n)]
        if module.kind.reads != "pooled" and any(self.uses(n) for n in LOGIT_LOSSES):
            needs.append(f"{module.kind.name} soft targets")
        needs += list(self.same_vocabulary_for)
        tokenizer, theirs = module.tokenizer, self.frozen.tokenizer
        if needs and tokenizer is not None and not same_vocabulary(tokenizer, theirs):
            size = len(theirs) if theirs is not None else "unknown"
            raise PtmError(f"teacher '{self.spec.teacher}' and the student use different tokenizers (vocabularies "
                           f"of {size} and {len(tokenizer)} tokens), and {', '.join(needs)} compare(s) token "
                           f"positions; set data.init_args.tokenizer.pretrained to the teacher ({self.spec.teacher}), "
                           f"or keep only the kd and hard losses")

    def style(self) -> str:
        return "distillation"

    # -- the teacher's outputs -------------------------------------------------------------------------------------
    def teacher_inputs(self, module, batch: dict) -> dict:
        """The batch as the teacher reads it (its own tokens when its tokenizer is another:
        ``compression.teacher.TeacherInputs``)."""
        if "teacher_input_ids" in batch:
            return {k[len("teacher_"):]: v for k, v in batch.items() if k.startswith("teacher_")}
        return module.backbone_inputs(batch)

    def teacher_forward(self, module, batch: dict, hidden: bool) -> tuple[Any, Any]:
        """``(the teacher's raw output, its outputs as the module's kind gives them, in the student's label order)``."""
        self.check(module)
        teacher = self.frozen.on(module.device)
        with torch.no_grad():
            out = teacher(**self.teacher_inputs(module, batch), output_hidden_states=hidden)
        outputs = module.outputs(out)
        return out, (outputs if self.label_order is None else outputs[..., self.label_order])

    def cached_teacher_logits(self, module, batch: dict) -> tuple[torch.Tensor, float]:
        """The teacher's logits for a training batch from the cache, running the teacher only for examples it has
        not seen; also the share served from the cache."""
        from ptm_app.compression.logit_cache import TeacherLogitCache, autocast_precision, example_digests

        if module.kind.name != "sequence":
            raise PtmError(f"distill.cache_teacher_logits keeps one row of logits per example (sequence "
                           f"classification); the {module.kind.name} kind has other outputs: set it to false")
        self.check(module)
        if self.logit_cache is None:
            self.logit_cache = TeacherLogitCache(resolve_teacher(self.spec.teacher), self.teacher,
                                                 autocast_precision(module.device.type))
        digests = example_digests(self.teacher_inputs(module, batch))
        missing = [d for d in digests if self.logit_cache.get(d) is None]
        if missing:
            out, _ = self.teacher_forward(module, batch, hidden=False)
            for row, digest in enumerate(digests):
                self.logit_cache.put(digest, out.logits[row])
        logits = torch.stack([self.logit_cache.get(d) for d in digests]).to(module.device)
        logits = logits if self.label_order is None else logits[:, self.label_order]
        return logits, 1.0 - len(missing) / len(digests)

    # -- the losses --------------------------------------------------------------------------------------------------
    def training_loss(self, module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        parts = self.losses(module, batch)
        return sum(getattr(self.spec, name) * value for name, value in parts.items()), parts

    def losses(self, module, batch: dict) -> dict[str, torch.Tensor]:
        """Every loss with a weight above 0, unweighted, by name."""
        token_level = self.token_level()
        student = module.backbone(**module.backbone_inputs(batch), output_hidden_states=token_level)
        outputs = module.outputs(student, prepended_tokens(module.backbone))
        if self.spec.cache_teacher_logits and module.training:
            teacher = None
            teacher_outputs, cached = self.cached_teacher_logits(module, batch)
            module.log("train/teacher_cached", cached, batch_size=module.batch_size(batch))
        else:
            teacher, teacher_outputs = self.teacher_forward(module, batch, token_level)
        parts: dict[str, torch.Tensor] = {}
        targets = module.kind.soft_targets
        if self.uses("kd"):
            parts["kd"] = kind_soft_target_loss(targets, outputs, teacher_outputs, batch, self.spec.temperature)
        if self.uses("hard"):
            parts["hard"] = module.kind.loss(outputs, batch)
        if self.uses("logit_mse"):
            parts["logit_mse"] = kind_logit_mse(targets, outputs, teacher_outputs, batch)
        if token_level:
            parts.update(self.state_losses(module, student.hidden_states, teacher.hidden_states,
                                           batch["attention_mask"]))
        return parts

    def state_losses(self, module, hs: tuple, ht: tuple, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """The hidden-state, attention and embedding losses between the student's and the teacher's states."""
        parts: dict[str, torch.Tensor] = {}
        project = getattr(module, "distill_projection", None) or (lambda h: h)
        pairs, student, teacher = self.layer_pairs, module.backbone, self.teacher
        if self.uses("embedding"):
            parts["embedding"] = losses.hidden_mse(project(hs[0]), ht[0], mask)
        if self.uses("hidden"):
            parts["hidden"] = sum(losses.hidden_mse(project(hs[s]), ht[t], mask) for s, t in pairs) / len(pairs)
        if self.uses("patient"):
            parts["patient"] = sum(losses.patient_loss(project(hs[s][:, 0]), ht[t][:, 0])
                                   for s, t in pairs) / len(pairs)
        if self.uses("attention"):
            parts["attention"] = sum(losses.attention_score_mse(layer_scores(student, hs, s),
                                                                layer_scores(teacher, ht, t), mask)
                                     for s, t in pairs) / len(pairs)
        if self.uses("cosine"):
            parts["cosine"] = losses.cosine_loss(project(hs[-1]), ht[-1], mask)
        if self.uses("minilm"):
            parts["minilm"] = self.self_attention_transfer(module, hs, ht, mask)
        return parts

    def last_layers(self, module) -> tuple[int, int]:
        return module.backbone.config.num_hidden_layers, self.teacher.config.num_hidden_layers

    def self_attention_transfer(self, module, hs: tuple, ht: tuple, mask: torch.Tensor) -> torch.Tensor:
        """MiniLM: KL of the last layers' attention distributions + KL of their value relations."""
        (s, t), relations = self.last_layers(module), []
        for model, states, layer in ((module.backbone, hs, s), (self.teacher, ht, t)):
            attention = self_attention(model, layer, "minilm")
            heads = attention.num_attention_heads
            relations.append((losses.attention_scores(states[layer - 1], attention.query, attention.key, heads),
                              losses.value_relations(states[layer - 1], attention.value, heads)))
        (student_at, student_vr), (teacher_at, teacher_vr) = relations
        return losses.relation_kl(student_at, teacher_at, mask) + losses.relation_kl(student_vr, teacher_vr, mask)

    # -- the teacher's reference metrics ------------------------------------------------------------------------------
    def teaching_reference(self, module) -> bool:
        logits = self.uses("kd") or self.uses("logit_mse")
        return (self.spec.teacher_metrics and logits and not self.logged and module._trainer is not None
                and not module.trainer.sanity_checking)

    def eval_step(self, module, stage: str, batch: dict, outputs: Any) -> None:
        if stage != "val" or not self.teaching_reference(module):
            return
        if self.reference is None:
            self.reference = module.build_metrics().to(module.device)
        _, teacher_outputs = self.teacher_forward(module, batch, hidden=False)
        module.kind.update(self.reference, teacher_outputs, batch, module.eval_settings())

    def epoch_end(self, module, stage: str) -> None:
        if stage == "train" and self.logit_cache is not None:
            self.logit_cache.save()
        if stage == "val" and self.teaching_reference(module) and self.reference is not None:
            from ptm_app.task_kinds.spans import SPLITS

            values = module.kind.compute(self.reference, lambda: module.data_facts.records(SPLITS["val"]))
            module.log_dict({f"val/teacher_{k}": v for k, v in values.items()})
            self.logged = True

    def summary(self, module) -> dict:
        """The student's and the teacher's parameter counts for ``summary.json`` (shared weights count once)."""
        return size_facts(module.backbone, self.teacher)

    # -- checkpoints: the teacher by name, never its weights ------------------------------------------------------
    def save(self, module, checkpoint: dict) -> None:
        checkpoint["hyper_parameters"]["distill"] = {**asdict(self.spec), "teacher": resolve_teacher(self.spec.teacher)}
        record = checkpoint[CKPT_KEY]
        record["training_only"] = [*record.get("training_only", []), "distill_projection."]  # export leaves W_h out
        record["teacher_logged"] = self.logged  # a run resumed after the teacher's evaluation does not repeat it
        if self.logit_cache is not None:  # a run resumed from this checkpoint finds every logit computed so far
            self.logit_cache.save()

    def load(self, module, checkpoint: dict) -> None:
        self.logged = bool(checkpoint.get(CKPT_KEY, {}).get("teacher_logged"))
        if getattr(module, "distill_projection", None) is None:  # loaded to predict or export: W_h only trains
            state = checkpoint.get("state_dict", {})
            for key in [k for k in state if k.startswith("distill_projection.")]:
                del state[key]


def kind_soft_target_loss(targets: SoftTargets, student: Any, teacher: Any, batch: dict,
                          temperature: float) -> torch.Tensor:
    """Hinton §2's ``T²·KL(softmax(z_T/T) ‖ softmax(z_S/T))`` over a kind's score rows (``task_kinds.parts
    .SoftTargets``): the mean over its rows (examples, labelled tokens, windows), the mean over its lists (the
    start and end distributions of QA)."""
    pairs = list(zip(targets.rows(student, batch), targets.rows(teacher, batch)))
    return sum(losses.soft_target_loss(s, t, temperature) for s, t in pairs) / len(pairs)


def kind_logit_mse(targets: SoftTargets, student: Any, teacher: Any, batch: dict) -> torch.Tensor:
    """Tang et al. 2019 §3.2's ``‖z_T − z_S‖²`` over the same rows as ``kind_soft_target_loss``."""
    pairs = list(zip(targets.rows(student, batch), targets.rows(teacher, batch)))
    return sum(losses.logit_mse(s, t) for s, t in pairs) / len(pairs)


def self_attention(model: nn.Module, layer: int, loss: str = "attention") -> nn.Module:
    """Block ``layer``'s (1..L) BERT-style self-attention (``encoder.layer[i].attention.self``), or one line."""
    try:
        attention = model.base_model.encoder.layer[layer - 1].attention.self
        attention.query, attention.key, attention.value, attention.num_attention_heads
    except (AttributeError, IndexError, TypeError):
        raise PtmError(f"distill.{loss} reads BERT-style self-attention (encoder.layer[i].attention.self); "
                       f"{type(model).__name__} has none: set distill.{loss}: 0") from None
    return attention


def layer_scores(model: nn.Module, hidden_states: tuple, layer: int) -> torch.Tensor:
    """Attention scores of block ``layer`` (1..L) from its input ``hidden_states[layer − 1]``."""
    attention = self_attention(model, layer)
    return losses.attention_scores(hidden_states[layer - 1], attention.query, attention.key,
                                   attention.num_attention_heads)
