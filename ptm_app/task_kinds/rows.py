"""A task kind's prediction rows: what ``predict --text/--input`` and ``serve`` compute for each kind (the rows
functions the entries of ``task_kinds.registry`` name: ``TaskKind.prediction``), each reusing the run's own
collator, alignment and post-processing so its rows equal those ``predict --config`` writes for the same examples:

- ``label_rows`` (``sequence``, ``regression``, ``multilabel``): the label with every label's probability, the chosen
  label set, or the value for regression (the run's ``predict_step``, ``training.callbacks.score_rows``);
- ``tag_rows`` (``token``): one tag per word from its first sub-token (BERT, Devlin et al. 2019 §4.3;
  ``data.tagging_data.align_words``, ``task_kinds.tagging.tags_by_word``);
- ``answer_rows`` (``qa``): the best span over a context's overlapping windows (BERT §4.2; ``data.qa_data.qa_windows``,
  ``task_kinds.spans``): its text, start and end characters and score;
- ``choice_rows`` (``choice``): each question's chosen answer and every choice's probability (BERT §4.4);
- ``generation_rows`` (``generation``): a ``GenerationModule`` run's own greedy / beam decoding of each source text.

``loaded`` is an ``inference.loading.LoadedModel``: its ``head_outputs`` (the module's ``forward``, a plain export's
model or an ONNX Runtime session) and ``data_args`` (the run's recorded data settings) are all a rows function asks
of the run, so this module stands below ``inference`` and imports nothing from it.  Batches are grouped by length
(fewer pad tokens); the rows come back in input order.  Inputs longer than the run's limit are truncated with one
warning line, or refused (``too_long="refuse"``).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional

import torch

from ptm_app.backbones.build import max_positions
from ptm_app.backbones.delta import transformers_model
from ptm_app.errors import PtmError

TOO_LONG = ("truncate", "refuse")
PRECISIONS = ("run", "32", "bf16")  # run: bf16 autocast when the run predicted in bf16 (precision auto / bf16-mixed)


@dataclass(frozen=True)
class Settings:
    """``batch_size``; ``max_length`` overrides the run's input limit; ``too_long``: truncate or refuse;
    ``progress``: show a progress bar; ``precision``: the autocast ``predict`` runs the rows under
    (``inference.predict.precision_context``); ``warn_truncated``: the one warning line when truncating (a caller
    that says it once for many calls turns it off)."""

    batch_size: int = 32
    max_length: Optional[int] = None
    too_long: str = "truncate"
    progress: bool = False  # a transient bar over the batches (on a terminal): files, not single texts
    precision: str = "run"
    warn_truncated: bool = True

    def __post_init__(self):
        if self.batch_size < 1:
            raise PtmError("--batch_size must be at least 1")
        if self.max_length is not None and self.max_length < 4:
            raise PtmError("--max_length must be at least 4 tokens")
        if self.too_long not in TOO_LONG:
            raise PtmError(f"--too_long {self.too_long}: use one of {', '.join(TOO_LONG)}")
        if self.precision not in PRECISIONS:
            raise PtmError(f"--precision {self.precision}: use one of {', '.join(PRECISIONS)}")


# -- shared helpers ---------------------------------------------------------------------------------
def model_limit(loaded) -> Optional[int]:
    return max_positions(transformers_model(loaded.model))


def check_lengths(lengths: list[int], limit: int, settings: Settings, what: str) -> None:
    """Refuse (one line) or warn once (one stderr line) about inputs longer than ``limit`` tokens."""
    over = [i for i, n in enumerate(lengths) if n > limit]
    if not over:
        return
    if settings.too_long == "refuse":
        raise PtmError(f"input {over[0] + 1} is {lengths[over[0]]} tokens, longer than {what}={limit}; shorten it, "
                       f"or pass --too_long truncate")
    if settings.warn_truncated:
        print(f"warning: {len(over)} of {len(lengths)} inputs are longer than {what}={limit} tokens and were "
              f"truncated (--too_long refuse rejects them instead)", file=sys.stderr)


def length_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length (longest first)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]


def batches(lengths: list[int], settings: Settings):
    """``length_batches``, behind a transient progress bar when ``settings.progress`` (``data.sources.fetch``'s:
    stderr, only on a terminal)."""
    groups = length_batches(lengths, settings.batch_size)
    if not settings.progress or len(groups) < 2:
        return groups
    from ptm_app.data.sources.fetch import progress

    return progress(groups, f"predicting {len(lengths)} inputs")


# -- classification and regression ---------------------------------------------------------------
def label_rows(loaded, texts: list[str], settings: Settings, kind) -> list[dict]:
    """The label and every label's probability, the chosen label set, or the value (the task ``kind``'s scores), and
    any per-example extras (``score_rows`` of the run's own ``predict_step``; a plain export's or an ONNX graph's
    scores)."""
    from ptm_app.data.collators import PadCollator
    from ptm_app.data.datasets import EncodedDataset
    from ptm_app.training.callbacks import score_rows

    module = loaded.module
    regression = kind.problem_type == "regression"
    if module is not None:
        collate, labels = module.make_collator(loaded.tokenizer), list(module.hparams.get("labels") or [])
    else:
        config = transformers_model(loaded.model).config
        collate = PadCollator(pad_token_id=loaded.tokenizer.pad_token_id)
        labels = [] if regression else [config.id2label[i] for i in range(config.num_labels)]
    limit = settings.max_length or loaded.data_args().get("max_length") or model_limit(loaded)
    if limit is not None:
        check_lengths([len(ids) for ids in loaded.tokenizer(texts)["input_ids"]], limit, settings, "max_length")
    enc = loaded.tokenizer(texts, truncation=limit is not None, max_length=limit)
    dataset = EncodedDataset(enc["input_ids"], None, enc.get("token_type_ids"))
    rows: list[Optional[dict]] = [None] * len(texts)
    for index in batches(dataset.lengths(), settings):
        batch = collate([dataset[i] for i in index])
        if module is not None and loaded.session is None:  # the run's own predict_step (an early exit's exit layer)
            scores = module.predict_step(batch, 0)
            if "values" in scores:
                scores["values"] = scores["values"].float()
        else:
            scores = kind.scores(loaded.head_outputs(batch, "sequence_classification", regression).float())
        for i, row in zip(index, score_rows(scores, labels)):
            rows[i] = row
    return rows


# -- token tagging ------------------------------------------------------------------------------------
def tag_rows(loaded, sentences: list[list[str]], settings: Settings, kind=None) -> list[dict]:
    """One tag per word, from its first sub-token; ``None`` for words beyond the length limit; an early-exit
    tagger's rows add each sentence's ``exit_layer``."""
    from ptm_app.data.collators import TokenLabelCollator
    from ptm_app.data.tagging_data import TaggedDataset, TokenTaskDataModule, align_words
    from ptm_app.task_kinds.tagging import tags_by_word

    module = loaded.module
    if module is not None:
        labels = list(module.hparams.labels)
    else:
        config = transformers_model(loaded.model).config
        labels = [config.id2label[i] for i in range(config.num_labels)]
    limit = settings.max_length or loaded.data_args(TokenTaskDataModule)["max_length"]
    tok = loaded.tokenizer
    full = tok(sentences, is_split_into_words=True)["input_ids"]
    check_lengths([len(ids) for ids in full], limit, settings, "max_length")
    input_ids, first, _, _ = align_words(tok, sentences, limit)
    dataset = TaggedDataset(input_ids, first, [[0] * len(words) for words in sentences])
    collate = TokenLabelCollator(pad_token_id=tok.pad_token_id)
    rows: list[Optional[dict]] = [None] * len(sentences)
    for index in batches(dataset.lengths(), settings):
        batch = collate([dataset[i] for i in index])
        logits, extras = loaded.predicted_outputs(batch, "token_classification")
        for r, i in enumerate(index):
            tags = tags_by_word(labels, logits[r].argmax(-1), batch["word_index"][r], len(sentences[i]))
            rows[i] = {"words": sentences[i], "tags": tags, **(extras[r] if extras else {})}
    return rows


# -- extractive QA ------------------------------------------------------------------------------------
def answer_rows(loaded, pairs: list[tuple[str, str]], settings: Settings, kind=None) -> list[dict]:
    """Each question's best answer span in its context (``answer``, ``answer_start``, ``answer_end``, ``score``)."""
    from ptm_app.data.collators import QACollator
    from ptm_app.data.qa_data import QADataModule, QADataset, qa_windows
    from ptm_app.data.encoded import EncodedSplit
    from ptm_app.task_kinds.parts import SpanMetrics
    from ptm_app.task_kinds.spans import BestSpans, answer_row, epoch_answers

    module = loaded.module
    args = loaded.data_args(QADataModule)
    length = settings.max_length or args["max_length"]
    if model_limit(loaded) is not None:
        length = min(length, model_limit(loaded))
    own = length == args["max_length"]  # the run's windows: its own stride and question limit
    stride = args["doc_stride"] if own and args.get("doc_stride") is not None else length // 4
    question_limit = args["max_question_length"] if own and args.get("max_question_length") else length // 2
    questions, contexts = [q for q, _ in pairs], [c for _, c in pairs]
    tok = loaded.tokenizer
    check_lengths([len(ids) for ids in tok(questions, add_special_tokens=False)["input_ids"]], question_limit,
                  settings, "max_question_length")
    windows, _ = qa_windows(tok, questions, contexts, length, stride, question_limit)
    n = len(windows["input_ids"])
    features = EncodedSplit(columns={**windows, "start": [0] * n, "end": [0] * n},
                            fields={"question": questions, "context": contexts}, lines=[0] * len(pairs), path="")
    dataset, collate = QADataset(features, list(range(n))), QACollator(pad_token_id=tok.pad_token_id)
    hp = module.hparams if module is not None else {}
    span_settings = {"n_best": hp.get("n_best", 20), "max_answer_length": hp.get("max_answer_length", 30)}
    spans, metrics = BestSpans(sync_on_compute=False), SpanMetrics()
    for index in batches(dataset.lengths(), settings):
        batch = collate([dataset[i] for i in index])
        metrics.update(spans, loaded.head_outputs(batch, "question_answering"), batch, span_settings)
    threshold = module.null_threshold() if module is not None and hasattr(module, "null_threshold") else None
    answers = epoch_answers(spans, features, threshold)  # "no answer" below the run's tuned τ (SQuAD 2.0)
    return [{"question": q, "context": c, **answer_row(answers[e], threshold is not None)}
            for e, (q, c) in enumerate(pairs)]


