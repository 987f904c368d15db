"""``python main.py probe --config configs/analysis/minilm_probe_linear_mix.yaml``: layer-wise probing of frozen backbones
(Tenney et al. 2019, "What do you learn from context?" and "BERT Rediscovers the Classical NLP Pipeline"), with
control tasks and selectivity (Hewitt & Liang 2019), ELMo scalar-mix weights and their center of gravity.

Each model's layers are computed once per task and split (``representations.cached_layers``); then one probe per
layer is trained on the training sample and scored on the test sample.  Writes to the output directory:
``probe.md|csv|json`` (one row per model, task and layer: accuracy, control, selectivity, mix weight),
``center_of_gravity.md|csv|json`` (one row per model and task), ``probe.png`` (accuracy per layer, one curve per
model and task; control dashed) and ``scalar_mix.png`` (the mix weights, center of gravity marked), and the
resolved ``settings.json``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import torch

from ptm_app.analysis.probe_tasks import PROBE_TASKS, ProbeTask, load_examples, probe_task
from ptm_app.analysis.probes import (ProbeSettings, Standardizer, accuracy, center_of_gravity, control_label,
                                     label_distribution, one_thread, probe_accuracy, train_scalar_mix,
                                     word_type)
from ptm_app.analysis.representations import Encoder, Examples, Features, cached_layers, load_encoder
from ptm_app.data.sources import prepared_dir
from ptm_app.paths import run_path, write_json

TaskName = Literal["brown_pos", "bbc", "wordnet_pairs"]
LAYER_COLUMNS = ["model", "task", "layer", "accuracy", "control", "selectivity", "mix_weight"]
GRAVITY_COLUMNS = ["model", "task", "layers", "center_of_gravity", "best_layer", "best_accuracy", "mix_accuracy",
                   "train_rows", "test_rows"]


def row_labels(examples: Examples, features: Features) -> list[str]:
    """The label of every feature row: the word's tag (token level) or the record's label."""
    if examples.level == "token":
        return [examples.labels[s][w] for s, w in zip(features.sentence.tolist(), features.word.tolist())]
    return [examples.labels[s] for s in features.sentence.tolist()]


def row_types(examples: Examples, features: Features) -> list[str]:
    return [word_type(examples.texts[s][w]) for s, w in zip(features.sentence.tolist(), features.word.tolist())]


def label_ids(labels: list[str], label_set: list[str]) -> torch.Tensor:
    index = {name: i for i, name in enumerate(label_set)}
    return torch.tensor([index.get(name, -1) for name in labels], dtype=torch.long)


def probe_model_task(encoder: Encoder, task: ProbeTask, layers: list[int], settings: ProbeSettings, *,
                     train_examples: Optional[int], test_examples: Optional[int], control: bool, scalar_mix: bool,
                     mix_l2: float, max_length: int, encode_batch_size: int, cache_dtype: str,
                     seed: int) -> tuple[list[dict], dict]:
    """Per-layer rows and the center-of-gravity row of one model on one task."""
    splits = {}
    for split, limit in (("train", train_examples), ("test", test_examples)):
        examples = load_examples(task, split, limit, seed)
        features = cached_layers(encoder, examples, max_length, encode_batch_size, cache_dtype)
        splits[split] = (examples, features)
    (train_ex, train_f), (test_ex, test_f) = splits["train"], splits["test"]
    train_labels, test_labels = row_labels(train_ex, train_f), row_labels(test_ex, test_f)
    label_set = sorted(set(train_labels))
    y_train, y_test = label_ids(train_labels, label_set), label_ids(test_labels, label_set)
    control_ids = None
    if control and task.level == "token":
        distribution = label_distribution(train_labels)
        control_ids = tuple(label_ids([control_label(t, distribution, seed) for t in row_types(ex, f)], label_set)
                            for ex, f in ((train_ex, train_f), (test_ex, test_f)))
    with one_thread():
        return _fit_layers(encoder.name, task, layers, settings, train_f, test_f, y_train, y_test, len(label_set),
                           control_ids, scalar_mix, mix_l2)


def _fit_layers(model_name: str, task: ProbeTask, layers: list[int], settings: ProbeSettings, train_f: Features,
                test_f: Features, y_train: torch.Tensor, y_test: torch.Tensor, classes: int,
                control_ids: Optional[tuple[torch.Tensor, torch.Tensor]], scalar_mix: bool,
                mix_l2: float = 0.0) -> tuple[list[dict], dict]:
    """One probe per layer (and one per layer on the control labels), then the scalar mix."""
    controlled = control_ids is not None
    c_train, c_test = control_ids if controlled else (None, None)
    from ptm_app.data.sources.fetch import progress

    rows = []
    for layer in progress(layers, f"{model_name}: {task.name} probes per layer"):
        x_train, x_test = train_f.layers[layer], test_f.layers[layer]
        acc = probe_accuracy(x_train, y_train, x_test, y_test, classes, settings)
        ctrl = probe_accuracy(x_train, c_train, x_test, c_test, classes, settings) if controlled else None
        rows.append({"model": model_name, "task": task.name, "layer": layer, "accuracy": acc, "control": ctrl,
                     "selectivity": acc - ctrl if controlled else None, "mix_weight": None})
    best = max(rows, key=lambda r: r["accuracy"])
    contiguous = layers == list(range(layers[0], layers[-1] + 1))
    gravity = {"model": model_name, "task": task.name,
               "layers": f"{layers[0]}..{layers[-1]}" if contiguous else ",".join(map(str, layers)),
               "best_layer": best["layer"], "best_accuracy": best["accuracy"],
               "center_of_gravity": None, "mix_accuracy": None,
               "train_rows": len(y_train), "test_rows": len(y_test)}
    if scalar_mix:
        scales = [Standardizer(train_f.layers[l]) for l in layers]
        weights, model = train_scalar_mix([s(train_f.layers[l]) for s, l in zip(scales, layers)], y_train,
                                          classes, settings, mix_l2)
        test_stack = torch.stack([s(test_f.layers[l]) for s, l in zip(scales, layers)])
        gravity.update(center_of_gravity=center_of_gravity(weights.tolist(), layers),
                       mix_accuracy=accuracy(model, test_stack, y_test))
        for row, w in zip(rows, weights.tolist()):
            row["mix_weight"] = w
    return rows, gravity


def draw_probe(rows: list[dict], gravity: list[dict]):
    """One panel per task: accuracy per layer, one solid curve per model, its control dashed, its center of
    gravity a dotted vertical line."""
    from ptm_app.analysis.figures import new_figure

    tasks = list(dict.fromkeys(r["task"] for r in rows))
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = new_figure(len(tasks))
    colours = {m: f"C{i % 10}" for i, m in enumerate(models)}
    for ax, task in zip(axes, tasks):
        for model in models:
            mine = [r for r in rows if r["task"] == task and r["model"] == model]
            if not mine:
                continue
            layers = [r["layer"] for r in mine]
            ax.plot(layers, [r["accuracy"] for r in mine], marker="o", color=colours[model], label=model)
            if mine[0]["control"] is not None:
                ax.plot(layers, [r["control"] for r in mine], linestyle="--", marker=".", color=colours[model],
                        label=f"{model} control")
            cog = next((g["center_of_gravity"] for g in gravity if g["task"] == task and g["model"] == model), None)
            if cog is not None:
                ax.axvline(cog, linestyle=":", color=colours[model], label=f"{model} center of gravity")
        ax.set_title(f"{task} ({PROBE_TASKS[task].level} level)")
        ax.set_xlabel("layer (0 = embeddings)")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def draw_mix(rows: list[dict]):
    """One panel per task: the scalar-mix weight of every layer, one curve per model."""
    from ptm_app.analysis.figures import new_figure

    rows = [r for r in rows if r["mix_weight"] is not None]
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    fig, axes = new_figure(max(1, len(tasks)))
    for ax, task in zip(axes, tasks):
        for model in dict.fromkeys(r["model"] for r in rows):
            mine = [r for r in rows if r["task"] == task and r["model"] == model]
            ax.plot([r["layer"] for r in mine], [r["mix_weight"] for r in mine], marker="o", label=model)
        ax.set_title(f"{task}: scalar mix weights")
        ax.set_xlabel("layer")
        ax.set_ylabel("s_l")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def probe(models: list[str] = ["minilm"], tasks: list[TaskName] = ["brown_pos", "bbc", "wordnet_pairs"],
          layers: Optional[list[int]] = None, probe: Literal["linear", "mlp"] = "linear", hidden_size: int = 256,
          optimizer: Literal["lbfgs", "adam"] = "lbfgs", steps: int = 100, lr: Optional[float] = None,
          weight_decay: float = 1e-4, batch_size: int = 512, control: bool = True, scalar_mix: bool = True,
          mix_l2: float = 0.0, train_examples: Optional[int] = 500, test_examples: Optional[int] = 200,
          max_length: int = 128, encode_batch_size: int = 32,
          cache_dtype: Literal["float32", "float16"] = "float32", seed: int = 0, run_name: str = "probe",
          output_dir: Optional[str] = None, readme: Optional[str] = None) -> Path:
    """Layer-wise probing of frozen backbones, with control tasks, scalar mix and center of gravity.

    Args:
        models: backbones: prepared names (minilm, smollm2), save_pretrained directories, run directories or .ckpt
            files.
        tasks: brown_pos (token level: the POS tag of each word, on its first sub-token), bbc (sentence level:
            article topic, mean-pooled tokens) and wordnet_pairs (pair level: gloss and word encoded together).
        layers: which layers to probe (0 = the embeddings); default all.
        probe: linear, or mlp (one hidden layer of hidden_size, ReLU).
        hidden_size: the MLP probe's hidden width.
        optimizer: lbfgs (full batch, steps = its iterations) or adam (minibatches of batch_size, steps = epochs).
        steps: L-BFGS iterations or Adam epochs per probe.
        lr: learning rate; default 1.0 for lbfgs, 1e-3 for adam.
        weight_decay: L2 penalty on the probe's weight matrices.
        batch_size: Adam's minibatch size.
        control: also train each token-level probe on the control task (word types mapped to random labels with
            the task's label distribution) and report selectivity.
        scalar_mix: learn ELMo scalar-mix weights over the layers jointly with one linear probe (same optimizer
            and steps as the probes) and report their center of gravity.
        mix_l2: ELMo's L2 penalty on the mix's pre-softmax weights (Peters et al. 2018 §3.2), which keeps the mix
            near the layer average unless the task pulls it away; 0 (default) = none, as Tenney et al. 2019a.
        train_examples: records sampled from the training split (sentences, articles or pairs); null = all.
        test_examples: records sampled from the test split; null = all.
        max_length: longest input in tokens, at most the backbone's position limit (longer texts are cut;
            cut-off words are not probed).
        encode_batch_size: texts per backbone pass.
        cache_dtype: how the cached representations are stored.
        seed: sampling, probe initialisation, minibatch order and control labels.
        run_name: output directory name under the runs root (checkpoints/).
        output_dir: output directory (overrides run_name).
        readme: also put the tables into this page (e.g. docs/analyse.md), between the lines
            ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``, NAME the output directory's name.
    """
    resolved = dict(locals())  # the settings, written next to the results
    from ptm_app.analysis.figures import save_png
    from ptm_app.analysis.tables import check_readme, show, write_table

    chosen = [probe_task(t) for t in tasks]
    for task in chosen:
        prepared_dir(task.name)  # one line saying how to prepare it, before any model is loaded
    settings = ProbeSettings(kind=probe, hidden_size=hidden_size, optimizer=optimizer, steps=steps, lr=lr,
                             weight_decay=weight_decay, batch_size=batch_size, seed=seed)
    out = Path(output_dir) if output_dir else run_path(run_name)
    check_readme(readme, out)
    rows, gravity = [], []
    for ref in models:
        encoder = load_encoder(ref)
        layer_ids = encoder.check_layers(layers)
        for task in chosen:
            task_rows, task_gravity = probe_model_task(
                encoder, task, layer_ids, settings, train_examples=train_examples, test_examples=test_examples,
                control=control, scalar_mix=scalar_mix, mix_l2=mix_l2, max_length=max_length,
                encode_batch_size=encode_batch_size, cache_dtype=cache_dtype, seed=seed)
            rows += task_rows
            gravity.append(task_gravity)
        del encoder
    write_json(out / "settings.json", resolved)
    layers_md = write_table(rows, LAYER_COLUMNS, out / "probe",
                            "Layer-wise probing: test accuracy, control, selectivity")
    md = write_table(gravity, GRAVITY_COLUMNS, out / "center_of_gravity", "Scalar mix center of gravity")
    save_png(draw_probe(rows, gravity), out / "probe.png")
    if scalar_mix:
        save_png(draw_mix(rows), out / "scalar_mix.png")
    show([md, layers_md], readme, out, out / "probe.png")
    return out
