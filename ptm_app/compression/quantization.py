"""8-bit quantization for CPU inference.

* Post-training dynamic int8 (``quantize``): every ``nn.Linear`` gets int8 weights and runs on the CPU's quantized
  kernels, its activations quantized per batch on the fly.  Chosen by measurement (issue 14, MiniLM, batch 1,
  2 threads): ``torch.ao.quantization.quantize_dynamic`` 1.46x faster than fp32, torchao's eager int8 0.57x (slower).
  torch.ao's API is deprecated; while it exists it is the ``torch_ao`` backend, and ``weight_only`` (int8 weights
  stored, dequantised per call: 4x smaller, no speed-up) is the fallback when it is gone
  (``tests/compression/test_quantization.py`` notices).
* Quantization-aware fine-tuning (Q8BERT, Zafrir et al. 2019 §2): the ``qat`` policy of any task module
  (``compression.fake_quant``); ``adaptation.compressed.QuantAwareModule`` is the sequence classifier that carries it
  (the name older configs and checkpoints use).  The run then converts to int8 with the same weight scale.
* Weights are weight-exact in both: the int8 weight is ``round(w · 127/max|w|)`` (Q8BERT's symmetric scale).
  A quantized model is a directory: the fp32 model's config and tokenizer, ``model_int8.safetensors`` (int8 weights,
  scales, every other tensor) and ``quantization.json``; it reloads without pickle, and ``predict`` runs on it.
"""
from __future__ import annotations

import contextlib
import copy
import json
import warnings
from pathlib import Path
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from ptm_app.compression.fake_quant import (QMAX, ActivationRanges, QATSpec, disable_fake_quant,  # noqa: F401
                                            enable_fake_quant, fake_quant_forward, fake_quantize, quantizable_linears,
                                            symmetric_scale)
from ptm_app.errors import PtmError

QUANT_CONFIG, QUANT_WEIGHTS = "quantization.json", "model_int8.safetensors"
BACKENDS = ("torch_ao", "weight_only")  # dynamic int8: any fp32 model
STATIC = "q8bert_static"  # Q8BERT's int8 with the input ranges a QAT run learned (``quantize_static_q8bert``)
STATIC_OP = "linear_with_input_q_dq_qweight_dq_output_fp32"  # fbgemm's int8 linear with a given input scale


# -- dynamic int8 ----------------------------------------------------------------------------------------------------
def quantized_engines() -> list[str]:
    return list(torch.backends.quantized.supported_engines)


def check_quantized_engine() -> str:
    """The CPU's quantized kernel engine, or one line when this build has none."""
    engines = [e for e in quantized_engines() if e != "none"]
    if not engines:
        raise PtmError("int8: this torch build has no quantized CPU kernels (torch.backends.quantized."
                       "supported_engines is ['none']); use --backend weight_only (smaller, not faster) or a torch "
                       "build with fbgemm/x86/qnnpack")
    engine = torch.backends.quantized.engine
    return engine if engine in engines else engines[0]


def torch_ao_available() -> bool:
    return callable(getattr(getattr(torch.ao, "quantization", None), "quantize_dynamic", None))


