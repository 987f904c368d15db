"""``python main.py robustness --config configs/analysis/minilm_robustness_tweets.yaml``: a fine-tuned classifier on
perturbed copies of its test set (character typos, word dropout, WordNet synonyms; ``perturbations``), seeded.

The classifier is a run directory (or ``.ckpt``) of ``SequenceClassificationModule``, loaded with the module's
weights-only ``load_from_checkpoint`` (the checkpoint carries its tokenizer and label set); the data (source,
fields, ``max_length``) come from the run's resolved ``config.yaml``.  Each perturbation at each rate is one copy
of the chosen examples, drawn with its own seed (``seed``, perturbation, rate), so a copy is the same in every run
and for every model.  Writes ``robustness.md|csv|json`` (accuracy and macro F1 per perturbation and rate, the drop
from the clean score, and the share of words actually changed), ``robustness.png`` and ``settings.json``.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Literal, Optional

import torch

from ptm_app.analysis.perturbations import PERTURBATIONS, count_words, perturb
from ptm_app.errors import PtmError
from ptm_app.paths import run_path, write_json

COLUMNS = ["model", "perturbation", "rate", "words_changed", "accuracy", "f1_macro", "accuracy_drop", "f1_drop",
           "examples"]
Perturbation = Literal["typo_swap", "typo_drop", "typo_insert", "typo_replace", "word_dropout", "synonym"]


def check_rates(rates: list[float]) -> list[float]:
    for rate in rates:
        if not 0.0 <= rate <= 1.0:
            raise PtmError(f"rates: {rate} is outside [0, 1]; a rate is the share of words perturbed "
                           f"(0.05 = 5 % of the words)")
    return list(rates)


def run_files(run: str, checkpoint: str) -> tuple[Path, Optional[Path]]:
    """The checkpoint file and the run's ``config.yaml`` (None when there is none) of a run dir or ``.ckpt``."""
    path = Path(run).expanduser()
    if path.is_dir():
        ckpt = path / "checkpoints" / f"{checkpoint}.ckpt"
        if not ckpt.exists():
            ckpt = path / "checkpoints" / "last.ckpt"
        if not ckpt.exists():
            raise PtmError(f"{run}: no checkpoints/{checkpoint}.ckpt or last.ckpt; give the run directory of a "
                           f"finished 'fit' or a .ckpt file")
        config = path / "config.yaml"
    elif path.is_file():
        ckpt, config = path, path.parent.parent / "config.yaml"
    else:
        raise PtmError(f"run {run} not found; give a run directory (checkpoints/<run_name>) or a .ckpt file")
    return ckpt, config if config.is_file() else None


def load_classifier(ckpt: Path, purpose: str = "robustness"):
    """The ``SequenceClassificationModule`` of a checkpoint (checked, weights-only), in eval mode; anything else is
    refused in one line naming ``purpose`` (the command)."""
    from ptm_app.adaptation.classification import SequenceClassificationModule
    from ptm_app.backbones.build import quiet_transformers
    from ptm_app.checkpoint_io.reading import CKPT_KEY, as_file, read_checkpoint

    state = read_checkpoint(ckpt)
    module = str(state.get(CKPT_KEY, {}).get("module", ""))
    if not module.endswith(".SequenceClassificationModule"):
        raise PtmError(f"{ckpt} is a {module.rpartition('.')[2] or 'checkpoint of unknown kind'}, not a "
                       f"SequenceClassificationModule with a classifier head; {purpose} needs a fine-tuned sequence "
                       f"classifier")
    with quiet_transformers():
        model = SequenceClassificationModule.load_from_checkpoint(as_file(state), map_location="cpu")
    if model.tokenizer is None or not model.hparams.labels:
        raise PtmError(f"{ckpt} holds no tokenizer or label set; re-run its fit with this version of ptm_app")
    return model.eval()


