"""``python main.py crosslingual --encoder LABEL=REF ...``: cross-lingual evaluation of any encoder (issue 29; Qiu et
al. 2020 §4.2.1, Lample & Conneau 2019 §5, Hu et al. 2020's XTREME protocol at small scale), from the prepared
``quran`` (11 languages) and ``bible_en_es`` test splits, never typed.

- **Retrieval** (Tatoeba / BUCC style, Artetxe & Schwenk 2019): every test verse in English is a query, its
  translations in language x the candidates; accuracy@1 = how often the nearest candidate by cosine of the
  mean-pooled last-layer states is the verse's own translation (and x -> English).
- **Zero-shot transfer**: a classifier on frozen mean-pooled states is fitted on English training verses only and
  tested on the test verses of every language; the transfer gap is English accuracy minus the language's.  Tasks:
  Quran verse -> revelation period (``meccan``/``medinan``, the package's surah labels) and Bible verse -> book
  genre (``GENRES``, a fixed map).  The classifier is a logistic regression (scikit-learn, L2, C=1) on standardised
  features: feature-based transfer, the CPU-sized form of XTREME's fine-tune-on-English protocol.

An XLM encoder with language embeddings gets each text's language id (``config.lang2id``).  Every number is given
with a 95 % interval: over test verses by a percentile bootstrap for one seed, over seeds (Student's t) for several;
a seed draws the English training subsample of the classifier.  The table goes to
``<runs>/crosslingual/<name>/crosslingual.md`` (+ ``.json``) and, with ``--readme``, between
``<!-- <name>:start -->`` and ``<!-- <name>:end -->`` of a document.
"""
from __future__ import annotations

import math
import re
import time
from typing import Optional

import numpy as np
import torch

from ptm_app.errors import PtmError
from ptm_app.experiments.stats import bootstrap_interval, seed_interval
from ptm_app.paths import atomic_file, check_run_name, require_markers, runs_root, write_between_markers, write_json

# Bible book (OSIS) -> genre, the usual Protestant-canon grouping (Lamentations with the prophets, Acts with history)
GENRES = {
    **dict.fromkeys(["Gen", "Exod", "Lev", "Num", "Deut"], "law"),
    **dict.fromkeys(["Josh", "Judg", "Ruth", "1Sam", "2Sam", "1Kgs", "2Kgs", "1Chr", "2Chr", "Ezra", "Neh", "Esth",
                     "Acts"], "history"),
    **dict.fromkeys(["Job", "Ps", "Prov", "Eccl", "Song"], "wisdom"),
    **dict.fromkeys(["Isa", "Jer", "Lam", "Ezek", "Dan", "Hos", "Joel", "Amos", "Obad", "Jonah", "Mic", "Nah", "Hab",
                     "Zeph", "Hag", "Zech", "Mal"], "prophets"),
    **dict.fromkeys(["Matt", "Mark", "Luke", "John"], "gospels"),
    **dict.fromkeys(["Rom", "1Cor", "2Cor", "Gal", "Eph", "Phil", "Col", "1Thess", "2Thess", "1Tim", "2Tim", "Titus",
                     "Phlm", "Heb", "Jas", "1Pet", "2Pet", "1John", "2John", "3John", "Jude"], "letters"),
    "Rev": "apocalyptic",
}
TASKS = {"quran": ("period", "revelation period"), "bible_en_es": ("genre", "book genre")}


def _records(source: str, split: str) -> list[dict]:
    import json

    from ptm_app.data.datamodules import resolve_source

    with open(resolve_source(source)[split], encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def label(source: str, record: dict) -> str:
    if source == "bible_en_es":
        return GENRES[record["book"]]
    return record["period"]


def encode(loaded, texts: list[str], lang: str, batch_size: int = 64, max_length: int = 128) -> np.ndarray:
    """Mean-pooled last-layer states of ``texts`` (an XLM model also gets the language's id when it has one)."""
    from ptm_app.inference.embed import default_max_length, layer_states, pool

    max_length = min(max_length, default_max_length(loaded))
    config = loaded.model.config
    lang_id = (getattr(config, "lang2id", None) or {}).get(lang) if getattr(config, "use_lang_emb", False) and \
        getattr(config, "n_langs", 1) > 1 else None
    out = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            enc = loaded.tokenizer(texts[start:start + batch_size], padding=True, truncation=True,
                                   max_length=max_length, return_tensors="pt")
            inputs = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc}
            if lang_id is not None:
                inputs["langs"] = torch.full_like(inputs["input_ids"], int(lang_id))
            states = layer_states(loaded, inputs)[-1].float()
            out.append(pool(states, inputs["attention_mask"], "mean"))
    return torch.cat(out).numpy()


