"""Language-tagged monolingual corpora for multilingual denoising pre-training (mBART, Liu et al. 2020 §2.1-2.2).

Each corpus is one language's text: a prepared set, a folder of split files or one file, and the field holding
the text (``bible_en_es`` with ``text_field: en`` and again with ``text_field: es`` gives both Bible sides; a new
language is one more entry in the config).  Per language, the records of a split are tokenized once (cached by the
file's content, the field, the tokenizer and the length) and packed in file order into instances of at most
``max_length - 2`` tokens (room for ``[EOS] <lang>``); a record longer than that is cut into several.  Every
instance carries its language's token ``[<code>]`` (``language_token``), which a trained tokenizer gets as a special
token and a pre-trained one must already have.

Training instances are re-balanced across languages as mBART and XLM do (Liu et al. 2020 §2.1; Lample & Conneau
2019 §3.1): language *i*, with a share ``p_i`` of all instances, gets ``q_i = p_i^α / Σ_j p_j^α`` of the epoch
(``sampling_alpha``; 1 keeps the natural shares, smaller values up-sample the small languages), drawn once with
the run's seed (down-sampled without replacement, up-sampled by whole copies plus a draw), so a run resumes on
the same examples.  Validation and test keep every instance.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import torch
from torch.utils.data import Dataset

from ptm_app.data.cache import cached_json
from ptm_app.data.datamodules import _Base, check_batch_sizes, holdout_split, resolve_source
from ptm_app.data.datasets import _index
from ptm_app.data.formats import read_records
from ptm_app.data.tokenizer import TokenizerSpec, tokenizer_fingerprint
from ptm_app.errors import PtmError
from ptm_app.paths import sha256_file

FORMAT_VERSION = 1
_CODE = re.compile(r"[A-Za-z0-9_-]{1,16}")


def language_token(code: str) -> str:
    """The token that names language ``code`` (``en`` → ``[en]``): mBART's language id (Liu et al. 2020 §2.2), one
    form for pre-training, fine-tuning and ``generate``."""
    if not isinstance(code, str) or not _CODE.fullmatch(code):
        raise PtmError(f"language code {code!r}: use letters, digits, '_' or '-' (e.g. en, es, zh_CN)")
    return f"[{code}]"


def language_token_id(tokenizer, code: str) -> int:
    """The id of ``[code]`` in ``tokenizer``; a tokenizer without it is one line naming the fix."""
    token = language_token(code)
    ids = tokenizer.convert_tokens_to_ids([token])
    if not ids or ids[0] is None or ids[0] == tokenizer.unk_token_id or token not in tokenizer.get_vocab():
        raise PtmError(f"language '{code}': the tokenizer has no token {token}; use the tokenizer of a run "
                       f"pre-trained with that language (configs/pretrain/mbart_dae_bible.yaml adds one token per corpus "
                       f"language) or train one with tokenizer.special_tokens: ['{token}']")
    return ids[0]


def sampling_counts(sizes: dict[str, int], alpha: float, total: Optional[int] = None) -> dict[str, int]:
    """Instances per language in a re-balanced epoch of ``total`` (default: all) instances:
    ``round(total * q_i)`` with ``q_i = p_i^α / Σ_j p_j^α`` (Lample & Conneau 2019 §3.1; Liu et al. 2020 §2.1), by
    ``data.language_sampling.balanced_counts`` (the one place it is computed), with α checked to lie in (0, 1]."""
    from ptm_app.data.language_sampling import balanced_counts

    if not 0 < alpha <= 1:
        raise PtmError(f"sampling_alpha={alpha}: use a value in (0, 1] (1: natural shares; mBART 0.7, XLM 0.5)")
    return balanced_counts(sizes, alpha, total)


def resample(index: list[int], count: int, rng: random.Random) -> list[int]:
    """``count`` of ``index``: a draw without replacement when fewer, else whole copies and a draw for the rest."""
    copies, rest = divmod(count, len(index)) if index else (0, 0)
    return sorted(index * copies + rng.sample(index, rest))


def pack(records: list[list[int]], budget: int) -> list[list[int]]:
    """Consecutive records' tokens packed into instances of at most ``budget`` tokens; a longer record is cut."""
    out, current = [], []
    for ids in records:
        while len(ids) > budget:  # an overlong record: full pieces of its own
            if current:
                out.append(current)
                current = []
            out.append(ids[:budget])
            ids = ids[budget:]
        if len(current) + len(ids) > budget:
            out.append(current)
            current = []
        current = current + ids
    return out + [current] if current else out


