"""Extractive QA data, following BERT §4.2 (SQuAD v1.1): the question is segment A, the passage segment B, and
the model predicts the answer's start and end tokens; long passages are cut into overlapping windows
(``doc_stride``), each window keeping its character offsets so spans map back to the passage.

Each split is tokenized once into an ``EncodedSplit`` (``data.encoded``, cached by file content, fields, tokenizer
and length settings); an answer that is not at its ``answer_start`` is an error naming ``file:line``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from torch.utils.data import Dataset

from ptm_app.data.datamodules import _Base, holdout_split
from ptm_app.data.datasets import _index
from ptm_app.data.encoded import EncodedSplit, encoded_split, read_rows, record_ids
from ptm_app.data.formats import read_records
from ptm_app.data.tokenizer import TokenizerSpec, fast_tokenizer_fingerprint
from ptm_app.errors import DataFormatError, PtmError
from ptm_app.paths import sha256_file


def _answers(path: Path, line: int, record: dict, field: str, context: str,
             unanswerable: bool = False) -> tuple[list[str], int]:
    """Gold answer texts and the first answer's start (-1 for none: an unanswerable question, allowed only with
    ``unanswerable``); each text must sit at its ``answer_start``."""
    answers = record[field]
    texts, starts = (answers.get("text"), answers.get("answer_start")) if isinstance(answers, dict) else (None, None)
    if not isinstance(texts, list) or not isinstance(starts, list) or len(texts) != len(starts):
        raise DataFormatError(path, line, f"'{field}' must be {{'text': [...], 'answer_start': [...]}} (SQuAD format)",
                              "fix the record")
    if not texts:
        if not unanswerable:
            raise DataFormatError(path, line, f"'{field}' has no answer (an unanswerable question)",
                                  "set data.unanswerable: true and model.init_args.null_answer: true for SQuAD "
                                  "2.0-style data, or give the answer")
        return [], -1
    for text, start in zip(texts, starts):
        if not isinstance(start, int) or context[start:start + len(str(text))] != str(text):
            raise DataFormatError(path, line, f"answer {text!r} is not at character {start} of the context",
                                  "fix answer_start (a 0-based character offset into the context)")
    return [str(t) for t in texts], starts[0]


def _cut_question(tokenizer, question: str, limit: int) -> str:
    """The question cut after its ``limit``-th token (at a token boundary)."""
    offsets = tokenizer(question, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return question if len(offsets) <= limit else question[: offsets[limit - 1][1]]


def qa_windows(tokenizer, questions: list[str], contexts: list[str], max_length: int, doc_stride: int,
               max_question_length: int) -> tuple[dict, int]:
    """Cut each (question, context) into windows of ``max_length`` tokens overlapping by ``doc_stride``: the
    windows' columns and the number of questions cut to ``max_question_length``.  Per window: ``input_ids``,
    ``token_type_ids`` (if the tokenizer gives them), ``example`` (index into the questions) and ``offsets``
    (``[start, end)`` character offsets of each token in the context, ``[-1, -1]`` for question, special and
    padding tokens)."""
    cut = [_cut_question(tokenizer, q, max_question_length) for q in questions]
    enc = tokenizer(cut, contexts, truncation="only_second", max_length=max_length, stride=doc_stride,
                    return_overflowing_tokens=True, return_offsets_mapping=True, verbose=False)
    offsets = []
    for i in range(len(enc["input_ids"])):
        in_context = [s == 1 for s in enc.sequence_ids(i)]
        offsets.append([list(o) if c else [-1, -1] for o, c in zip(enc["offset_mapping"][i], in_context)])
    columns = {"input_ids": enc["input_ids"], "example": list(enc["overflow_to_sample_mapping"]), "offsets": offsets}
    if enc.get("token_type_ids") is not None:
        columns["token_type_ids"] = enc["token_type_ids"]
    return columns, sum(c != q for c, q in zip(cut, questions))


def encode_qa(path: Path, tokenizer, *, question_field: str, context_field: str, answers_field: str, id_field: str,
              max_length: int, doc_stride: int, max_question_length: int, unanswerable: bool = False) -> EncodedSplit:
    """Cut each (question, context) into windows of ``max_length`` tokens overlapping by ``doc_stride``: one row per
    window (the columns of ``qa_windows``, plus ``start``/``end``, the answer's tokens, both 0, the [CLS] token,
    when the answer is not inside the window or the question has none); fields ``question``, ``context`` and
    ``answers`` (gold texts, empty for an unanswerable question) per example; stats ``truncated_questions`` and
    ``unanswerable``."""
    def build() -> EncodedSplit:
        rows = read_rows(path, (question_field, context_field, answers_field))
        contexts = [str(r[context_field]) for _, r in rows]
        golds = [_answers(path, line, r, answers_field, c, unanswerable) for (line, r), c in zip(rows, contexts)]
        questions = [str(r[question_field]) for _, r in rows]
        windows, truncated = qa_windows(tokenizer, questions, contexts, max_length, doc_stride, max_question_length)
        starts, ends = [], []
        for example, window in zip(windows["example"], windows["offsets"]):
            in_context = [o != [-1, -1] for o in window]
            texts, start_char = golds[example]
            end_char = start_char + len(texts[0]) if texts else -1
            start = end = 0
            tokens = [t for t, c in enumerate(in_context) if c]
            if texts and tokens and window[tokens[0]][0] <= start_char and window[tokens[-1]][1] >= end_char:
                start = max(t for t in tokens if window[t][0] <= start_char)
                end = min(t for t in tokens if window[t][1] >= end_char)
            starts.append(start)
            ends.append(end)
        return EncodedSplit(
            columns={**windows, "start": starts, "end": ends},
            fields={"question": questions, "context": contexts, "answers": [g[0] for g in golds]},
            lines=[line for line, _ in rows], path=str(path), ids=record_ids(path, rows, id_field),
            stats={"truncated_questions": truncated, "unanswerable": sum(not g[0] for g in golds)})

    key = [sha256_file(path), question_field, context_field, answers_field, id_field, max_length, doc_stride,
           max_question_length, fast_tokenizer_fingerprint(tokenizer)] + (["unanswerable"] if unanswerable else [])
    return encoded_split("qa", key, build)


class QADataset(Dataset):
    """Windows of one split: inputs, answer start/end tokens, context offsets and the example index."""

    def __init__(self, features: EncodedSplit, index: list[int]):
        self.windows, self.index = features.columns, index

    def __len__(self) -> int:
        return len(self.index)

    def lengths(self) -> list[int]:
        return [len(self.windows["input_ids"][i]) for i in self.index]

    def __getitem__(self, key) -> dict:
        w, i = self.windows, self.index[_index(key)]
        item = {"input_ids": torch.as_tensor(w["input_ids"][i], dtype=torch.long), "key": key,
                "start_position": w["start"][i], "end_position": w["end"][i], "example": w["example"][i],
                "offsets": torch.as_tensor(w["offsets"][i], dtype=torch.long)}
        if "token_type_ids" in w:
            item["token_type_ids"] = torch.as_tensor(w["token_type_ids"][i], dtype=torch.long)
        return item


class QADataModule(_Base):
    """Extractive QA in SQuAD format: ``question``, ``context``, ``answers: {text: [..], answer_start: [..]}``.

    Args:
        source: prepared dataset name (``wordnet_qa``), a directory with split files, or one file.
        question_field / context_field / answers_field / id_field: column names.
        max_length: window length in tokens (question + context + 3 specials).
        doc_stride: tokens shared by consecutive windows of a long context (transformers' ``stride``, as in
            its ``run_qa.py``; BERT's ``run_squad.py`` named the step between window starts so);
            default ``max_length // 4``.  Must be smaller than the room left for the context.
        max_question_length: longer questions are cut to this many tokens; default ``max_length // 2``.
        holdout: fraction of training examples held out when the source has no validation split.
        limit_train: use only the windows of the first N training examples.
        group_by_length: batch windows of similar length together (see ``TaskDataModule``).
        unanswerable: questions may have no answer (empty ``answers`` lists, SQuAD 2.0 / ``squad_unanswerable``):
            their start and end are [CLS] in every window (BERT §4.3); the model needs ``null_answer: true``.
    """

    kind = "qa"

    def __init__(self, tokenizer: TokenizerSpec, source: str = "wordnet_qa", question_field: str = "question",
                 context_field: str = "context", answers_field: str = "answers", id_field: str = "id",
                 max_length: int = 384, doc_stride: Optional[int] = None, max_question_length: Optional[int] = None,
                 batch_size: int = 32, eval_batch_size: Optional[int] = None, num_workers: int = 0, seed: int = 1234,
                 holdout: float = 0.1, limit_train: Optional[int] = None, group_by_length: bool = True,
                 unanswerable: bool = False):
        super().__init__(source, tokenizer, batch_size, eval_batch_size, num_workers, seed, holdout)
        self.unanswerable = unanswerable
        self.group_by_length = group_by_length
        self.question_field, self.context_field = question_field, context_field
        self.answers_field, self.id_field, self.max_length = answers_field, id_field, max_length
        self.doc_stride = max_length // 4 if doc_stride is None else doc_stride
        self.max_question_length = max_length // 2 if max_question_length is None else max_question_length
        self.limit_train = limit_train
        self.splits: dict = {}
        self.encoded: dict[Path, EncodedSplit] = {}  # this run's splits, read once
        room = max_length - self.max_question_length - 3  # [CLS] question [SEP] context [SEP]
        if self.max_question_length < 1 or room < 1 or not 0 <= self.doc_stride < room:
            raise PtmError(f"QADataModule: max_length={max_length} leaves {room} context tokens after a "
                           f"{self.max_question_length}-token question; doc_stride={self.doc_stride} must be smaller; "
                           "lower data.doc_stride / data.max_question_length or raise data.max_length")

    def _tokenizer_corpus(self):
        train = self.files["train"]
        fields = (self.question_field, self.context_field)
        texts = lambda: [str(r[f]) for _, r in read_records(train, fields) for f in fields]  # noqa: E731
        return texts, f"{train}:{self.question_field}+{self.context_field}"

    def _encode(self, path: Path) -> EncodedSplit:
        if path not in self.encoded:
            self.encoded[path] = encode_qa(path, self.load_tokenizer(), question_field=self.question_field,
                                           context_field=self.context_field, answers_field=self.answers_field,
                                           id_field=self.id_field, max_length=self.max_length,
                                           doc_stride=self.doc_stride, max_question_length=self.max_question_length,
                                           unanswerable=self.unanswerable)
        return self.encoded[path]

    def prepare_data(self) -> None:
        for path in self.files.values():
            truncated = self._encode(path).stats["truncated_questions"]
            if truncated:
                print(f"{path}: {truncated} questions cut to max_question_length="
                      f"{self.max_question_length} tokens")

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        for split, path in self.files.items():
            enc = self._encode(path)
            examples = list(range(len(enc.ids)))
            if split == "train" and "validation" not in self.files:
                examples, held = holdout_split(len(enc.ids), self.holdout, self.seed)
                self._add("validation", enc, set(held))
            if split == "train" and self.limit_train:
                examples = examples[: self.limit_train]
            self._add(split, enc, set(examples))

    def _add(self, split: str, enc: EncodedSplit, examples: set[int]) -> None:
        self.splits[split] = enc
        self.datasets[split] = QADataset(enc, [i for i, e in enumerate(enc.columns["example"]) if e in examples])

    def records(self, split: str) -> EncodedSplit:
        """The split: its examples (ids, questions, contexts, gold answers), which its windows' ``example`` index."""
        return self.splits[split]
