"""Prompt-based learning (survey §5.7): classification recast as the pre-training task.

* ``PromptClassifierModule``: PET (Schick & Schütze 2021 §3).  A pattern turns an input into a cloze question with
  one [MASK]; a verbalizer maps each label to words; a label's score is the masked LM's logit of its words at the
  mask, and training minimises the cross-entropy of the softmax over the label scores (PET's L_CE).  Evaluated
  without training it is zero-shot; ``fit`` on a few examples is few-shot PET.  Optionally N trainable soft prompt
  vectors follow [CLS], with the masked LM frozen (prompt tuning, Lester et al. 2021 §2).
* ``InContextEvalModule``: in-context learning (GPT-3, Brown et al. 2020 §2).  k training examples with their
  labels precede the query; each candidate label is scored by the causal LM's log-likelihood of its words (per
  token by default, §2.4), and no gradient step is ever taken.
"""
from __future__ import annotations

import string
import zlib
from dataclasses import dataclass, field
from typing import Literal, Optional, Sequence, Union

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from ptm_app.backbones.build import max_positions
from ptm_app.data.contract import DataFacts
from ptm_app.data.collators import PadCollator, pad
from ptm_app.data.prompt_data import PromptDataset
from ptm_app.errors import PtmError
from ptm_app.adaptation.task_module import TaskModule
from ptm_app.training.optim import OptimConfig

FIELDS = ("text", "text_pair")
Fields = dict[str, Optional[Sequence[int]]]
NO_FIT = ("InContextEvalModule takes no gradient steps (in-context learning, Brown et al. 2020 §2): "
          "run 'main.py validate' or 'main.py test' instead of fit")


@dataclass(frozen=True)
class Template:
    """A pattern (PET §3): literal text around ``{text}`` (optionally ``{text_pair}``) and exactly one answer slot,
    ``{mask}`` in cloze questions or ``{label}`` in in-context demonstrations; ``{{`` and ``}}`` are braces.

    A space just before the slot belongs to the answer's words (``"It was {mask}"`` scores ``" great"``), as
    byte-level BPE tokenizes words in running text; WordPiece ignores it."""

    pattern: str
    slot: str = "mask"

    def __post_init__(self) -> None:
        self.parts()

    def parts(self) -> list[tuple[str, str]]:
        """``("literal", text)``, ``("field", name)`` and one ``("slot", space before it)``, in order."""
        try:
            parsed = list(string.Formatter().parse(self.pattern))
        except ValueError as exc:
            raise PtmError(f"template {self.pattern!r}: {exc}; write literal braces as {{{{ and }}}}") from None
        allowed = (*FIELDS, self.slot)
        names = [name for _, name, _, _ in parsed if name is not None]
        for _, name, spec, conversion in parsed:
            if name is not None and (name not in allowed or spec or conversion):
                shown = name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
                raise PtmError(f"template {self.pattern!r}: unknown placeholder {{{shown}}}; "
                               f"use {{text}}, optionally {{text_pair}}, and one {{{self.slot}}}")
        counts = {name: names.count(name) for name in allowed}
        if counts[self.slot] != 1 or counts["text"] != 1 or counts["text_pair"] > 1:
            raise PtmError(f"template {self.pattern!r} needs exactly one {{{self.slot}}} and one {{text}} "
                           f"(found {counts[self.slot]} and {counts['text']}), and at most one {{text_pair}}")
        parts = []
        for literal, name, _, _ in parsed:
            space = ""
            if name == self.slot and literal.endswith(" "):
                literal, space = literal[:-1], " "
            if literal:
                parts.append(("literal", literal))
            if name is not None:
                parts.append(("slot", space) if name == self.slot else ("field", name))
        return parts

    @property
    def slot_space(self) -> str:
        """The space moved from the pattern into the answer's words."""
        return next(value for kind, value in self.parts() if kind == "slot")

    def render(self, answer: str, text: str, text_pair: str = "") -> str:
        """The filled pattern as text (``answer`` = the tokenizer's mask token for a cloze question)."""
        return self.pattern.format(**{self.slot: answer}, text=text, text_pair=text_pair)


