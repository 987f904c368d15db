"""Pre-training targets: each owns its layers, its losses and metrics, and names the examples it needs (UER-py's
``uer/targets``; docs/design.md principle 2).  A recipe lists them, and ``MaskedLMModule`` sums their weighted losses:

    targets: [MaskedLM, NextSentence]          # BERT (Devlin et al. 2019 §3.1)
    targets: [MaskedLM, SentenceOrder]         # ALBERT (Lan et al. 2020 §4.1)
    targets:                                   # SpanBERT (Joshi et al. 2020 §3)
      - {class_path: MaskedLM, init_args: {masking: span}}
      - SpanBoundary
    targets: [MaskedLM, {class_path: Supersense, init_args: {sense_input: true}}]   # SenseBERT (knowledge.sensebert)

Each entry is a typed class (jsonargparse checks its settings); ``MaskedLM``'s settings are the corruption recipe
(``MaskedLM.mlm_probability`` ... go to ``data.collators.MLMCollator`` by name in ``MaskedLM.collator``, and from
there to ``corruption.masking.mask_tokens``).
A checkpoint keeps the list as plain data (``target_records``), read back through ``known_targets`` only: a stored name is
never imported.
"""
from __future__ import annotations

from typing import ClassVar, Literal, Optional, Sequence, Union

import torch
from jsonargparse.typing import PositiveInt
from torch import nn

from ptm_app.backbones.build import max_positions
from ptm_app.data import IGNORE_INDEX
from ptm_app.errors import PtmError
from ptm_app.checkpoint_io.module_classes import PACKAGES, exported_classes
from ptm_app.objectives.heads import MaskedLMOutput, masked_lm_forward

ERNIE_STAGES = (1 / 3, 2 / 3)  # step fractions where phrase-level, then entity-level masking start


class Target:
    """One part of a pre-training loss.

    ``name``: the key of its layers (``target_layers.<name>``), its loss (``train/<name>``) and its weight;
    ``examples``: what it needs from the data (``data.examples``: ``nsp``, ``sop``, ``knowledge_spans``,
    ``supersenses``), None for any examples; ``metrics``: the parts averaged over validation (``val/<metric>``);
    ``needs_masking``: the ``MaskedLM`` masking its loss reads (SBO: span), if any.
    """

    name: ClassVar[str]
    examples: ClassVar[Optional[str]] = None
    metrics: ClassVar[tuple[str, ...]] = ()
    needs_masking: ClassVar[Optional[str]] = None

    def __init__(self, weight: float = 1.0):
        self.weight = weight

    def build(self, backbone) -> Optional[nn.Module]:
        """Its layers, sized from the backbone (its hidden size); None when it has none."""
        return None

    def losses(self, layers: Optional[nn.Module], out: MaskedLMOutput, batch: dict, backbone) -> dict[str, torch.Tensor]:
        """Its named losses and metrics on a batch, from the masked LM's output (``out.hidden``: the last hidden
        states); the one called ``name`` enters the total with ``weight``."""
        raise NotImplementedError

    def settings(self) -> dict:
        """Its constructor arguments as plain data (kept in checkpoints)."""
        return {"weight": self.weight}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.settings().items())})"


