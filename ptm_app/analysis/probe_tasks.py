"""The probing tasks: which prepared set, which fields, which level (Tenney et al. 2019 probe token-, span- and
sentence-level properties; here POS tags of words, topics of articles, and whether a gloss matches a word)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ptm_app.analysis.representations import Examples, Level, sample_indices
from ptm_app.data.formats import read_records
from ptm_app.data.sources import prepared_dir
from ptm_app.errors import PtmError


@dataclass(frozen=True)
class ProbeTask:
    """A prepared set and its fields: ``text`` (a word list for token level), ``labels`` (one per word or
    record), ``pair`` (the second text of pair-level tasks)."""

    name: str
    level: Level
    text: str
    labels: str
    pair: Optional[str] = None
    description: str = ""


PROBE_TASKS: dict[str, ProbeTask] = {t.name: t for t in (
    ProbeTask("brown_pos", "token", "words", "tags", description="Brown corpus, 12 universal POS tags per word"),
    ProbeTask("bbc", "sentence", "text", "label", description="BBC News article topic (5 classes)"),
    ProbeTask("wordnet_pairs", "pair", "text", "label", pair="text_pair",
              description="WordNet gloss and word: match or mismatch"),
)}


def probe_task(name: str) -> ProbeTask:
    if name not in PROBE_TASKS:
        raise PtmError(f"unknown probing task {name!r}; use one of {', '.join(PROBE_TASKS)}")
    return PROBE_TASKS[name]


def load_examples(task: ProbeTask, split: str, limit: Optional[int], seed: int) -> Examples:
    """``limit`` records of ``split`` drawn with ``seed`` (the prepared set must exist: one line says how)."""
    path = prepared_dir(task.name) / f"{split}.jsonl"
    fields = (task.text, task.labels) + ((task.pair,) if task.pair else ())
    records = [r for _, r in read_records(path, fields)]
    chosen = [records[i] for i in sample_indices(len(records), limit, seed)]
    texts = [[str(w) for w in r[task.text]] if task.level == "token" else str(r[task.text]) for r in chosen]
    labels = [[str(t) for t in r[task.labels]] if task.level == "token" else str(r[task.labels]) for r in chosen]
    return Examples(level=task.level, texts=texts, labels=labels,
                    pairs=[str(r[task.pair]) for r in chosen] if task.pair else None,
                    source=str(path), sample=f"{split}:{limit}:{seed}")
