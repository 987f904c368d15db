"""A knowledge graph on disk (``data prepare wordnet_kg``, or a folder laid out the same way), read and checked.

Layout: ``entities.jsonl`` (``{id, names, description}``), triple files ``train.jsonl``, ``validation.jsonl``,
``test.jsonl`` (the transductive setting) and ``inductive/validation.jsonl``, ``inductive/test.jsonl`` (unseen
entities), one ``{head, relation, tail}`` per line.  A relation named in the config that the graph lacks, or a
triple naming an entity that ``entities.jsonl`` lacks (``file:line``), is one line of error.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

import torch

from ptm_app.data.formats import read_records
from ptm_app.errors import DataFormatError, PtmError

FILES = {"train": "train.jsonl", "validation": "validation.jsonl", "test": "test.jsonl",
         "inductive/validation": "inductive/validation.jsonl", "inductive/test": "inductive/test.jsonl"}
TRANSDUCTIVE = ("train", "validation", "test")
EntityText = Literal["names_gloss", "gloss"]


@dataclass
class KnowledgeGraph:
    """Entities (those of some triple) with the text the encoder embeds, relation names, and the triples of each
    file as ``[n, 3]`` (head, relation, tail) index tensors."""

    root: Path
    entity_ids: list[str]
    texts: list[str]
    relations: list[str]
    triples: dict[str, torch.Tensor]
    _known: Optional[tuple[dict, dict]] = field(default=None, repr=False)

    def known(self) -> tuple[dict, dict]:
        """``(h, r) -> true tails`` and ``(r, t) -> true heads`` over every file (the filter of the ranking)."""
        if self._known is None:
            tails, heads = defaultdict(set), defaultdict(set)
            for rows in self.triples.values():
                for h, r, t in rows.tolist():
                    tails[h, r].add(t)
                    heads[r, t].add(h)
            self._known = (dict(tails), dict(heads))
        return self._known

    def candidates(self, name: str) -> torch.Tensor:
        """The entities a held-out triple of file ``name`` is ranked against (sorted indices): every entity of
        the transductive files; for an inductive file, the unseen entities of that file (Wikidata5M's protocol)."""
        names = TRANSDUCTIVE if name in TRANSDUCTIVE else (name,)
        rows = torch.cat([self.triples[n] for n in names if n in self.triples])
        return torch.unique(torch.cat([rows[:, 0], rows[:, 2]]))


def entity_text(names: list[str], description: str, kind: EntityText) -> str:
    """The text KEPLER encodes for an entity: its description (the gloss), by default after its names."""
    if kind == "gloss" or not names:
        return description
    return f"{', '.join(names)}: {description}" if description else ", ".join(names)


def graph_relations(root: Path) -> Optional[list[str]]:
    """The relation names a prepared graph's manifest declares (None for a plain folder)."""
    try:
        manifest = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    symbols = (manifest.get("relations") or {}).get("pointer_symbols")
    return list(dict.fromkeys(symbols.values())) if symbols else None


def load_graph(source: str, relations: Optional[list[str]] = None, kind: EntityText = "names_gloss") -> KnowledgeGraph:
    """Read the graph ``source`` (a prepared name such as ``wordnet_kg``, or a folder), keeping ``relations``
    (all when None)."""
    from ptm_app.data.sources import prepared_dir

    root = prepared_dir(source)
    entities_path = root / "entities.jsonl"
    if not (root / FILES["train"]).is_file():
        raise PtmError(f"knowledge graph {root}: no {FILES['train']}; prepare it (python main.py data prepare "
                       f"wordnet_kg) or point data.init_args.graph at a folder with entities.jsonl and train.jsonl")
    entities = {rec["id"]: rec for _, rec in read_records(entities_path, required=("id",))}
    declared = graph_relations(root)
    rows: dict[str, list[tuple[str, str, str]]] = {}
    for name, file in FILES.items():
        path = root / file
        if not path.is_file():
            continue
        rows[name] = []
        for line, rec in read_records(path, required=("head", "relation", "tail")):
            for end in ("head", "tail"):
                if rec[end] not in entities:
                    raise DataFormatError(path, line, f"unknown entity '{rec[end]}' (not in {entities_path})",
                                          "fix the id or add the entity to entities.jsonl")
            if declared is not None and rec["relation"] not in declared:
                raise DataFormatError(path, line, f"unknown relation '{rec['relation']}' (the graph's: "
                                      f"{', '.join(declared)})", "fix or remove that line")
            rows[name].append((rec["head"], rec["relation"], rec["tail"]))
    available = declared or sorted({r for triples in rows.values() for _, r, _ in triples})
    if relations is not None:
        unknown = [r for r in relations if r not in available]
        if unknown:
            raise PtmError(f"data.init_args.relations: '{unknown[0]}' is not a relation of the graph {root}; "
                           f"its relations: {', '.join(available)}")
        if not relations:
            raise PtmError("data.init_args.relations is empty; name some relations or leave it null (all)")
    kept = list(relations) if relations is not None else list(available)
    wanted = set(kept)
    rows = {name: [x for x in triples if x[1] in wanted] for name, triples in rows.items()}
    entity_ids = sorted({e for triples in rows.values() for h, _, t in triples for e in (h, t)})
    index = {e: i for i, e in enumerate(entity_ids)}
    rel_index = {r: i for i, r in enumerate(kept)}
    tensors = {name: torch.tensor([[index[h], rel_index[r], index[t]] for h, r, t in triples],
                                  dtype=torch.long).reshape(-1, 3) for name, triples in rows.items()}
    texts = [entity_text(list(entities[e].get("names") or []), entities[e].get("description") or "", kind)
             for e in entity_ids]
    return KnowledgeGraph(root, entity_ids, texts, kept, tensors)
