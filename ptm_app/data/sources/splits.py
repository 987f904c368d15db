"""The deterministic splits and the JSON Lines writer every source's conversion shares (``data prepare`` and the
sources that write their own splits: emoji, squad, squad_unanswerable)."""
from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

SEED = 1234
FRACTIONS = {"train": 0.8, "validation": 0.1, "test": 0.1}
SPLIT_METHOD = ("{unit}-level, stratified by {key}: records sorted by id, grouped by {key} (groups in sorted "
                "order), each group shuffled with one random.Random(seed); per group test = round(n*0.1), "
                "validation = round(n*0.1) (halves round up), train = the rest")


GROUP_SPLIT_METHOD = ("{group}-level, stratified by {key}: records sharing a {group} form one unit (all its "
                      "records have the same {key}) and stay in one split, in their input order; the units are "
                      "split like single records: sorted by {group}, grouped by {key} (groups in sorted order), "
                      "each group shuffled with one random.Random(seed); per group test = round(n*0.1), "
                      "validation = round(n*0.1) (halves round up), train = the rest, n counting units")


def split_records(records: list[dict], key: str, seed: int = SEED,
                  group_by: str | None = None) -> dict[str, list[dict]]:
    """Deterministic stratified split; each split is returned sorted by id.

    With ``group_by``, the records sharing that field's value are one unit (e.g. a document's sentences), split
    as a whole: each split then holds its units sorted by that value, each unit's records in input order.
    """
    if group_by is not None:
        return _split_groups(records, key, seed, group_by)
    groups: dict[str, list[dict]] = defaultdict(list)
    for rec in sorted(records, key=lambda r: r["id"]):
        groups[rec[key]].append(rec)
    rng = random.Random(seed)
    out: dict[str, list[dict]] = {name: [] for name in FRACTIONS}
    for value in sorted(groups):
        group = groups[value]
        rng.shuffle(group)
        n_test = int(len(group) * FRACTIONS["test"] + 0.5)
        n_val = int(len(group) * FRACTIONS["validation"] + 0.5)
        out["test"] += group[:n_test]
        out["validation"] += group[n_test:n_test + n_val]
        out["train"] += group[n_test + n_val:]
    return {name: sorted(recs, key=lambda r: r["id"]) for name, recs in out.items()}


def _split_groups(records: list[dict], key: str, seed: int, group_by: str) -> dict[str, list[dict]]:
    members: dict[str, list[dict]] = defaultdict(list)
    for rec in records:
        members[rec[group_by]].append(rec)
    units = []
    for value, recs in members.items():
        strata = {r[key] for r in recs}
        if len(strata) != 1:
            raise ValueError(f"{group_by} {value!r} spans several {key} values {sorted(strata)}")
        units.append({"id": value, key: strata.pop()})
    return {name: [rec for unit in split for rec in members[unit["id"]]]
            for name, split in split_records(units, key, seed).items()}


def write_jsonl(path: Path, records: Iterable[dict]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
