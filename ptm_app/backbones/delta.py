"""Delta tuning behind one call (survey §5.6): ``model = apply_delta(model, DeltaSpec(...), task_type)``.

Hand-written bottleneck adapters and PALs (``backbones.adapters``); peft's LoRA (Hu et al. 2022),
IA3 (Liu et al. 2022), prefix-tuning (Li & Liang 2021), prompt tuning (Lester et al. 2021) and
P-tuning (Liu et al. 2021b); BitFit (Ben Zaken et al. 2022 §2: every bias term, LayerNorm biases
included). Only the delta (+ the task head, + LayerNorms when asked) stays trainable, and
``delta_state_dict`` is exactly that: what an adapter-only checkpoint or ``delta.safetensors`` holds.

Export: LoRA and IA3 merge into the weights (``merge_for_export``); BitFit and ``none`` train the
backbone's own tensors, so the model already is the export. Adapters, PALs and soft prompts cannot
be merged: export the unchanged base model (``save_pretrained``) plus ``save_delta`` files, and
rebuild with ``load_delta(base_model, dir)``.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Literal, Optional, Union

import torch
from peft import (IA3Config, LoraConfig, PeftModel, PeftType, PrefixTuningConfig, PromptEncoderConfig,
                  PromptTuningConfig, PromptTuningInit, TaskType, get_peft_model)
from safetensors.torch import load_file, save_file
from torch import nn

from ptm_app.backbones.adapters import remove_adapter, ADAPTER_KINDS, add_adapter, list_adapters
from ptm_app.backbones.model_classes import MODEL_CLASSES
from ptm_app.errors import PtmError

Method = Literal["houlsby", "pfeiffer", "pals", "lora", "ia3", "prefix", "prompt", "ptuning", "bitfit", "none"]
DELTA_FILE, CONFIG_FILE = "delta.safetensors", "delta_config.json"



@dataclass
class DeltaSpec:
    """What to tune; flat so that a YAML ``delta:`` block maps straight onto it.

    Attributes:
        method: ``houlsby`` / ``pfeiffer`` / ``pals`` (hand-written adapters: the families of
            ``adapters.LAYOUTS``, BERT-style, GPT-2, Llama-style, BART, T5, and BERT2BERT ``EncoderDecoderModel``);
            ``lora`` / ``ia3`` / ``prefix`` / ``prompt`` / ``ptuning`` (peft); ``bitfit`` (biases only);
            ``none`` (full fine-tuning: every weight trainable).
        name: adapter name (peft's adapter name, or the key in ``model.delta_adapters``); several
            named adapters can share one backbone (K-Adapter).
        bottleneck: adapter bottleneck size (houlsby, pfeiffer) or PAL projected size (pals).
        reduction: hidden_size / bottleneck; overrides ``bottleneck`` when set (Pfeiffer et al. use 16).
        activation: adapter nonlinearity, a transformers ``ACT2FN`` name.
        heads: PAL attention heads; default gcd(bottleneck, backbone heads).
        r: LoRA rank.
        alpha: LoRA scale numerator (the update is scaled by alpha / r).
        dropout: LoRA dropout; also dropout inside adapters and PALs.
        target_modules: module names LoRA / IA3 wrap; None = peft's default for the model type
            (BERT: query, value; GPT-2: c_attn).
        feedforward_modules: with IA3 and your own ``target_modules``: which of them are FFN layers, whose
            input (not output) is rescaled (Liu et al. 2022 §3.3, l_ff); None = none of them.
        num_virtual_tokens: soft prompt / prefix length (prefix, prompt, ptuning).
        prompt_init: how prompt tuning's vectors start: ``random`` (peft's default) or ``sample_vocab``, the
            embeddings of randomly sampled vocabulary tokens (Lester et al. 2021 §3.2).
        train_layer_norm: also train every LayerNorm (Houlsby et al. 2019 §2.1 do).
        train_head: train the task head (a classifier; a pre-trained causal / seq2seq LM head, or one tied to the
            input embeddings, stays frozen; BERT2BERT's new cross-attention and LM head count as head).
    """

    method: Method
    name: str = "default"
    bottleneck: int = 64
    reduction: Optional[int] = None
    activation: str = "relu"
    heads: Optional[int] = None
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: Optional[list[str]] = None
    feedforward_modules: Optional[list[str]] = None
    num_virtual_tokens: int = 20
    prompt_init: Literal["random", "sample_vocab"] = "random"
    train_layer_norm: bool = False
    train_head: bool = True

    def __post_init__(self):
        if self.method not in METHODS:
            raise PtmError(f"delta.method '{self.method}' is unknown; use one of {', '.join(METHODS)}")
        for field in ("bottleneck", "r", "num_virtual_tokens"):
            if getattr(self, field) < 1:
                raise PtmError(f"delta.{field} must be >= 1 (got {getattr(self, field)})")
        if self.prompt_init not in ("random", "sample_vocab"):
            raise PtmError(f"delta.prompt_init '{self.prompt_init}' is unknown; use random or sample_vocab")
        if self.prompt_init != "random" and self.method != "prompt":
            raise PtmError(f"delta.prompt_init is for method prompt (got method {self.method}); drop it")
        if self.feedforward_modules is not None:
            if self.method != "ia3" or self.target_modules is None:
                raise PtmError("delta.feedforward_modules is for method ia3 with your own target_modules; "
                               "set both, or drop it")
            if not set(self.feedforward_modules) <= set(self.target_modules):
                raise PtmError(f"delta.feedforward_modules {self.feedforward_modules} must be among "
                               f"delta.target_modules {self.target_modules}")


def as_delta_spec(value: Union[DeltaSpec, dict, None]) -> Optional[DeltaSpec]:
    """A ``DeltaSpec`` from itself or its ``asdict`` form (keep the dict in checkpoint hparams: a
    dataclass there breaks ``torch.load(weights_only=True)``); None stays None."""
    if value is None or isinstance(value, DeltaSpec):
        return value
    try:
        return DeltaSpec(**value)
    except TypeError as exc:
        raise PtmError(f"delta: {exc}; the fields are {', '.join(DeltaSpec.__dataclass_fields__)}") from None


def peft_task_type(task_type: Union[str, TaskType, None]) -> Optional[TaskType]:
    """A peft ``TaskType`` from itself, its name (``SEQ_CLS``) or a ptm_app model class (``sequence_classification``:
    its ``backbones.model_classes.MODEL_CLASSES`` entry's)."""
    if task_type is None or isinstance(task_type, TaskType):
        return task_type
    if task_type in MODEL_CLASSES:
        value = MODEL_CLASSES[task_type].peft_task_type
        return TaskType(value) if value else None
    try:
        return TaskType(task_type.upper())
    except ValueError:
        names = ", ".join(list(MODEL_CLASSES) + [t.value for t in TaskType])
        raise PtmError(f"task type '{task_type}' is unknown; use one of {names}") from None


def transformers_model(model: nn.Module) -> nn.Module:
    """The transformers model itself (inside a peft wrapper, with LoRA/IA3 layers injected)."""
    return model.get_base_model() if isinstance(model, PeftModel) else model


def prepended_tokens(model: nn.Module) -> int:
    """How many virtual tokens peft puts before the input (prompt tuning, P-tuning; prefix-tuning adds key/value
    pairs instead): the first outputs of a token-level head belong to them.  peft's TOKEN_CLS and QUESTION_ANS
    models return them too, so callers drop ``[:, n:]`` to line logits up with labels and offsets."""
    if isinstance(model, PeftModel):
        config = model.active_peft_config
        if config.peft_type in (PeftType.PROMPT_TUNING, PeftType.P_TUNING):
            return config.num_virtual_tokens
    return 0


def _own_named_parameters(hf: nn.Module):
    """The backbone's parameters and the live head copies: no adapters, no peft ``original_module``."""
    for name, param in hf.named_parameters():
        if not name.startswith("delta_adapters.") and ".original_module." not in f".{name}":
            yield name, param


def _head_parameters(hf: nn.Module, lm: bool = False) -> list[nn.Parameter]:
    """Parameters outside the base model that are not tied to it (classifier, MLM transform ...); none for a
    pre-trained causal / seq2seq LM head (``lm``). In a warm-started ``EncoderDecoderModel`` (Rothe et al. 2020
    §2) the decoder's cross-attention and LM head are new (peft's LoRA / IA3 tensors inside them excepted)."""
    if hf.config.model_type == "encoder-decoder":
        from peft.tuners.tuners_utils import BaseTunerLayer

        injected = {id(p) for m in hf.modules() if isinstance(m, BaseTunerLayer)
                    for name in m.adapter_layer_names for p in getattr(m, name).parameters()}
        new = [p for n, p in _own_named_parameters(hf) if not n.startswith("encoder.")
               and ("crossattention" in n or not n.startswith("decoder."))]  # + enc_to_dec_proj
        return [p for p in new + _head_parameters(hf.decoder) if id(p) not in injected]
    base = hf.base_model
    if lm:
        return []
    if base is hf:
        return []
    in_base = {id(p) for p in base.parameters()}
    prefix = hf.base_model_prefix + "."
    return [p for n, p in _own_named_parameters(hf) if not n.startswith(prefix) and id(p) not in in_base]


def _layer_norm_parameters(hf: nn.Module) -> list[nn.Parameter]:
    return [p for name, module in hf.named_modules()
            if (isinstance(module, nn.LayerNorm) or type(module).__name__.endswith(("LayerNorm", "RMSNorm")))
            and not name.startswith("delta_adapters") and "original_module" not in name.split(".")
            for p in module.parameters(recurse=False)]


def _encoder_decoder_defaults(spec: DeltaSpec, model: nn.Module) -> dict:
    """peft reads defaults from the top-level config, and an ``EncoderDecoderModel`` keeps them in its halves:
    LoRA / IA3 target modules of the decoder's type, the decoder's sizes for prompt methods."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != "encoder-decoder":
        return {}
    from peft.utils.constants import (TRANSFORMERS_MODELS_TO_IA3_FEEDFORWARD_MODULES_MAPPING as IA3_FFN,
                                      TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING as IA3,
                                      TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as LORA)

    decoder = config.decoder
    if spec.method in PROMPT_METHODS:
        return {"num_layers": decoder.num_hidden_layers, "token_dim": decoder.hidden_size,
                "num_attention_heads": decoder.num_attention_heads}
    kind = decoder.model_type
    if spec.target_modules is not None or kind != config.encoder.model_type or kind not in IA3:
        return {}
    return {"target_modules": LORA[kind]} if spec.method == "lora" else \
        {"target_modules": IA3[kind], "feedforward_modules": IA3_FFN[kind]}


def _lora_config(spec: DeltaSpec, task: Optional[TaskType], defaults: dict):
    return LoraConfig(**{"task_type": task, "r": spec.r, "lora_alpha": spec.alpha, "lora_dropout": spec.dropout,
                         "target_modules": spec.target_modules, **defaults})


def _ia3_config(spec: DeltaSpec, task: Optional[TaskType], defaults: dict):
    return IA3Config(**{"task_type": task, "target_modules": spec.target_modules,
                        "feedforward_modules": spec.feedforward_modules, **defaults})


def _prompt_config(config_class: type):
    def build(spec: DeltaSpec, task: Optional[TaskType], defaults: dict):
        if task is None:
            raise PtmError(f"delta.method={spec.method} needs a peft task type, and this model class has "
                           f"none; use lora, ia3, bitfit or adapters, or one of {', '.join(t.value for t in TaskType)}")
        if spec.prompt_init != "random":  # prompt tuning only (DeltaSpec checks)
            defaults = {**defaults, "prompt_tuning_init": PromptTuningInit(spec.prompt_init.upper())}
        return config_class(task_type=task, num_virtual_tokens=spec.num_virtual_tokens, **defaults)
    return build


def _apply_peft(config_fn):
    """peft's ``get_peft_model`` with the method's config (peft wraps and modifies the model in place)."""
    def apply(model: nn.Module, spec: DeltaSpec, task: Optional[TaskType]) -> nn.Module:
        config = config_fn(spec, task, _encoder_decoder_defaults(spec, model))
        try:
            return get_peft_model(model, config, adapter_name=spec.name)
        except (ValueError, KeyError) as exc:  # e.g. no default target modules, prefix + checkpointing
            message = str(exc).strip("'\"").splitlines()[0]
            hint = "; set delta.target_modules" if "target_modules" in message else ""
            raise PtmError(f"delta.method={spec.method}: {message}{hint}") from None
    return apply


def _apply_adapter(model: nn.Module, spec: DeltaSpec, task: Optional[TaskType]) -> nn.Module:
    """A hand-written bottleneck adapter or PAL (``backbones.adapters``) in the frozen model."""
    model.requires_grad_(False)
    add_adapter(model, spec.name, spec.method, bottleneck=spec.bottleneck, reduction=spec.reduction,
                activation=spec.activation, dropout=spec.dropout, heads=spec.heads).requires_grad_(True)
    return model


def _apply_bitfit(model: nn.Module, spec: DeltaSpec, task: Optional[TaskType]) -> nn.Module:
    """Every bias term trains, LayerNorm biases included (Ben Zaken et al. 2022 §2)."""
    model.requires_grad_(False)
    biases = [p for name, p in _own_named_parameters(model) if name.endswith("bias")]
    if not biases:
        raise PtmError(f"delta.method=bitfit: this {model.config.model_type} model has no bias terms; use lora or ia3")
    for param in biases:
        param.requires_grad_(True)
    return model


@dataclass(frozen=True)
class DeltaMethod:
    """One delta-tuning method (peft's one-entry-per-method registry): how it is applied to a fresh model, whether
    it puts virtual tokens before the input, and whether it folds into the weights on export."""

    name: str
    apply: Callable[[nn.Module, DeltaSpec, Optional[TaskType]], nn.Module]
    virtual_tokens: bool = False
    mergeable: bool = False


DELTA_METHODS: dict[str, DeltaMethod] = {m.name: m for m in (
    *(DeltaMethod(kind, _apply_adapter) for kind in ADAPTER_KINDS),
    DeltaMethod("lora", _apply_peft(_lora_config), mergeable=True),
    DeltaMethod("ia3", _apply_peft(_ia3_config), mergeable=True),
    DeltaMethod("prefix", _apply_peft(_prompt_config(PrefixTuningConfig)), virtual_tokens=True),
    DeltaMethod("prompt", _apply_peft(_prompt_config(PromptTuningConfig)), virtual_tokens=True),
    DeltaMethod("ptuning", _apply_peft(_prompt_config(PromptEncoderConfig)), virtual_tokens=True),
    DeltaMethod("bitfit", _apply_bitfit, mergeable=True),
    DeltaMethod("none", lambda model, spec, task: model.requires_grad_(True), mergeable=True),
)}


def apply_delta(model: nn.Module, spec: DeltaSpec, task_type: Union[str, TaskType, None] = None) -> nn.Module:
    """Return ``model`` ready for delta tuning: only the delta (+ head if ``train_head``, + LayerNorms
    if ``train_layer_norm``) is trainable. peft methods return a ``PeftModel`` wrapping ``model`` and
    modify it in place, so always pass a freshly built backbone. ``task_type``: a ptm_app model class,
    a peft ``TaskType`` or its name (peft's SEQ_CLS / TOKEN_CLS / QUESTION_ANS keep the head trainable
    through ``modules_to_save``)."""
    task = peft_task_type(task_type)
    model = DELTA_METHODS[spec.method].apply(model, spec, task)
    if spec.method == "none":
        return model
    hf = transformers_model(model)
    for param in _head_parameters(hf, task in (TaskType.CAUSAL_LM, TaskType.SEQ_2_SEQ_LM)):
        param.requires_grad_(spec.train_head)
    if spec.train_layer_norm:
        for param in _layer_norm_parameters(hf):
            param.requires_grad_(True)
    return model


METHODS = tuple(DELTA_METHODS)
PROMPT_METHODS = tuple(name for name, method in DELTA_METHODS.items() if method.virtual_tokens)


def trainable_report(model: nn.Module) -> dict:
    """``{"trainable", "total", "percent"}`` over unique parameters (peft's frozen head original counts in total)."""
    params = list(model.parameters())
    trainable = sum(p.numel() for p in params if p.requires_grad)
    total = sum(p.numel() for p in params)
    return {"trainable": trainable, "total": total, "percent": 100.0 * trainable / total}


def delta_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters by ``named_parameters`` name (detached copies): an adapter-only checkpoint."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def load_delta_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy ``state`` into a model prepared by ``apply_delta`` with the same spec; every trainable
    parameter must be covered and nothing else may be present."""
    params = dict(model.named_parameters())
    unknown = [k for k in state if k not in params]
    missing = [n for n, p in params.items() if p.requires_grad and n not in state]
    wrong = [k for k, v in state.items() if k in params and params[k].shape != v.shape]
    if unknown or missing or wrong:
        raise PtmError(f"delta state does not fit this model (unknown {unknown[:2]}, missing {missing[:2]}, "
                       f"wrong shape {wrong[:2]}); build the same backbone and apply the same DeltaSpec first")
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(value)


def merge_for_export(model: nn.Module) -> Optional[nn.Module]:
    """A plain transformers ``PreTrainedModel`` with the delta folded in, or None when it cannot be.

    LoRA / IA3: ``merge_and_unload()`` (in place: the peft model is consumed). BitFit / none: the
    model itself. Adapters, PALs, prefix / prompt / P-tuning: None; export the unchanged base model
    with ``save_pretrained`` and the delta with ``save_delta``."""
    if isinstance(model, PeftModel):
        if model.peft_config[model.active_adapter].peft_type in (PeftType.LORA, PeftType.IA3):
            return model.merge_and_unload()
        return None
    return None if list_adapters(model) else model


def save_delta(model: nn.Module, spec: DeltaSpec, directory: Union[str, Path]) -> Path:
    """Write ``delta.safetensors`` (``delta_state_dict``) and ``delta_config.json`` (spec, task type, model type)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    task = model.peft_config[model.active_adapter].task_type if isinstance(model, PeftModel) else None
    save_file({k: v.contiguous() for k, v in delta_state_dict(model).items()}, str(directory / DELTA_FILE))
    meta = {"spec": asdict(spec), "task_type": TaskType(task).value if task else None,
            "model_type": transformers_model(model).config.model_type}
    (directory / CONFIG_FILE).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return directory


def save_base(model: nn.Module, directory: Union[str, Path]) -> None:
    """``save_pretrained`` the frozen base under a delta that cannot be merged (adapters, prompt methods)."""
    import copy

    if isinstance(model, PeftModel):
        model.get_base_model().save_pretrained(directory)
        return
    base = copy.deepcopy(model)
    for name in list(list_adapters(base)):
        remove_adapter(base, name)
    base.save_pretrained(directory)


def load_delta(base_model: nn.Module, directory: Union[str, Path]) -> nn.Module:
    """Apply a ``save_delta`` directory to a fresh copy of the base model it was trained on."""
    directory = Path(directory)
    if not (directory / CONFIG_FILE).is_file() or not (directory / DELTA_FILE).is_file():
        raise PtmError(f"{directory} has no {CONFIG_FILE} + {DELTA_FILE}; pass a directory written by save_delta")
    meta = json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8"))
    model_type = base_model.config.model_type
    if meta["model_type"] != model_type:
        raise PtmError(f"{directory} holds a delta for a '{meta['model_type']}' model, not '{model_type}'")
    model = apply_delta(base_model, DeltaSpec(**meta["spec"]), meta["task_type"])
    state = load_file(str(directory / DELTA_FILE))
    for name, param in model.named_parameters():  # what trained is what was saved (an LM head may have stayed frozen)
        param.requires_grad_(name in state)
    load_delta_state_dict(model, state)
    return model
