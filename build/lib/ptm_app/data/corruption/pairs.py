"""Sentence-pair objectives: NSP (BERT, Devlin et al. 2019 §3.1 Task #2) and SOP (ALBERT, Lan et al.
2020 §3.1 "Inter-sentence coherence loss")

``documents`` is a list of documents, each a list of non-empty sentences of token ids.  Segment A
is one or more consecutive sentences starting at ``sentence_index``; sentences are gathered (as in
BERT's ``create_pretraining_data``) until ``max_tokens`` is reached, at least two when the
document has them.  ``max_tokens`` bounds ``len(a) + len(b)`` WITHOUT the three special tokens
(pass ``max_seq_length - 3``); the longer segment is trimmed from its end.

Label conventions:

* ``nsp_example`` returns ``is_next``: 1 = B really follows A (the survey's ``t = 1``), 0 = B is
  from another document.  HF ``BertForPreTraining(next_sentence_label=...)`` uses the OPPOSITE
  (0 = continuation, 1 = random), so pass ``1 - is_next`` there.
* ``sop_example`` returns ``sentence_order_label`` as HF ``AlbertForPreTraining`` expects:
  0 = original order (A then B), 1 = swapped (B then A).
"""
from __future__ import annotations

import random
from typing import Sequence

Document = Sequence[Sequence[int]]


def _chunk(document: Document, sentence_index: int, max_tokens: int) -> list[Sequence[int]]:
    if not 0 <= sentence_index < len(document):
        raise ValueError(f"sentence_index {sentence_index} outside a document of {len(document)} sentences")
    if max_tokens < 2:
        raise ValueError("max_tokens must be >= 2")
    chunk, total = [], 0
    for sentence in document[sentence_index:]:
        if total >= max_tokens and len(chunk) >= 2:
            break
        chunk.append(sentence)
        total += len(sentence)
    return chunk


def _flat(sentences: Sequence[Sequence[int]]) -> list[int]:
    return [t for sentence in sentences for t in sentence]


def _truncate(a: list[int], b: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
    """BERT's ``truncate_seq_pair``, always trimming the end of the longer segment (B on ties)."""
    while len(a) + len(b) > max_tokens:
        (a if len(a) > len(b) else b).pop()
    return a, b


def _split(chunk: list[Sequence[int]], rng: random.Random) -> tuple[list[int], list[int]]:
    a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
    return _flat(chunk[:a_end]), _flat(chunk[a_end:])


def nsp_example(
    documents: Sequence[Document], doc_index: int, sentence_index: int, rng: random.Random, *, max_tokens: int
) -> tuple[list[int], list[int], int]:
    """Next sentence prediction pair ``(segment_a, segment_b, is_next)`` (Devlin et al. 2019 §3.1).

    With probability 1/2 B is the text that follows A; otherwise B is consecutive sentences
    starting at a random sentence of a different, uniformly chosen document.  When
    ``sentence_index`` is the document's last sentence nothing follows, so the pair is always a
    negative (as in BERT); pick starts with a following sentence to keep labels balanced.
    """
    chunk = _chunk(documents[doc_index], sentence_index, max_tokens)
    a, b = _split(chunk, rng)
    is_next = int(len(chunk) >= 2 and rng.random() < 0.5)
    if not is_next:
        if len(documents) < 2:
            raise ValueError("NSP negatives need at least two documents")
        other_index = rng.randrange(len(documents) - 1)
        other = documents[other_index + (other_index >= doc_index)]
        b = []
        for sentence in other[rng.randrange(len(other)):]:
            b += sentence
            if len(b) >= max_tokens - len(a):
                break
    return (*_truncate(a, b, max_tokens), is_next)


def sop_example(
    documents: Sequence[Document], doc_index: int, sentence_index: int, rng: random.Random, *, max_tokens: int
) -> tuple[list[int], list[int], int]:
    """Sentence order prediction pair ``(segment_a, segment_b, sentence_order_label)`` (ALBERT).

    Two consecutive segments of the same document, truncated, then swapped with probability 1/2:
    label 0 = in order, 1 = swapped (HF ``AlbertForPreTraining`` convention).  Needs a sentence
    after ``sentence_index``.
    """
    chunk = _chunk(documents[doc_index], sentence_index, max_tokens)
    if len(chunk) < 2:
        raise ValueError("SOP needs at least one sentence after sentence_index")
    a, b = _truncate(*_split(chunk, rng), max_tokens)
    return (b, a, 1) if rng.random() < 0.5 else (a, b, 0)


def pair_input(a: Sequence[int], b: Sequence[int], *, cls_id: int, sep_id: int) -> tuple[list[int], list[int]]:
    """``[CLS] a [SEP] b [SEP]`` with token type ids 0 for ``[CLS] a [SEP]`` and 1 for ``b [SEP]``."""
    input_ids = [cls_id, *a, sep_id, *b, sep_id]
    return input_ids, [0] * (len(a) + 2) + [1] * (len(b) + 1)
