"""``python main.py attention --config configs/analysis/minilm_attention_brown.yaml``: what every attention head looks
at over Brown sentences (Clark et al. 2019 §3-4; measures in ``attention_stats``): its entropy, its share of
attention to [CLS], [SEP] and punctuation, its mean attended distance, and how often the word it attends to most
is the previous / next word or, from Brown's POS tags, the noun of a determiner, adposition or adjective.

The backbone runs with its own attention kernel (``attn_implementation: eager``, the one that returns weights).
Writes ``attention.md|csv|json`` (one row per model, layer and head), ``attention_by_layer.*`` (means over
heads), ``attention_relations.*`` (per relation the best head against the best fixed-offset baseline, as Clark et
al. §4.2), ``attention.png`` (one heat map per model and measure, layers x heads) and the resolved
``settings.json`` to the output directory.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import torch

from ptm_app.analysis.attention_stats import (MEASURES, RELATIONS, add_sums, is_punctuation, means, relation_sums,
                                              relation_shares, sentence_sums, word_attention)
from ptm_app.analysis.probe_tasks import PROBE_TASKS, load_examples
from ptm_app.analysis.representations import Encoder, load_encoder, token_words, word_spans
from ptm_app.data.sources import prepared_dir
from ptm_app.errors import PtmError
from ptm_app.paths import run_path, write_json

COLUMNS = ["model", "layer", "head", *MEASURES, *RELATIONS]
TITLES = {"entropy": "entropy (nats)", "to_cls": "attention to [CLS]", "to_sep": "attention to [SEP]",
          "to_punct": "attention to punctuation", "distance": "mean attended distance (tokens)",
          "prev_word": "most-attended = previous word", "next_word": "most-attended = next word",
          "det_noun": "determiner -> its noun", "adp_noun": "adposition -> its noun",
          "adj_noun": "adjective -> its noun"}


def attention_layers(encoder: Encoder) -> int:
    """How many attention layers the backbone has; one line if it has none (the ELMo BiLSTM)."""
    cfg = encoder.model.config
    if not getattr(cfg, "num_attention_heads", None):
        raise PtmError(f"{encoder.name} ({cfg.model_type}) has no attention heads; attention analysis needs a "
                       f"transformer backbone")
    return encoder.num_layers - 1


def targets(encoder: Encoder, ids: list[int]) -> dict[str, Optional[torch.Tensor]]:
    """Key masks of one sentence: [CLS], [SEP] (None when the tokenizer has no such token) and punctuation."""
    tok = encoder.tokenizer
    tensor = torch.tensor(ids)
    tokens = tok.convert_ids_to_tokens(ids)
    special = set(tok.all_special_ids)
    return {"to_cls": tensor == tok.cls_token_id if tok.cls_token_id is not None else None,
            "to_sep": tensor == tok.sep_token_id if tok.sep_token_id is not None else None,
            "to_punct": torch.tensor([i not in special and is_punctuation(t) for i, t in zip(ids, tokens)])}


@torch.no_grad()
def head_means(encoder: Encoder, sentences: list[list[str]], tags: list[list[str]],
               max_length: int) -> tuple[list[dict], list[dict]]:
    """Per layer (a list): the token-weighted mean of every measure per head ([H] tensors), and the word-relation
    shares (``attention_stats.relation_shares``)."""
    layers = attention_layers(encoder)
    totals: list[Optional[dict]] = [None] * layers
    relations: list[Optional[dict]] = [None] * layers
    max_length = encoder.fit_length(max_length)
    from ptm_app.data.sources.fetch import progress

    for words, word_tags in progress(list(zip(sentences, tags)), f"{encoder.name}: attention maps"):
        text, owner = word_spans(words)
        enc = encoder.tokenizer(text, truncation=True, max_length=max_length, return_offsets_mapping=True,
                                return_special_tokens_mask=True)
        ids = enc["input_ids"]
        output = encoder.model(torch.tensor([ids]), output_attentions=True)
        attentions = getattr(output, "attentions", None)
        if not attentions:
            raise PtmError(f"{encoder.name} returned no attention weights; attention analysis needs a model whose "
                           f"eager attention returns them")
        masks = targets(encoder, ids)
        owners = token_words(enc["offset_mapping"], enc["special_tokens_mask"], owner)
        n_words = max(owners) + 1  # words cut off by truncation are left out
        for layer, att in enumerate(attentions):
            totals[layer] = add_sums(totals[layer], sentence_sums(att[0].float(), masks))
            if n_words > 0:
                word_maps = word_attention(att[0].float(), owners, n_words)
                relations[layer] = add_sums(relations[layer], relation_sums(word_maps, word_tags))
    return [means(t) for t in totals], [relation_shares(r) if r is not None else None for r in relations]


def draw(rows: list[dict]):
    """One heat map (layers x heads) per model and measure."""
    from matplotlib.ticker import MaxNLocator

    from ptm_app.analysis.figures import new_figure

    models = list(dict.fromkeys(r["model"] for r in rows))
    shown = [m for m in (*MEASURES, *RELATIONS) if any(r.get(m) is not None for r in rows)]
    fig, axes = new_figure(len(models) * len(shown), width=3.4, height=3.0, columns=len(shown))
    for i, model in enumerate(models):
        mine = [r for r in rows if r["model"] == model]
        layers, heads = max(r["layer"] for r in mine), max(r["head"] for r in mine) + 1
        for j, measure in enumerate(shown):
            ax = axes[i * len(shown) + j]
            grid = torch.full((layers, heads), float("nan"))
            for r in mine:
                if r.get(measure) is not None:
                    grid[r["layer"] - 1, r["head"]] = r[measure]
            image = ax.imshow(grid.numpy(), aspect="auto", origin="lower", cmap="viridis",
                              extent=(-0.5, heads - 0.5, 0.5, layers + 0.5))
            fig.colorbar(image, ax=ax, fraction=0.046)
            ax.set_title(f"{model}: {TITLES[measure]}", fontsize="small")
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    return fig


def attention(models: list[str] = ["minilm"], split: Literal["train", "validation", "test"] = "test",
              sentences: Optional[int] = 200, max_length: int = 128, seed: int = 0, run_name: str = "attention",
              output_dir: Optional[str] = None, readme: Optional[str] = None) -> Path:
    """Per-head entropy, attention to [CLS], [SEP] and punctuation, and mean attended distance.

    Args:
        models: transformer backbones: prepared names (minilm, smollm2), save_pretrained directories, run
            directories or .ckpt files.
        split: the brown_pos split whose sentences are read.
        sentences: sentences sampled from it (null = all).
        max_length: longest sentence in tokens (longer ones are cut).
        seed: the sentence sample.
        run_name: output directory name under the runs root (checkpoints/).
        output_dir: output directory (overrides run_name).
        readme: also put the tables into this page (e.g. docs/analyse.md), between the lines
            ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``, NAME the output directory's name.
    """
    resolved = dict(locals())
    from ptm_app.analysis.figures import save_png
    from ptm_app.analysis.tables import check_readme, show, write_table

    task = PROBE_TASKS["brown_pos"]
    prepared_dir(task.name)
    out = Path(output_dir) if output_dir else run_path(run_name)
    check_readme(readme, out)
    examples = load_examples(task, split, sentences, seed)
    rows, best = [], []
    for ref in models:
        encoder = load_encoder(ref, attention=True)
        per_layer, relations = head_means(encoder, examples.texts, examples.labels, max_length)
        for layer, (values, shares) in enumerate(zip(per_layer, relations), start=1):
            for head in range(len(values["entropy"])):
                row = {"model": encoder.name, "layer": layer, "head": head,
                       **{m: (float(values[m][head]) if values[m] is not None else None) for m in MEASURES}}
                for name in RELATIONS:
                    heads = shares[name]["heads"] if shares is not None else None
                    row[name] = float(heads[head]) if heads is not None else None
                rows.append(row)
        best += best_heads(encoder.name, [r for r in rows if r["model"] == encoder.name], relations)
        del encoder
    write_json(out / "settings.json", resolved)
    write_table(rows, COLUMNS, out / "attention", "Attention heads (Clark et al. 2019): token-weighted means, and "
                "the share of words whose most-attended word is the relation's target")
    save_png(draw(rows), out / "attention.png")
    summary = [{"model": m, "layer": l, **{k: _mean([r[k] for r in rows if r["model"] == m and r["layer"] == l])
                                          for k in MEASURES}}
               for m in dict.fromkeys(r["model"] for r in rows)
               for l in sorted({r["layer"] for r in rows if r["model"] == m})]
    md = write_table(summary, ["model", "layer", *MEASURES], out / "attention_by_layer",
                     "Attention per layer (mean over heads)")
    md_relations = write_table(best, ["model", "relation", "best_head", "accuracy", "baseline", "baseline_offset",
                                      "words"], out / "attention_relations",
                               "Word relations (Clark et al. 2019 §4): the best single head against the best "
                               "fixed-offset baseline")
    show([md, md_relations], readme, out, out / "attention.png")
    return out


def best_heads(model: str, rows: list[dict], relations: list[Optional[dict]]) -> list[dict]:
    """Per relation, the head with the highest share (``layer-head``) and the fixed-offset baseline."""
    out = []
    for name in RELATIONS:
        scored = [r for r in rows if r[name] is not None]
        info = next((shares[name] for shares in relations if shares is not None), None)
        if not scored or info is None:
            continue
        top = max(scored, key=lambda r: r[name])
        out.append({"model": model, "relation": name, "best_head": f"{top['layer']}-{top['head']}",
                    "accuracy": top[name], "baseline": info["baseline"], "baseline_offset": info["baseline_offset"],
                    "words": info["count"]})
    return out


def _mean(values: list) -> Optional[float]:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None