class MaskedLM(Target):
    """The masked-LM target and its corruption recipe (``data.collators.MLMCollator`` →
    ``data.corruption.masking``).

    Args:
        mlm_probability / mask_ratio / random_ratio: the masking recipe (BERT §3.1: 0.15 / 0.8 / 0.1).
        masking: ``token``, ``whole_word``, ``span`` (SpanBERT geometric spans, ``span_p``, ``max_span_length``) or
            ``knowledge`` (ERNIE: words, phrases and entities masked as whole units; needs a span-annotated corpus
            such as ``brown_spans``, see ``data.knowledge_spans``).
        static_masking: BERT's static masking (RoBERTa §4.1): ``true``, each example's mask (and, with NSP/SOP, its
            sentence pair) is drawn once from the example's own key, the same in every batch and epoch; a number k,
            each example gets one of k fixed masks (copy ``epoch % k``; BERT's ``dupe_factor``, 10 in RoBERTa's
            static baseline); ``false`` (the default), dynamic: a fresh mask every batch.
        knowledge_levels: with ``masking: knowledge``, ``staged`` (ERNIE's three stages: basic word masking, then
            phrase-level from ``knowledge_stages[0]`` of the run's steps, then entity-level from
            ``knowledge_stages[1]``) or ``mixed`` (entities, phrases and words are units of one draw throughout).
        sparse_prediction: compute vocabulary logits only at the masked positions (the default; same loss, see
            ``heads.masked_lm_forward``); ``false`` projects every position, as ``*ForMaskedLM`` does.
        weight: its weight in the summed loss.
    """

    name = "mlm"

    def __init__(self, mlm_probability: float = 0.15, mask_ratio: float = 0.8, random_ratio: float = 0.1,
                 masking: Literal["token", "whole_word", "span", "knowledge"] = "token",
                 span_p: float = 0.2, max_span_length: int = 10, static_masking: Union[bool, PositiveInt] = False,
                 knowledge_levels: Literal["staged", "mixed"] = "staged",
                 knowledge_stages: tuple[float, float] = ERNIE_STAGES, sparse_prediction: bool = True,
                 weight: float = 1.0):
        super().__init__(weight)
        stages = tuple(float(f) for f in knowledge_stages)
        if len(stages) != 2 or not 0.0 <= stages[0] <= stages[1] <= 1.0:
            raise PtmError(f"knowledge_stages must be two step fractions 0 <= phrase <= entity <= 1 "
                           f"(got {list(knowledge_stages)})")
        if masking != "knowledge" and (knowledge_levels != "staged" or stages != ERNIE_STAGES):
            raise PtmError(f"knowledge_levels and knowledge_stages apply to masking: knowledge only (got masking: "
                           f"{masking}); remove them or set masking: knowledge")
        if knowledge_levels == "mixed" and stages != ERNIE_STAGES:
            raise PtmError("knowledge_stages schedule knowledge_levels: staged; with mixed every level is drawn "
                           "from the first step: remove knowledge_stages")
        self.mlm_probability, self.mask_ratio, self.random_ratio = float(mlm_probability), float(mask_ratio), float(random_ratio)
        self.masking, self.span_p, self.max_span_length = masking, span_p, max_span_length
        self.static_masking = static_masking if isinstance(static_masking, bool) else int(static_masking)
        self.knowledge_levels, self.knowledge_stages = knowledge_levels, stages
        self.sparse_prediction = sparse_prediction

    @property
    def examples(self) -> Optional[str]:  # ERNIE reads phrase and entity spans
        return "knowledge_spans" if self.masking == "knowledge" else None

    @property
    def static_copies(self) -> Optional[int]:
        """With static masking, the k fixed draws per example; None when every batch draws anew."""
        if self.static_masking is False:
            return None
        return 1 if self.static_masking is True else int(self.static_masking)

    def collator(self, kind: type, **common):
        """The collator that draws this recipe's masks per batch: ``kind`` (``MLMCollator`` or a subclass) with the
        recipe's settings and ``common`` (the tokenizer's ids, the seed ...)."""
        static = self.static_copies
        return kind(mlm_probability=self.mlm_probability, mask_ratio=self.mask_ratio, random_ratio=self.random_ratio,
                    masking=self.masking, span_p=self.span_p, max_span_length=self.max_span_length,
                    static=static is not None, static_copies=static or 1, **common)

    def predict(self, backbone, inputs: dict, batch: dict, hidden: bool) -> MaskedLMOutput:
        """The masked-LM loss (and the last hidden states when another target reads them)."""
        return masked_lm_forward(backbone, inputs, batch["labels"], sparse=self.sparse_prediction, hidden=hidden,
                                 positions=batch.get("mlm_positions"))

    def losses(self, layers, out: MaskedLMOutput, batch: dict, backbone) -> dict[str, torch.Tensor]:
        return {"mlm": out.loss}

    def settings(self) -> dict:
        return dict(mlm_probability=self.mlm_probability, mask_ratio=self.mask_ratio, random_ratio=self.random_ratio,
                    masking=self.masking, span_p=self.span_p, max_span_length=self.max_span_length,
                    static_masking=self.static_masking, knowledge_levels=self.knowledge_levels,
                    knowledge_stages=list(self.knowledge_stages), sparse_prediction=self.sparse_prediction,
                    weight=self.weight)


