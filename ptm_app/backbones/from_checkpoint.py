"""The plain transformers model inside a ptm_app checkpoint: for ``export`` and for stage chaining
(``backbone: run_dir_or.ckpt``, a later run starting from an earlier one's weights).

A full checkpoint holds the resolved backbone config and every weight, so the model is rebuilt from them alone.
A delta-tuned or frozen-feature checkpoint holds only what trained (its frozen base is rebuilt from its source):
the module class named in the checkpoint (one of ptm_app's: ``module_classes``) rebuilds it, and LoRA / IA3 are then
merged into plain weights; adapters and soft prompts cannot be, and come back as ``(spec, tuned model)`` for
``export`` to save apart.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from ptm_app.backbones.model_classes import from_config
from ptm_app.backbones.sense_input import fold_sense_input
from ptm_app.checkpoint_io.reading import CKPT_KEY, as_file, backbone_state, read_checkpoint, trusted, write_tokenizer_files
from ptm_app.errors import PtmError
from ptm_app.paths import atomic_dir, cache_root


def is_checkpoint(where: str | Path) -> bool:
    """A ptm_app ``.ckpt`` (file or sharded directory) or run directory, not a ``save_pretrained`` directory."""
    path = Path(where)
    return str(where).endswith(".ckpt") or ((path / "checkpoints").is_dir() and not (path / "config.json").exists())


def rebuild_backbone(ckpt: dict) -> nn.Module:
    """The transformers model of a full checkpoint, from its resolved config and weights."""
    import transformers

    config = dict(ckpt["hyper_parameters"]["backbone_config"])
    hf_config = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    model = from_config(ckpt[CKPT_KEY]["model_class"], hf_config)
    own = model.state_dict()
    state = {k: v.reshape(own[k].shape) if k in own and v.shape != own[k].shape and v.numel() == own[k].numel() == 1
             else v for k, v in backbone_state(ckpt).items()}  # a one-element parameter kept as [1] for FSDP2
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    real_missing = [k for k in missing if k not in tied and not any(k.endswith(t) for t in tied)]
    if real_missing or unexpected:
        raise PtmError(f"checkpoint does not match its backbone: missing {real_missing[:3]}, unexpected {unexpected[:3]}")
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    fold = ckpt[CKPT_KEY].get("fold_sense_input")
    if fold:
        fold_sense_input(model, ckpt["state_dict"][fold["senses"]], ckpt["state_dict"][fold["matrix"]].float())
    return model.eval()


def module_from_checkpoint(ckpt: dict, trust: Optional[bool] = None, source: object = "the checkpoint") -> nn.Module:
    """The module class named in the checkpoint (looked up among ptm_app's: ``module_classes.module_class``)
    rebuilds its frozen base from the source and loads what trained (the dict was read and checked once: Lightning
    gets it as an in-memory file, consolidated shards included)."""
    from ptm_app.checkpoint_io.module_classes import module_class

    trust = trusted(trust)
    cls = module_class(ckpt[CKPT_KEY].get("module"), source, trust)
    return cls.load_from_checkpoint(as_file(ckpt), map_location="cpu", weights_only=not trust)


def checkpoint_backbone(ckpt: dict) -> tuple[Optional[nn.Module], Optional[tuple]]:
    """``(model, None)`` with any delta merged in, or ``(None, (delta spec, tuned model))`` for a delta that
    cannot be merged (adapters, PALs, prefix / prompt / P-tuning)."""
    from ptm_app.backbones.delta import as_delta_spec, merge_for_export

    delta = checkpoint_delta(ckpt)
    if not (delta or ckpt[CKPT_KEY].get("delta_only")):
        return rebuild_backbone(ckpt), None
    module = module_from_checkpoint(ckpt)
    tuned = module.backbone.eval()
    merged = merge_for_export(tuned)
    return (merged, None) if merged is not None else (None, (as_delta_spec(delta), tuned))


def checkpoint_delta(ckpt: dict) -> Optional[dict]:
    """The checkpoint's delta spec (as a dict): the module's ``delta`` setting, or one derived from another setting
    (PET's ``soft_prompt_tokens``), which ``adaptation.policies.Delta`` keeps in the ptm_app record."""
    return ckpt["hyper_parameters"].get("delta") or ckpt[CKPT_KEY].get("delta")


def checkpoint_backbone_dir(ckpt_path: str | Path) -> Path:
    """The checkpoint's backbone as a ``save_pretrained`` directory (+ its tokenizer), written once into the cache
    (keyed by path, size and time), for ``from_pretrained``."""
    path = Path(ckpt_path).resolve()
    stat = path.stat()
    key = hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache_root() / "exported" / key
    if (target / "config.json").exists():
        return target
    ckpt = read_checkpoint(path)
    with torch.random.fork_rng(devices=[]):  # rebuilding the model draws a random init: the first use of a run
        model, delta = checkpoint_backbone(ckpt)  # must leave the RNG where the cached ones do (same runs, same draws)
    if model is None:
        raise PtmError(f"{ckpt_path} holds a {delta[0].method} delta, which cannot be merged into the weights; "
                       f"start from it with init_from (or export it and use backbones.delta.load_delta)")
    with atomic_dir(target) as tmp:
        model.save_pretrained(tmp)
        write_tokenizer_files(ckpt[CKPT_KEY].get("tokenizer") or {}, tmp, ckpt_path)
    return target
