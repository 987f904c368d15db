"""Students made from the teacher: the same architecture with fewer layers, its embeddings, the chosen layers,
pooler and head copied (DistilBERT, Sanh et al. 2019 §3: "initialize the student from the teacher by taking one
layer out of two").  Layers are numbered 1..L (``hidden_states`` indices).  Also: the teacher's word embeddings
copied into a student of another structure (BiLSTM, CNN), and an ALBERT-shaped student (``SharedStudent``)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, is_dataclass
from typing import Optional, Union

import torch
from torch import nn

from ptm_app.backbones.layers import _blocks, num_layers
from ptm_app.errors import PtmError

StudentLayers = Union[str, list[int]]


def chosen_layers(spec: StudentLayers, teacher_layers: int) -> list[int]:
    """``every_other`` (L, L−2, … : the top layer is kept) or an explicit list of teacher layers (1..L)."""
    if spec == "every_other":
        return list(range(teacher_layers % 2 or 2, teacher_layers + 1, 2))
    if isinstance(spec, str) or not spec:
        raise PtmError(f"student_layers {spec!r}: use 'every_other' or a list of teacher layers such as [2, 4, 6]")
    for layer in spec:
        if not isinstance(layer, int) or not 1 <= layer <= teacher_layers:
            raise PtmError(f"student_layers names teacher layer {layer!r}, but the teacher has layers "
                           f"1..{teacher_layers}; name layers that exist")
    return list(spec)


def layer_list_path(model: nn.Module) -> str:
    """The name of the ``nn.ModuleList`` holding the model's transformer blocks (``bert.encoder.layer``)."""
    first = next(iter(_blocks(model, num_layers(model))))
    return first.rsplit(".", 1)[0]


def student_from_teacher(teacher: nn.Module, layers: list[int], **config_updates) -> nn.Module:
    """A copy of ``teacher`` keeping only ``layers`` (in that order) of its blocks, every other weight copied."""
    config = teacher.config.__class__.from_dict({**teacher.config.to_dict(), "num_hidden_layers": len(layers),
                                                 **config_updates})
    student = type(teacher)(config)
    copy_teacher_layers(student, teacher, layers)
    return student


def copy_teacher_layers(student: nn.Module, teacher: nn.Module, layers: list[int]) -> None:
    """Load ``student`` with the teacher's embeddings, pooler, head and its blocks ``layers`` (student block j ←
    teacher block ``layers[j]``); every student weight must be filled (strict)."""
    prefix = layer_list_path(teacher) + "."
    source_block = {teacher_layer - 1: j for j, teacher_layer in enumerate(layers)}
    state: dict[str, torch.Tensor] = {}
    for key, value in teacher.state_dict().items():
        if not key.startswith(prefix):
            state[key] = value
            continue
        index, rest = key[len(prefix):].split(".", 1)
        if int(index) in source_block:
            state[f"{prefix}{source_block[int(index)]}.{rest}"] = value
    student.load_state_dict(state, strict=True)


def copy_teacher_embeddings(student: nn.Module, teacher: nn.Module) -> None:
    """The teacher's word-embedding matrix into a student of another architecture (a BiLSTM or CNN built from a
    config: Tang et al. 2019 §3 start theirs from pre-trained word vectors); one line when the shapes differ."""
    source, target = teacher.get_input_embeddings().weight, student.get_input_embeddings().weight
    if source.shape != target.shape:
        raise PtmError(f"teacher_embeddings: the teacher's word embeddings are {tuple(source.shape)} and the "
                       f"student's {tuple(target.shape)}; use the teacher's tokenizer and leave "
                       f"backbone_config.embedding_dim unset (or {source.shape[1]}), or set teacher_embeddings: false")
    with torch.no_grad():
        target.copy_(source)


@dataclass
class SharedStudent:
    """An ALBERT student (Lan et al. 2020 §3.1) with the teacher's width, heads, feed-forward size and vocabulary:
    factorised embeddings (V×E then E×H, E ≪ H) and cross-layer parameter sharing (``num_hidden_groups`` layer
    groups serve all ``num_hidden_layers`` layers; 1 = every layer shares one set of weights), started from the
    teacher (``init_shared_from_teacher``) or from scratch.

    Args:
        embedding_size: E, the factorised embedding width (ALBERT: 128).
        num_hidden_layers: the layers it runs (default: the teacher's).
        num_hidden_groups: how many distinct layers' weights there are (1: all shared).
        from_teacher: start from the teacher's weights (``init_shared_from_teacher``); false: random, as ALBERT
            before pre-training (distillation on a small task set alone then barely moves it from chance).
    """

    embedding_size: int = 128
    num_hidden_layers: Optional[int] = None
    num_hidden_groups: int = 1
    from_teacher: bool = True