class SentenceRelationHead(nn.Module):
    """NSP / SOP layers: a tanh pooler on the [CLS] state, then a 2-way classifier."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.pooler = nn.Linear(hidden_size, hidden_size)
        self.classifier = nn.Linear(hidden_size, 2)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.tanh(self.pooler(hidden[:, 0])))


class _SentenceRelation(Target):
    """A 2-way classification of the [CLS] state of a sentence pair (``sentence_labels``: 0 the real
    continuation / order, 1 not)."""

    def build(self, backbone) -> nn.Module:
        return SentenceRelationHead(backbone.config.hidden_size)

    def losses(self, layers, out: MaskedLMOutput, batch: dict, backbone) -> dict[str, torch.Tensor]:
        logits = layers(out.hidden).float()
        return {self.name: nn.functional.cross_entropy(logits, batch["sentence_labels"]),
                f"{self.name}_acc": (logits.argmax(-1) == batch["sentence_labels"]).float().mean()}


class NextSentence(_SentenceRelation):
    """BERT's next sentence prediction (Devlin et al. 2019 §3.1 task 2): is segment B the text that follows A,
    or a segment of another document (50 / 50)?"""

    name, examples, metrics = "nsp", "nsp", ("nsp", "nsp_acc")


class SentenceOrder(_SentenceRelation):
    """ALBERT's sentence order prediction (Lan et al. 2020 §4.1): are two consecutive segments in their order,
    or swapped (50 / 50)?"""

    name, examples, metrics = "sop", "sop", ("sop", "sop_acc")


class SpanBoundaryHead(nn.Module):
    """SpanBERT's ``y_i = f(x_{s-1}, x_{e+1}, p_{i-s+1})``, a 2-layer GeLU + LayerNorm FFN; the output projection
    is the (tied) MLM decoder matrix passed in at call time.

    ``p`` counts tokens from the left boundary while span lengths are capped in words, so one span may hold many
    more tokens than ``max_span_length``: the table has a row per position of the input (``max_offsets``, the
    backbone's positions), and an offset past it is an error, never folded onto another."""

    def __init__(self, hidden_size: int, max_offsets: int):
        super().__init__()
        self.positions = nn.Embedding(max_offsets, hidden_size)
        self.ffn = nn.Sequential(
            nn.Linear(3 * hidden_size, hidden_size), nn.GELU(), nn.LayerNorm(hidden_size),
            nn.Linear(hidden_size, hidden_size), nn.GELU(), nn.LayerNorm(hidden_size),
        )

    def forward(self, hidden: torch.Tensor, rows: torch.Tensor, left: torch.Tensor, right: torch.Tensor,
                offset: torch.Tensor, decoder: torch.Tensor) -> torch.Tensor:
        pos = self.positions(offset)
        h = self.ffn(torch.cat([hidden[rows, left], hidden[rows, right], pos], dim=-1))
        return h @ decoder.t()


class SpanBoundary(Target):
    """SpanBERT's span boundary objective (Joshi et al. 2020 §3.2): predict each masked token of a span from the
    two tokens just outside it and its position in the span.  Reads the span collator's ``sbo`` targets, so it
    needs ``MaskedLM(masking: span)``."""

    name, metrics, needs_masking = "sbo", ("sbo",), "span"

    def build(self, backbone) -> nn.Module:
        offsets = max_positions(backbone)  # a span's token offsets stay inside the row
        if offsets is None:
            raise PtmError("SpanBoundary sizes its position table by the backbone's positions; "
                           "use a backbone with max_position_embeddings (model_type: bert ...)")
        return SpanBoundaryHead(backbone.config.hidden_size, offsets)

    def losses(self, layers, out: MaskedLMOutput, batch: dict, backbone) -> dict[str, torch.Tensor]:
        sbo = batch["sbo"]
        target = batch["labels"][sbo["rows"], sbo["pos"]]
        decoder = backbone.get_output_embeddings().weight
        logits = layers(out.hidden, sbo["rows"], sbo["left"], sbo["right"], sbo["offset"], decoder).float()
        return {"sbo": nn.functional.cross_entropy(logits, target, ignore_index=IGNORE_INDEX)}


def known_targets() -> dict[str, type[Target]]:
    """Every target by its short name: the ``Target`` classes ptm_app's packages export (this module's, exported by
    ``objectives``, and ``knowledge``'s ``Supersense``), from the registry (``module_classes.exported_classes``)."""
    return {name: cls for name, cls in exported_classes().items() if issubclass(cls, Target)}


def known_record(spec) -> dict:
    """A target's plain record (``{class_path, init_args}`` as jsonargparse and ``target_records`` write it, or a
    bare class name) with its class named by its short name, one of ``known_targets``: a name read from a file is
    looked up there, never imported.  A dotted name is the class's module path, its package's (jsonargparse writes
    ``ptm_app.objectives.MaskedLM``) or this module's (where every target was defined before ``Supersense`` moved to
    ``knowledge.sensebert``)."""
    targets = known_targets()
    if isinstance(spec, str):
        spec = {"class_path": spec}
    if not hasattr(spec, "get") or not isinstance(spec.get("class_path"), str):
        raise PtmError(f"a target is a class name ({', '.join(targets)}) or {{class_path, init_args}}, not {spec!r}")
    name = spec["class_path"].rpartition(".")[2]
    homes = ("", targets[name].__module__, __name__, *PACKAGES) if name in targets else ()
    if spec["class_path"] not in {f"{home}.{name}".lstrip(".") for home in homes}:
        raise PtmError(f"unknown target {spec['class_path']!r}; the targets are {', '.join(targets)}")
    return {"class_path": name, "init_args": dict(spec.get("init_args") or {})}


def as_target(spec) -> Target:
    """A target from a ``Target`` or from its plain record (``known_record``)."""
    if isinstance(spec, Target):
        return spec
    record = known_record(spec)
    return known_targets()[record["class_path"]](**record["init_args"])


def target_records(targets: Sequence[Target]) -> list[dict]:
    """The targets as plain data (checkpoints, exports): short class names and settings."""
    return [{"class_path": type(t).__name__, "init_args": t.settings()} for t in targets]


def compose(specs: Optional[Sequence]) -> tuple[MaskedLM, tuple[Target, ...], frozenset]:
    """A recipe's targets: its ``MaskedLM`` (exactly one: the masking every target reads), all of them in order,
    and the examples they need; a combination that cannot work is one line naming it."""
    from ptm_app.data.examples import example_builder

    targets = tuple(as_target(s) for s in (specs if specs is not None else [MaskedLM()]))
    mlm = [t for t in targets if isinstance(t, MaskedLM)]
    if len(mlm) != 1:
        raise PtmError(f"targets {list(targets)} must list MaskedLM once (it draws the masks the others read)")
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise PtmError(f"targets {names} list one target twice; give each once")
    for t in targets:
        if t.needs_masking and mlm[0].masking != t.needs_masking:
            raise PtmError(f"{type(t).__name__} reads {t.needs_masking} masks; set MaskedLM's masking: "
                           f"{t.needs_masking}")
    needs = frozenset(t.examples for t in targets if t.examples)
    example_builder(needs, who="targets " + ", ".join(type(t).__name__ for t in targets if t.examples))
    return mlm[0], targets, needs
