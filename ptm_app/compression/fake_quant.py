"""Quantization-aware training as a policy any task module carries (``model.init_args.qat: {ema: ..., activations:
...}``; Q8BERT, Zafrir et al. 2019 §2): symmetric linear 8-bit fake quantization
``x_q = clamp(round(x · S), −127, 127) / S`` with ``S = 127 / max|x|`` of the weights (per call) and of the inputs of
every linear layer (``max|x|`` an exponential moving average during training), gradients passed straight through
(``∂x_q/∂x = 1``).  The modules, their weights and ``state_dict`` stay plain fp32 (export writes them as they are);
``python main.py quantize`` then converts the run to int8 with the same weight scale (``compression.quantization``),
and ``--backend q8bert_static`` with the input ranges learned here (``module.qat_ranges``)."""
from __future__ import annotations

import types
from dataclasses import asdict, dataclass, is_dataclass
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from ptm_app.checkpoint_io.reading import CKPT_KEY
from ptm_app.errors import PtmError
from ptm_app.training.policy import BackbonePolicy

QMAX = 127


def symmetric_scale(max_abs: torch.Tensor) -> torch.Tensor:
    """``S = 127 / max|x|`` (1 for an all-zero tensor)."""
    return QMAX / max_abs.clamp_min(1e-12) if float(max_abs) > 0 else torch.ones_like(max_abs)


class _RoundSTE(torch.autograd.Function):
    """``clamp(round(x·S), −127, 127)/S`` forward; the identity backward (straight-through estimator)."""

    @staticmethod
    def forward(ctx, x, scale):
        return torch.clamp(torch.round(x * scale), -QMAX, QMAX) / scale

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def fake_quantize(x: torch.Tensor, max_abs: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Symmetric 8-bit fake quantization of ``x`` (scale from ``max_abs``, default ``max|x|``), STE gradient."""
    max_abs = x.detach().abs().max() if max_abs is None else max_abs
    return _RoundSTE.apply(x, symmetric_scale(max_abs.to(x.dtype)))


@dataclass
class QATSpec:
    """Args:
        ema: decay of the moving average of each linear layer's input ``max|x|`` (Q8BERT §2).
        activations: also fake-quantize the inputs of the linear layers (else weights only).
    """

    ema: float = 0.9999
    activations: bool = True

    def __post_init__(self):
        if not 0.0 <= float(self.ema) < 1.0:
            raise PtmError(f"qat.ema={self.ema} is outside [0, 1); use a decay such as 0.9999")


class ActivationRanges(nn.Module):
    """One EMA ``max|x|`` buffer per quantized linear layer (in the checkpoint: a resumed run continues exactly)."""

    def __init__(self, names: list[str]):
        super().__init__()
        for name in names:
            self.register_buffer(name.replace(".", "__"), torch.zeros(()))
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))

    def get(self, name: str) -> torch.Tensor:
        return getattr(self, name.replace(".", "__"))


def fake_quant_forward(ranges: ActivationRanges, name: str, spec: QATSpec):
    """A replacement ``nn.Linear.forward`` (bound to the layer) with fake-quantized weights and inputs."""
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if spec.activations:
            current = ranges.get(name)
            if self.training:
                observed = x.detach().abs().max().float()
                current.copy_(observed if float(current) == 0 else spec.ema * current + (1 - spec.ema) * observed)
            x = fake_quantize(x, current.to(x.dtype) if float(current) > 0 else None)
        return F.linear(x, fake_quantize(self.weight), self.bias)
    return forward


def disable_fake_quant(model: nn.Module) -> nn.Module:
    """The plain fp32 computation again (the QAT run's weights, as ``export`` writes them)."""
    for linear in quantizable_linears(model).values():
        linear.__dict__.pop("forward", None)
    return model


def quantizable_linears(model: nn.Module) -> dict[str, nn.Linear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}


def enable_fake_quant(model: nn.Module, ranges: ActivationRanges, spec: QATSpec) -> None:
    """Every ``nn.Linear`` of ``model`` computes with fake-quantized weights and inputs (the modules, their
    weights and state_dict stay plain: export and the int8 conversion read ordinary fp32 weights)."""
    for name, linear in quantizable_linears(model).items():
        linear.forward = types.MethodType(fake_quant_forward(ranges, name, spec), linear)


def as_qat_spec(value) -> Optional[QATSpec]:
    if value is None or isinstance(value, QATSpec):
        return value
    return QATSpec(**(asdict(value) if is_dataclass(value) else value))


class FakeQuant(BackbonePolicy):
    """Every ``nn.Linear`` of the freshly built backbone computes with fake-quantized weights and inputs; the input
    ranges are ``module.qat_ranges`` (buffers: checkpointed, so a resumed run continues exactly; export leaves them
    out)."""

    def __init__(self, spec: QATSpec | dict):
        self.spec = as_qat_spec(spec) or QATSpec()

    def apply(self, module, fresh: bool, fitting: bool) -> None:
        if fresh:
            module.qat_ranges = ActivationRanges(list(quantizable_linears(module.backbone)))
            enable_fake_quant(module.backbone, module.qat_ranges, self.spec)

    def style(self) -> str:
        return "quantization-aware (Q8BERT)"

    def save(self, module, checkpoint: dict) -> None:
        checkpoint["hyper_parameters"]["qat"] = asdict(self.spec)
        record = checkpoint[CKPT_KEY]
        record["training_only"] = [*record.get("training_only", []), "qat_ranges."]  # export: the plain fp32 weights
