"""``python main.py attention --config configs/analysis/attention_minilm.yaml``: what every attention head looks
at over Brown sentences (Clark et al. 2019 §3; measures in ``attention_stats``): its entropy, its share of
attention to [CLS], [SEP] and punctuation, and its mean attended distance.

The backbone runs with its own attention kernel (``attn_implementation: eager``, the one that returns weights).
Writes ``attention.md|csv|json`` (one row per model, layer and head), ``attention.png`` (one heat map per model
and measure, layers x heads) and the resolved ``settings.json`` to the output directory.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import torch

from ptm_app.analysis.attention_stats import MEASURES, add_sums, is_punctuation, means, sentence_sums
from ptm_app.analysis.probe_tasks import PROBE_TASKS, load_examples
from ptm_app.analysis.representations import Encoder, load_encoder, word_spans
from ptm_app.data.sources import prepared_dir
from ptm_app.errors import PtmError
from ptm_app.paths import runs_root, write_json

COLUMNS = ["model", "layer", "head", *MEASURES]
TITLES = {"entropy": "entropy (nats)", "to_cls": "attention to [CLS]", "to_sep": "attention to [SEP]",
          "to_punct": "attention to punctuation", "distance": "mean attended distance (tokens)"}


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
def head_means(encoder: Encoder, sentences: list[list[str]], max_length: int) -> list[dict]:
    """Token-weighted mean of every measure per layer (a list) and head ([H] tensors)."""
    layers = attention_layers(encoder)
    totals: list[Optional[dict]] = [None] * layers
    max_length = encoder.fit_length(max_length)
    from ptm_app.data.sources.fetch import progress

    for words in progress(sentences, f"{encoder.name}: attention maps"):
        ids = encoder.tokenizer(word_spans(words)[0], truncation=True, max_length=max_length)["input_ids"]
        output = encoder.model(torch.tensor([ids]), output_attentions=True)
        attentions = getattr(output, "attentions", None)
        if not attentions:
            raise PtmError(f"{encoder.name} returned no attention weights; attention analysis needs a model whose "
                           f"eager attention returns them")
        masks = targets(encoder, ids)
        for layer, att in enumerate(attentions):
            totals[layer] = add_sums(totals[layer], sentence_sums(att[0].float(), masks))
    return [means(t) for t in totals]


def draw(rows: list[dict]):
    """One heat map (layers x heads) per model and measure."""
    from matplotlib.ticker import MaxNLocator

    from ptm_app.analysis.figures import new_figure

    models = list(dict.fromkeys(r["model"] for r in rows))
    shown = [m for m in MEASURES if any(r[m] is not None for r in rows)]
    fig, axes = new_figure(len(models) * len(shown), width=3.4, height=3.0, columns=len(shown))
    for i, model in enumerate(models):
        mine = [r for r in rows if r["model"] == model]
        layers, heads = max(r["layer"] for r in mine), max(r["head"] for r in mine) + 1
        for j, measure in enumerate(shown):
            ax = axes[i * len(shown) + j]
            grid = torch.full((layers, heads), float("nan"))
            for r in mine:
                if r[measure] is not None:
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
              output_dir: Optional[str] = None) -> Path:
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
    """
    resolved = dict(locals())
    from ptm_app.analysis.figures import save_png
    from ptm_app.analysis.tables import write_table

    task = PROBE_TASKS["brown_pos"]
    prepared_dir(task.name)
    out = Path(output_dir) if output_dir else runs_root() / run_name
    examples = load_examples(task, split, sentences, seed)
    rows = []
    for ref in models:
        encoder = load_encoder(ref, attention=True)
        for layer, values in enumerate(head_means(encoder, examples.texts, max_length), start=1):
            heads = len(values["entropy"])
            for head in range(heads):
                rows.append({"model": encoder.name, "layer": layer, "head": head,
                             **{m: (float(values[m][head]) if values[m] is not None else None) for m in MEASURES}})
        del encoder
    write_json(out / "settings.json", resolved)
    write_table(rows, COLUMNS, out / "attention", "Attention heads (Clark et al. 2019): token-weighted means")
    save_png(draw(rows), out / "attention.png")
    summary = [{"model": m, "layer": l, **{k: _mean([r[k] for r in rows if r["model"] == m and r["layer"] == l])
                                          for k in MEASURES}}
               for m in dict.fromkeys(r["model"] for r in rows)
               for l in sorted({r["layer"] for r in rows if r["model"] == m})]
    md = write_table(summary, ["model", "layer", *MEASURES], out / "attention_by_layer",
                     "Attention per layer (mean over heads)")
    print(md.read_text(encoding="utf-8"), end="")
    return out


def _mean(values: list) -> Optional[float]:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def attention_command(argv: list[str]) -> int:
    from ptm_app.analysis.settings import run_command

    out = run_command(attention, argv, "attention")
    print(f"wrote {out}")
    return 0
