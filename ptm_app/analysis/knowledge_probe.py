"""``python main.py knowledge-probe --config configs/analysis/smollm2_lama_wordnet.yaml``: how much relational
knowledge a pre-trained LM answers as a cloze, with no training (LAMA, Petroni et al. 2019).

Facts come from relation files (``knowledge_facts``: built-in WordNet relations or your JSONL), each fact
``template`` + ``subject`` + ``object``:
- a masked LM fills ``[MASK]`` and the whole vocabulary is ranked at that position; as in LAMA §3 only facts
  whose object is one token of this model's tokenizer are scored (the rest are counted as ``multi_token``).
- a causal LM reads the template's prefix (the text before ``[MASK]``; what follows is not seen): a one-token
  object is ranked over the vocabulary as the next token; a multi-token object is ranked among the relation's
  candidate set (every distinct object of the sampled facts) by its total log-likelihood
  ``sum_t log p(o_t | prefix, o_<t)`` (column ``ranking``: ``vocabulary`` or ``candidates``).
Rankings are filtered as in LAMA §4: the subject's other valid objects (any line of the relation file) are left
out, so ``dog -> canine`` is not penalised for ranking ``domestic animal`` higher.  Scores: P@1, P@10 and the
mean reciprocal rank, per relation and over all facts.

A masked LM whose MLM head did not load with its weights (a sentence-transformers checkpoint such as MiniLM) is
refused in one line rather than scored at chance.  Writes ``knowledge_probe.md|csv|json``, ``knowledge_p_at_1``
(relations x models), ``knowledge_probe.png``, ``predictions.jsonl`` (each fact's rank and top 10) and
``settings.json``.
"""
from __future__ import annotations

import copy

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ptm_app.analysis.knowledge_facts import (SLOT, SUBJECT, WORDNET_RELATIONS, Fact, read_facts, relation_file,
                                             valid_objects)
from ptm_app.errors import PtmError
from ptm_app.objectives.heads import logits_at
from ptm_app.paths import atomic_file, run_path, write_json

COLUMNS = ["model", "relation", "ranking", "facts", "multi_token", "p_at_1", "p_at_10", "mrr"]
TOP = 10


@dataclass
class LanguageModel:
    """A pre-trained LM with its output head: ``kind`` is ``masked`` or ``causal``."""

    name: str
    kind: str
    model: torch.nn.Module
    tokenizer: object


def is_masked_lm(where: str) -> bool:
    """Masked when transformers has a masked-LM class for the config (BERT, RoBERTa ...), else causal."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(where, trust_remote_code=False)
    return type(config) in transformers.MODEL_FOR_MASKED_LM_MAPPING


def load_language_model(ref: str) -> LanguageModel:
    """The model with its LM head; one line when a masked LM's head is untrained (freshly initialised)."""
    from transformers import AutoTokenizer

    from ptm_app.backbones.build import quiet_transformers
    from ptm_app.backbones.build import build_backbone, model_dir
    from ptm_app.data.sources.references import load_error

    where = model_dir(ref)
    name = Path(ref).name if Path(ref).exists() else ref
    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(where, trust_remote_code=False)
            masked = is_masked_lm(where)
    except (OSError, ValueError) as exc:
        raise load_error(ref, exc) from None
    with quiet_transformers():
        model = build_backbone("masked_lm" if masked else "causal_lm", where, None).eval()
    model.requires_grad_(False)
    prefix = f"{model.base_model_prefix}."
    fresh = [k for k in getattr(model, "ptm_missing_keys", ()) if not k.startswith(prefix)]
    if masked and fresh:
        raise PtmError(f"{name} has no trained MLM head ({len(fresh)} tensors, e.g. {fresh[0]}, are not in its "
                       f"files and would be freshly initialised), so a knowledge probe would score it at chance; "
                       f"use a masked LM pre-trained with its head (or a run directory of MLM training)")
    if masked and tokenizer.mask_token is None:
        raise PtmError(f"{name}: its tokenizer has no mask token; a masked-LM cloze needs one")
    return LanguageModel(name, "masked" if masked else "causal", model, tokenizer)