def as_shared_student(value) -> Optional[SharedStudent]:
    if value is None or isinstance(value, SharedStudent):
        return value
    return SharedStudent(**(asdict(value) if is_dataclass(value) else value))


TEACHER_FIELDS = ("vocab_size", "hidden_size", "num_attention_heads", "intermediate_size", "hidden_act",
                  "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
                  "layer_norm_eps", "initializer_range", "pad_token_id")


def shared_student(teacher: nn.Module, spec: SharedStudent, **config_updates) -> nn.Module:
    """A fresh ``AlbertForSequenceClassification`` shaped by the teacher's BERT-style config and ``spec``."""
    from transformers import AlbertConfig, AlbertForSequenceClassification

    source = teacher.config
    missing = [f for f in TEACHER_FIELDS if getattr(source, f, None) is None and f != "pad_token_id"]
    if missing:
        raise PtmError(f"shared_student builds an ALBERT from a BERT-style teacher config; "
                       f"{type(teacher).__name__}'s has no {', '.join(missing)}: use backbone_config for this teacher")
    layers = spec.num_hidden_layers or source.num_hidden_layers
    if not 1 <= spec.num_hidden_groups <= layers or spec.embedding_size < 1:
        raise PtmError(f"shared_student: num_hidden_groups must be 1..{layers} (the layers) and embedding_size >= 1 "
                       f"(got {spec.num_hidden_groups} and {spec.embedding_size})")
    fields = {f: getattr(source, f) for f in TEACHER_FIELDS if getattr(source, f, None) is not None}
    config = AlbertConfig(**fields, embedding_size=spec.embedding_size, num_hidden_layers=layers,
                          num_hidden_groups=spec.num_hidden_groups, classifier_dropout_prob=source.hidden_dropout_prob,
                          **config_updates)
    student = AlbertForSequenceClassification(config)
    if spec.from_teacher:
        init_shared_from_teacher(student, teacher)
    return student


ALBERT_LAYER_FROM_BERT = {  # ALBERT layer weight <- BERT block weight (same shapes)
    "attention.query": "attention.self.query", "attention.key": "attention.self.key",
    "attention.value": "attention.self.value", "attention.dense": "attention.output.dense",
    "attention.LayerNorm": "attention.output.LayerNorm", "ffn": "intermediate.dense",
    "ffn_output": "output.dense", "full_layer_layer_norm": "output.LayerNorm",
}


