"""Export a ptm_app checkpoint as a transformers ``save_pretrained`` directory (+ tokenizer).

The Auto class of its model class (``AutoModelFor<...>.from_pretrained(output_dir)``) then gives the same outputs as
the module's ``.backbone``.  No LightningModule is instantiated: the checkpoint is self-contained.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

import yaml

from ptm_app.backbones.from_checkpoint import checkpoint_backbone
from ptm_app.checkpoint_io.reading import BACKBONE_PREFIX, CKPT_KEY, read_checkpoint, trusted, trusting, write_tokenizer_files
from ptm_app.errors import PtmError
from ptm_app.inference.model_card import model_card, run_directory
from ptm_app.paths import atomic_dir

EXPORT_INFO = "ptm_app_export.json"  # the model class and module class of the run, its data settings and precision


def export_checkpoint(ckpt_path: str | Path, output_dir: str | Path, trust: Optional[bool] = None,
                      also: Optional[Callable[[Path], object]] = None) -> Path:
    """Write ``output_dir`` atomically: model weights + config, tokenizer files, provenance, a model card
    (``README.md``, ``model_card.model_card``).

    Delta-tuned runs: LoRA/IA3 are merged into plain weights; adapters and prompt methods cannot be
    merged, so the directory holds the unchanged base model plus ``delta.safetensors`` and
    ``delta_config.json`` (load with ``backbones.delta.load_delta``).
    Weights the module keeps outside the transformers model (a scalar mix and feature head, multitask heads,
    K-Adapter's switchable adapters and head) go to ``module_weights.safetensors`` with ``module_config.json``;
    ``load_exported_module`` rebuilds the whole module from the directory.  ``also(directory)`` adds more files
    before the directory appears (``--format onnx``: ``inference.onnx_export.write_onnx``).  ``trust``
    (``--trust_checkpoint``) covers every checkpoint the export reads (``checkpoint_io.reading.trusting``)."""
    with trusting(trust):
        return _export(ckpt_path, Path(output_dir), also)


def _export(ckpt_path: str | Path, output_dir: Path, also: Optional[Callable[[Path], object]]) -> Path:
    ckpt = read_checkpoint(ckpt_path)
    model, delta = checkpoint_backbone(ckpt)
    with atomic_dir(output_dir) as tmp:
        if delta is not None:
            from ptm_app.backbones.delta import save_delta, save_base

            spec, tuned = delta
            if spec is not None:
                save_delta(tuned, spec, tmp)
            elif not ckpt[CKPT_KEY].get("module_backbone_keys"):
                raise PtmError(f"{ckpt_path}: its backbone carries adapters that no delta spec describes; "
                               f"export the run that trained them")
            save_base(tuned, tmp)  # adapters the module owns (K-Adapter) go to its module weights
        else:
            model.save_pretrained(tmp)
        write_tokenizer_files(ckpt[CKPT_KEY].get("tokenizer") or {}, tmp, ckpt_path)
        save_module_weights(ckpt, tmp)
        provenance = {"checkpoint": str(Path(ckpt_path).resolve()), "model_class": ckpt[CKPT_KEY]["model_class"],
                      "module": ckpt[CKPT_KEY]["module"], "global_step": ckpt.get("global_step"),
                      "epoch": ckpt.get("epoch"), "data": exported_data_args(ckpt_path),
                      "precision": recorded_precision(ckpt_path)}
        (tmp / EXPORT_INFO).write_text(json.dumps(provenance, indent=2))
        (tmp / "README.md").write_text(model_card(ckpt, ckpt_path, output_dir.name), encoding="utf-8")
        if also is not None:
            also(tmp)
    return output_dir


def exported_data_args(ckpt_path) -> dict:
    """The run's plain data settings (lengths, windows, fields: JSON scalars only), so ``predict`` on the export
    cuts and windows inputs as the run did."""
    return {k: v for k, v in recorded_data_args(ckpt_path).items() if isinstance(v, (str, int, float, bool))}


def recorded_data_args(where) -> dict:
    """The run's data settings for a checkpoint / run directory, or an export's record of them ({} if none)."""
    run = run_directory(where)
    config = run / "config.yaml" if run is not None else None
    if config is not None and config.is_file():
        data = yaml.safe_load(config.read_text()).get("data") or {}
        return dict(data.get("init_args") or {})
    info = Path(where) / EXPORT_INFO
    if info.is_file():
        return dict(json.loads(info.read_text()).get("data") or {})
    return {}


def recorded_precision(where) -> Optional[str]:
    """The run's ``trainer.precision`` (its ``config.yaml``), or the one an export recorded (None if neither)."""
    run = run_directory(where)
    config = run / "config.yaml" if run is not None else None
    if config is not None and config.is_file():
        value = (yaml.safe_load(config.read_text()).get("trainer") or {}).get("precision")
        return None if value is None else str(value)
    info = Path(where) / EXPORT_INFO
    if info.is_file():
        return json.loads(info.read_text()).get("precision")
    return None


MODULE_WEIGHTS, MODULE_CONFIG = "module_weights.safetensors", "module_config.json"


def save_module_weights(ckpt: dict, directory: Path) -> bool:
    """Write the checkpoint's non-backbone weights and the module's class + hyper-parameters, if it has any weights,
    a delta that only the module's settings describe (PET's ``soft_prompt_tokens``: the module rebuilds it) or
    settings that inference needs (``module_settings``: a translation model's language tokens)."""
    extra, aliases, seen = {}, {}, {}
    training_only = tuple(ckpt[CKPT_KEY].get("training_only", ()))  # e.g. a distillation projection
    owned = tuple(ckpt[CKPT_KEY].get("module_backbone_keys", ()))  # backbone parts the module owns (K-Adapter)
    for key, value in ckpt["state_dict"].items():
        if (key.startswith(BACKBONE_PREFIX) and not (owned and key.startswith(owned))) \
                or (training_only and key.startswith(training_only)):
            continue
        storage = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape))
        if storage in seen:  # a tied tensor (ELECTRA's generator head = its word table): stored once
            aliases[key] = seen[storage]
        else:
            seen[storage], extra[key] = key, value.contiguous()
    if not extra and not ckpt[CKPT_KEY].get("delta") and not ckpt[CKPT_KEY].get("module_settings"):
        return False  # module_settings: settings inference needs (a translation model's languages)
    from safetensors.torch import save_file

    hparams = {k: v for k, v in ckpt["hyper_parameters"].items() if k not in ("backbone", "backbone_config",
                                                                              "init_from", "_instantiator")}
    hparams.update(ckpt[CKPT_KEY].get("export_hparams", {}))  # settings the export made part of the weights
    if extra:
        save_file(extra, str(directory / MODULE_WEIGHTS))
    (directory / MODULE_CONFIG).write_text(json.dumps({"module": ckpt[CKPT_KEY]["module"], "hparams": hparams,
                                                       "aliases": aliases}, indent=2, default=str))
    return True