# -- multiple choice ----------------------------------------------------------------------------------
def choice_rows(loaded, questions: list[tuple[str, list[str]]], settings: Settings,
                kind=None) -> list[dict]:
    """Each question's chosen answer (``choice``: its index, ``answer``: its text) and every choice's probability
    (the soft-max over the (question, choice) pairs' scores, BERT §4.4), the pairs encoded as the run's data encodes
    them (``data.choice_data.read_choices``: the longer of the two cut first)."""
    from ptm_app.data.choice_data import MultipleChoiceDataModule
    from ptm_app.data.collators import ChoiceCollator

    module, tok = loaded.module, loaded.tokenizer
    n = module.hparams.num_choices if module is not None else len(questions[0][1])
    for i, (_, choices) in enumerate(questions):
        if len(choices) != n:
            raise PtmError(f"question {i + 1} has {len(choices)} choices; {loaded.ref} picks one of {n}: give every "
                           f"question {n} choices")
    limit = settings.max_length or loaded.data_args(MultipleChoiceDataModule)["max_length"]
    firsts = [q for q, choices in questions for _ in choices]
    seconds = [c for _, choices in questions for c in choices]
    full = tok(firsts, seconds)["input_ids"]
    check_lengths([max(len(ids) for ids in full[i * n:(i + 1) * n]) for i in range(len(questions))], limit, settings,
                  "max_length")
    enc = tok(firsts, seconds, truncation="longest_first", max_length=limit)
    items = []
    for i in range(len(questions)):
        rows_of = range(i * n, (i + 1) * n)
        item = {"choices": [torch.tensor(enc["input_ids"][r], dtype=torch.long) for r in rows_of], "label": 0, "key": i}
        if enc.get("token_type_ids") is not None:
            item["choice_types"] = [torch.tensor(enc["token_type_ids"][r], dtype=torch.long) for r in rows_of]
        items.append(item)
    collate = ChoiceCollator(pad_token_id=tok.pad_token_id)
    rows: list[Optional[dict]] = [None] * len(questions)
    for index in batches([max(len(c) for c in item["choices"]) for item in items], settings):
        batch = collate([items[i] for i in index])
        if module is None and loaded.session is None:  # a plain *ForMultipleChoice export reads [B, choices, L]
            batch = {k: v.view(len(index), n, -1) if torch.is_tensor(v) and v.dim() == 2 else v
                     for k, v in batch.items()}
        probs = torch.softmax(loaded.head_outputs(batch, "multiple_choice").float().view(len(index), n), dim=-1)
        for i, p in zip(index, probs.tolist()):
            best = max(range(n), key=p.__getitem__)
            question, choices = questions[i]
            rows[i] = {"question": question, "choices": choices, "choice": best, "answer": choices[best],
                       "probs": [round(v, 6) for v in p]}
    return rows


# -- generation ---------------------------------------------------------------------------------------
def generation_rows(loaded, texts: list[str], settings: Settings, kind=None) -> list[dict]:
    """The run's own decoding (greedy or its beam search) of each source text, laid out by its collator."""
    from ptm_app.data.generation_data import Seq2SeqDataModule

    module, tok = loaded.module, loaded.tokenizer
    args = loaded.data_args(Seq2SeqDataModule)
    limit = settings.max_length or args["max_source_length"]
    sources = tok(texts, add_special_tokens=False)["input_ids"]
    check_lengths([len(ids) for ids in sources], limit, settings, "max_source_length")
    items = [{"source_ids": torch.tensor(ids[:limit], dtype=torch.long), "target_ids": torch.tensor([], dtype=torch.long),
              "target": "", "key": i} for i, ids in enumerate(sources)]
    collate = module.make_collator(tok)
    rows: list[Optional[dict]] = [None] * len(texts)
    for index in batches([len(item["source_ids"]) for item in items], settings):
        generated = module.generate(collate([items[i] for i in index]), target_length=args["max_target_length"])
        for i, text in zip(index, generated):
            rows[i] = {"generated": text}
    return rows
