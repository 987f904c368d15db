"""Stage chaining: start a run from an earlier stage's weights, optionally only some sub-modules and
optionally frozen (ULMFiT's 3 stages, Howard & Ruder 2018 §3; two-stage fine-tuning, Qiu et al. 2020 §5.2).

This is not resume (docs/design.md principle 4): only weights are taken, never the optimiser, schedule, step
or data position, and the new run has its own head and hyper-parameters.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Optional

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from ptm_app.errors import PtmError
from ptm_app.checkpoint_io.reading import backbone_state, read_checkpoint
from ptm_app.paths import runs_root


@dataclass
class InitFrom:
    """Where the weights come from and which ones to take.

    Args:
        path: a ptm_app ``.ckpt``, a run directory (its ``checkpoints/last.ckpt``) or a ``save_pretrained``
            directory; a relative path that does not exist is looked up under the runs directory.
        modules: prefixes of the backbone's ``state_dict`` keys to load (``["bert.embeddings", "bert.encoder"]``);
            None = every key whose name and shape match.
        freeze: prefixes of the backbone's parameter names to freeze (``requires_grad=False``) for the whole run.
        strict: fail unless every selected backbone tensor is loaded.
    """

    path: str
    modules: Optional[list[str]] = None
    freeze: Optional[list[str]] = None
    strict: bool = False


def as_init_from(value) -> Optional[InitFrom]:
    if value is None or isinstance(value, InitFrom):
        return value
    return InitFrom(**(asdict(value) if is_dataclass(value) else value))


def _under(key: str, prefixes: Optional[list[str]]) -> bool:
    return prefixes is None or any(key == p or key.startswith(p.rstrip(".") + ".") for p in prefixes)


def resolve_path(path: str) -> Path:
    where = Path(path).expanduser()
    if not where.exists() and not where.is_absolute() and (runs_root() / where).exists():
        where = runs_root() / where
    if not where.exists():
        raise PtmError(f"init_from.path '{path}' not found (nor under the runs directory {runs_root()}); "
                       f"give a .ckpt, a run directory or a save_pretrained directory")
    return where


def source_state_dict(path: str) -> dict[str, torch.Tensor]:
    """The backbone weights stored at ``path`` (a checkpoint's ``backbone.*`` keys, prefix removed)."""
    where = resolve_path(path)
    if where.is_dir() and (where / "config.json").is_file():
        return _pretrained_state_dict(where)
    return backbone_state(read_checkpoint(where))


def _pretrained_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {k: v for shard in shards for k, v in load_file(directory / shard).items()}
    if (directory / "model.safetensors").is_file():
        return load_file(directory / "model.safetensors")
    if (directory / "pytorch_model.bin").is_file():
        return torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise PtmError(f"init_from.path {directory} has no model.safetensors or pytorch_model.bin")


def _match_keys(source: dict[str, torch.Tensor], target: nn.Module) -> dict[str, torch.Tensor]:
    """Source tensors keyed by target names; bare encoders and models with heads differ by ``base_model_prefix``."""
    names = set(target.state_dict())
    prefix = getattr(target, "base_model_prefix", "")
    matched = {}
    for key, value in source.items():
        candidates = (key, f"{prefix}.{key}", key.removeprefix(f"{prefix}.")) if prefix else (key,)
        name = next((c for c in candidates if c in names), None)
        if name is not None:
            matched[name] = value
    return matched


def freeze_prefixes(model: nn.Module, prefixes: Optional[list[str]]) -> int:
    """Set ``requires_grad=False`` on the parameters under ``prefixes``; returns how many."""
    if not prefixes:
        return 0
    frozen = 0
    for prefix in prefixes:
        params = [p for name, p in model.named_parameters() if _under(name, [prefix])]
        if not params:
            raise PtmError(f"init_from.freeze: '{prefix}' matches no parameter of the backbone "
                           f"(e.g. {next(iter(dict(model.named_parameters())), '')!r})")
        for p in params:
            p.requires_grad_(False)
        frozen += len(params)
    return frozen


def apply_init_from(module_or_model: nn.Module, spec: InitFrom) -> dict[str, int]:
    """Load the matching weights of ``spec.path`` into the backbone (shape-checked), then freeze ``spec.freeze``.

    Returns the counts ``loaded`` (tensors), ``skipped`` (same name, other shape) and ``fresh`` (selected
    backbone tensors left at their initialisation).
    """
    spec = as_init_from(spec)
    backbone = getattr(module_or_model, "backbone", None)
    target = backbone if backbone is not None else module_or_model
    state = target.state_dict()
    source = _match_keys(source_state_dict(spec.path), target)
    selected = [k for k in state if _under(k, spec.modules)]
    load = {k: source[k] for k in selected if k in source and source[k].shape == state[k].shape}
    skipped = [k for k in selected if k in source and k not in load]
    loaded_storage = {state[k].data_ptr() for k in load}  # tied weights are loaded through their twin
    fresh = [k for k in selected if k not in source and state[k].data_ptr() not in loaded_storage]
    for prefix in spec.modules or []:
        if not any(_under(k, [prefix]) for k in load):
            raise PtmError(f"init_from.modules: nothing under '{prefix}' was loaded from {spec.path} "
                           f"(backbone keys look like {next(iter(state), '')!r})")
    if not load:
        raise PtmError(f"init_from: no weight of {spec.path} matches the backbone by name and shape")
    if spec.strict and (skipped or fresh):
        raise PtmError(f"init_from.strict: {len(skipped)} shape mismatches and {len(fresh)} tensors not in "
                       f"{spec.path}, e.g. {(skipped + fresh)[0]}")
    target.load_state_dict(load, strict=False)
    frozen = freeze_prefixes(target, spec.freeze)
    rank_zero_info(f"init_from {spec.path}: loaded {len(load)} tensors, skipped {len(skipped)} (shape), "
                   f"{len(fresh)} left fresh, froze {frozen} parameters")
    return {"loaded": len(load), "skipped": len(skipped), "fresh": len(fresh)}