@dataclass
class LanguageCorpus:
    """One language's monolingual text.

    Args:
        language: its code (``en``); the language token is ``[en]``.
        source: a prepared set (``bible_en_es``), a folder of split files, or one file (train only).
        text_field: the field that holds this language's text (``en`` / ``es`` in ``bible_en_es``).
    """

    language: str
    source: str
    text_field: str = "text"


class LanguageDataset(Dataset):
    """Items ``input_ids`` (content tokens), ``language_token_id`` and ``key``."""

    def __init__(self, instances: list[tuple[list[int], int]]):
        self.instances = instances

    def __len__(self) -> int:
        return len(self.instances)

    def __getitem__(self, key) -> dict:
        ids, language = self.instances[_index(key)]
        return {"input_ids": torch.as_tensor(ids, dtype=torch.long), "language_token_id": language, "key": key}


class MultilingualDenoisingDataModule(_Base):
    """Language-tagged monolingual corpora → instances for mBART's multilingual denoising (module docstring).

    Args:
        corpora: one ``LanguageCorpus`` per language (``{language: en, source: bible_en_es, text_field: en}``).
        tokenizer: a pre-trained tokenizer that has every ``[<code>]`` token, or ``train: wordpiece`` (one
            vocabulary over every corpus's training text; the language tokens are added as special tokens).
        max_length: longest encoder input in tokens, ``[EOS]`` and the language token included.
        sampling_alpha: the re-balancing exponent α over languages (mBART 0.7; 1: natural shares).
        holdout: fraction of a corpus's instances held out for validation when it has no validation split.
        limit_documents: use only the first N training records of each corpus (quick runs).
    """

    def __init__(self, corpora: list[LanguageCorpus], tokenizer: TokenizerSpec, max_length: int = 128,
                 sampling_alpha: float = 0.7, batch_size: int = 32, eval_batch_size: Optional[int] = None,
                 num_workers: int = 0, seed: int = 1234, holdout: float = 0.05, limit_documents: Optional[int] = None):
        check_batch_sizes(batch_size, eval_batch_size)
        if isinstance(corpora, (str, dict)) or not all(isinstance(c, (LanguageCorpus, dict)) for c in corpora or []):
            raise PtmError(f"data.init_args.corpora: a list of {{language, source, text_field}}, one per language; "
                           f"got {corpora!r:.80}")
        corpora = [c if isinstance(c, LanguageCorpus) else LanguageCorpus(**c) for c in corpora or []]
        if not corpora:
            raise PtmError("data.init_args.corpora is empty; give one {language, source, text_field} per language")
        codes = [c.language for c in corpora]
        for code in codes:
            language_token(code)
        if len(set(codes)) != len(codes):
            raise PtmError(f"data.init_args.corpora names a language twice ({', '.join(codes)}); one corpus per "
                           f"language (put more text for it into that corpus's files)")
        if max_length < 4:
            raise PtmError(f"max_length={max_length} leaves no room for text besides [EOS] and the language token")
        sampling_counts({"x": 1}, sampling_alpha)  # checks alpha
        super().__init__(",".join(f"{c.language}:{c.source}" for c in corpora), tokenizer, batch_size,
                         eval_batch_size, num_workers, seed, holdout)
        self.corpora, self.languages = corpora, codes
        self.max_length, self.sampling_alpha, self.limit_documents = max_length, sampling_alpha, limit_documents

    def corpus_files(self, corpus: LanguageCorpus) -> dict[str, Path]:
        files = resolve_source(corpus.source)
        if any(isinstance(p, tuple) for p in files.values()):
            raise PtmError(f"corpus {corpus.language}: source {corpus.source} is a glob; give a file or folder")
        return files

    def _tokenizer_corpus(self):
        trains = [(self.corpus_files(c)["train"], c.text_field) for c in self.corpora]

        def texts():
            for path, field in trains:
                for _, record in read_records(path, (field,)):
                    yield str(record[field])

        return texts, "languages:" + ":".join(f"{c.language}={p}:{f}" for c, (p, f) in zip(self.corpora, trains))

    def load_tokenizer(self):
        if self.tokenizer is None:
            spec = self.tokenizer_spec
            if spec.train is not None:
                tokens = [language_token(c) for c in self.languages]
                spec = replace(spec, special_tokens=[*spec.special_tokens, *(t for t in tokens
                                                                               if t not in spec.special_tokens)])
            corpus, key = self._tokenizer_corpus()
            from ptm_app.data.tokenizer import load_tokenizer

            self.tokenizer = load_tokenizer(spec, corpus, key)
            for code in self.languages:
                language_token_id(self.tokenizer, code)
        return self.tokenizer

    def _instances(self, path: Path, field: str, limit: Optional[int]) -> list[list[int]]:
        """The split's records (the first ``limit``) tokenized and packed; cached."""
        tok = self.load_tokenizer()

        def build() -> dict:
            texts = [str(r[field]) for _, r in read_records(path, (field,))]
            texts = texts[:limit] if limit else texts
            ids = tok(texts, add_special_tokens=False, verbose=False)["input_ids"] if texts else []
            return {"instances": pack([i for i in ids if i], self.max_length - 2), "records": len(texts)}

        key = ["language_corpus", FORMAT_VERSION, sha256_file(path), field, tokenizer_fingerprint(tok),
               self.max_length, limit]
        return cached_json(key, build)["instances"]

    def prepare_data(self) -> None:
        for corpus in self.corpora:
            for split, path in self.corpus_files(corpus).items():
                self._instances(path, corpus.text_field, self.limit_documents if split == "train" else None)

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        tok = self.load_tokenizer()
        splits: dict[str, list[tuple[list[int], int]]] = {"train": [], "validation": [], "test": []}
        train_by_language: dict[str, list[tuple[list[int], int]]] = {}
        for corpus in self.corpora:
            language = language_token_id(tok, corpus.language)
            files = self.corpus_files(corpus)
            loaded = {split: [(ids, language) for ids in
                              self._instances(path, corpus.text_field, self.limit_documents if split == "train" else None)]
                      for split, path in files.items()}
            if not loaded["train"]:
                raise PtmError(f"corpus {corpus.language} ({corpus.source}, field {corpus.text_field}) has no text "
                               f"in its train split; check the source and text_field")
            if "validation" not in loaded:
                kept, held = holdout_split(len(loaded["train"]), self.holdout, self.seed)
                loaded["validation"] = [loaded["train"][i] for i in held]
                loaded["train"] = [loaded["train"][i] for i in kept]
            train_by_language[corpus.language] = loaded.pop("train")
            for split, instances in loaded.items():
                splits[split].extend(instances)
        counts = sampling_counts({k: len(v) for k, v in train_by_language.items()}, self.sampling_alpha)
        rng = random.Random(self.seed)
        for code, instances in train_by_language.items():
            splits["train"].extend(instances[i] for i in resample(list(range(len(instances))), counts[code], rng))
        self.datasets = {split: LanguageDataset(instances) for split, instances in splits.items() if instances}

    def language_shares(self, split: str = "train") -> dict[str, float]:
        """Each language's share of a split's instances (after re-balancing, for train)."""
        tok = self.load_tokenizer()
        ids = {language_token_id(tok, code): code for code in self.languages}
        shares = dict.fromkeys(self.languages, 0)
        for _, language in self.datasets[split].instances:
            shares[ids[language]] += 1
        total = sum(shares.values())
        return {code: n / total for code, n in shares.items()} if total else shares

