"""Raw text → token ids, tokenized once and cached; documents and lines (sentences) kept; packing.

The cache (``<data>/.cache/tokenized/<key>``) is keyed by the file's content, the text field,
the tokenizer and this module's format version, so a second run, or another rank, skips the work.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal

import numpy as np

from ptm_app.data.formats import read_records
from ptm_app.data.pieces import document_lines
from ptm_app.data.tokenizer import tokenizer_fingerprint
from ptm_app.errors import PtmError
from ptm_app.paths import atomic_dir, cache_root, sha256_file

FORMAT_VERSION = 1
Packing = Literal["pack", "split_documents"]


@dataclass
class TokenizedCorpus:
    """Flat token ids with line (sentence) and document boundaries.

    ``line_offsets[i]:line_offsets[i+1]`` are the ids of line ``i``;
    ``doc_offsets[d]:doc_offsets[d+1]`` are the line indices of document ``d``.
    """

    ids: np.ndarray
    line_offsets: np.ndarray
    doc_offsets: np.ndarray

    @property
    def num_documents(self) -> int:
        return len(self.doc_offsets) - 1

    def document(self, d: int) -> np.ndarray:
        first, last = self.doc_offsets[d], self.doc_offsets[d + 1]
        return self.ids[self.line_offsets[first]: self.line_offsets[last]]

    def lines(self, d: int) -> list[np.ndarray]:
        first, last = self.doc_offsets[d], self.doc_offsets[d + 1]
        return [self.ids[self.line_offsets[i]: self.line_offsets[i + 1]] for i in range(first, last)]

    def tokens(self, start: int, stop: int) -> np.ndarray:
        return self.ids[start:stop]

    def doc_spans(self, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each chosen document's token start and length (as ``litcorpus.LitCorpus``)."""
        starts = np.asarray(self.line_offsets[np.asarray(self.doc_offsets[docs])], np.int64)
        ends = np.asarray(self.line_offsets[np.asarray(self.doc_offsets[docs + 1])], np.int64)
        return starts, ends - starts

    def sentence_counts(self, docs: np.ndarray) -> np.ndarray:
        return np.asarray(self.doc_offsets[docs + 1], np.int64) - np.asarray(self.doc_offsets[docs], np.int64)


class CorpusDocuments:
    """Documents of a corpus (in memory, or prepared: ``litcorpus.LitCorpus``) as a read-on-demand sequence of
    lines of ids (``documents[k]`` is document ``docs[k]``), for the NSP/SOP pair datasets
    (``datasets.SentencePairDataset``) over any corpus size."""

    def __init__(self, corpus, docs):
        self.corpus, self.docs = corpus, np.asarray(docs, np.int64)

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, k: int) -> list[list[int]]:
        return [line.tolist() for line in self.corpus.lines(int(self.docs[k]))]

    def sentence_counts(self) -> np.ndarray:
        return self.corpus.sentence_counts(self.docs)




def cache_dir_for(path: Path, text_field: str, tokenizer) -> Path:
    key = json.dumps([FORMAT_VERSION, sha256_file(path), text_field, tokenizer_fingerprint(tokenizer)])
    return cache_root() / "tokenized" / hashlib.sha256(key.encode()).hexdigest()[:20]


def read_texts(path: Path, text_field: str) -> list[str]:
    """Documents' texts in file order (lines inside a text are its sentences/paragraphs)."""
    return list(iter_texts([path], text_field))


def iter_texts(paths, text_field: str) -> Iterator[str]:
    """The documents' texts of ``paths`` in order, streamed (never the whole corpus in memory): what a tokenizer
    is trained on (``tokenizers``' ``train_from_iterator`` pulls it batch by batch)."""
    for path in paths:
        for _, record in read_records(path, (text_field,)):
            yield str(record[text_field])


