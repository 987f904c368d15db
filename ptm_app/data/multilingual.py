"""Multilingual text: monolingual streams of every language and parallel pairs, with XLM's language sampling.

- XLM's language sampling q_i (``data.language_sampling``: ``language_probabilities``, ``balanced_counts``,
  ``balanced_texts``).
- ``MultilingualDataModule``: mBERT / XLM-R style multilingual MLM over the monolingual sides of aligned sets
  (``quran``: 11 languages, ``bible_en_es``: 2), as XLM streams (§3.2: consecutive sentences of one language, cut
  into blocks), each block with its language; the training examples are drawn per language with q_i.  With
  ``pairs`` each example also carries an aligned sentence pair (TLM, §3.3) for XLM's mix of objectives.
- ``split_leaks``: what of a split set could leak a verse's translation from training into evaluation.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Iterable, Mapping, Optional

import numpy as np
import torch
from torch.utils.data import Dataset

from ptm_app.data.corruption import draw_rng
from ptm_app.data.datamodules import _Base, resolve_source
from ptm_app.data.datasets import _index
from ptm_app.data.language_sampling import balanced_counts, balanced_texts, language_probabilities  # noqa: F401
from ptm_app.data.parallel import tlm_example
from ptm_app.data.tokenizer import TokenizerSpec, check_languages, is_bert_style
from ptm_app.errors import PtmError

SPLITS = ("train", "validation", "test")


def set_languages() -> dict[str, tuple[str, ...]]:
    """The language fields of the prepared aligned sets."""
    from ptm_app.data.sources import bible, quran

    return {"quran": quran.LANGUAGES, "bible_en_es": tuple(bible.MODULES)}


def words(text: str, lang: str) -> int:
    """Words of a text for fertility: whitespace-separated, or characters for Chinese (written without spaces)."""
    return len(text.replace(" ", "")) if lang == "zh" else len(text.split())


def fertility(tokenizer, texts: Mapping[str, list[str]]) -> dict[str, float]:
    """Tokens per word per language (Rust et al. 2021's fertility; ``words`` counts the words)."""
    out = {}
    for lang, items in texts.items():
        ids = tokenizer(list(items), add_special_tokens=False)["input_ids"]
        out[lang] = sum(map(len, ids)) / max(1, sum(words(t, lang) for t in items))
    return out


# -- reading the aligned sets ----------------------------------------------------------------------------------
def _records(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def source_languages(source: str) -> tuple[str, ...]:
    """The languages of a prepared aligned set, or of a folder's records (their fields of 2-3 lowercase letters)."""
    known = set_languages()
    if source in known:
        return known[source]
    first = _records(resolve_source(source)["train"])[:1]
    return tuple(k for k in (first[0] if first else {}) if k.isalpha() and k.islower() and 2 <= len(k) <= 3
                 and k != "id")


def split_texts(sources: list[str], languages: list[str], split: str) -> dict[str, list[str]]:
    """Per language, the texts of ``split`` of every source that has the language, in file order."""
    out: dict[str, list[str]] = {lang: [] for lang in languages}
    for source in sources:
        files = resolve_source(source)
        if split not in files:
            continue
        have = [lang for lang in languages if lang in source_languages(source)]
        for rec in _records(files[split]):
            for lang in have:
                if str(rec.get(lang) or "").strip():
                    out[lang].append(str(rec[lang]).strip())
    return out


def aligned_texts(source: str, languages: list[str], split: str) -> tuple[list[str], dict[str, list[str]]]:
    """The ids and, per language, the texts of ``split``'s records that have every one of ``languages``."""
    check_known(languages, {source: source_languages(source)})
    rows = [r for r in _records(resolve_source(source)[split])
            if all(str(r.get(lang) or "").strip() for lang in languages)]
    return [r["id"] for r in rows], {lang: [str(r[lang]).strip() for r in rows] for lang in languages}


def check_known(languages: Iterable[str], have: Mapping[str, Iterable[str]]) -> None:
    """One line for a language code no source has, naming the ones the data has."""
    every = sorted({lang for langs in have.values() for lang in langs})
    unknown = [lang for lang in languages if lang not in every]
    if unknown:
        raise PtmError(f"language {', '.join(map(repr, unknown))} is not in the data ({', '.join(have)}); the data "
                       f"has {', '.join(every)}")


def split_leaks(rows: Mapping[str, list[dict]], unit: Iterable[str], languages: Iterable[str]) -> dict:
    """What of a split aligned set could leak a translation across splits: ids or units (``unit`` fields, e.g.
    ``("surah",)`` or ``("book",)``) found in two splits, and, for information, the texts of evaluation records
    that also occur verbatim in training (a verse the source itself repeats elsewhere: not a leak of the
    verse's own translation, which the unit split keeps out)."""
    unit = tuple(unit)
    where: dict[str, set] = {"id": set(), "unit": set()}
    seen: dict[str, dict] = {"id": {}, "unit": {}}
    for split, recs in rows.items():
        for r in recs:
            for kind, value in (("id", r["id"]), ("unit", tuple(r[f] for f in unit))):
                first = seen[kind].setdefault(value, split)
                if first != split:
                    where[kind].add(value)
    train = {lang: {r[lang] for r in rows.get("train", [])} for lang in languages}
    repeated = {lang: sum(r[lang] in train[lang] for split, recs in rows.items() if split != "train" for r in recs)
                for lang in languages}
    return {"ids_in_two_splits": sorted(where["id"]), "units_in_two_splits": sorted(where["unit"]),
            "texts_repeated_from_train": repeated}


# -- examples -----------------------------------------------------------------------------------------------------
def stream_blocks(pieces: list[list[int]], *, cls_id: int, sep_id: int, max_length: int) -> list[list[int]]:
    """XLM's streams (§3.2): the sentences of one language in order, each closed by [SEP], cut into blocks of
    ``max_length - 1`` tokens, each opened by [CLS]; a last block shorter than half is dropped (unless it is the
    only one)."""
    stream = [t for p in pieces for t in (*p, sep_id)]
    size = max_length - 1
    blocks = [[cls_id, *stream[i: i + size]] for i in range(0, len(stream), size)]
    if len(blocks) > 1 and len(blocks[-1]) - 1 < size // 2:
        blocks.pop()
    return blocks


class MultilingualDataset(Dataset):
    """Language blocks drawn per language with q_i (``order``: (language index, block) per example), and with
    ``pairs`` an aligned pair per example (the ``k``-th of a seeded permutation, cycled) for TLM; the pair's side
    order is drawn from the sample key (as ``parallel.ParallelDataset``)."""

    def __init__(self, blocks: list[list[list[int]]], order: np.ndarray, pairs: Optional[list[tuple]] = None, *,
                 cls_id: int, sep_id: int, max_length: int, seed: int, swap_probability: float = 0.5):
        self.blocks, self.order, self.pairs = blocks, order, pairs
        self.cls_id, self.sep_id, self.max_length, self.seed = cls_id, sep_id, max_length, seed
        self.swap_probability = swap_probability
        self.pair_order = np.random.default_rng(seed).permutation(len(pairs)) if pairs else None

    def __len__(self) -> int:
        return len(self.order)

    def mono(self, k: int) -> dict:
        lang, block = (int(v) for v in self.order[k])
        ids = self.blocks[lang][block]
        return {"input_ids": torch.tensor(ids, dtype=torch.long),
                "langs": torch.full((len(ids),), lang, dtype=torch.long),
                "position_ids": torch.arange(len(ids), dtype=torch.long)}

    def __getitem__(self, key) -> dict:
        k = _index(key)
        if not self.pairs:
            return {**self.mono(k), "key": key}
        a, b, la, lb = self.pairs[self.pair_order[k % len(self.pairs)]]
        if self.swap_probability > 0 and draw_rng(self.seed, [key]).random() < self.swap_probability:
            a, b, la, lb = b, a, lb, la
        para = tlm_example(a, b, (la, lb), cls_id=self.cls_id, sep_id=self.sep_id, max_length=self.max_length)
        return {"mono": self.mono(k), "para": para, "key": key}


def sampled_order(sizes: list[int], alpha: float, seed: int, total: Optional[int] = None) -> np.ndarray:
    """``total`` (default: all blocks) examples as (language, block): each example's language drawn from q_i
    (``alpha``), its block the next of that language's seeded permutation (cycled when a language is up-sampled)."""
    rng = np.random.default_rng(seed)
    q = language_probabilities(dict(enumerate(sizes)), alpha)
    total = sum(sizes) if total is None else total
    langs = rng.choice(len(sizes), size=total, p=[q[i] for i in range(len(sizes))])
    perms = [rng.permutation(n) if n else np.zeros(0, np.int64) for n in sizes]
    taken = [0] * len(sizes)
    order = np.zeros((total, 2), dtype=np.int64)
    for k, lang in enumerate(langs):
        order[k] = (lang, perms[lang][taken[lang] % sizes[lang]])
        taken[lang] += 1
    return order


class MultilingualDataModule(_Base):
    """Monolingual streams of every language (mBERT / XLM-R multilingual MLM; XLM's CLM and MLM), sampled per
    language with XLM's q_i ∝ p_i^alpha, and with ``pairs`` aligned sentence pairs too (XLM's TLM, §3.3).

    Args:
        tokenizer: ``train: unigram`` (SentencePiece Unigram, as XLM-R; ``tokenizer.alpha`` samples its corpus per
            language), ``wordpiece`` ... or a pretrained one (refused when it records its languages and lacks one).
        sources: aligned sets whose language fields are the monolingual text (prepared ``quran``, ``bible_en_es``,
            or a folder of split .jsonl files with one field per language code).
        languages: the languages to use (default: every language of the sources); an unknown code is refused.
        alpha: the exponent of the language sampling of training examples (1: the corpus's proportions).
        pairs: language pairs ``"en-es"`` for TLM examples, from every source that has both (default: none).
        max_length: block length in tokens (XLM streams: [CLS] + the stream), and the longest TLM example.
        swap_probability: how often a TLM pair puts its second language first.
        limit_documents: use only the first N training sentences of each language and source (quick runs).
    """

    def __init__(self, tokenizer: TokenizerSpec, sources: Optional[list[str]] = None,
                 languages: Optional[list[str]] = None, alpha: float = 0.5, pairs: Optional[list[str]] = None,
                 max_length: int = 128, swap_probability: float = 0.5, batch_size: int = 32,
                 eval_batch_size: Optional[int] = None, num_workers: int = 0, seed: int = 1234,
                 limit_documents: Optional[int] = None):
        sources = ["quran", "bible_en_es"] if sources is None else list(sources)
        super().__init__(",".join(sources), tokenizer, batch_size, eval_batch_size, num_workers, seed, 0.0)
        if not sources:
            raise PtmError("data.init_args.sources is empty; name at least one aligned set (quran, bible_en_es)")
        if not 0.0 < alpha <= 1.0:
            raise PtmError(f"data.init_args.alpha={alpha}: the sampling exponent is in (0, 1] (XLM: 0.5-0.7)")
        if max_length < 8:
            raise PtmError(f"max_length={max_length} is too short for a block; use at least 8")
        self.sources, self.alpha, self.max_length = list(sources), alpha, max_length
        self.swap_probability, self.limit_documents = swap_probability, limit_documents
        self.requested, self.pair_names = languages, list(pairs or [])
        self._languages: Optional[list[str]] = None

    @property
    def languages(self) -> list[str]:
        """The languages in use, checked against the sources (each one's index is its language id)."""
        if self._languages is None:
            have = {s: source_languages(s) for s in self.sources}
            every = list(dict.fromkeys(lang for langs in have.values() for lang in langs))
            wanted = list(self.requested) if self.requested else every
            check_known(wanted, have)
            for pair in self.pair_names:
                langs = pair.split("-")
                if len(langs) != 2 or langs[0] == langs[1]:
                    raise PtmError(f"data.init_args.pairs: {pair!r} is not two languages 'xx-yy'")
                check_known(langs, have)
                missing = [lang for lang in langs if lang not in wanted]
                if missing:
                    raise PtmError(f"data.init_args.pairs: {pair!r} uses {', '.join(missing)}, not among the "
                                   f"languages {', '.join(wanted)}; add it to data.init_args.languages")
                if not any(set(langs) <= set(v) for v in have.values()):
                    raise PtmError(f"data.init_args.pairs: no source has both sides of {pair!r} aligned")
            self._languages = wanted
        return self._languages

    def _texts(self, split: str) -> dict[str, list[str]]:
        texts = split_texts(self.sources, self.languages, split)
        if split == "train" and self.limit_documents:
            texts = {lang: items[: self.limit_documents * len(self.sources)] for lang, items in texts.items()}
        return texts

    def _tokenizer_corpus(self):
        return (lambda: self._texts("train")), "multilingual:" + json.dumps(
            [self.sources, self.languages, self.limit_documents, [str(resolve_source(s)["train"]) for s in self.sources]])

    def load_tokenizer(self):
        tok = super().load_tokenizer()
        check_languages(tok, self.languages)
        return tok

    def prepare_data(self) -> None:
        self.load_tokenizer()

    def _pairs(self, split: str, tok) -> list[tuple]:
        out = []
        for pair in self.pair_names:
            a, b = pair.split("-")
            ia, ib = self.languages.index(a), self.languages.index(b)
            for source in self.sources:
                if {a, b} <= set(source_languages(source)) and split in resolve_source(source):
                    _, texts = aligned_texts(source, [a, b], split)
                    if split == "train" and self.limit_documents:
                        texts = {k: v[: self.limit_documents] for k, v in texts.items()}
                    ids_a = tok(texts[a], add_special_tokens=False)["input_ids"] if texts[a] else []
                    ids_b = tok(texts[b], add_special_tokens=False)["input_ids"] if texts[b] else []
                    out += [(x, y, ia, ib) for x, y in zip(ids_a, ids_b)]
        return out

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        tok = self.load_tokenizer()
        if not is_bert_style(tok):
            raise PtmError("multilingual blocks need a BERT-style tokenizer ([CLS]/[SEP]/[MASK]); use train: unigram")
        self.block_counts = {}
        for split in SPLITS:
            texts = self._texts(split)
            if not any(texts.values()):
                continue
            blocks = [stream_blocks(tok(items, add_special_tokens=False)["input_ids"] if items else [],
                                    cls_id=tok.cls_token_id, sep_id=tok.sep_token_id, max_length=self.max_length)
                      if items else [] for items in texts.values()]
            sizes = [len(b) for b in blocks]
            self.block_counts[split] = dict(zip(self.languages, sizes))
            # training: languages drawn with q_i; evaluation: every block once, in order (alpha 1 keeps proportions)
            order = (sampled_order(sizes, self.alpha, self.seed) if split == "train" else
                     np.asarray([(i, j) for i, n in enumerate(sizes) for j in range(n)], dtype=np.int64))
            pairs = self._pairs(split, tok) if self.pair_names else None
            if self.pair_names and not pairs:
                raise PtmError(f"no aligned pairs {', '.join(self.pair_names)} in the {split} split of "
                               f"{', '.join(self.sources)}")
            self.datasets[split] = MultilingualDataset(blocks, order, pairs, cls_id=tok.cls_token_id,
                                                       sep_id=tok.sep_token_id, max_length=self.max_length,
                                                       seed=self.seed, swap_probability=self.swap_probability)
        if "train" not in self.datasets or "validation" not in self.datasets:
            raise PtmError(f"the sources {', '.join(self.sources)} need train and validation splits in "
                           f"{', '.join(self.languages)}")

    def sampled_languages(self, split: str = "train") -> Counter:
        """How many examples of each language ``split`` holds (the effect of ``alpha``)."""
        order = self.datasets[split].order
        return Counter(self.languages[int(i)] for i in order[:, 0])
