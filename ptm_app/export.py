"""Export a ptm_app checkpoint as a transformers ``save_pretrained`` directory (+ tokenizer).

``AutoModelFor<head>.from_pretrained(output_dir)`` then gives the same outputs as the module's
``.backbone``.  No LightningModule is instantiated: the checkpoint is self-contained.
"""
from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from ptm_app.checkpoints import (BACKBONE_PREFIX, CKPT_KEY, as_file, backbone_state, read_checkpoint)
from ptm_app.errors import PtmError
from ptm_app.paths import atomic_dir, cache_root

def backbone_from_checkpoint(ckpt: dict):
    """Rebuild the plain transformers model stored in a checkpoint."""
    import transformers

    from ptm_app.backbones.build import from_config

    config = dict(ckpt["hyper_parameters"]["backbone_config"])
    hf_config = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    model = from_config(ckpt["ptm_app"]["head"], hf_config)
    missing, unexpected = model.load_state_dict(backbone_state(ckpt), strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    real_missing = [k for k in missing if k not in tied and not any(k.endswith(t) for t in tied)]
    if real_missing or unexpected:
        raise PtmError(f"checkpoint does not match its backbone: missing {real_missing[:3]}, unexpected {unexpected[:3]}")
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model.eval()


def delta_backbone_from_checkpoint(ckpt: dict):
    """A delta-tuned run: merge LoRA/IA3 into plain weights, or return (base, delta-tuned model) to save apart.
    Also a frozen-feature run whose checkpoint omits the backbone: the module rebuilds it from its source."""
    import importlib

    from ptm_app.adaptation.delta import merge_for_export

    module_path, _, name = ckpt[CKPT_KEY]["module"].rpartition(".")
    # the dict was read (and checked) once: Lightning gets it as an in-memory file, consolidated shards included
    module = getattr(importlib.import_module(module_path), name).load_from_checkpoint(as_file(ckpt), map_location="cpu",
                                                                                      weights_only=True)
    tuned = module.backbone.eval()
    merged = merge_for_export(tuned)
    return (merged, None) if merged is not None else (None, (module.delta, tuned))


def export_checkpoint(ckpt_path: str | Path, output_dir: str | Path, trust: bool = False) -> Path:
    """Write ``output_dir`` atomically: model weights + config, tokenizer files, provenance.

    Delta-tuned runs: LoRA/IA3 are merged into plain weights; adapters and prompt methods cannot be
    merged, so the directory holds the unchanged base model plus ``delta.safetensors`` and
    ``delta_config.json`` (load with ``adaptation.delta.load_delta``).
    Weights the module keeps outside the transformers model (a soft prompt, a scalar mix and feature head,
    multitask heads) go to ``module_weights.safetensors`` with ``module_config.json``; ``load_exported_module``
    rebuilds the whole module from the directory."""
    ckpt = read_checkpoint(ckpt_path, trust)
    delta = None
    if ckpt["hyper_parameters"].get("delta") or ckpt["ptm_app"].get("delta_only"):  # base rebuilt by the module
        model, delta = delta_backbone_from_checkpoint(ckpt)
    else:
        model = backbone_from_checkpoint(ckpt)
    output_dir = Path(output_dir)
    with atomic_dir(output_dir) as tmp:
        if delta is not None:
            from ptm_app.adaptation.delta import save_delta, save_base

            spec, tuned = delta
            save_delta(tuned, spec, tmp)
            save_base(tuned, tmp)
        else:
            model.save_pretrained(tmp)
        for name, text in ckpt["ptm_app"].get("tokenizer", {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
        save_module_weights(ckpt, tmp)
        provenance = {"checkpoint": str(Path(ckpt_path).resolve()), "head": ckpt["ptm_app"]["head"],
                      "module": ckpt["ptm_app"]["module"], "global_step": ckpt.get("global_step"),
                      "epoch": ckpt.get("epoch")}
        (tmp / "ptm_app_export.json").write_text(json.dumps(provenance, indent=2))
    return output_dir


MODULE_WEIGHTS, MODULE_CONFIG = "module_weights.safetensors", "module_config.json"


def save_module_weights(ckpt: dict, directory: Path) -> bool:
    """Write the checkpoint's non-backbone weights and the module's class + hyper-parameters, if it has any."""
    extra, aliases, seen = {}, {}, {}
    for key, value in ckpt["state_dict"].items():
        if key.startswith(BACKBONE_PREFIX):
            continue
        storage = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape))
        if storage in seen:  # a tied tensor (ELECTRA's generator head = its word table): stored once
            aliases[key] = seen[storage]
        else:
            seen[storage], extra[key] = key, value.contiguous()
    if not extra:
        return False
    from safetensors.torch import save_file

    hparams = {k: v for k, v in ckpt["hyper_parameters"].items() if k not in ("backbone", "backbone_config",
                                                                              "init_from", "_instantiator")}
    save_file(extra, str(directory / MODULE_WEIGHTS))
    (directory / MODULE_CONFIG).write_text(json.dumps({"module": ckpt["ptm_app"]["module"], "hparams": hparams,
                                                       "aliases": aliases}, indent=2, default=str))
    return True


def load_exported_module(directory: str | Path):
    """The LightningModule of an exported run, rebuilt from the directory alone: its backbone from the saved
    transformers model, its own weights (soft prompt, heads ...) from ``module_weights.safetensors``."""
    import importlib
    import inspect

    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    directory = Path(directory)
    if not (directory / MODULE_CONFIG).is_file():
        raise PtmError(f"{directory} has no {MODULE_CONFIG}: this export is a plain transformers model; "
                       f"load it with AutoModel*.from_pretrained")
    spec = json.loads((directory / MODULE_CONFIG).read_text())
    module_path, _, name = spec["module"].rpartition(".")
    cls = getattr(importlib.import_module(module_path), name)
    accepted = set(inspect.signature(cls).parameters)  # drops CLI bookkeeping such as _class_path
    hparams = {k: v for k, v in spec["hparams"].items() if k in accepted}
    from ptm_app.adaptation.delta import CONFIG_FILE, DELTA_FILE, load_delta_state_dict

    unmerged = (directory / CONFIG_FILE).is_file()  # adapters / prompts: base + delta.safetensors
    if not unmerged:
        hparams.pop("delta", None)  # LoRA / IA3 / BitFit are already in the saved weights
    module = cls(backbone=str(directory), **hparams)
    module.tokenizer = AutoTokenizer.from_pretrained(directory)
    module.configure_model()
    if unmerged and getattr(module, "delta", None) is not None:  # the module re-applied the same spec
        load_delta_state_dict(module.backbone, load_file(str(directory / DELTA_FILE)))
    weights = load_file(str(directory / MODULE_WEIGHTS))
    weights.update({alias: weights[key] for alias, key in spec.get("aliases", {}).items()})
    missing, unexpected = module.load_state_dict(weights, strict=False)
    own = [k for k in missing if not k.startswith(BACKBONE_PREFIX)]
    if own or unexpected:
        raise PtmError(f"{directory}: module weights do not fit {name} (missing {own[:3]}, unexpected {unexpected[:3]})")
    return module.eval()


def exported_cache_dir(ckpt_path: str | Path) -> Path:
    """Export a checkpoint once into the cache (for ``backbone: path/to/run.ckpt``) and return the dir."""
    path = Path(ckpt_path).resolve()
    stat = path.stat()
    key = hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache_root() / "exported" / key
    if not (target / "config.json").exists():
        export_checkpoint(path, target)
    return target


def export_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="main.py export", description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt_path", required=True, help="a .ckpt file or a run directory (uses its last.ckpt)")
    parser.add_argument("--output_dir", required=True, help="where to write the save_pretrained directory")
    parser.add_argument("--trust_checkpoint", action="store_true",
                        help="read a checkpoint you made yourself even if it holds more than plain data (runs its code)")
    args = parser.parse_args(argv)
    out = export_checkpoint(args.ckpt_path, args.output_dir, trust=args.trust_checkpoint)
    print(f"exported {args.ckpt_path} -> {out}")
    return 0
