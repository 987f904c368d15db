"""Registry of the real datasets and models that ``data prepare`` fetches, and lookup helpers."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ptm_app import paths
from ptm_app.data.sources import bbc, bbc_headlines, bible, brown, brown_pos, minilm, smollm2, tweets, wordnet
from ptm_app.data.sources import bbc_spans, brown_spans, openmoji, wordnet_kg, wordnet_lexical
from ptm_app.data.sources import clipart, emoji, quran, squad, squad_unanswerable, wnut16
from ptm_app.data.sources.fetch import Artifact
from ptm_app.errors import PtmError

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Source:
    """One prepared dataset or model.

    Datasets give ``read(archive, *more_archives) -> (records, cleaning stats)`` and the field to stratify splits
    by (``more_artifacts``: further pinned files the set is built from, e.g. the second side of a parallel corpus);
    models give ``install(archive, out_dir) -> manifest facts``.
    Derived task sets may also give ``group_by`` (records sharing that field's value, e.g. one document's
    sentences, stay in one split), ``private_fields`` (used to split and count, not written to the jsonl),
    ``derived_from`` and ``derivation`` (the rules, recorded in the manifest).
    """

    name: str
    kind: str  # "task" | "corpus" | "model"
    artifact: Artifact
    licence: str
    description: str
    format_version: int
    fields: dict[str, str]
    read: Callable[[Path], tuple[list[dict], dict]] | None = None
    split_by: str | None = None
    measure: Callable[[dict], dict[str, int]] | None = None
    install: Callable[[Path, Path], dict] | None = None
    group_by: str | None = None
    private_fields: tuple[str, ...] = ()
    derived_from: str | None = None
    derivation: dict | None = None
    split_unit: str = "document"  # what one record is, named in the manifest's split method
    more_artifacts: tuple[Artifact, ...] = ()
    write: Callable[[list[Path], Path], dict] | None = None  # writes its own files (own splits): manifest facts

    @property
    def artifacts(self) -> tuple[Artifact, ...]:
        return (self.artifact, *self.more_artifacts)


def _source(name: str, mod: ModuleType | object) -> Source:
    """A Source from a module's (or a namespace's, for modules that define several sets) attributes."""
    return Source(name=name, kind=mod.KIND, artifact=mod.ARTIFACT, licence=mod.LICENCE,
                  description=mod.DESCRIPTION, format_version=mod.FORMAT_VERSION, fields=mod.FIELDS,
                  read=getattr(mod, "read", None), split_by=getattr(mod, "SPLIT_BY", None),
                  measure=getattr(mod, "measure", None), install=getattr(mod, "install", None),
                  group_by=getattr(mod, "GROUP_BY", None), private_fields=tuple(getattr(mod, "PRIVATE_FIELDS", ())),
                  derived_from=getattr(mod, "DERIVED_FROM", None), derivation=getattr(mod, "DERIVATION", None),
                  split_unit=getattr(mod, "SPLIT_UNIT", "document"),
                  more_artifacts=tuple(getattr(mod, "MORE_ARTIFACTS", ())), write=getattr(mod, "write", None))


SOURCES: dict[str, Source] = {name: _source(name, mod) for name, mod in
                              (("bbc", bbc), ("tweets", tweets), ("brown", brown), ("minilm", minilm),
                               ("brown_pos", brown_pos), ("wordnet_qa", wordnet.QA),
                               ("wordnet_pairs", wordnet.PAIRS), ("wordnet_supersense", wordnet.SUPERSENSE),
                               ("wordnet_choice", wordnet.CHOICE),
                               ("bbc_headlines", bbc_headlines), ("smollm2", smollm2), ("bible_en_es", bible),
                               ("wordnet_lexrel", wordnet_lexical.LEXREL), ("brown_spans", brown_spans),
                               ("bbc_spans", bbc_spans), ("openmoji", openmoji))}
SOURCES["wordnet_kg"] = _source("wordnet_kg", wordnet_kg)
SOURCES["squad"] = _source("squad", squad)
SOURCES["wnut16"] = _source("wnut16", wnut16)
SOURCES["squad_unanswerable"] = _source("squad_unanswerable", squad_unanswerable)
SOURCES["emoji"] = _source("emoji", emoji)
SOURCES["clipart"] = _source("clipart", clipart)
SOURCES["quran"] = _source("quran", quran)


def prepared_dir(name: str) -> Path:
    """The prepared folder of ``name`` (a registered source, or a path to an existing folder)."""
    path = paths.data_root() / name
    if (path / MANIFEST).is_file():
        return path
    if name in SOURCES:
        raise PtmError(f"dataset or model '{name}' is not prepared (looked in {path}); "
                       f"run: python main.py data prepare {name}")
    given = Path(name).expanduser()
    if given.is_dir():
        return given.resolve()
    raise PtmError(f"unknown dataset or model '{name}': not a folder either; "
                   f"known names: {', '.join(SOURCES)} (prepare with: python main.py data prepare NAME)")


def load_manifest(name: str) -> dict:
    """The manifest of a prepared source (see ``prepared_dir``)."""
    path = prepared_dir(name) / MANIFEST
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PtmError(f"{path}: cannot read the manifest ({exc}); "
                       f"re-run: python main.py data prepare {name} --force") from exc
