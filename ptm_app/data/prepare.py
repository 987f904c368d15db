"""``python main.py data prepare|list``: fetch, verify, convert and split the registered sources."""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from ptm_app import paths
from ptm_app.data.sources import MANIFEST, SOURCES, Source
from ptm_app.data.sources.fetch import fetch
from ptm_app.data.sources.splits import (FRACTIONS, GROUP_SPLIT_METHOD, SEED, SPLIT_METHOD,  # noqa: F401
                                         split_records, write_jsonl)
from ptm_app.errors import PtmError


def _plural(key: str) -> str:
    return key + ("es" if key.endswith("s") else "s")


def _counts(recs: list[dict], key: str, measure: Callable[[dict], dict[str, int]] | None,
            group_by: str | None = None) -> dict:
    counts: dict = {"records": len(recs), _plural(key): dict(sorted(Counter(r[key] for r in recs).items()))}
    if group_by is not None:
        counts[_plural(group_by)] = len({r[group_by] for r in recs})
    for rec in recs if measure else ():
        for name, value in measure(rec).items():
            counts[name] = counts.get(name, 0) + value
    return counts


def _public(recs: list[dict], private: tuple[str, ...]) -> Iterable[dict]:
    if not private:
        return recs
    return ({k: v for k, v in rec.items() if k not in private} for rec in recs)


def _write_dataset(src: Source, archives: list[Path], out: Path) -> dict:
    records, cleaning = src.read(*archives)
    splits = split_records(records, src.split_by, group_by=src.group_by)
    for name, recs in splits.items():
        write_jsonl(out / f"{name}.jsonl", _public(recs, src.private_fields))
    counts = {name: _counts(recs, src.split_by, src.measure, src.group_by) for name, recs in splits.items()}
    counts["total"] = _counts(records, src.split_by, src.measure, src.group_by)
    split = {"seed": SEED, "fractions": FRACTIONS, "by": src.split_by,
             "method": SPLIT_METHOD.format(unit=src.split_unit, key=src.split_by)}
    if src.group_by is not None:
        split.update(group_by=src.group_by, method=GROUP_SPLIT_METHOD.format(key=src.split_by, group=src.group_by))
    facts = {"split": split, "counts": counts, "cleaning": cleaning, "files": [f"{name}.jsonl" for name in splits]}
    if src.private_fields:
        facts["private_fields"] = {"fields": list(src.private_fields),
                                   "note": "used to split and count (see split, counts), not written to the jsonl"}
    if src.derived_from is not None:
        facts["derived_from"] = src.derived_from
    if src.derivation is not None:
        facts["derivation"] = src.derivation
    return facts


def _is_current(src: Source, target: Path) -> bool:
    try:
        manifest = json.loads((target / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (manifest.get("format_version") == src.format_version
            and manifest.get("source", {}).get("sha256") == src.artifact.sha256
            and [a.get("sha256") for a in manifest.get("more_sources", [])] == [a.sha256 for a in src.more_artifacts])


def _prepare_one(src: Source, force: bool) -> Path:
    target = paths.data_root() / src.name
    if not force and _is_current(src, target):
        print(f"{src.name}: already prepared in {target}")
        return target
    archives = [fetch(art) for art in src.artifacts]
    with paths.atomic_dir(target) as tmp:
        if src.write is not None:  # a set with its own files and splits (e.g. wordnet_kg)
            facts = src.write(archives, tmp)
        else:
            facts = src.install(archives[0], tmp) if src.kind == "model" else _write_dataset(src, archives, tmp)
        more = {"more_sources": [art.as_dict() for art in src.more_artifacts]} if src.more_artifacts else {}
        manifest = {"name": src.name, "kind": src.kind, "format_version": src.format_version,
                    "source": src.artifact.as_dict(), **more, "licence": src.licence,
                    "description": src.description, "fields": src.fields, "split": None, **facts}
        paths.write_json(tmp / MANIFEST, manifest)
    print(f"{src.name}: prepared {target} ({_summary(manifest)})")
    return target


def prepare(names: list[str] | None = None, force: bool = False) -> list[Path]:
    """Fetch, verify and convert the real datasets and models into the data folder.

    Returns their folders.

    Args:
        names: the sources to prepare (default: all).
        force: rebuild even if already prepared.
    """
    names = list(names or SOURCES)
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise PtmError(f"unknown source {', '.join(map(repr, unknown))}; known: {', '.join(SOURCES)}")
    return [_prepare_one(SOURCES[name], force) for name in dict.fromkeys(names)]


def _summary(manifest: dict) -> str:
    counts = manifest.get("counts", {})
    if manifest.get("kind") == "model":
        m = manifest.get("model", {})
        return (f"{counts.get('parameters', 0) / 1e6:.1f}M parameters, hidden {m.get('hidden_size')}, "
                f"{m.get('num_hidden_layers')} layers, vocab {m.get('vocab_size')}")
    key = manifest.get("split", {}).get("by", "label")
    total = counts.get("total", {})
    sizes = " / ".join(f"{s} {counts.get(s, {}).get('records', 0)}" for s in FRACTIONS)
    group = manifest.get("split", {}).get("group_by")
    units = ("sentences", "tokens") if group is None else (_plural(group), "sentences", "tokens")
    extra = "".join(f", {total[k]:,} {k}" for k in units if isinstance(total.get(k), int))
    strata = total.get(_plural(key), {})  # a dict of counts per value, or (e.g. squad's articles) a number
    return f"{total.get('records', 0):,} records ({sizes}), {strata if isinstance(strata, int) else len(strata)} " \
           f"{_plural(key)}{extra}"


def list_sources() -> None:
    """Show each source, whether it is prepared, its folder and counts."""
    width = max(map(len, SOURCES))
    for name, src in SOURCES.items():
        target = paths.data_root() / name
        try:
            manifest = json.loads((target / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            print(f"{name:<{width}} {src.kind:<6} not prepared  {target}")
            continue
        status = "prepared" if _is_current(src, target) else "outdated (run: data prepare --force)"
        print(f"{name:<{width}} {src.kind:<6} {status}  {target}  {_summary(manifest)}")
