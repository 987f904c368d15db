"""Parallel (aligned, bilingual) sentence pairs for translation language modelling.

XLM (Lample & Conneau 2019, §3.3): a TLM example is a source sentence and its translation
concatenated, with a language embedding per token and the positions of the target sentence reset
to 0.  Here the layout is BERT-style, ``[CLS] a [SEP] b [SEP]``: ``[CLS] a [SEP]`` carries the first
sentence's language id and positions ``0..len``; ``b [SEP]`` the second's, with positions from 0.

Pairs come from two aligned files (one sentence per line), from one TSV/CSV/JSONL/Parquet file
with a source and a target column, or from a prepared set / folder of such files per split (``bible_en_es``).
Each side is tokenized once into a cache keyed by the files' contents, the fields and the tokenizer;
truncation and the side order are decided per example.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ptm_app.data.corruption import draw_rng
from ptm_app.data.datamodules import _Base, holdout_split, resolve_source
from ptm_app.data.datasets import _index
from ptm_app.data.encoded import EncodedSplit, Ragged
from ptm_app.data.formats import read_records
from ptm_app.data.tokenizer import TokenizerSpec, is_bert_style, tokenizer_fingerprint
from ptm_app.errors import PtmError
from ptm_app.paths import atomic_dir, cache_root, sha256_file

FORMAT_VERSION = 1
SPECIALS_PER_PAIR = 3  # [CLS] a [SEP] b [SEP]


@dataclass(frozen=True)
class ParallelSource:
    """Where one split's pairs live: two aligned files, or one file with two columns (``target`` is None)."""

    source: Path
    target: Optional[Path]
    source_field: str = "src"
    target_field: str = "tgt"

    def check(self) -> None:
        for path in (self.source, self.target):
            if path is not None and not path.is_file():
                raise PtmError(f"parallel data file {path} does not exist; prepare the English-Spanish Bible with "
                               f"`python main.py data prepare bible_en_es` (source_file: bible_en_es) or supply "
                               f"your own aligned pairs (see configs/pretrain/xlm_tlm_bible.yaml)")

    def cache_key(self) -> list:
        self.check()
        if self.target is None:
            return [sha256_file(self.source), self.source_field, self.target_field]
        return [sha256_file(self.source), sha256_file(self.target)]

    def pairs(self) -> Iterator[tuple[int, str, str]]:
        """Yield ``(line, source_text, target_text)``; pairs with a blank side are skipped."""
        self.check()
        if self.target is None:
            rows = read_records(self.source, (self.source_field, self.target_field))
            triples = ((line, str(r[self.source_field]), str(r[self.target_field])) for line, r in rows)
        else:
            src, tgt = _lines(self.source), _lines(self.target)
            if len(src) != len(tgt):
                raise PtmError(f"parallel files are not aligned: {self.source} has {len(src)} lines but "
                               f"{self.target} has {len(tgt)}; they need one sentence per line, pair for pair")
            triples = ((i, s, t) for i, (s, t) in enumerate(zip(src, tgt), 1))
        for line, s, t in triples:
            if s.strip() and t.strip():
                yield line, s.strip(), t.strip()


def tokenize_pairs(source: ParallelSource, tokenizer, batch: int = 1000) -> Path:
    """Tokenize both sides once into ``<cache>/parallel/<key>`` and return that directory."""
    key = json.dumps([FORMAT_VERSION, *source.cache_key(), tokenizer_fingerprint(tokenizer)])
    target = cache_root() / "parallel" / hashlib.sha256(key.encode()).hexdigest()[:20]
    if (target / "meta.json").exists():
        return target
    rows = list(source.pairs())
    if not rows:
        raise PtmError(f"parallel data {source.source} has no sentence pairs; check the file(s) and the fields "
                       f"'{source.source_field}'/'{source.target_field}'")
    with atomic_dir(target) as tmp:
        for side, texts in (("source", [r[1] for r in rows]), ("target", [r[2] for r in rows])):
            pieces: list[list[int]] = []
            for start in range(0, len(texts), batch):
                pieces.extend(tokenizer(texts[start: start + batch], add_special_tokens=False,
                                        verbose=False)["input_ids"])
            lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
            np.save(tmp / f"{side}_ids.npy", np.fromiter((t for p in pieces for t in p), dtype=np.int32,
                                                         count=int(lengths.sum())))
            np.save(tmp / f"{side}_offsets.npy", np.concatenate([[0], np.cumsum(lengths)]))
        np.save(tmp / "lines.npy", np.asarray([r[0] for r in rows], dtype=np.int64))
        (tmp / "meta.json").write_text(json.dumps({"source": str(source.source), "target": str(source.target),
                                                   "pairs": len(rows)}, indent=2))
    return target


