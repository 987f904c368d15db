"""The model card (``README.md``) every ``export`` writes: what the model is, where its weights and data come from,
how it was trained, how it scored and what it is for (Mitchell et al. 2019, "Model Cards for Model Reporting",
§4: model details, intended use, training data, metrics, caveats).

Every fact comes from a file, never typed: the checkpoint (module class, model class, backbone config, step), the run's
``config.yaml`` (the resolved config) and ``summary.json`` (style, data, parameter counts, metrics), and the
prepared sets' ``manifest.json`` (description, licence, origin of the base model and the data).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import yaml

from ptm_app.backbones.model_classes import MODEL_CLASSES, auto_class_name
from ptm_app.checkpoint_io.reading import CKPT_KEY
from ptm_app.data.sources import MANIFEST, SOURCES
from ptm_app.paths import data_root



def intended_use(own: dict, hparams: dict) -> tuple[str, Optional[str]]:
    """What the model is for and its Hub pipeline tag: its task kind's (``task_kinds.registry``; the kind the
    checkpoint records, else the one its model class and problem type serve), else its model class's
    (``backbones.model_classes.MODEL_CLASSES``: language models, encoders)."""
    from ptm_app.task_kinds.registry import kind_of_model_class, task_kind

    name = own["model_class"]
    recorded = own.get("task_kind")
    problem = (hparams.get("backbone_config") or {}).get("problem_type")
    kind = task_kind(recorded, "the checkpoint") if recorded else kind_of_model_class(name, problem)
    model = MODEL_CLASSES.get(name)
    use = (kind.intended_use if kind is not None else None) or (model.use if model is not None else None) or ""
    pipeline = (kind.pipeline_tag if kind is not None else None) or (model.pipeline_tag if model is not None else None)
    return use, pipeline


def run_directory(ckpt_path: str | Path) -> Optional[Path]:
    """The run directory a checkpoint reference belongs to (``<run>/checkpoints/<name>.ckpt``), if any."""
    path = Path(ckpt_path).resolve()
    if (path / "checkpoints").is_dir():
        return path
    if path.parent.name == "checkpoints":
        return path.parent.parent
    return None


def prepared_manifest(name: Optional[str]) -> Optional[dict]:
    """The manifest of a prepared source name, or None (a path, a run, an unprepared name)."""
    if not name or name not in SOURCES:
        return None
    path = data_root() / name / MANIFEST
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, ValueError):
        return None


def _origin(manifest: dict) -> str:
    source = manifest.get("source") or {}
    if not isinstance(source, dict) or not source.get("package"):
        return ""
    version = f" {source['version']}" if source.get("version") else ""
    return f"; fetched from the {source.get('registry', '')} package `{source['package']}`{version}"


def _described(name: str, manifest: Optional[dict]) -> str:
    if manifest is None:
        return f"`{name}`"
    return (f"`{name}`: {manifest.get('description', '').strip()} Licence: {manifest.get('licence', 'not recorded')}"
            f"{_origin(manifest)}.")


def _metrics_table(metrics: dict) -> list[str]:
    shown = {k: v for k, v in sorted(metrics.items()) if not k.startswith("throughput/")}
    if not shown:
        return ["No metrics were recorded (the run has no `summary.json` metrics)."]
    rows = ["| metric | value |", "|---|---|"]
    rows += [f"| `{k}` | {v:.4f} |" if isinstance(v, float) else f"| `{k}` | {v} |" for k, v in shown.items()]
    return rows


def model_card(ckpt: dict, ckpt_path: str | Path, name: str) -> str:
    """The card's Markdown for the checkpoint ``ckpt`` read from ``ckpt_path``, exported as ``name``."""
    own = ckpt[CKPT_KEY]
    hparams = ckpt.get("hyper_parameters", {})
    model_class, module = own["model_class"], own["module"].rpartition(".")[2]
    run = run_directory(ckpt_path)
    summary = json.loads((run / "summary.json").read_text()) if run and (run / "summary.json").is_file() else {}
    config_text = (run / "config.yaml").read_text() if run and (run / "config.yaml").is_file() else None
    config = yaml.safe_load(config_text) if config_text else {}
    backbone_config = hparams.get("backbone_config") or {}
    model_type = backbone_config.get("model_type", "unknown")
    use, pipeline = intended_use(own, hparams)
    params = summary.get("total_params")

    lines = ["---", "library_name: transformers", "tags: [ptm_app]"]
    lines += [f"pipeline_tag: {pipeline}"] if pipeline else []
    lines += ["---", "", f"# {name}", ""]
    size = f", {params:,} parameters" if params else ""
    lines += [f"A `{model_type}` model of model class `{model_class}` (`{auto_class_name(model_class, model_class)}`"
              f"{size}), trained by ptm_app's "
              f"`{module}` ({summary.get('style', module)}) for {ckpt.get('global_step', '?')} steps "
              f"(epoch {ckpt.get('epoch', '?')}). It is for {use}.", ""]

    lines += ["## Base model", ""]
    source = own.get("backbone_source")
    if source:
        lines += [f"Started from {_described(str(source), prepared_manifest(str(source)))}", ""]
    else:
        lines += ["Trained from scratch: random initial weights built from the configuration below.", ""]

    lines += ["## Training data", ""]
    data = summary.get("data") or ((config.get("data") or {}).get("init_args") or {}).get("source")
    parts = str(data).split("+") if data else []
    lines += [f"- {_described(part, prepared_manifest(part))}" for part in parts] or ["Not recorded."]
    lines += [""]

    lines += ["## Objective or adaptation", ""]
    lines += [f"- module: `{own['module']}`", f"- style: {summary.get('style', module)}"]
    if hparams.get("delta"):
        lines += [f"- delta: `{json.dumps(hparams['delta'], default=str)}`"]
    if "trainable_params" in summary:
        lines += [f"- trained parameters: {summary['trainable_params']:,} of {summary['total_params']:,} "
                  f"({summary['trainable_percent']}%)"]
    lines += [""]

    lines += ["## Metrics", "", "From the run's `summary.json` (the latest value of each metric the run logged):", ""]
    lines += _metrics_table(summary.get("metrics") or {})
    lines += [""]

    lines += ["## Intended use and limits", ""]
    lines += [f"- Intended for {use}, on text like its training data; it has seen nothing else."]
    lines += ["- The metrics above are measured on the run's own validation / test splits only; they say nothing of "
              "other domains, languages or of fairness, and a short run's numbers are not a benchmark."]
    lines += ["- Licences: the base model's and the data's (above) apply to this model as well."]
    lines += ["- Use: `python main.py embed|generate|predict --ckpt_path <this directory>`, or "
              f"`transformers.{auto_class_name(model_class)}.from_pretrained(<this directory>)` (with "
              "`inference.export.load_exported_module` when `module_config.json` is present)."]
    lines += [""]

    lines += ["## Configuration", ""]
    if config_text:
        lines += ["The run's resolved `config.yaml`:", "", "```yaml", config_text.rstrip(), "```"]
    else:
        lines += ["The backbone configuration (no run directory was found beside the checkpoint):", "", "```json",
                  json.dumps(backbone_config, indent=2, sort_keys=True, default=str), "```"]
    return "\n".join(lines) + "\n"