def data_settings(config: Optional[Path], source: Optional[str]) -> dict:
    """Source, fields and length of the run's data module (``source`` overrides the run's)."""
    import yaml

    args = {}
    if config is not None:
        data = (yaml.safe_load(config.read_text(encoding="utf-8")) or {}).get("data") or {}
        if "TaskDataModule" not in str(data.get("class_path", "")):
            raise PtmError(f"{config}: data is {data.get('class_path')!r}, not a TaskDataModule; robustness reads "
                           f"a single-text or text-pair classification set")
        args = data.get("init_args") or {}
    if source is not None:
        args["source"] = source
    if "source" not in args:
        raise PtmError("no data source: the run has no config.yaml; set 'source' (a prepared name or directory)")
    return {"source": str(args["source"]), "text_field": args.get("text_field", "text"),
            "text_pair_field": args.get("text_pair_field"), "label_field": args.get("label_field", "label"),
            "id_field": args.get("id_field", "id"), "max_length": int(args.get("max_length", 128)),
            "unlabelled": args.get("unlabelled", "error")}


@torch.no_grad()
def predict(model, texts: list[str], pairs: Optional[list[str]], max_length: int, batch_size: int) -> list[int]:
    """The classifier's label index per text."""
    tok, out = model.tokenizer, []
    for start in range(0, len(texts), batch_size):
        chunk = texts[start:start + batch_size]
        args = (chunk, pairs[start:start + batch_size]) if pairs is not None else (chunk,)
        enc = tok(*args, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
        batch = {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        out += model(batch).argmax(-1).tolist()
    return out


def scores(gold: list[int], predicted: list[int], classes: int) -> dict[str, float]:
    """Accuracy and macro F1 (the mean over the classes that occur in gold or predictions)."""
    accuracy = sum(g == p for g, p in zip(gold, predicted)) / len(gold)
    f1s = []
    for c in range(classes):
        tp = sum(g == c == p for g, p in zip(gold, predicted))
        fp = sum(p == c != g for g, p in zip(gold, predicted))
        fn = sum(g == c != p for g, p in zip(gold, predicted))
        if tp + fp + fn:
            f1s.append(2 * tp / (2 * tp + fp + fn))
    return {"accuracy": accuracy, "f1_macro": sum(f1s) / len(f1s)}


def perturbed_copy(texts: list[str], kind: str, rate: float, seed: int, synonyms=None) -> tuple[list[str], float]:
    """The texts perturbed with one seeded generator, and the share of their words that changed."""
    rng = random.Random(f"{seed}:{kind}:{rate}")
    out, changed = [], 0
    for text in texts:
        new, n = perturb(text, kind, rate, rng, synonyms)
        out.append(new)
        changed += n
    return out, changed / max(1, sum(count_words(t) for t in texts))


def draw(rows: list[dict]):
    """Accuracy against the perturbation rate, one line per perturbation; the clean score dashed."""
    from ptm_app.analysis.figures import new_figure

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = new_figure(len(models), columns=2)
    for ax, model in zip(axes, models):
        mine = [r for r in rows if r["model"] == model]
        clean = next(r["accuracy"] for r in mine if r["perturbation"] == "clean")
        ax.axhline(clean, color="black", linestyle="--", label="clean")
        for i, kind in enumerate(dict.fromkeys(r["perturbation"] for r in mine if r["perturbation"] != "clean")):
            points = sorted((r["rate"], r["accuracy"]) for r in mine if r["perturbation"] == kind)
            ax.plot([0.0] + [p[0] for p in points], [clean] + [p[1] for p in points], marker="o",
                    color=f"C{i % 10}", label=kind)
        ax.set_title(f"{model}: accuracy under perturbation")
        ax.set_xlabel("rate (share of words perturbed)")
        ax.set_ylabel("accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def robustness(runs: list[str], checkpoint: Literal["best", "last"] = "best",
               split: Literal["train", "validation", "test"] = "test", source: Optional[str] = None,
               examples: Optional[int] = 500,
               perturbations: list[Perturbation] = list(PERTURBATIONS),
               rates: list[float] = [0.05, 0.1, 0.2], batch_size: int = 32, seed: int = 0,
               run_name: str = "robustness", output_dir: Optional[str] = None,
               readme: Optional[str] = None) -> Path:
    """A fine-tuned classifier's accuracy and macro F1 on perturbed copies of its test set.

    Args:
        runs: run directories (or .ckpt files) of SequenceClassificationModule fits.
        checkpoint: which checkpoint of a run directory (best, else last).
        split: the split of the run's data that is perturbed.
        source: the data (prepared name or directory of split files) instead of the run's own.
        examples: records sampled from the split (null = all); every run and perturbation gets the same ones.
        perturbations: typo_swap, typo_drop, typo_insert, typo_replace, word_dropout, synonym.
        rates: shares of the words perturbed, each in [0, 1].
        batch_size: texts per forward pass.
        seed: the sample and every perturbation's generator.
        run_name: output directory name under the runs root (checkpoints/).
        output_dir: output directory (overrides run_name).
        readme: also put the tables into this page (e.g. docs/analyse.md), between the lines
            ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``, NAME the output directory's name.
    """
    resolved = dict(locals())
    from ptm_app.analysis.figures import save_png
    from ptm_app.analysis.representations import sample_indices
    from ptm_app.analysis.tables import check_readme, show, write_table
    from ptm_app.data.datamodules import resolve_source
    from ptm_app.data.tasks import read_labelled

    check_rates(rates)
    synonyms = None
    if "synonym" in perturbations:
        from ptm_app.analysis.perturbations import wordnet_synonyms

        synonyms = wordnet_synonyms()
    out = Path(output_dir) if output_dir else run_path(run_name)
    check_readme(readme, out)
    rows = []
    for run in runs:
        ckpt, config = run_files(run, checkpoint)
        data = data_settings(config, source)
        files = resolve_source(data["source"])
        if split not in files:
            raise PtmError(f"{data['source']} has no {split} split ({', '.join(files)}); set 'split'")
        records = read_labelled(files[split], text_field=data["text_field"], text_pair_field=data["text_pair_field"],
                                label_field=data["label_field"], id_field=data["id_field"],
                                unlabelled=data["unlabelled"])
        chosen = sample_indices(len(records.texts), examples, seed)
        model = load_classifier(ckpt)
        labels = list(model.hparams.labels)
        strangers = sorted({str(records.labels[i]) for i in chosen} - set(labels))
        if strangers:
            raise PtmError(f"{files[split]}: labels {', '.join(strangers)} are not among the classifier's "
                           f"({', '.join(labels)}); give the data it was trained on")
        gold = [labels.index(str(records.labels[i])) for i in chosen]
        texts = [records.texts[i] for i in chosen]
        pairs = [records.pairs[i] for i in chosen] if records.pairs is not None else None
        name = Path(run).name
        clean = scores(gold, predict(model, texts, pairs, data["max_length"], batch_size), len(labels))
        rows.append({"model": name, "perturbation": "clean", "rate": 0.0, "words_changed": 0.0, **clean,
                     "accuracy_drop": 0.0, "f1_drop": 0.0, "examples": len(texts)})
        for kind in perturbations:
            for rate in rates:
                new, changed = perturbed_copy(texts, kind, rate, seed, synonyms)
                new_pairs = perturbed_copy(pairs, kind, rate, seed + 1, synonyms)[0] if pairs is not None else None
                got = scores(gold, predict(model, new, new_pairs, data["max_length"], batch_size), len(labels))
                rows.append({"model": name, "perturbation": kind, "rate": rate, "words_changed": changed, **got,
                             "accuracy_drop": clean["accuracy"] - got["accuracy"],
                             "f1_drop": clean["f1_macro"] - got["f1_macro"], "examples": len(texts)})
        del model
    write_json(out / "settings.json", resolved)
    md = write_table(rows, COLUMNS, out / "robustness",
                     "Robustness: accuracy and macro F1 on perturbed copies (drop = clean - perturbed)")
    save_png(draw(rows), out / "robustness.png")
    show([md], readme, out, out / "robustness.png")
    return out