def int8_symmetric(weight: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Q8BERT's weight quantization: ``(round(w · 127/max|w|) as int8, 1/S)``."""
    scale = float(symmetric_scale(weight.detach().abs().max().float()))
    return torch.clamp(torch.round(weight.detach().float() * scale), -QMAX, QMAX).to(torch.int8), 1.0 / scale


class WeightOnlyInt8Linear(nn.Module):
    """The fallback: int8 weights + one scale, dequantised to fp32 for each call (4x smaller weights, fp32 speed)."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight_int8", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.ones(()))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight_int8.to(x.dtype) * self.weight_scale.to(x.dtype), self.bias)


class StaticInt8Linear(nn.Module):
    """Q8BERT's int8 inference (Zafrir et al. 2019 §2): int8 weights (scale ``max|w|/127``) times inputs quantized
    with the scale the QAT run learned (its EMA of ``max|x|``, over 127), accumulated in int32, fp32 out: the
    arithmetic QAT simulated, computed by fbgemm's ``quantized::linear_with_input_q_dq_qweight_dq_output_fp32``.  The
    input goes in as quint8 with zero point 128, which holds the signed steps −128…127 exactly (QAT clamps at −127:
    the two differ only for an input below −max, one step)."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight_int8", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.ones((), dtype=torch.float64))
        self.register_buffer("input_scale", torch.ones((), dtype=torch.float64))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        self._packed = None

    @classmethod
    def of(cls, weight_int8: torch.Tensor, weight_scale: float, input_scale: float,
           bias: Optional[torch.Tensor]) -> "StaticInt8Linear":
        """The layer with these int8 weights, their scale, the input scale and the bias, packed."""
        module = cls(weight_int8.shape[1], weight_int8.shape[0], bias is not None)
        module.weight_int8.copy_(weight_int8)
        module.weight_scale.fill_(weight_scale)
        module.input_scale.fill_(input_scale)
        if bias is not None:
            module.bias.copy_(bias.detach())
        return module.pack()

    def pack(self) -> "StaticInt8Linear":
        """fbgemm's packed int8 weight (rebuilt after the buffers change: call again after loading them)."""
        with _quiet_deprecation():
            weight = torch._make_per_tensor_quantized_tensor(self.weight_int8, float(self.weight_scale), 0)
            bias = None if self.bias is None else self.bias.float()
            self._packed = torch.ops.quantized.linear_prepack(weight, bias)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is None:
            self.pack()
        flat = x.reshape(-1, x.shape[-1]).float().contiguous()
        out = getattr(torch.ops.quantized, STATIC_OP)(flat, float(self.input_scale), 128, self._packed)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def static_engine() -> str:
    """The engine ``StaticInt8Linear`` needs (fbgemm's kernels: ``x86`` or ``fbgemm``), set; one line without it."""
    engine = next((e for e in ("x86", "fbgemm") if e in quantized_engines()), None)
    if engine is None or not hasattr(torch.ops.quantized, STATIC_OP):
        raise PtmError(f"--backend {STATIC}: needs fbgemm's quantized::{STATIC_OP} (x86 engines "
                       f"{quantized_engines()} have none here); use --backend torch_ao")
    torch.backends.quantized.engine = engine
    return engine


def quantize_static_q8bert(model: nn.Module, input_max: dict[str, float]) -> nn.Module:
    """Every ``nn.Linear`` of ``model`` to ``StaticInt8Linear``, its input scale ``input_max[name] / 127`` (the QAT
    run's ranges: ``module.qat_ranges``, ``compression.fake_quant``); the fp32 model stays as it was."""
    static_engine()
    model = copy.deepcopy(model).float().eval()
    for name, linear in quantizable_linears(model).items():
        top = input_max.get(name)
        if top is None or not top > 0:
            raise PtmError(f"--backend {STATIC}: no learned input range for {name}; quantize a QAT run "
                           f"(configs/compress/minilm_qat_bbc.yaml) that trained with qat.activations: true")
        weight, step = int8_symmetric(linear.weight)
        _set_module(model, name, StaticInt8Linear.of(weight, step, top / QMAX, linear.bias))
    return model


@contextlib.contextmanager
def _quiet_deprecation():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*(deprecat|torchao).*")
        yield


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def quantize_dynamic_int8(model: nn.Module, backend: str = "torch_ao") -> nn.Module:
    """Every ``nn.Linear`` of ``model`` (eval mode, fp32) to int8, with Q8BERT's symmetric weight scale."""
    if backend not in BACKENDS:
        raise PtmError(f"--backend {backend}: use one of {', '.join(BACKENDS)}")
    model = copy.deepcopy(model).float().eval()  # the fp32 model stays as it was
    linears = quantizable_linears(model)
    if backend == "weight_only":
        for name, linear in linears.items():
            q = WeightOnlyInt8Linear(linear.in_features, linear.out_features, linear.bias is not None)
            q.weight_int8.copy_(int8_symmetric(linear.weight)[0])
            q.weight_scale.fill_(int8_symmetric(linear.weight)[1])
            if linear.bias is not None:
                q.bias.copy_(linear.bias.detach())
            _set_module(model, name, q)
        return model
    if not torch_ao_available():
        raise PtmError("int8: torch.ao.quantization.quantize_dynamic is gone from this torch; "
                       "use --backend weight_only")
    torch.backends.quantized.engine = check_quantized_engine()
    with _quiet_deprecation():
        quantized = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)
    for name, linear in linears.items():
        q, scale = int8_symmetric(linear.weight)
        quantized.get_submodule(name).set_weight_bias(
            torch._make_per_tensor_quantized_tensor(q, scale, 0),
            None if linear.bias is None else linear.bias.detach().float())
    return quantized


def _dynamic_linear_type():
    with _quiet_deprecation():
        return torch.ao.nn.quantized.dynamic.Linear