def tokenize_corpus(path: Path, text_field: str, tokenizer, progress: bool = True) -> Path:
    """Tokenize ``path`` once into the cache and return the cache directory."""
    target = cache_dir_for(path, text_field, tokenizer)
    if (target / "meta.json").exists():
        return target
    docs = [document_lines(text) for text in read_texts(path, text_field)]
    docs = [d for d in docs if d]
    if not docs:
        raise PtmError(f"corpus {path} is empty: no text in field '{text_field}'; check the file or data.text_field")
    lines = [ln for d in docs for ln in d]
    pieces: list[list[int]] = []
    batch = 1000
    from rich.progress import track

    steps = range(0, len(lines), batch)
    for start in track(steps, description=f"tokenizing {path.name}", disable=not progress, transient=True):
        pieces.extend(tokenizer(lines[start: start + batch], add_special_tokens=False, verbose=False)["input_ids"])
    line_lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    if line_lengths.sum() == 0:
        raise PtmError(f"corpus {path} tokenizes to zero tokens; check the text field '{text_field}'")
    ids = np.fromiter((t for p in pieces for t in p), dtype=np.int32, count=int(line_lengths.sum()))
    line_offsets = np.concatenate([[0], np.cumsum(line_lengths)])
    doc_offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    with atomic_dir(target) as tmp:
        np.save(tmp / "ids.npy", ids)
        np.save(tmp / "line_offsets.npy", line_offsets)
        np.save(tmp / "doc_offsets.npy", doc_offsets)
        meta = {"source": str(path), "documents": len(docs), "lines": len(lines), "tokens": int(ids.size)}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    return target


def load_corpus(cache_dir: Path) -> TokenizedCorpus:
    return TokenizedCorpus(
        ids=np.load(cache_dir / "ids.npy", mmap_mode="r"),
        line_offsets=np.load(cache_dir / "line_offsets.npy"),
        doc_offsets=np.load(cache_dir / "doc_offsets.npy"),
    )


def pack_blocks(
    corpus: TokenizedCorpus,
    block_len: int,
    prefix: list[int],
    suffix: list[int],
    doc_sep: list[int],
    mode: Packing = "pack",
    documents: list[int] | None = None,
    with_documents: bool = False,
) -> list[np.ndarray] | tuple[list[np.ndarray], list[np.ndarray]]:
    """Cut the corpus into training blocks of at most ``block_len`` ids.

    ``pack``: documents are concatenated with ``doc_sep`` between them and cut into full blocks,
    the remainder dropped (RoBERTa FULL-SENTENCES, Liu et al. 2019 §4.2; HF ``group_texts``).
    ``split_documents``: each document is cut on its own, so no block spans two documents and
    the last block of a document is shorter (padded later).  Every block is ``prefix + chunk + suffix``.

    ``with_documents``: also return, per block, the document index of every token (the separator after
    a document belongs to it; ``prefix``/``suffix`` to the block's first/last document), for
    document-boundary attention (``backbones.attention.packed_document_inputs``).
    """
    content = block_len - len(prefix) - len(suffix)
    if content < 1:
        raise PtmError(f"max_length={block_len} leaves no room for tokens after the special tokens")
    pre, suf = np.asarray(prefix, np.int32), np.asarray(suffix, np.int32)
    documents = range(corpus.num_documents) if documents is None else documents
    if mode == "pack":
        sep = np.asarray(doc_sep, np.int32)
        parts, owners = [], []
        for d in documents:
            parts.append(corpus.document(d))
            parts.append(sep)
            owners.append(np.full(len(parts[-2]) + len(sep), d, np.int64))
        stream, owner = np.concatenate(parts), np.concatenate(owners)
        n_full = len(stream) // content
        cuts = [(i * content, (i + 1) * content) for i in range(n_full)] or [(0, len(stream))]
        chunks = [(stream[a:b], owner[a:b]) for a, b in cuts]
    else:
        chunks = []
        for d in documents:
            doc = np.asarray(corpus.document(d))
            chunks.extend((doc[i: i + content], np.full(len(doc[i: i + content]), d, np.int64))
                          for i in range(0, len(doc), content))
    chunks = [(c, o) for c, o in chunks if len(c)]
    blocks = [np.concatenate([pre, np.asarray(c, np.int32), suf]) for c, _ in chunks]
    if not with_documents:
        return blocks
    owners = [np.concatenate([np.full(len(pre), o[0]), o, np.full(len(suf), o[-1])]) for _, o in chunks]
    return blocks, owners
