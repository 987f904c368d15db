"""Tokenize once (cached), packing with document boundaries, and bad corpus files."""
import json

import numpy as np
import pytest

from ptm_app.data import corpus as corpus_mod
from ptm_app.data.corpus import load_corpus, pack_blocks, tokenize_corpus
from ptm_app.data.tokenizer import TokenizerSpec, load_tokenizer
from ptm_app.errors import PtmError

from tests.conftest import write_jsonl


@pytest.fixture(scope="module")
def tokenizer(tiny_corpus):
    texts = [json.loads(l)["text"] for l in (tiny_corpus / "train.jsonl").read_text().splitlines()]
    return load_tokenizer(TokenizerSpec(train="wordpiece", vocab_size=200, min_frequency=1), lambda: texts, "t")


def test_tokenize_once_reuses_the_cache(tiny_corpus, tokenizer, monkeypatch):
    first = tokenize_corpus(tiny_corpus / "train.jsonl", "text", tokenizer, progress=False)
    monkeypatch.setattr(corpus_mod, "read_texts", lambda *a: pytest.fail("re-tokenized a cached corpus"))
    assert tokenize_corpus(tiny_corpus / "train.jsonl", "text", tokenizer, progress=False) == first
    c = load_corpus(first)
    assert c.num_documents == 60 and c.line_offsets[-1] == len(c.ids)


def test_pack_fills_blocks_and_split_documents_respects_boundaries(tiny_corpus, tokenizer):
    c = load_corpus(tokenize_corpus(tiny_corpus / "train.jsonl", "text", tokenizer, progress=False))
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    packed = pack_blocks(c, 32, [cls], [sep], [sep], "pack")
    assert all(len(b) == 32 and b[0] == cls and b[-1] == sep for b in packed)
    total = sum(len(c.document(d)) + 1 for d in range(c.num_documents))
    assert len(packed) == total // 30
    split = pack_blocks(c, 32, [cls], [sep], [sep], "split_documents")
    doc_lengths = [len(c.document(d)) for d in range(c.num_documents)]
    assert len(split) == sum(-(-n // 30) for n in doc_lengths)
    # no block crosses a document: each block's content is a slice of a single document
    first = np.asarray(c.document(0))
    assert np.array_equal(split[0][1:-1], first[:30])


def test_empty_corpus_and_malformed_line_are_one_line_errors(tmp_path, tokenizer):
    empty = write_jsonl(tmp_path / "empty.jsonl", [{"text": "   "}, {"text": ""}])
    with pytest.raises(PtmError, match="empty"):
        tokenize_corpus(empty, "text", tokenizer)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": oops}\n')
    with pytest.raises(PtmError, match=r"bad.jsonl:2: malformed JSON") as err:
        tokenize_corpus(bad, "text", tokenizer)
    assert "\n" not in str(err.value)
