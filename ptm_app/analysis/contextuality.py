"""``python main.py contextuality --config configs/analysis/minilm_contextuality_brown.yaml``: how contextual each
layer's word representations are, over Brown sentences (Ethayarajh 2019; measures in ``geometry``).

A word is its first sub-token's representation (as in ``probe``); a word type is its lowercased form, and its
occurrences are its first occurrence in each sentence (at most ``max_occurrences`` sentences; types seen in fewer
than ``min_occurrences`` sentences are left out, as Ethayarajh 2019 §3.1 keeps words in at least 5 contexts).
Writes ``contextuality.md|csv|json`` (one row per model and layer) and ``contextuality.png`` to the output
directory, with the resolved ``settings.json``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import torch

from ptm_app.analysis import geometry
from ptm_app.analysis.probe_tasks import PROBE_TASKS, load_examples
from ptm_app.analysis.probes import word_type
from ptm_app.analysis.representations import Examples, Features, cached_layers, load_encoder
from ptm_app.data.sources import prepared_dir
from ptm_app.errors import PtmError
from ptm_app.paths import run_path, write_json

COLUMNS = ["model", "layer", "self_similarity", "intra_sentence", "mev", "anisotropy", "baseline_mev",
           "self_similarity_adjusted", "intra_sentence_adjusted", "mev_adjusted", "words", "sentences"]
PANELS = [("self_similarity", "self-similarity"), ("intra_sentence", "intra-sentence similarity"),
          ("mev", "max explainable variance"), ("anisotropy", "anisotropy (random words)")]


def occurrence_rows(examples: Examples, features: Features, min_occurrences: int,
                    max_occurrences: int) -> dict[str, list[int]]:
    """Feature rows of every word type seen in at least ``min_occurrences`` sentences: its first occurrence in
    each sentence, at most ``max_occurrences`` of them."""
    rows: dict[str, list[int]] = {}
    seen: set[tuple[str, int]] = set()
    for row, (s, w) in enumerate(zip(features.sentence.tolist(), features.word.tolist())):
        kind = word_type(examples.texts[s][w])
        if (kind, s) in seen:
            continue
        seen.add((kind, s))
        found = rows.setdefault(kind, [])
        if len(found) < max_occurrences:
            found.append(row)
    return {kind: found for kind, found in rows.items() if len(found) >= min_occurrences}


def sentence_rows(features: Features) -> list[torch.Tensor]:
    """Feature rows of every sentence with at least two words."""
    sentence = features.sentence
    groups = [torch.nonzero(sentence == s).flatten() for s in torch.unique(sentence)]
    return [g for g in groups if len(g) >= 2]


def layer_measures(vectors: torch.Tensor, words: dict[str, list[int]], sentences: list[torch.Tensor],
                   pairs: tuple[torch.Tensor, torch.Tensor], seed: int) -> dict:
    """Every measure of one layer, raw and anisotropy-adjusted."""
    occurrences = [vectors[rows] for rows in words.values()]
    self_sim = geometry.self_similarity(occurrences)
    intra = geometry.intra_sentence_similarity([vectors[rows] for rows in sentences])
    mev = geometry.max_explainable_variance(occurrences)
    baseline = geometry.anisotropy(vectors, *pairs)
    baseline_mev = geometry.random_sets_mev(vectors, [len(r) for r in words.values()],
                                            torch.Generator().manual_seed(seed))
    return {"self_similarity": self_sim, "intra_sentence": intra, "mev": mev, "anisotropy": baseline,
            "baseline_mev": baseline_mev, "self_similarity_adjusted": self_sim - baseline,
            "intra_sentence_adjusted": intra - baseline, "mev_adjusted": mev - baseline_mev}


def draw(rows: list[dict]):
    """Four panels (self-similarity, intra-sentence similarity, MEV, anisotropy) against the layer, one solid
    curve per model; the anisotropy-adjusted values dashed in the same colour."""
    from ptm_app.analysis.figures import new_figure

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = new_figure(len(PANELS), columns=2)
    for ax, (key, title) in zip(axes, PANELS):
        for i, model in enumerate(models):
            mine = [r for r in rows if r["model"] == model]
            layers = [r["layer"] for r in mine]
            ax.plot(layers, [r[key] for r in mine], marker="o", color=f"C{i % 10}", label=model)
            if f"{key}_adjusted" in mine[0]:
                ax.plot(layers, [r[f"{key}_adjusted"] for r in mine], linestyle="--", marker=".",
                        color=f"C{i % 10}", label=f"{model} adjusted")
        ax.set_title(title)
        ax.set_xlabel("layer (0 = embeddings)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def contextuality(models: list[str] = ["minilm"], split: Literal["train", "validation", "test"] = "test",
                  sentences: Optional[int] = 500, min_occurrences: int = 5, max_occurrences: int = 20,
                  baseline_pairs: int = 5000, layers: Optional[list[int]] = None, max_length: int = 128,
                  encode_batch_size: int = 32, cache_dtype: Literal["float32", "float16"] = "float32",
                  seed: int = 0, run_name: str = "contextuality", output_dir: Optional[str] = None,
                  readme: Optional[str] = None) -> Path:
    """Self-similarity, intra-sentence similarity, max explainable variance and anisotropy per layer.

    Args:
        models: backbones: prepared names (minilm, smollm2), save_pretrained directories, run directories or .ckpt
            files.
        split: the brown_pos split whose sentences are read.
        sentences: sentences sampled from it (null = all).
        min_occurrences: a word type enters self-similarity and MEV when it occurs in this many sentences.
        max_occurrences: at most this many occurrences (sentences) per word type.
        baseline_pairs: random word pairs (from different sentences) for the anisotropy baseline.
        layers: which layers (0 = the embeddings); default all.
        max_length: longest sentence in tokens (cut-off words are left out).
        encode_batch_size: sentences per backbone pass.
        cache_dtype: how the cached representations are stored.
        seed: the sentence sample, the random pairs and the random sets of the MEV baseline.
        run_name: output directory name under the runs root (checkpoints/).
        output_dir: output directory (overrides run_name).
        readme: also put the tables into this page (e.g. docs/analyse.md), between the lines
            ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``, NAME the output directory's name.
    """
    resolved = dict(locals())
    from ptm_app.analysis.figures import save_png
    from ptm_app.analysis.tables import check_readme, show, write_table

    task = PROBE_TASKS["brown_pos"]
    prepared_dir(task.name)  # one line saying how to prepare it, before any model is loaded
    out = Path(output_dir) if output_dir else run_path(run_name)
    check_readme(readme, out)
    rows = []
    for ref in models:
        encoder = load_encoder(ref)
        layer_ids = encoder.check_layers(layers)
        examples = load_examples(task, split, sentences, seed)
        features = cached_layers(encoder, examples, max_length, encode_batch_size, cache_dtype)
        words = occurrence_rows(examples, features, min_occurrences, max_occurrences)
        if not words:
            raise PtmError(f"no word type occurs in {min_occurrences} of the {len(examples.texts)} sentences; "
                           f"raise 'sentences' or lower 'min_occurrences'")
        groups = sentence_rows(features)
        pairs = geometry.random_pairs(len(features.sentence), baseline_pairs, torch.Generator().manual_seed(seed),
                                      features.sentence)
        for layer in layer_ids:
            measures = layer_measures(features.layers[layer], words, groups, pairs, seed)
            rows.append({"model": encoder.name, "layer": layer, **measures, "words": len(words),
                         "sentences": len(groups)})
        del encoder
    write_json(out / "settings.json", resolved)
    md = write_table(rows, COLUMNS, out / "contextuality",
                     "Contextuality per layer (Ethayarajh 2019); *_adjusted = raw - random-word baseline")
    save_png(draw(rows), out / "contextuality.png")
    show([md], readme, out, out / "contextuality.png")
    return out