def load_exported_module(directory: str | Path, trust: Optional[bool] = None):
    """The LightningModule of an exported run, rebuilt from the directory alone: its backbone from the saved
    transformers model (+ an unmerged delta: adapters, a soft prompt), its own weights (heads, a scalar mix ...) from
    ``module_weights.safetensors``.  The module class is one of ptm_app's (``module_classes``) unless ``trust``."""
    import inspect

    from safetensors.torch import load_file

    from ptm_app.data.sources.references import load_tokenizer_dir
    from ptm_app.checkpoint_io.module_classes import module_class

    directory = Path(directory)
    if not (directory / MODULE_CONFIG).is_file():
        raise PtmError(f"{directory} has no {MODULE_CONFIG}: this export is a plain transformers model; "
                       f"load it with AutoModel*.from_pretrained")
    try:
        spec = json.loads((directory / MODULE_CONFIG).read_text())
        name, hparams = spec["module"], dict(spec["hparams"])
    except (ValueError, KeyError, TypeError) as exc:
        raise PtmError(f"{directory / MODULE_CONFIG} is damaged ({type(exc).__name__}: {exc}); export the run "
                       f"again") from None
    cls = module_class(name, directory / MODULE_CONFIG, trusted(trust))
    stored = hparams
    hparams = cls.upgrade_checkpoint(dict(stored)) if hasattr(cls, "upgrade_checkpoint") else hparams
    accepted = set(inspect.signature(cls).parameters)  # drops CLI bookkeeping such as _class_path
    hparams = {k: v for k, v in hparams.items() if k in accepted}
    from ptm_app.backbones.delta import CONFIG_FILE, DELTA_FILE, load_delta_state_dict

    unmerged = (directory / CONFIG_FILE).is_file()  # adapters / prompts: base + delta.safetensors
    if not unmerged:
        hparams.pop("delta", None)  # LoRA / IA3 / BitFit are already in the saved weights
    module = cls(backbone=str(directory), **hparams)
    module.tokenizer = load_tokenizer_dir(directory)
    module.build()
    if unmerged and getattr(module, "delta", None) is not None:  # the module re-applied the same spec
        load_delta_state_dict(module.backbone, load_file(str(directory / DELTA_FILE)))
    weights = load_file(str(directory / MODULE_WEIGHTS)) if (directory / MODULE_WEIGHTS).is_file() else {}
    weights.update({alias: weights[key] for alias, key in spec.get("aliases", {}).items()})
    if hasattr(cls, "upgrade_checkpoint"):  # weights named by an earlier version
        cls.upgrade_checkpoint(dict(stored), weights)
    missing, unexpected = module.load_state_dict(weights, strict=False)
    own = [k for k in missing if not k.startswith(BACKBONE_PREFIX)]
    if own or unexpected:
        raise PtmError(f"{directory}: module weights do not fit {cls.__name__} (missing {own[:3]}, "
                       f"unexpected {unexpected[:3]})")
    return module.eval()


def check_online(repo: str) -> None:
    """Refuse ``--push_to_hub`` in one line when the hub is switched off (docs/design.md principle 6)."""
    import os

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise PtmError(f"--push_to_hub {repo}: HF_HUB_OFFLINE is set, so nothing can be uploaded; export without "
                       f"--push_to_hub, then upload the directory from a machine online (huggingface-cli upload)")


def push_to_hub(directory: Path, repo: str) -> None:
    """Upload an export directory (model card included) to the Hub repository ``repo``, creating it if needed."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi()
    try:
        api.create_repo(repo, exist_ok=True)
        info = api.upload_folder(folder_path=str(directory), repo_id=repo, commit_message="Upload from ptm_app export")
    except (HfHubHTTPError, OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PtmError(f"--push_to_hub {repo}: the upload failed ({first}); check the network and huggingface-cli "
                       f"login; the export itself is in {directory}") from None
    print(f"pushed {directory} -> {getattr(info, 'commit_url', repo)}")