def rank_of(scores: torch.Tensor, gold: int, excluded: list[int]) -> tuple[int, torch.Tensor]:
    """The gold index's 1-based rank among ``scores`` with the ``excluded`` indices (the other valid answers)
    left out, and the scores as ranked (excluded ones at -inf)."""
    scores = scores.clone().float()
    others = [i for i in excluded if i != gold]
    if others:
        scores[others] = float("-inf")
    return int((scores > scores[gold]).sum()) + 1, scores


def fill(template: str, subject: str) -> str:
    return template.replace(SUBJECT, subject)


# ---------------------------------------------------------------------------------------------- masked LM
def object_token(lm: LanguageModel, fact: Fact) -> Optional[int]:
    """The object's token id when it is one token in this place of the sentence (the filled sentence tokenizes
    as the masked one with the mask replaced), else None."""
    tok = lm.tokenizer
    text = fill(fact.template, fact.subject)
    masked = tok(text.replace(SLOT, tok.mask_token))["input_ids"]
    filled = tok(text.replace(SLOT, fact.object))["input_ids"]
    if len(masked) != len(filled):
        return None
    diff = [i for i, (a, b) in enumerate(zip(masked, filled)) if a != b]
    return filled[diff[0]] if len(diff) == 1 and masked[diff[0]] == tok.mask_token_id else None


@torch.no_grad()
def masked_scores(lm: LanguageModel, facts: list[Fact], batch_size: int) -> torch.Tensor:
    """Log-probabilities over the vocabulary at each fact's mask, ``[F, V]``."""
    tok, out = lm.tokenizer, []
    for start in range(0, len(facts), batch_size):
        texts = [fill(f.template, f.subject).replace(SLOT, tok.mask_token) for f in facts[start:start + batch_size]]
        enc = tok(texts, return_tensors="pt", padding=True)
        rows, cols = torch.nonzero(enc["input_ids"] == tok.mask_token_id, as_tuple=True)
        if rows.tolist() == list(range(len(texts))):  # one mask per fact (the slot): project only there
            logits = logits_at(lm.model, dict(enc), cols)
        else:
            logits = lm.model(**enc).logits[rows, cols]
        out.append(torch.log_softmax(logits.float(), dim=-1))
    return torch.cat(out)