def retrieval_hits(queries: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Per query i, is candidate i (its translation) the nearest by cosine?"""
    q = queries / np.clip(np.linalg.norm(queries, axis=1, keepdims=True), 1e-12, None)
    c = candidates / np.clip(np.linalg.norm(candidates, axis=1, keepdims=True), 1e-12, None)
    return (q @ c.T).argmax(axis=1) == np.arange(len(q))


def probe_hits(train_x: np.ndarray, train_y: list[str], tests: dict[str, tuple[np.ndarray, list[str]]]) -> dict:
    """A logistic regression on standardised features fitted on ``train``; per test set, is each example right?"""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    model.fit(train_x, train_y)
    return {name: model.predict(x) == np.asarray(y) for name, (x, y) in tests.items()}


def _cell(per_seed: list[np.ndarray], seed: int) -> dict:
    """Mean over seeds of the accuracy, with its 95 % interval (bootstrap for one seed, t over seeds for more)."""
    means = [float(h.mean()) for h in per_seed]
    lo, hi = bootstrap_interval(per_seed[0], seed=seed) if len(means) == 1 else seed_interval(means)
    return {"mean": float(np.mean(means)), "low": lo, "high": hi, "seeds": means, "n": int(per_seed[0].size)}


def _fmt(cell: Optional[dict]) -> str:
    if not cell:
        return ""
    if math.isnan(cell["low"]):
        return f"{cell['mean']:.3f}"
    return f"{cell['mean']:.3f} [{cell['low']:.3f}, {cell['high']:.3f}]"


def evaluate_encoder(ref: str, seeds: list[int], limit: int, limit_train: int, languages: list[str]) -> dict:
    """Retrieval and zero-shot transfer numbers of one encoder (see the module docstring)."""
    from ptm_app.data.multilingual import aligned_texts, check_known, source_languages
    from ptm_app.inference.loading import load_for_inference

    loaded = load_for_inference(ref)
    loaded.model.eval()
    result: dict = {"retrieval": {}, "transfer": {}}
    for source in TASKS:
        langs = [lang for lang in languages if lang in source_languages(source)]
        if "en" not in langs:
            continue
        check_known(langs, {source: source_languages(source)})
        _, test_texts = aligned_texts(source, langs, "test")
        test_rows = [r for r in _records(source, "test") if all(str(r.get(lang) or "").strip() for lang in langs)]
        pick = np.random.default_rng(0).permutation(len(test_rows))[:limit] if limit else np.arange(len(test_rows))
        pick = np.sort(pick)
        vectors = {lang: encode(loaded, [test_texts[lang][i] for i in pick], lang) for lang in langs}
        labels = [label(source, test_rows[i]) for i in pick]
        for lang in langs:
            if lang == "en":
                continue
            hits = {"en->x": retrieval_hits(vectors["en"], vectors[lang]),
                    "x->en": retrieval_hits(vectors[lang], vectors["en"])}
            result["retrieval"][f"{source}:{lang}"] = {k: _cell([h], 0) for k, h in hits.items()}
        train_rows = [r for r in _records(source, "train") if str(r.get("en") or "").strip()]
        per_seed: dict[str, list[np.ndarray]] = {lang: [] for lang in langs}
        chosen = {seed: np.sort(np.random.default_rng(seed).permutation(len(train_rows))[:limit_train])
                  for seed in seeds}
        union = sorted(set().union(*(c.tolist() for c in chosen.values())))
        at = {i: k for k, i in enumerate(union)}  # each training verse encoded once for every seed
        union_x = encode(loaded, [train_rows[i]["en"] for i in union], "en")
        for seed in seeds:
            train_x = union_x[[at[i] for i in chosen[seed].tolist()]]
            hits = probe_hits(train_x, [label(source, train_rows[i]) for i in chosen[seed]],
                              {lang: (vectors[lang], labels) for lang in langs})
            for lang in langs:
                per_seed[lang].append(hits[lang])
        result["transfer"][source] = {lang: _cell(h, seeds[0]) for lang, h in per_seed.items()}
        gaps = {}
        for lang in langs:
            diffs = [e.astype(float) - x.astype(float) for e, x in zip(per_seed["en"], per_seed[lang])]
            gaps[lang] = _cell(diffs, seeds[0])  # paired: the same test verses in both languages
        result["transfer"][f"{source}:gap"] = gaps
        result["labels"] = result.get("labels", {}) | {source: dict(sorted(
            {v: labels.count(v) for v in set(labels)}.items()))}
    return result


def _table(results: dict[str, dict], languages: list[str]) -> str:
    labels = list(results)
    lines = []
    for source, (field, what) in TASKS.items():
        langs = [lang for lang in languages if any(f"{source}:{lang}" in r["retrieval"] for r in results.values())]
        if not langs:
            continue
        lines += [f"**Retrieval accuracy@1, {source} test verses** (English query -> its translation among all "
                  f"candidates in the language; x->en the other way; 95 % bootstrap interval over verses)", "",
                  "| encoder | direction | " + " | ".join(langs) + " |", "|---|---|" + "---|" * len(langs)]
        for name in labels:
            cells = results[name]["retrieval"]
            for direction in ("en->x", "x->en"):
                lines.append(f"| {name} | {direction} | " + " | ".join(
                    _fmt(cells.get(f"{source}:{lang}", {}).get(direction)) for lang in langs) + " |")
        lines.append("")
        every = ["en", *langs]
        lines += [f"**Zero-shot transfer, {source}: verse -> {what}** (classifier fitted on English training verses; "
                  f"accuracy on each language's test verses, then the transfer gap = English - language)", "",
                  "| encoder | row | " + " | ".join(every) + " |", "|---|---|" + "---|" * len(every)]
        for name in labels:
            transfer = results[name]["transfer"]
            if source not in transfer:
                continue
            lines.append(f"| {name} | accuracy | " + " | ".join(_fmt(transfer[source].get(lang)) for lang in every)
                         + " |")
            lines.append(f"| {name} | gap | " + " | ".join(
                "" if lang == "en" else _fmt(transfer[f"{source}:gap"].get(lang)) for lang in every) + " |")
        counts = next((r["labels"][source] for r in results.values() if source in r.get("labels", {})), {})
        majority = max(counts.values()) / sum(counts.values()) if counts else math.nan
        lines += ["", f"Test labels: {', '.join(f'{k} {v}' for k, v in counts.items())} (majority class "
                      f"{majority:.3f}).", ""]
    return "\n".join(lines)


def crosslingual(encoder: list[str], seeds: Optional[list[int]] = None, limit: int = 300, limit_train: int = 1000,
                 languages: Optional[list[str]] = None, name: str = "multilingual", readme: Optional[str] = None,
                 note: Optional[str] = None) -> dict:
    """Cross-lingual retrieval and zero-shot transfer of encoders, side by side (see the module docstring).

    Args:
        encoder: ``LABEL=REF`` (repeatable): a run directory, .ckpt, export directory or prepared model (minilm).
        seeds: seeds of the English training subsample of the transfer classifier (one interval over seeds when
            several; a bootstrap over test verses for one); default [0].
        limit: test verses per set (a seeded sample; 0: all).
        limit_train: English training verses the classifier is fitted on (a sample per seed).
        languages: the languages to evaluate (default: every language of quran and bible_en_es); English is the
            source language and must be among them.
        name: the report's name: ``<runs>/crosslingual/<name>/`` and the markers in ``readme``.
        readme: also put the table into this document between ``<!-- <name>:start -->`` and ``<!-- <name>:end -->``.
        note: a line printed above the table (how the encoders were trained).
    """
    from ptm_app.data.multilingual import check_known, set_languages

    seeds = list(seeds) if seeds else [0]
    check_run_name(name, "--name")
    have = set_languages()
    every = list(dict.fromkeys(lang for langs in have.values() for lang in langs))
    languages = list(languages) if languages else every
    check_known(languages, have)
    if "en" not in languages:
        raise PtmError("--languages must include en: English is the language the transfer classifier is fitted on")
    if not encoder:
        raise PtmError("give at least one --encoder LABEL=REF (a run, export or prepared model such as minilm)")
    parsed = []
    for item in encoder:
        label_, sep, ref = item.partition("=")
        if not sep or not label_ or not ref or not re.fullmatch(r"[\w .+()-]+", label_):
            raise PtmError(f"--encoder {item!r}: give LABEL=REF, e.g. mmlm=checkpoints/mbert_mlm_quran_bible/export")
        parsed.append((label_, ref))
    if readme:
        require_markers(readme, name)
    started = time.time()
    results = {}
    for label_, ref in parsed:
        print(f"crosslingual: {label_} ({ref}) ...", flush=True)
        results[label_] = evaluate_encoder(ref, seeds, limit, limit_train, languages)
    header = (f"Generated by `python main.py crosslingual` ({len(parsed)} encoders, seeds {list(seeds)}, {limit or 'all'} "
              f"test verses per set, {limit_train} English training verses; {time.time() - started:.0f} s).")
    md = "\n".join(filter(None, [header, note])) + "\n\n" + _table(results, languages)
    out = runs_root() / "crosslingual" / name
    out.mkdir(parents=True, exist_ok=True)
    with atomic_file(out / "crosslingual.md", "w", encoding="utf-8") as fh:
        fh.write(md + "\n")
    write_json(out / "crosslingual.json", {"encoders": dict(parsed), "seeds": list(seeds), "limit": limit,
                                          "limit_train": limit_train, "results": results})
    if readme:
        write_between_markers(readme, name, md)
    print(md)
    print(f"wrote {out / 'crosslingual.md'}" + (f" and {readme}" if readme else ""))
    return results