def group_teacher_layers(student_layers: int, groups: int, teacher_layers: int) -> list[int]:
    """The teacher block (0-based) each ALBERT layer group starts from: the middle (rounded down) of the student
    layers the group serves (ALBERT runs layer ``i`` with group ``int(i / (L/G))``), scaled to the teacher's depth.
    With as many groups as layers and the teacher's depth, group ``g`` takes block ``g``."""
    served: dict[int, list[int]] = {}
    for layer in range(student_layers):
        served.setdefault(int(layer / (student_layers / groups)), []).append(layer)
    middles = [served[g][(len(served[g]) - 1) // 2] for g in range(groups)]
    return [min(teacher_layers - 1, (m * teacher_layers) // student_layers) for m in middles]


def init_shared_from_teacher(student: nn.Module, teacher: nn.Module) -> None:
    """The ALBERT student from a BERT-style teacher (ptm_app's starting point; the ALBERT paper pre-trains):

    * factorised embeddings from a truncated SVD: every input sums one row of the word, position and token-type
      tables, so the SVD is of the three stacked, each row centred (minus its mean, which the teacher's LayerNorm
      removes anyway) and each table weighted by ``√(V / its rows)`` (``V`` word rows: the three weigh the same).
      A table row's E values are its coordinates ``x B`` on the top-E right singular vectors ``V_E``, turned by a
      reflection ``R`` that puts the weakest of them on the all-ones direction (``B = V_E R``), so ALBERT's E-wide
      LayerNorm centring removes that direction and nothing else.  The E→H map is ``B`` times ``√(H/E)`` (a
      normalised E vector has norm ``√E``, the teacher's normalised H vector ``√H``) times the teacher's
      LayerNorm weight, with its bias: at E = H the embedding output is the teacher's exactly, below it the
      input's projection on E−1 directions, normalised (MiniLM at E = 128, two news sentences: 0.73 relative
      error; 0.91 with the SVD of the word table alone);
    * each layer group's weights from one teacher block (``group_teacher_layers``), the pooler as the teacher's
      (when it has one), the classifier as the teacher's, rows put in the student's label order."""
    source = dict(teacher.base_model.named_parameters())
    albert = student.albert
    width = albert.config.embedding_size  # E
    missing = [k for k in ("embeddings.word_embeddings.weight", "embeddings.LayerNorm.weight",
                           "embeddings.LayerNorm.bias") if k not in source]
    if missing:
        raise PtmError(f"shared_student.from_teacher needs a BERT-style teacher; {type(teacher).__name__} has no "
                       f"{missing[0]}: set shared_student.from_teacher: false")
    with torch.no_grad():
        words = source["embeddings.word_embeddings.weight"].float()
        hidden = words.shape[1]
        tables = [words] + [source[f"embeddings.{n}.weight"].float() for n in ("position_embeddings",
                                                                                 "token_type_embeddings")
                            if f"embeddings.{n}.weight" in source]
        stacked = torch.cat([(t - t.mean(1, keepdim=True)) * (words.shape[0] / t.shape[0]) ** 0.5 for t in tables])
        _, _, vh = torch.linalg.svd(stacked, full_matrices=False)
        rank = min(width, vh.shape[0])  # an E above H keeps all H directions, the other E columns zero
        basis = torch.zeros(hidden, width)
        basis[:, :rank] = vh[:rank].T  # V_E: H -> E coordinates (orthonormal columns)
        basis = basis @ reflection_onto_ones(width)
        albert.embeddings.word_embeddings.weight.copy_(words @ basis)
        for name in ("position_embeddings", "token_type_embeddings"):
            table = source.get(f"embeddings.{name}.weight")
            target = getattr(albert.embeddings, name).weight
            if table is not None and table.shape[0] >= target.shape[0]:
                target.copy_(table[:target.shape[0]].float() @ basis)
        albert.embeddings.LayerNorm.weight.fill_(1.0)
        albert.embeddings.LayerNorm.bias.zero_()
        scale = (hidden / width) ** 0.5
        albert.encoder.embedding_hidden_mapping_in.weight.copy_(
            source["embeddings.LayerNorm.weight"].float()[:, None] * basis * scale)  # nn.Linear's H×E
        albert.encoder.embedding_hidden_mapping_in.bias.copy_(source["embeddings.LayerNorm.bias"])
        prefix = layer_list_path(teacher.base_model)
        blocks = group_teacher_layers(albert.config.num_hidden_layers, albert.config.num_hidden_groups,
                                      num_layers(teacher))
        for group, block in zip(albert.encoder.albert_layer_groups, blocks):
            layer = group.albert_layers[0]
            for target_name, bert_name in ALBERT_LAYER_FROM_BERT.items():
                module = layer.get_submodule(target_name)
                module.weight.copy_(source[f"{prefix}.{block}.{bert_name}.weight"])
                module.bias.copy_(source[f"{prefix}.{block}.{bert_name}.bias"])
        if "pooler.dense.weight" in source:  # RoBERTa-style classifiers have none: ALBERT's stays fresh
            albert.pooler.weight.copy_(source["pooler.dense.weight"])
            albert.pooler.bias.copy_(source["pooler.dense.bias"])
        copy_classifier(student, teacher)


def reflection_onto_ones(size: int) -> torch.Tensor:
    """The Householder reflection (symmetric, orthogonal) swapping the last unit vector and ``1/√size``."""
    last, ones = torch.zeros(size), torch.full((size,), size ** -0.5)
    last[-1] = 1.0
    direction = last - ones
    if float(direction.norm()) < 1e-12:  # size 1: they are the same vector
        return torch.eye(size)
    direction = direction / direction.norm()
    return torch.eye(size) - 2.0 * torch.outer(direction, direction)


def copy_classifier(student: nn.Module, teacher: nn.Module) -> None:
    """The teacher's linear classifier into the student's, its rows in the student's label order (left fresh when
    the teacher has no such head or other labels)."""
    head = getattr(teacher, "classifier", None)
    if not isinstance(head, nn.Linear) or head.weight.shape != student.classifier.weight.shape:
        return
    names = [teacher.config.id2label[i] for i in range(teacher.config.num_labels)]
    labels = [student.config.id2label[i] for i in range(student.config.num_labels)]
    if sorted(names) != sorted(labels):
        return
    order = [names.index(label) for label in labels]
    student.classifier.weight.copy_(head.weight[order])
    student.classifier.bias.copy_(head.bias[order])
