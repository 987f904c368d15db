"""XLM's language sampling (Lample & Conneau 2019 §3.1): the multinomial q_i = p_i^a / sum_j p_j^a over languages,
p_i = n_i / sum_k n_k, which up-samples low-resource languages for a < 1 (XLM: 0.5 for the BPE corpus and 0.7 for
batches in the paper's code; XLM-R: 0.3, Conneau et al. 2020 §3.1).  The one place it is computed: the tokenizer's
training sentences (``data.tokenizer``), the multilingual batches (``data.multilingual``) and mBART's language mix
(``data.language_corpora``) all draw through it."""
from __future__ import annotations

from typing import Iterable, Mapping, Optional

import numpy as np

from ptm_app.errors import PtmError


def language_probabilities(counts: Mapping[str, int], alpha: float) -> dict[str, float]:
    """XLM §3.1: q_i = p_i^alpha / sum_j p_j^alpha, p_i = n_i / sum_k n_k (languages with no text get 0)."""
    total = sum(counts.values())
    if total <= 0:
        raise PtmError("no text in any language: nothing to sample from")
    weights = {lang: (n / total) ** alpha if n > 0 else 0.0 for lang, n in counts.items()}
    norm = sum(weights.values())
    return {lang: w / norm for lang, w in weights.items()}


def balanced_counts(counts: Mapping[str, int], alpha: float, total: Optional[int] = None) -> dict[str, int]:
    """How many sentences of each language a sample of ``total`` (default: all of them) holds under q_i, rounded."""
    q = language_probabilities(counts, alpha)
    total = sum(counts.values()) if total is None else total
    return {lang: int(round(q[lang] * total)) for lang in counts}


def balanced_texts(texts: Mapping[str, Iterable[str]], alpha: float, seed: int = 0) -> tuple[list[str], dict]:
    """The sentences a tokenizer trains on: as many as the corpus has, language i's share q_i (``alpha``); a language
    is up-sampled by repeating its sentences (a seeded shuffle, cycled) and down-sampled by taking the first of the
    shuffle.  Returns the sentences and the record saved beside the tokenizer."""
    by_lang = {lang: [t for t in items if t.strip()] for lang, items in texts.items()}
    empty = [lang for lang, items in by_lang.items() if not items]
    if empty:
        raise PtmError(f"the tokenizer's training corpus has no text in {', '.join(empty)}; a tokenizer trained "
                       f"without them cannot write them: give data with those languages or drop them")
    counts = {lang: len(items) for lang, items in by_lang.items()}
    want = balanced_counts(counts, alpha)
    rng = np.random.default_rng(seed)
    out: list[str] = []
    for lang, items in by_lang.items():
        order = rng.permutation(len(items))
        out += [items[order[k % len(items)]] for k in range(want[lang])]
    record = {"languages": list(by_lang), "alpha": alpha, "sentences": counts, "sampled_sentences": want}
    return out, record