@dataclass
class Verbalizer:
    """PET's verbalizer (§3): each label → one or more label words, each a single token of the tokenizer."""

    words: dict[str, Union[str, list[str]]]

    def __post_init__(self) -> None:
        self.words = {str(k): [v] if isinstance(v, str) else list(v) for k, v in self.words.items()}
        empty = [label for label, words in self.words.items() if not words]
        if empty:
            raise PtmError(f"verbalizer: label '{empty[0]}' has no label words; give it at least one")

    @classmethod
    def of(cls, words: Optional[dict], labels: Sequence[str]) -> "Verbalizer":
        """From a ``{label: word | [words]}`` mapping; None = each label's own name."""
        return cls(dict(words) if words is not None else {label: label for label in labels})

    def token_ids(self, tokenizer, labels: Sequence[str], space: str = "") -> list[list[int]]:
        """Per label (in ``labels`` order) its words' token ids; a word that is not exactly one known token is
        an error naming it."""
        if set(self.words) != set(labels):
            raise PtmError(f"verbalizer labels {sorted(self.words)} differ from the task's labels {sorted(labels)}; "
                           f"give every label its words (model.init_args.verbalizer)")
        out = []
        for label in labels:
            ids = []
            for word in self.words[label]:
                pieces = tokenizer(space + word, add_special_tokens=False)["input_ids"]
                if len(pieces) != 1:
                    shown = " ".join(tokenizer.convert_ids_to_tokens(pieces))
                    raise PtmError(f"verbalizer word '{word}' of label '{label}' is {len(pieces)} tokens ({shown}) for "
                                   f"this tokenizer; a label word must be a single token: choose another word")
                if pieces[0] == tokenizer.unk_token_id:
                    raise PtmError(f"verbalizer word '{word}' of label '{label}' is not in the tokenizer's vocabulary "
                                   f"(it becomes {tokenizer.unk_token}); choose another word")
                ids.append(pieces[0])
            out.append(ids)
        return out


def label_scores(mask_logits: torch.Tensor, word_ids: list[list[int]],
                 reduce: Literal["mean", "max"] = "mean") -> torch.Tensor:
    """PET's s(l|x) (§3): a label's score is the mean (PET) or max of its words' MLM logits [B, V]; → [B, C]."""
    width = max(map(len, word_ids))
    ids = torch.tensor([w + [w[0]] * (width - len(w)) for w in word_ids], device=mask_logits.device)
    real = torch.tensor([[i < len(w) for i in range(width)] for w in word_ids], device=mask_logits.device)
    picked = mask_logits[:, ids]  # [B, C, W]
    if reduce == "max":
        return picked.masked_fill(~real, float("-inf")).amax(-1)
    return (picked * real).sum(-1) / real.sum(-1)


