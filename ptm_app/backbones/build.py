"""Build or load a plain transformers model for a given head (DESIGN principle 3).

From scratch: ``backbone_config`` is a transformers config dict with a ``model_type``.
Pretrained: a prepared name (``minilm``), a local ``save_pretrained`` directory, or a hub id;
``backbone_config`` then holds overrides (e.g. dropout).
"""
from __future__ import annotations

from typing import Any, Optional

import transformers

from ptm_app.backbones.resolve import load_error, resolve_pretrained
from ptm_app.errors import PtmError

HEADS = {
    "masked_lm": "AutoModelForMaskedLM",
    "causal_lm": "AutoModelForCausalLM",
    "seq2seq_lm": "AutoModelForSeq2SeqLM",
    "sequence_classification": "AutoModelForSequenceClassification",
    "token_classification": "AutoModelForTokenClassification",
    "question_answering": "AutoModelForQuestionAnswering",
    "base": "AutoModel",
    "rtd": "ElectraForPreTraining",  # ELECTRA's discriminator (Clark et al. 2020 §2)
    "bilm": "BiLSTMForLanguageModeling",  # ptm_app.backbones.bilstm (ELMo, Peters et al. 2018)
}


def auto_class(head: str):
    if head == "bilm":  # ELMo's BiLSTM: ptm_app's own transformers-compatible model
        from ptm_app.backbones.bilstm import HEAD_CLASSES

        return HEAD_CLASSES["bilm"]
    return getattr(transformers, HEADS[head])


def from_config(head: str, config):
    """Instantiate a head class from a config (Auto classes and concrete classes alike)."""
    cls = auto_class(head)
    return cls.from_config(config) if hasattr(cls, "from_config") else cls._from_config(config)


def build_backbone(head: str, pretrained: Optional[str], config: Optional[dict], **updates: Any):
    """Return a ``PreTrainedModel`` with the head's output layer."""
    auto = auto_class(head)
    overrides = {**(config or {}), **updates}
    if pretrained:
        where = resolve_pretrained(pretrained)
        if where.endswith(".ckpt"):  # stage chaining from a ptm_app checkpoint
            from ptm_app.export import exported_cache_dir

            where = str(exported_cache_dir(where))
        overrides.pop("model_type", None)
        try:
            return auto.from_pretrained(where, **overrides)
        except (OSError, ValueError) as exc:
            raise load_error(pretrained, exc) from None
    if not config or "model_type" not in config:
        raise PtmError("model: give 'backbone' (a prepared name or directory) or 'backbone_config' with a 'model_type'")
    model_type = overrides.pop("model_type")
    try:
        hf_config = transformers.AutoConfig.for_model(model_type, **overrides)
    except ValueError as exc:
        raise PtmError(f"backbone_config: {str(exc).splitlines()[0]}") from None
    return from_config(head, hf_config)


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