# ---------------------------------------------------------------------------------------------- causal LM
def prefix_ids(lm: LanguageModel, fact: Fact) -> list[int]:
    """The template's text before the slot (trailing space dropped: it belongs to the object's first token),
    after the tokenizer's BOS when it has one."""
    tok = lm.tokenizer
    text = fill(fact.template, fact.subject).split(SLOT)[0].rstrip()
    start = [tok.bos_token_id] if tok.bos_token_id is not None else []
    ids = start + tok(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise PtmError(f"relation {fact.relation}: the template {fact.template!r} has no text before {SLOT} and "
                       f"{lm.name}'s tokenizer no BOS token; a causal LM needs a prefix to continue")
    return ids


def continuation_ids(lm: LanguageModel, fact: Fact, obj: str) -> list[int]:
    """The object's tokens as they follow the prefix (with the template's space before the slot)."""
    tok = lm.tokenizer
    before = fill(fact.template, fact.subject).split(SLOT)[0]
    spaced = (" " if before[-1:].isspace() else "") + obj
    prefix = tok(before.rstrip(), add_special_tokens=False)["input_ids"]
    whole = tok(before.rstrip() + spaced, add_special_tokens=False)["input_ids"]
    if whole[:len(prefix)] == prefix and len(whole) > len(prefix):
        return whole[len(prefix):]
    return tok(spaced, add_special_tokens=False)["input_ids"]


def _padded(sequences: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, seq in enumerate(sequences):
        ids[row, :len(seq)] = torch.tensor(seq)
        mask[row, :len(seq)] = 1
    return ids, mask


@torch.no_grad()
def next_token_scores(lm: LanguageModel, prefixes: list[list[int]], batch_size: int) -> torch.Tensor:
    """Log-probabilities of the next token after each prefix, ``[F, V]`` (right padding, read at the last real
    position)."""
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    out = []
    for start in range(0, len(prefixes), batch_size):
        chunk = prefixes[start:start + batch_size]
        ids, mask = _padded(chunk, pad)
        logits = lm.model(input_ids=ids, attention_mask=mask).logits
        last = torch.tensor([len(p) - 1 for p in chunk])
        out.append(torch.log_softmax(logits[torch.arange(len(chunk)), last].float(), dim=-1))
    return torch.cat(out)


@torch.no_grad()
def sequence_log_likelihoods(lm: LanguageModel, prefix: list[int], continuations: list[list[int]],
                             batch_size: int) -> torch.Tensor:
    """``sum_t log p(c_t | prefix, c_<t)`` of each continuation, ``[C]``.

    The prefix runs once: its last position scores every continuation's first token, and its key/value cache,
    repeated over a batch, carries the continuations' other tokens (each fed but its last, right-padded)."""
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    start_out = lm.model(input_ids=torch.tensor([prefix]), use_cache=True)
    first = torch.log_softmax(start_out.logits[0, -1].float(), dim=-1)
    cache = start_out.past_key_values
    out = []
    for start in range(0, len(continuations), batch_size):
        chunk = continuations[start:start + batch_size]
        totals = first[torch.tensor([c[0] for c in chunk])]
        longest = max(len(c) for c in chunk)
        if longest > 1:
            ids, mask = _padded([c[:-1] if len(c) > 1 else [pad] for c in chunk], pad)
            mask = torch.cat([torch.ones(len(chunk), len(prefix), dtype=mask.dtype), mask], dim=1)
            past = copy.deepcopy(cache)
            past.batch_repeat_interleave(len(chunk))
            logp = torch.log_softmax(lm.model(input_ids=ids, attention_mask=mask, past_key_values=past,
                                              use_cache=True).logits.float(), dim=-1)
            for row, cont in enumerate(chunk):
                if len(cont) > 1:
                    totals[row] += logp[row, torch.arange(len(cont) - 1), torch.tensor(cont[1:])].sum()
        out.append(totals)
    return torch.cat(out)


# ---------------------------------------------------------------------------------------------- scoring
def _prediction(fact: Fact, ranking: str, rank: int, top: list[str]) -> dict:
    return {"relation": fact.relation, "subject": fact.subject, "object": fact.object, "ranking": ranking,
            "rank": rank, "top": top}


def score_relation(lm: LanguageModel, facts: list[Fact], valid: dict, batch_size: int) -> tuple[list[dict], int]:
    """One prediction row per scored fact and the number of facts left out (multi-token objects of an MLM)."""
    tok = lm.tokenizer
    decode = lambda ids: [tok.decode([i]).strip() for i in ids]  # noqa: E731
    single = [(f, object_token(lm, f) if lm.kind == "masked" else _single(continuation_ids(lm, f, f.object)))
              for f in facts]
    one = [(f, gold) for f, gold in single if gold is not None]
    rows = []
    if one:
        if lm.kind == "masked":
            scores = masked_scores(lm, [f for f, _ in one], batch_size)
        else:
            scores = next_token_scores(lm, [prefix_ids(lm, f) for f, _ in one], batch_size)
        for (fact, gold), row in zip(one, scores):
            excluded = [t for o in valid[fact.relation, fact.subject] if o != fact.object
                        for t in [_valid_token(lm, fact, o)] if t is not None]
            rank, ranked = rank_of(row, gold, excluded)
            rows.append(_prediction(fact, "vocabulary", rank, decode(torch.topk(ranked, TOP).indices.tolist())))
    several = [f for f, gold in single if gold is None]
    if lm.kind == "masked":
        return rows, len(several)
    candidates = sorted({f.object for f in facts})
    for fact in several:
        conts = [continuation_ids(lm, fact, c) for c in candidates]
        scores = sequence_log_likelihoods(lm, prefix_ids(lm, fact), conts, batch_size)
        excluded = [i for i, c in enumerate(candidates) if c in valid[fact.relation, fact.subject]]
        rank, ranked = rank_of(scores, candidates.index(fact.object), excluded)
        top = [candidates[i] for i in torch.topk(ranked, min(TOP, len(candidates))).indices.tolist()]
        rows.append(_prediction(fact, "candidates", rank, top))
    return rows, 0


def _single(ids: list[int]) -> Optional[int]:
    return ids[0] if len(ids) == 1 else None


def _valid_token(lm: LanguageModel, fact: Fact, obj: str) -> Optional[int]:
    other = Fact(fact.relation, fact.template, fact.subject, obj)
    return object_token(lm, other) if lm.kind == "masked" else _single(continuation_ids(lm, other, obj))


def summary(model: str, relation: str, ranking: str, ranks: list[int], multi_token: int) -> dict:
    n = len(ranks)
    return {"model": model, "relation": relation, "ranking": ranking, "facts": n, "multi_token": multi_token,
            "p_at_1": sum(r == 1 for r in ranks) / n if n else None,
            "p_at_10": sum(r <= 10 for r in ranks) / n if n else None,
            "mrr": sum(1 / r for r in ranks) / n if n else None}


def summaries(model: str, predictions: list[dict], skipped: dict[str, int]) -> list[dict]:
    """Per relation and ranking, then over all facts of each ranking (``relation: all``)."""
    rows = []
    relations = list(dict.fromkeys([*skipped, *(p["relation"] for p in predictions)]))
    rankings = [k for k in ("vocabulary", "candidates") if any(p["ranking"] == k for p in predictions)] or ["vocabulary"]
    for ranking in rankings:
        for relation in relations:
            ranks = [p["rank"] for p in predictions if p["relation"] == relation and p["ranking"] == ranking]
            if ranks or ranking == "vocabulary":
                rows.append(summary(model, relation, ranking, ranks, skipped.get(relation, 0) if ranking == "vocabulary" else 0))
        rows.append(summary(model, "all", ranking, [p["rank"] for p in predictions if p["ranking"] == ranking],
                            sum(skipped.values()) if ranking == "vocabulary" else 0))
    return rows


def sample_facts(facts: list[Fact], limit: Optional[int], seed: int) -> list[Fact]:
    from ptm_app.analysis.representations import sample_indices

    return [facts[i] for i in sample_indices(len(facts), limit, seed)]


def draw(rows: list[dict]):
    """P@1 per relation (bars), one colour per model and ranking."""
    from ptm_app.analysis.figures import new_figure

    shown = [r for r in rows if r["p_at_1"] is not None]
    relations = list(dict.fromkeys(r["relation"] for r in shown))
    series = list(dict.fromkeys((r["model"], r["ranking"]) for r in shown))
    fig, (ax,) = new_figure(1, width=max(6.0, 1.2 * len(relations) * max(1, len(series)) ** 0.5), height=3.6)
    width = 0.8 / max(1, len(series))
    for k, (model, ranking) in enumerate(series):
        values = {r["relation"]: r["p_at_1"] for r in shown if (r["model"], r["ranking"]) == (model, ranking)}
        xs = [i + k * width for i, rel in enumerate(relations) if rel in values]
        ax.bar(xs, [values[rel] for rel in relations if rel in values], width, label=f"{model} ({ranking})")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(relations))], relations, rotation=20)
    ax.set_ylabel("P@1")
    ax.set_title("Knowledge probe (LAMA cloze): P@1 per relation")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def knowledge_probe(models: list[str] = ["smollm2"],
                    relations: list[str] = ["hypernym", "part_of", "member_of", "antonym", "supersense"],
                    templates: Optional[dict[str, str]] = None, facts_per_relation: Optional[int] = 200,
                    batch_size: int = 16, seed: int = 0, run_name: str = "knowledge_probe",
                    output_dir: Optional[str] = None, readme: Optional[str] = None) -> Path:
    """LAMA-style cloze probes of relational knowledge: P@1, P@10 and MRR per relation.

    Args:
        models: LMs with their heads: prepared names (smollm2), save_pretrained directories, run directories or
            .ckpt files. Masked LMs rank the vocabulary at [MASK], causal LMs the next token after the prefix.
        relations: built-in WordNet relations (hypernym, part_of, member_of, antonym, supersense) or paths of JSONL
            relation files (relation, template, subject, object per line).
        templates: relation name -> template (with [X] and one [MASK]) replacing the file's own.
        facts_per_relation: facts sampled per relation (null = all); every model gets the same sample.
        batch_size: sequences per forward pass.
        seed: the fact sample.
        run_name: output directory name under the runs root (checkpoints/).
        output_dir: output directory (overrides run_name).
        readme: also put the tables into this page (e.g. docs/analyse.md), between the lines
            ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``, NAME the output directory's name.
    """
    resolved = dict(locals())
    from ptm_app.analysis.figures import save_png
    from ptm_app.analysis.tables import check_readme, show, write_table

    templates = templates or {}
    keys = {name: name if name in WORDNET_RELATIONS else Path(name).stem for name in relations}
    unknown = sorted(set(templates) - set(keys.values()))
    if unknown:
        raise PtmError(f"templates: {', '.join(unknown)} is not among the relations ({', '.join(keys.values())}); "
                       f"fix the name or add the relation")
    files = {name: relation_file(name) for name in relations}
    loaded = {}
    for name, path in files.items():
        facts = read_facts(path, templates.get(keys[name]))
        loaded[name] = (facts, valid_objects(facts), sample_facts(facts, facts_per_relation, seed))
    out = Path(output_dir) if output_dir else run_path(run_name)
    check_readme(readme, out)
    rows, predictions = [], []
    for ref in models:
        lm = load_language_model(ref)
        mine, skipped = [], {}
        for name, (facts, valid, sample) in loaded.items():
            scored, skipped[sample[0].relation] = score_relation(lm, sample, valid, batch_size)
            mine += scored
        rows += summaries(lm.name, mine, skipped)
        predictions += [{"model": lm.name, **p} for p in mine]
        del lm
    write_json(out / "settings.json", {**resolved, "relation_files": {k: str(v) for k, v in files.items()}})
    with atomic_file(out / "predictions.jsonl", "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions)
    md = write_table(rows, COLUMNS, out / "knowledge_probe",
                     "Knowledge probe (LAMA, Petroni et al. 2019): filtered P@1, P@10, MRR")
    pivot = pivot_p_at_1(rows)
    write_table(pivot, ["relation", *[k for k in pivot[0] if k != "relation"]] if pivot else ["relation"],
                out / "knowledge_p_at_1", "P@1 per relation and model (ranking in brackets)")
    save_png(draw(rows), out / "knowledge_probe.png")
    show([md], readme, out, out / "knowledge_probe.png")
    return out


def pivot_p_at_1(rows: list[dict]) -> list[dict]:
    """Relations x models: P@1, one column per model and ranking."""
    table: dict[str, dict] = {}
    for r in rows:
        table.setdefault(r["relation"], {"relation": r["relation"]})[f"{r['model']} ({r['ranking']})"] = r["p_at_1"]
    columns = list(dict.fromkeys(k for row in table.values() for k in row))
    return [{c: row.get(c) for c in columns} for row in table.values()]
