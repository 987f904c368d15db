"""Build or load a plain transformers model as a given model class (backbones are plain transformers models:
export is ``save_pretrained``, reuse is ``from_pretrained``).

From scratch: ``backbone_config`` is a transformers config dict with a ``model_type``.
Pretrained: a prepared name (``minilm``), a local ``save_pretrained`` directory, or a hub id;
``backbone_config`` then holds overrides (e.g. dropout).

``backbone_config.attn_implementation`` picks the attention kernel in both cases (transformers 5 takes it as a
config field and a ``from_pretrained`` argument): ``sdpa`` (``torch.nn.functional.scaled_dot_product_attention``,
transformers' default where the model supports it, else ``eager``), ``eager`` (the model's own matmul-softmax-matmul:
the one that can return attention weights), ``flex_attention`` or ``flash_attention_2/3/4`` (CUDA + the
flash-attn package) where the model declares them (``attention_choices``).
"""
from __future__ import annotations

import contextlib

import difflib
from typing import Any, Iterator, Optional

import transformers
from huggingface_hub.errors import StrictDataclassError

from ptm_app.backbones.from_checkpoint import checkpoint_backbone_dir, is_checkpoint
from ptm_app.backbones.model_classes import MODEL_CLASSES, auto_class, from_config, load_pruned  # noqa: F401
from ptm_app.data.sources.references import REMOTE_CODE, load_error, resolve_pretrained
from ptm_app.errors import PtmError

def build_backbone(model_class: str, pretrained: Optional[str], config: Optional[dict], **updates: Any):
    """Return a ``PreTrainedModel`` of ``model_class`` (``backbones.model_classes.MODEL_CLASSES``), with its output
    layer."""
    auto = auto_class(model_class)
    overrides = {**(config or {}), **updates}
    attention = overrides.get("attn_implementation")
    if pretrained:
        where = model_dir(pretrained)
        overrides.pop("model_type", None)
        if attention is not None:
            check_attention(attention, concrete_class(
                auto, lambda: transformers.AutoConfig.from_pretrained(where, **REMOTE_CODE)))
        from ptm_app.backbones.pruned_heads import is_head_pruned

        if is_head_pruned(where):  # heads sliced out (backbones.pruned_heads): built to its shapes, then loaded
            model = load_pruned(auto, where, **overrides)
            model.ptm_missing_keys = ()
            return model
        try:
            model, info = auto.from_pretrained(where, output_loading_info=True, **REMOTE_CODE, **overrides)
        except ImportError as exc:  # a declared implementation this machine cannot run (flash-attn)
            raise attention_error(attention, exc) from None
        except (OSError, ValueError) as exc:
            raise load_error(pretrained, exc) from None
        model.ptm_missing_keys = tuple(info.get("missing_keys", ()))  # weights the files did not have: fresh
        return model
    if not config or "model_type" not in config:
        raise PtmError("model: give 'backbone' (a prepared name or directory) or 'backbone_config' with a 'model_type'")
    model_type = overrides.pop("model_type")
    check_model_type(model_type)
    try:
        hf_config = transformers.AutoConfig.for_model(model_type, **overrides)
    except ValueError as exc:
        raise PtmError(f"backbone_config: {str(exc).splitlines()[0]}") from None
    except StrictDataclassError as exc:  # a value of the wrong type, e.g. "0.1" typed on the command line
        cause = str(exc.__cause__ or exc).split(". Errors:")[0]
        raise PtmError(f"backbone_config: {cause}; give the value its type (e.g. 768, 0.1, true; "
                       f"a quoted '0.1' in YAML stays a string)") from None
    if attention is not None:
        check_attention(attention, concrete_class(auto, lambda: hf_config))
        try:
            return from_config(model_class, hf_config)
        except (ImportError, ValueError) as exc:
            raise attention_error(attention, exc) from None
    return from_config(model_class, hf_config)


def model_dir(ref: str) -> str:
    """A local ``from_pretrained`` directory (or hub id) for any model reference: a prepared name, a directory, a
    hub id, or a ptm_app checkpoint / run directory (stage chaining: its backbone, exported once into the cache)."""
    where = resolve_pretrained(ref)
    return str(checkpoint_backbone_dir(where)) if is_checkpoint(where) else where


def check_model_type(model_type: str) -> None:
    """One line for an unknown ``model_type`` (transformers' own message lists all ~800 of them)."""
    known = transformers.models.auto.configuration_auto.CONFIG_MAPPING
    if model_type in known:
        return
    close = difflib.get_close_matches(str(model_type), list(known.keys()), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    raise PtmError(f"backbone_config: unknown model_type {model_type!r}; {hint}"
                   f"use a transformers model type such as 'bert', 'gpt2', 'bart' or 't5'")


def concrete_class(auto, config_fn) -> type:
    """The concrete model class an Auto class builds for a config (``config_fn`` is called only for Auto classes)."""
    mapping = getattr(auto, "_model_mapping", None)
    if mapping is None:
        return auto
    try:
        return mapping[type(config_fn())]
    except (KeyError, OSError, ValueError):
        return auto  # unknown here: transformers' own check runs when the model is built


def attention_choices(cls) -> list[str]:
    """The ``attn_implementation`` values a transformers model class declares (transformers 5 class flags)."""
    from transformers.modeling_flash_attention_utils import FLASH_ATTENTION_COMPATIBILITY_MATRIX

    names = ["eager"]
    if getattr(cls, "_supports_sdpa", False):
        names.append("sdpa")
    if getattr(cls, "_supports_flex_attn", False):
        names.append("flex_attention")
    if getattr(cls, "_supports_flash_attn", False):
        names += [f"flash_attention_{v}" for v in sorted(FLASH_ATTENTION_COMPATIBILITY_MATRIX)]
    return names


def check_attention(attention: str, cls) -> None:
    """Refuse, in one line, an ``attn_implementation`` the model class does not declare."""
    if not hasattr(cls, "_supports_sdpa"):  # an Auto class we could not resolve
        return
    choices = attention_choices(cls)
    if attention not in choices:
        raise PtmError(f"backbone_config.attn_implementation={attention!r} is not supported by {cls.__name__}; "
                       f"set it to one of {', '.join(choices)} (or remove it: sdpa where supported, else eager)")


def attention_error(attention: Optional[str], exc: BaseException) -> PtmError:
    """A declared attention implementation that cannot run here, as one line."""
    reason = " ".join(str(exc).split()).split(". ")[0]
    return PtmError(f"backbone_config.attn_implementation={attention!r} cannot run here ({reason}); "
                    f"use sdpa or eager, or remove the setting")


def max_positions(model) -> Optional[int]:
    """The longest input the backbone's position embeddings allow (None if unbounded)."""
    cfg = model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            # RoBERTa-style position ids start after the padding index
            offset = (cfg.pad_token_id + 1) if getattr(cfg, "model_type", "") in {"roberta", "xlm-roberta", "camembert"} else 0
            return value - offset
    return None


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' weight-loading bars and info notices off the console while a model loads (a command prints only
    its results; a training run's console filters them in ``training.console``)."""
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