def load_pairs(cache_dir: Path) -> EncodedSplit:
    """The pairs cached by ``tokenize_pairs``: columns ``source_ids`` and ``target_ids`` (token ids without special
    tokens, memory-mapped), and the pairs' 1-based lines."""
    return EncodedSplit(
        columns={f"{s}_ids": Ragged(np.load(cache_dir / f"{s}_ids.npy", mmap_mode="r"),
                                    np.load(cache_dir / f"{s}_offsets.npy")) for s in ("source", "target")},
        fields={}, lines=np.load(cache_dir / "lines.npy"),
        path=json.loads((cache_dir / "meta.json").read_text())["source"])


def fit_pair(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """How many tokens of each side to keep so both fit ``budget``: the longer side is cut first."""
    if len_a + len_b <= budget:
        return len_a, len_b
    short = min(len_a, len_b, budget // 2)
    return (short, budget - short) if len_a <= len_b else (budget - short, short)


def tlm_example(first: list[int], second: list[int], languages: tuple[int, int], *, cls_id: int, sep_id: int,
                max_length: int) -> dict[str, torch.Tensor]:
    """``[CLS] first [SEP] second [SEP]`` with per-token language ids and positions reset at ``second``.

    XLM §3.3: "we also reset the positions of target sentences"; the first segment (with its
    [CLS]/[SEP]) carries ``languages[0]``, the second (with its closing [SEP]) ``languages[1]``.
    """
    keep_a, keep_b = fit_pair(len(first), len(second), max_length - SPECIALS_PER_PAIR)
    a, b = [cls_id, *first[:keep_a], sep_id], [*second[:keep_b], sep_id]
    return {
        "input_ids": torch.tensor(a + b, dtype=torch.long),
        "langs": torch.tensor([languages[0]] * len(a) + [languages[1]] * len(b), dtype=torch.long),
        "position_ids": torch.tensor([*range(len(a)), *range(len(b))], dtype=torch.long),
    }


class ParallelDataset(Dataset):
    """TLM examples from tokenized pairs; the order of the two sides is drawn per key.

    With probability ``swap_probability`` the target sentence comes first (then it is the one
    with positions from 0 at [CLS] and the source's positions are reset), so both translation
    directions are trained.  The draw is seeded by the sample key ``(epoch, index)``, so it
    changes every epoch and is the same when a run resumes.
    """

    def __init__(self, pairs: EncodedSplit, index: list[int], *, cls_id: int, sep_id: int, max_length: int,
                 seed: int, swap_probability: float):
        self.pairs, self.index, self.seed, self.swap_probability = pairs, index, seed, swap_probability
        self.cls_id, self.sep_id, self.max_length = cls_id, sep_id, max_length

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, key) -> dict:
        i, columns = self.index[_index(key)], self.pairs.columns
        src, tgt = columns["source_ids"][i], columns["target_ids"][i]
        swap = self.swap_probability > 0 and draw_rng(self.seed, [key]).random() < self.swap_probability
        first, second, languages = (tgt, src, (1, 0)) if swap else (src, tgt, (0, 1))
        example = tlm_example(first, second, languages, cls_id=self.cls_id, sep_id=self.sep_id,
                              max_length=self.max_length)
        return {**example, "key": key}


class ParallelDataModule(_Base):
    """Aligned sentence pairs → TLM examples (XLM, Lample & Conneau 2019 §3.3).

    Args:
        tokenizer: a pretrained BERT-style tokenizer, or ``train: wordpiece`` (one vocabulary trained on
            both sides of the training pairs, as XLM shares one BPE vocabulary across languages, §3.1).
        source_file: the source side, one sentence per line (with ``target_file``); or, without
            ``target_file``, one TSV/CSV (with a header row)/JSONL/Parquet file holding both sides; or a
            prepared set's name (``bible_en_es``) or a folder, whose ``train``/``validation``/``test`` files hold
            both sides (then no validation files are given).
        target_file: the target side, aligned line by line with ``source_file``.
        source_field / target_field: the two columns of a single pairs file.
        source_lang / target_lang: language codes; language id = index in ``[source_lang, target_lang]``.
        validation_source_file / validation_target_file: validation pairs, in the same layout as training;
            without them a ``holdout`` fraction of the training pairs is held out (deterministically).
        max_length: longest example in tokens, the 3 special tokens included (the longer side is cut first).
        swap_probability: how often the target sentence is put first (0.5: both directions equally).
    """

    def __init__(self, tokenizer: TokenizerSpec, source_file: str, target_file: Optional[str] = None,
                 source_field: str = "src", target_field: str = "tgt", source_lang: str = "en",
                 target_lang: str = "fr", validation_source_file: Optional[str] = None,
                 validation_target_file: Optional[str] = None, max_length: int = 128, swap_probability: float = 0.5,
                 batch_size: int = 32, eval_batch_size: Optional[int] = None, num_workers: int = 0, seed: int = 1234,
                 holdout: float = 0.05):
        super().__init__(source_file, tokenizer, batch_size, eval_batch_size, num_workers, seed, holdout)
        if source_lang == target_lang:
            raise PtmError(f"source_lang and target_lang are both '{source_lang}'; TLM needs two languages")
        if max_length < SPECIALS_PER_PAIR + 2:
            raise PtmError(f"max_length={max_length} leaves no room for a sentence pair; use at least 5")
        if not 0.0 <= swap_probability <= 1.0:
            raise PtmError(f"swap_probability={swap_probability} must be between 0 and 1")
        if (validation_target_file is not None) != (validation_source_file is not None and target_file is not None):
            raise PtmError("validation files must follow the training layout: validation_source_file + "
                           "validation_target_file with two files, validation_source_file alone with one pairs file")
        self.languages = [source_lang, target_lang]
        self.max_length, self.swap_probability = max_length, swap_probability
        fields = dict(source_field=source_field, target_field=target_field)
        splits = _split_files(source_file) if target_file is None and validation_source_file is None else None
        if splits is not None:
            self.sources = {split: ParallelSource(path, None, **fields) for split, path in splits.items()}
            return
        self.sources = {"train": ParallelSource(_path(source_file), _path(target_file), **fields)}
        if validation_source_file is not None:
            self.sources["validation"] = ParallelSource(_path(validation_source_file), _path(validation_target_file),
                                                        **fields)

    def _tokenizer_corpus(self):
        train = self.sources["train"]
        texts = lambda: (text for _, s, t in train.pairs() for text in (s, t))  # noqa: E731
        return texts, "parallel:" + ":".join(map(str, train.cache_key()))

    def prepare_data(self) -> None:
        tokenizer = self.load_tokenizer()
        for source in self.sources.values():
            tokenize_pairs(source, tokenizer)

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        tok = self.load_tokenizer()
        if not is_bert_style(tok):
            raise PtmError("TLM examples need a BERT-style tokenizer ([CLS]/[SEP]/[MASK]); use train: wordpiece")
        pairs = {split: load_pairs(tokenize_pairs(source, tok)) for split, source in self.sources.items()}
        index = {split: list(range(len(p))) for split, p in pairs.items()}
        if "validation" not in pairs:
            index["train"], index["validation"] = holdout_split(len(pairs["train"]), self.holdout, self.seed)
            pairs["validation"] = pairs["train"]
        for split, p in pairs.items():
            self.datasets[split] = ParallelDataset(p, index[split], cls_id=tok.cls_token_id, sep_id=tok.sep_token_id,
                                                   max_length=self.max_length, seed=self.seed,
                                                   swap_probability=self.swap_probability)

    def _eval_loader(self, split: str, seeded_order: bool = True) -> DataLoader:
        if split not in self.datasets:
            raise PtmError(f"parallel data has no {split} split: ParallelDataModule reads training pairs, "
                           f"validation pairs (validation_source_file or a holdout) and the test file of a "
                           f"prepared set or folder (source_file: bible_en_es)")
        return super()._eval_loader(split, seeded_order)


def _lines(path: Path) -> list[str]:
    """The lines of a text file, split at newlines only (a stray U+2028 must not break the alignment)."""
    with open(path, encoding="utf-8") as fh:
        return [line.rstrip("\n") for line in fh]


def _path(name: Optional[str]) -> Optional[Path]:
    return None if name is None else Path(name).expanduser().resolve()


def _split_files(name: str) -> Optional[dict[str, Path]]:
    """The split files of a prepared set's name or a folder; None for anything else (a pairs file)."""
    from ptm_app.data.sources import SOURCES

    path = Path(name).expanduser()
    return resolve_source(name) if path.is_dir() or (name in SOURCES and not path.exists()) else None