def special_affixes(tokenizer) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after one sequence ([CLS] / [SEP]; a BOS; none)."""
    plain, full = tokenizer("a", add_special_tokens=False)["input_ids"], tokenizer("a")["input_ids"]
    start = full.index(plain[0])
    return full[:start], full[start + len(plain):]


def longest_first(lengths: list[int], budget: int) -> list[int]:
    """Drop the last token of the longest field until the total fits ``budget`` (PET's truncation)."""
    kept = list(lengths)
    while sum(kept) > budget:
        kept[kept.index(max(kept))] -= 1
    return kept


class PromptEncoder:
    """A template compiled for one tokenizer: literal pieces tokenized once; examples come as field token ids."""

    def __init__(self, template: Template, tokenizer):
        self.template, self.tokenizer = template, tokenizer
        self.pieces: list[Union[list[int], str, None]] = []  # literal ids, a field name, or None for the slot
        for kind, value in template.parts():
            if kind == "literal":
                self.pieces.append(tokenizer(value, add_special_tokens=False)["input_ids"])
            else:
                self.pieces.append(value if kind == "field" else None)
        self.prefix, self.suffix = special_affixes(tokenizer)

    def encode(self, fields: Fields, answer: list[int], budget: Optional[int] = None,
               until_slot: bool = False) -> tuple[list[int], int]:
        """The filled template's ids (no special tokens) and the index of the slot's first token.

        Fields are cut at their ends, longest first, to fit ``budget`` tokens, so the literal text and the
        slot always stay.  ``until_slot``: stop after the answer (an in-context query)."""
        pieces = self.pieces[: self.pieces.index(None) + 1] if until_slot else self.pieces
        names = [p for p in pieces if isinstance(p, str)]
        for name in names:
            if fields.get(name) is None:
                raise PtmError(f"template {self.template.pattern!r} uses {{{name}}} but the examples have no such "
                               f"field; set data.init_args.text_pair_field")
        lengths = [len(fields[name]) for name in names]
        if budget is not None:
            fixed = sum(len(p) for p in pieces if isinstance(p, list)) + len(answer)
            if budget - fixed < 1:
                raise PtmError(f"template {self.template.pattern!r} takes {fixed} tokens, leaving no room for the text "
                               f"within {budget} (data.max_length without special tokens); shorten the template "
                               f"or raise data.max_length")
            lengths = longest_first(lengths, budget - fixed)
        kept = dict(zip(names, lengths))
        ids: list[int] = []
        slot_at = -1
        for piece in pieces:
            if piece is None:
                slot_at = len(ids)
                ids += answer
            elif isinstance(piece, str):
                ids += list(fields[piece][: kept[piece]])
            else:
                ids += piece
        return ids, slot_at

    def cloze(self, fields: Fields, max_length: int) -> tuple[list[int], int]:
        """A PET input, special tokens included, with the mask token in the slot: ids and the mask's index."""
        budget = max_length - len(self.prefix) - len(self.suffix)
        content, at = self.encode(fields, [self.tokenizer.mask_token_id], budget)
        return self.prefix + content + self.suffix, len(self.prefix) + at


@dataclass
class ClozeCollator(PadCollator):
    """PET inputs (§3): each example's pattern with one mask token, at most ``max_length`` tokens, padded;
    ``mask_positions`` holds each row's mask index."""

    encoder: Optional[PromptEncoder] = None
    max_length: int = 512

    def __call__(self, examples: list[dict]) -> dict:
        built = [self.encoder.cloze(e["fields"], self.max_length) for e in examples]
        batch = self.pad_batch([{"input_ids": torch.tensor(ids), "key": e["key"], "label": e["label"]}
                                for (ids, _), e in zip(built, examples)])
        batch["mask_positions"] = torch.tensor([at for _, at in built])
        return batch


@dataclass
class InContextCollator(PadCollator):
    """k-shot prompts (GPT-3, Brown et al. 2020 §2), one row per (example, candidate label).

    An example's k demonstrations are distinct training examples drawn by a generator seeded with ``seed`` and
    the example's own tokens (the same in every run and batch), never one with the example's text.  A row is
    [special prefix] instruction, demonstrations (template with their gold label), the query up to the slot, and
    a candidate label's tokens; rows are left-padded, so every row ends with its label.  Demonstrations are
    dropped from the front while a row would exceed ``max_length`` (the model's positions; GPT-3 also uses as
    many as fit); ``shots`` counts those used.

    When every label is one token (``one_row``, the default then), an example needs one row, not one per label:
    the labels' scores are read off the next-token distribution at the slot (same scores, C times fewer rows).
    With ``content_free`` ids, each example gets a second query after the same demonstrations, the content-free
    input of contextual calibration (Zhao et al. 2021 §5, "N/A").
    """

    encoder: Optional[PromptEncoder] = None
    pool: Optional[PromptDataset] = None
    answers: list[list[int]] = field(default_factory=list)  # each label's verbalised tokens
    k_shot: int = 0
    seed: int = 0
    instruction: list[int] = field(default_factory=list)
    max_length: Optional[int] = None
    content_free: Optional[list[int]] = None  # calibration's content-free text, for every field of the query
    one_row: Optional[bool] = None  # None: when every label is a single token

    def __post_init__(self) -> None:
        if self.one_row is None:
            self.one_row = all(len(a) == 1 for a in self.answers)
        self._by_text: dict[tuple, list[int]] = {}
        for i in range(len(self.pool)):
            self._by_text.setdefault(_text_key(self.pool.fields(i)), []).append(i)

    def demonstrations(self, fields: Fields) -> list[int]:
        """Pool indices of the k demonstrations for an example with these fields."""
        key = _text_key(fields)
        exclude = set(self._by_text.get(key, ()))
        available = len(self.pool) - len(exclude)
        if available < self.k_shot:
            raise PtmError(f"k_shot={self.k_shot} but only {available} training examples differ from the evaluated "
                           f"one; lower model.init_args.k_shot or raise data.init_args.limit_train")
        tokens = np.asarray([*key[0], -1, *key[1]], dtype=np.int64).tobytes()
        rng = np.random.default_rng([self.seed, zlib.crc32(tokens)])
        drawn = rng.choice(len(self.pool), size=min(len(self.pool), self.k_shot + len(exclude)), replace=False)
        return [int(i) for i in drawn if int(i) not in exclude][: self.k_shot]

    def prompts(self, fields: Fields) -> tuple[list[list[int]], int]:
        """The contexts before the candidate label (the query's; then, with ``content_free``, the content-free
        query's after the same demonstrations) and the number of demonstrations in them."""
        demos = [self.encoder.encode(self.pool.fields(d), self.answers[self.pool.labels[d]])[0]
                 for d in self.demonstrations(fields)]
        queries = [self.encoder.encode(fields, [], until_slot=True)[0]]
        if self.content_free is not None:
            blank = {name: (self.content_free if ids is not None else None) for name, ids in fields.items()}
            queries.append(self.encoder.encode(blank, [], until_slot=True)[0])
        head, longest = self.encoder.prefix + self.instruction, max(map(len, self.answers))
        limit, query = self.max_length or float("inf"), max(map(len, queries))
        while demos and len(head) + sum(map(len, demos)) + query + longest > limit:
            demos.pop(0)
        contexts = [head + [t for demo in demos for t in demo] + q for q in queries]
        if not contexts[0] or len(head) + sum(map(len, demos)) + query + longest > limit:
            raise PtmError(f"an in-context query takes {len(contexts[0])} + {longest} tokens, which does not fit the "
                           f"model's {self.max_length} positions (or is empty); lower data.init_args.max_length")
        return contexts, len(demos)

    def prompt(self, fields: Fields) -> tuple[list[int], int]:
        """The query's context before the candidate label and the number of demonstrations in it."""
        contexts, shots = self.prompts(fields)
        return contexts[0], shots

    def __call__(self, examples: list[dict]) -> dict:
        rows, shots = [], []
        for e in examples:
            contexts, n = self.prompts(e["fields"])
            for context in contexts:
                rows += [torch.tensor(context)] if self.one_row else [torch.tensor(context + a) for a in self.answers]
            shots.append(n)
        ids = pad([r.flip(0) for r in rows], self.pad_token_id).flip(1)  # left padding
        mask = pad([torch.ones_like(r) for r in rows], 0).flip(1)
        batch = {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
                 "labels": torch.tensor([e["label"] for e in examples]), "keys": [e["key"] for e in examples],
                 "shots": torch.tensor(shots, dtype=torch.float32)}
        if self.one_row:
            batch["answer_ids"] = torch.tensor([a[0] for a in self.answers])
        else:
            batch["answer_lengths"] = torch.tensor([len(a) for a in self.answers] * (len(rows) // len(self.answers)))
        return batch


def _text_key(fields: Fields) -> tuple:
    return tuple(fields["text"]), tuple(fields.get("text_pair") or ())


class _LabelScoringModule(TaskModule):
    """Shared: the label set, ``val``/``test`` accuracy and macro-F1 over label scores (the ``sequence`` task type,
    as ``SequenceClassificationModule``), cross-entropy as ``*/loss``, predictions with label probabilities."""

    monitor = ("val/acc", "max")
    task_kind = "sequence"

    def __init__(self, backbone: Optional[str], backbone_config: Optional[dict], optim: OptimConfig = OptimConfig(),
                 gradient_checkpointing: bool = False):
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)

    def can_build(self) -> bool:
        return super().can_build() and (self.hparams.labels is not None or self.hparams.verbalizer is not None)

    @property
    def labels(self) -> list[str]:
        """``labels``; else the data module's label set (then kept in hparams); else the verbalizer's labels."""
        if self.hparams.labels is None:
            labels = self.data_facts.labels() if self.data_facts is not None else None
            if labels is not None:
                self.hparams.labels = labels
            elif self.hparams.verbalizer is not None:
                return list(self.hparams.verbalizer)
            else:
                raise PtmError(f"{type(self).__name__} needs labels: set model.init_args.labels or verbalizer, "
                               f"or use a PromptDataModule")
        return list(self.hparams.labels)

    def task_labels(self) -> list[str]:
        return self.labels

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        """Every label's probability (``training.callbacks.PredictionWriter`` writes the rows)."""
        return {"keys": batch["keys"], "probs": torch.softmax(self(batch).float(), dim=-1).cpu()}


class PromptClassifierModule(_LabelScoringModule):
    """PET cloze classification over a masked LM (Schick & Schütze 2021 §3); zero-shot with ``validate``/``test``,
    few-shot with ``fit`` (a ``PromptDataModule`` with ``limit_train``).  Logs ``val/acc``, ``val/f1_macro``.

    Args:
        backbone / backbone_config: the masked LM (``AutoModelForMaskedLM``), pretrained or from a config.
        labels: the label names in order; by default the data module's.
        template: the pattern, with ``{text}`` (optionally ``{text_pair}``) and one ``{mask}``.
        verbalizer: label → one word or a list of words, each one token; None = the labels' own names.
        scoring: a label's score from its words' logits at the mask: ``mean`` (PET) or ``max``.
        soft_prompt_tokens: N trainable prompt vectors inserted after the special prefix ([CLS]), initialised
            from sampled vocabulary embeddings (prompt tuning, Lester et al. 2021 §2, §3.2).
        freeze_backbone: train the soft prompt only; the masked LM, its head included, stays bit-identical.
    """

    head = "masked_lm"

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 labels: Optional[list[str]] = None, template: str = "{text} It was {mask}.",
                 verbalizer: Optional[dict[str, Union[str, list[str]]]] = None,
                 scoring: Literal["mean", "max"] = "mean", soft_prompt_tokens: int = 0, freeze_backbone: bool = False,
                 optim: OptimConfig = OptimConfig(lr=1e-5), gradient_checkpointing: bool = False):
        self.template = Template(template)
        if soft_prompt_tokens < 0:
            raise PtmError(f"soft_prompt_tokens must be >= 0 (got {soft_prompt_tokens})")
        if freeze_backbone and not soft_prompt_tokens:
            raise PtmError("freeze_backbone: true leaves nothing to train; set soft_prompt_tokens > 0 "
                           "(prompt tuning) or freeze_backbone: false")
        self.soft_prompt: Optional[nn.Parameter] = None
        self._words: Optional[tuple] = None
        self._fresh_head: list[str] = []  # MLM head weights the backbone's files did not have
        self._restored = self._warned_fresh_head = False
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)  # may build the model

    def style(self) -> str:
        n = self.hparams.soft_prompt_tokens
        return "PET cloze" + (f" + {n} soft prompt tokens" if n else "") + (" (frozen MLM)" if self.hparams.freeze_backbone else "")

    def configure_model(self) -> None:
        built_here = self.backbone is None
        super().configure_model()
        if built_here and not self._restored:
            prefix = f"{self.backbone.base_model_prefix}."
            self._fresh_head = [k for k in getattr(self.backbone, "ptm_missing_keys", ()) if not k.startswith(prefix)]
        if self.hparams.freeze_backbone:
            self.backbone.requires_grad_(False)
        n = self.hparams.soft_prompt_tokens
        if n and self.soft_prompt is None:
            table = self.backbone.get_input_embeddings().weight
            self.soft_prompt = nn.Parameter(table[torch.randint(len(table), (n,))].detach().clone().float())

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if self.tokenizer is not None:
            self.label_words()  # a bad verbalizer fails now, not mid-epoch

    # -- a masked LM without a trained head (e.g. a sentence-transformers checkpoint) --------------------
    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self._restored, self._fresh_head = True, []  # the checkpoint brings its own (trained) head

    def fresh_head_warning(self) -> Optional[str]:
        """Why cloze scores will be near chance, when the MLM head loaded freshly initialised and nothing trains it."""
        fresh = self._fresh_head
        if not fresh:
            return None
        return (f"{type(self).__name__}: backbone {self.hparams.backbone!r} has no trained MLM head "
                f"({len(fresh)} tensors, e.g. {fresh[0]}, were freshly initialised), so its cloze scores are near "
                f"chance; train it (few-shot fit with freeze_backbone: false) or use a masked LM pre-trained "
                f"with its head")

    def on_train_start(self) -> None:
        if not self.hparams.freeze_backbone:
            self._fresh_head = []  # fine-tuning trains the head with the rest
        self._warn_fresh_head()

    def on_validation_start(self) -> None:
        self._warn_fresh_head()

    def on_test_start(self) -> None:
        self._warn_fresh_head()

    def _warn_fresh_head(self) -> None:
        message = self.fresh_head_warning()
        if message is not None and not self._warned_fresh_head:
            self._warned_fresh_head = True
            rank_zero_warn(message)

    def check_lengths(self, facts: DataFacts) -> None:
        super().check_lengths(facts)
        limit, wanted = max_positions(self.backbone), facts.max_length
        n = self.hparams.soft_prompt_tokens
        if n and limit is not None and wanted is not None and wanted + n > limit:
            raise PtmError(f"data.max_length={wanted} + soft_prompt_tokens={n} exceeds the backbone's {limit} "
                           f"positions; set data.init_args.max_length <= {limit - n}")

    def label_words(self) -> list[list[int]]:
        """The verbalizer's token ids per label, for the current labels and tokenizer."""
        if self.tokenizer is None:
            raise PtmError("PromptClassifierModule has no tokenizer; use it with a PromptDataModule")
        key = (id(self.tokenizer), tuple(self.labels))
        if self._words is None or self._words[0] != key:
            verbalizer = Verbalizer.of(self.hparams.verbalizer, self.labels)
            self._words = key, verbalizer.token_ids(self.tokenizer, self.labels, self.template.slot_space)
        return self._words[1]

    def make_collator(self, tokenizer, seed: int = 0) -> ClozeCollator:
        if tokenizer.mask_token_id is None:
            raise PtmError("PromptClassifierModule needs a masked LM's tokenizer (it has no mask token)")
        max_length = ((self.data_facts.max_length if self.data_facts is not None else None)
                      or max_positions(self.backbone) - self.hparams.soft_prompt_tokens)
        return ClozeCollator(pad_token_id=tokenizer.pad_token_id, encoder=PromptEncoder(self.template, tokenizer),
                             max_length=max_length)

    def model_inputs(self, batch: dict) -> dict:
        """Token inputs; with a soft prompt, ``inputs_embeds`` with the prompt vectors after the special prefix."""
        inputs = super().model_inputs(batch)
        if self.soft_prompt is None:
            return inputs
        ids = inputs.pop("input_ids")
        at, rows = len(special_affixes(self.tokenizer)[0]), len(ids)
        embeds = self.backbone.get_input_embeddings()(ids)
        prompt = self.soft_prompt.to(embeds.dtype).expand(rows, -1, -1)
        inputs["inputs_embeds"] = torch.cat([embeds[:, :at], prompt, embeds[:, at:]], dim=1)
        for name, fill in (("attention_mask", 1), ("token_type_ids", 0)):
            if name in inputs:
                value = inputs[name]
                inputs[name] = torch.cat([value[:, :at], value.new_full((rows, len(self.soft_prompt)), fill),
                                          value[:, at:]], dim=1)
        return inputs

    def forward(self, batch: dict) -> torch.Tensor:
        """Label scores [B, C] from the MLM logits at each row's mask."""
        logits = self.backbone(**self.model_inputs(batch)).logits
        at = batch["mask_positions"] + (0 if self.soft_prompt is None else len(self.soft_prompt))
        mask_logits = logits[torch.arange(len(logits), device=logits.device), at].float()
        return label_scores(mask_logits, self.label_words(), self.hparams.scoring)