def int8_state(model: nn.Module, backend: str) -> dict[str, torch.Tensor]:
    """Every tensor of the quantized model as plain tensors (int8 weights + their scales for the linears)."""
    state: dict[str, torch.Tensor] = {}
    dynamic = _dynamic_linear_type() if backend == "torch_ao" else None
    skip = []
    for name, module in model.named_modules():
        if dynamic is not None and isinstance(module, dynamic):
            weight, bias = module._weight_bias()
            state[f"{name}.weight_int8"] = weight.int_repr().contiguous()
            state[f"{name}.weight_scale"] = torch.tensor(weight.q_scale(), dtype=torch.float64)
            if bias is not None:
                state[f"{name}.bias"] = bias.detach().contiguous()
            skip.append(name + ".")
    for key, value in model.state_dict().items():
        if torch.is_tensor(value) and not key.startswith(tuple(skip)) and not value.is_quantized:
            state.setdefault(key, value.contiguous())
    seen, unique = set(), {}
    for key, value in state.items():  # tied tensors (word embeddings / LM heads) once
        ptr = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape))
        if ptr not in seen:
            seen.add(ptr)
            unique[key] = value
    return unique


def save_quantized(model: nn.Module, backend: str, directory: Path, model_class: str, tokenizer=None,
                   extra: Optional[dict] = None) -> Path:
    """Write the quantized model: config.json, ``model_int8.safetensors``, ``quantization.json``, the tokenizer."""
    from safetensors.torch import save_file

    from ptm_app.paths import atomic_dir

    directory = Path(directory)
    with atomic_dir(directory) as tmp:
        model.config.save_pretrained(tmp)
        save_file(int8_state(model, backend), str(tmp / QUANT_WEIGHTS))
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        info = {"method": "static_int8" if backend == STATIC else "dynamic_int8", "backend": backend,
                "model_class": model_class,
                "weight_scheme": "symmetric per-tensor int8, scale max|w|/127 (Q8BERT)",
                "modules": sorted(quantizable_linears_of(model, backend)),
                "torch": torch.__version__, **(extra or {})}
        (tmp / QUANT_CONFIG).write_text(json.dumps(info, indent=2))
    return directory


def quantizable_linears_of(model: nn.Module, backend: str) -> list[str]:
    kinds = ((_dynamic_linear_type(),) if backend == "torch_ao" else (StaticInt8Linear,) if backend == STATIC
             else (WeightOnlyInt8Linear,))
    return [name for name, m in model.named_modules() if isinstance(m, kinds)]


def is_quantized(directory) -> bool:
    return (Path(directory) / QUANT_CONFIG).is_file()


def load_quantized(directory, model_class: Optional[str] = None) -> nn.Module:
    """The int8 model of a ``save_quantized`` directory: built from its config, quantized the same way, then its
    int8 weights and other tensors loaded (safetensors + JSON: nothing is unpickled)."""
    import transformers
    from safetensors.torch import load_file

    from ptm_app.backbones.model_classes import from_config
    from ptm_app.checkpoint_io.reading import read_record

    directory = Path(directory)
    info = read_record(directory / QUANT_CONFIG)
    config = transformers.AutoConfig.from_pretrained(directory, trust_remote_code=False)
    state = load_file(str(directory / QUANT_WEIGHTS))
    linears = set(info["modules"])
    int8 = {name: (state.pop(f"{name}.weight_int8"), float(state.pop(f"{name}.weight_scale")),
                   state.pop(f"{name}.bias", None), state.pop(f"{name}.input_scale", None)) for name in linears}
    with torch.random.fork_rng(devices=[]):
        model = from_config(model_class or info["model_class"], config)
    missing, unexpected = model.load_state_dict(state, strict=False)  # every tensor but the int8 linears
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k.rpartition(".")[0] not in linears and k not in tied]
    if missing or unexpected:
        raise PtmError(f"{directory}: int8 weights do not fit the config (missing {missing[:3]}, unexpected "
                       f"{unexpected[:3]}); quantize the run again")
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    if info["backend"] == STATIC:
        return load_static(model, int8)
    model = quantize_dynamic_int8(model, info["backend"])
    for name, (q, scale, bias, _) in int8.items():
        module = model.get_submodule(name)
        if info["backend"] == "torch_ao":
            module.set_weight_bias(torch._make_per_tensor_quantized_tensor(q, scale, 0), bias)
        else:
            module.weight_int8.copy_(q)
            module.weight_scale.fill_(scale)
            if bias is not None:
                module.bias.copy_(bias)
    return model.eval()


def load_static(model: nn.Module, int8: dict) -> nn.Module:
    """``model`` with its linears replaced by the saved ``StaticInt8Linear`` weights, scales and input scales."""
    static_engine()
    for name, (q, scale, bias, input_scale) in int8.items():
        _set_module(model, name, StaticInt8Linear.of(q, scale, float(input_scale), bias))
    return model.eval()
