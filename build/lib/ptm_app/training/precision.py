"""``trainer.precision: auto``: the fastest precision the hardware runs natively.

- GPU: ``bf16-mixed`` where CUDA supports bfloat16 (compute capability 8.0+: ``torch.cuda.is_bf16_supported``),
  else ``16-mixed`` (with Lightning's loss scaling).
- CPU: ``bf16-mixed`` when the CPU has bfloat16 instructions (x86 AVX512-BF16 or AMX; on ARM, oneDNN's own
  bf16 check), which oneDNN uses: 1.4-1.7x fp32 on the project machines, loss equal to 3 decimals
  (docs/design.md "Platform notes" §7).  CPUs without them only emulate bf16, so they get ``32-true``.  fp16 is never chosen on
  a CPU: without AVX512-FP16 it is a scalar fallback about 1000x slower (§9).
"""
from __future__ import annotations

import platform
from typing import Optional

import torch


def cpu_has_native_bf16() -> bool:
    """oneDNN can run bf16 here, and the CPU has bf16 instructions (not an emulation on AVX512)."""
    if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return False
    if platform.machine().lower() in ("aarch64", "arm64"):
        return True  # oneDNN reports bf16 on ARM only with the BF16 extension
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def auto_precision(accelerator: Optional[str]) -> str:
    """The precision ``auto`` stands for on ``accelerator`` (``cpu``, ``gpu``/``cuda``, ``auto`` or None)."""
    accelerator = str(accelerator or "auto")
    on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    if on_gpu:
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
    if accelerator in ("cpu", "auto") and cpu_has_native_bf16():
        return "bf16-mixed"
    return "32-true"