class InContextEvalModule(_LabelScoringModule):
    """In-context learning with a causal LM (GPT-3, Brown et al. 2020 §2): ``validate``/``test`` only, never
    ``fit``.  Logs ``test/acc``, ``test/f1_macro`` (``val/*`` with ``validate``) and ``*/shots`` (demonstrations
    that fit the context).  Use with a ``PromptDataModule``: its training split is the demonstration pool.

    Args:
        backbone / backbone_config: the causal LM (``AutoModelForCausalLM``).
        labels: the label names in order; by default the data module's.
        template: one demonstration, with ``{text}`` (optionally ``{text_pair}``) and one ``{label}``; the query is
            the template up to ``{label}``.
        verbalizer: label → the text that stands for it (any number of tokens); None = the labels' own names.
        instruction: text before the demonstrations (GPT-3's task description; with ``k_shot: 0``, zero-shot).
        k_shot: demonstrations per evaluated example.
        seed: seeds each example's draw of demonstrations.
        length_normalize: score a label by the mean log-probability of its tokens (GPT-3 §2.4), not the sum.
        calibrate: contextual calibration (Zhao et al. 2021 §5): the label distribution after the same
            demonstrations with a content-free query (``content_free`` in every field) estimates the prompt's bias
            towards some labels, and the example's label probabilities are divided by it (W = diag(p_cf)^-1, b = 0).
        content_free: the content-free text ("N/A", Zhao et al. 2021 §5).
    """

    head = "causal_lm"

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 labels: Optional[list[str]] = None, template: str = "{text}\nLabel: {label}\n\n",
                 verbalizer: Optional[dict[str, str]] = None, instruction: str = "", k_shot: int = 4, seed: int = 0,
                 length_normalize: bool = True, calibrate: bool = False, content_free: str = "N/A"):
        self.template = Template(template, slot="label")
        if k_shot < 0:
            raise PtmError(f"k_shot must be >= 0 (got {k_shot})")
        super().__init__(backbone, backbone_config)

    def style(self) -> str:
        return f"in-context {self.hparams.k_shot}-shot" + (", calibrated" if self.hparams.calibrate else "")

    def configure_model(self) -> None:
        self.hparams.setdefault("gradient_checkpointing", False)  # not an argument: nothing trains
        super().configure_model()

    def setup(self, stage: str) -> None:
        if stage == "fit":
            raise PtmError(NO_FIT)
        super().setup(stage)

    def training_step(self, batch: dict, batch_idx: int) -> None:
        """Lightning requires one for ``fit``, which ``setup`` refuses before any step."""
        raise PtmError(NO_FIT)

    def answer_ids(self, tokenizer) -> list[list[int]]:
        """Each label's verbalised tokens, with the template's space before the slot."""
        words = self.hparams.verbalizer or {label: label for label in self.labels}
        if set(words) != set(self.labels):
            raise PtmError(f"verbalizer labels {sorted(words)} differ from the task's labels {sorted(self.labels)}; "
                           f"give every label its text (model.init_args.verbalizer)")
        answers = [tokenizer(self.template.slot_space + words[label], add_special_tokens=False)["input_ids"]
                   for label in self.labels]
        empty = [label for label, ids in zip(self.labels, answers) if not ids]
        if empty:
            raise PtmError(f"verbalizer: label '{empty[0]}' stands for no tokens; give it a non-empty text")
        return answers

    def build_collator(self, tokenizer, pool: PromptDataset) -> InContextCollator:
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        instruction = tokenizer(self.hparams.instruction, add_special_tokens=False)["input_ids"]
        content_free = None
        if self.hparams.calibrate:
            content_free = tokenizer(self.hparams.content_free, add_special_tokens=False)["input_ids"]
            if not content_free:
                raise PtmError("model.init_args.content_free is empty; give calibration a text such as 'N/A'")
        return InContextCollator(pad_token_id=pad_id, encoder=PromptEncoder(self.template, tokenizer), pool=pool,
                                 answers=self.answer_ids(tokenizer), k_shot=self.hparams.k_shot,
                                 seed=self.hparams.seed, instruction=instruction,
                                 max_length=max_positions(self.backbone), content_free=content_free)

    def make_collator(self, tokenizer, seed: int = 0) -> InContextCollator:
        pool = self.data_facts.train_examples() if self.data_facts is not None else None
        if not isinstance(pool, PromptDataset):
            raise PtmError("InContextEvalModule draws demonstrations from the training split of a PromptDataModule; "
                           "use data.class_path: ptm_app.data.prompt_data.PromptDataModule")
        return self.build_collator(tokenizer, pool)

    def forward(self, batch: dict) -> torch.Tensor:
        """Label scores [B, C]: the log-likelihood of each label's tokens after the prompt (mean if normalised);
        calibrated, the label log-probabilities minus those after the content-free query."""
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
        if "answer_ids" in batch:  # one-token labels: one row per query, the next-token distribution at the slot
            logits = self.backbone(**inputs, use_cache=False, logits_to_keep=1).logits[:, -1]
            scores = torch.log_softmax(logits.float(), -1)[:, batch["answer_ids"]]
        else:
            lengths = batch["answer_lengths"]
            k = int(lengths.max())
            logits = self.backbone(**inputs, use_cache=False, logits_to_keep=k + 1).logits
            logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch["input_ids"][:, -k:, None])
            is_answer = torch.arange(k, device=logp.device) >= (k - lengths)[:, None]
            scores = torch.where(is_answer, logp.squeeze(-1), 0.0).sum(-1)
            if self.hparams.length_normalize:
                scores = scores / lengths
        scores = scores.reshape(len(batch["keys"]), -1, len(self.labels))  # [B, queries, C]
        if scores.shape[1] == 2:  # p / p_cf over the labels, in log space (Zhao et al. 2021 §5)
            return torch.log_softmax(scores[:, 0], -1) - torch.log_softmax(scores[:, 1], -1)
        return scores[:, 0]

    def _eval_step(self, stage: str, batch: dict) -> None:
        super()._eval_step(stage, batch)
        self.log(f"{stage}/shots", batch["shots"].mean(), batch_size=len(batch["keys"]))
