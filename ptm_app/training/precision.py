"""``trainer.precision: auto`` (the default) and ``trainer.accelerator: auto``: the machine chooses.

- GPU: ``bf16-mixed`` where CUDA supports bfloat16 (compute capability 8.0+: ``torch.cuda.is_bf16_supported``),
  else ``16-mixed`` (with Lightning's loss scaling).
- CPU: ``bf16-mixed`` when the CPU has bfloat16 instructions (x86 AVX512-BF16 or AMX; on ARM, oneDNN's own
  bf16 check), which oneDNN uses: 1.4-1.7x fp32 on the project machines, loss equal to 3 decimals
  (docs/design.md "Platform notes" §7).  CPUs without them only emulate bf16, about 70x slower than fp32
  (a 2-core Zen 3: 0.9 against 63 GFLOP/s), so they get ``32-true``.  fp16 is never chosen on a CPU: without
  AVX512-FP16 it is a scalar fallback about 1000x slower (§9), and it is refused there (``check_hardware``).

The seam ``PTM_CPU_BF16=0`` (or ``1``) makes ``cpu_has_native_bf16`` answer no (or yes) whatever the CPU, so
the choice made on a CPU without bf16 can be tested on any machine.  oneDNN's own cap ``ONEDNN_MAX_CPU_ISA``
below ``AVX512_CORE_BF16`` also answers no: oneDNN then emulates bf16, as on a CPU without the instructions
(with ``ATEN_CPU_CAPABILITY=avx2`` too, this machine then runs as a CPU without AVX-512 does).
"""
from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from typing import Optional

import torch

from ptm_app.errors import PtmError

SEAM = "PTM_CPU_BF16"
# oneDNN ISA names (ONEDNN_MAX_CPU_ISA) below the first with bf16 instructions
ISA_WITHOUT_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI"}


@dataclass(frozen=True)
class Choice:
    """What ``auto`` stands for here, and why (the model line prints both)."""

    value: str
    reason: str


def cpu_bf16_reason() -> tuple[bool, str]:
    """(native bf16 on this CPU?, the reason in a few words)."""
    forced = os.environ.get(SEAM, "").strip()
    if forced in ("0", "1"):
        return forced == "1", f"{SEAM}={forced}"
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if isa in ISA_WITHOUT_BF16:
        return False, f"ONEDNN_MAX_CPU_ISA={isa} leaves out oneDNN's bf16 instructions"
    if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return False, "this CPU has no bf16 instructions"
    if platform.machine().lower() in ("aarch64", "arm64"):
        return True, "ARM BF16 found"  # oneDNN reports bf16 on ARM only with the BF16 extension
    found = [name for name, probe in (("AVX512-BF16", torch.cpu._is_avx512_bf16_supported),
                                      ("AMX", torch.cpu._is_amx_tile_supported)) if probe()]
    if found:
        return True, " and ".join(found) + " found"
    return False, "this CPU has no bf16 instructions"


def cpu_has_native_bf16() -> bool:
    """oneDNN can run bf16 here, and the CPU has bf16 instructions (not an emulation on AVX512)."""
    return cpu_bf16_reason()[0]


def on_gpu(accelerator: Optional[str]) -> bool:
    """Does ``accelerator`` (``cpu``, ``gpu``/``cuda``, ``auto`` or None) run on a CUDA GPU here?"""
    accelerator = str(accelerator or "auto")
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def choose_precision(accelerator: Optional[str]) -> Choice:
    """The precision ``auto`` stands for on ``accelerator``, with the reason."""
    if on_gpu(accelerator):
        if torch.cuda.is_bf16_supported():
            return Choice("bf16-mixed", "auto: this GPU runs bf16")
        return Choice("16-mixed", "auto: this GPU has no bf16 (compute capability below 8.0)")
    native, reason = cpu_bf16_reason()
    return Choice("bf16-mixed" if native else "32-true", f"auto: {reason}")


def auto_precision(accelerator: Optional[str]) -> str:
    """The precision ``auto`` stands for on ``accelerator`` (``cpu``, ``gpu``/``cuda``, ``auto`` or None)."""
    return choose_precision(accelerator).value


def check_hardware(accelerator: Optional[str], devices, precision) -> None:
    """One line for what the hardware cannot run: fp16 on a CPU, a GPU that is not there, more devices than exist."""
    accelerator = str(accelerator or "auto")
    gpu = on_gpu(accelerator)
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise PtmError(f"trainer.accelerator {accelerator}: no CUDA GPU is visible here "
                       f"(torch.cuda.is_available() is False); use accelerator: auto (the default) or cpu")
    text = str(precision) if precision is not None else ""
    if not gpu and "16" in text and "bf16" not in text:
        raise PtmError(f"precision={precision} (fp16) is not supported on CPU here; "
                       f"use trainer.precision: auto (the default), bf16-mixed (fast on CPUs with bf16) or 32-true")
    given = devices
    if isinstance(devices, str) and devices.strip().isdigit():
        devices = int(devices)  # the command line gives "4"
    if isinstance(devices, (list, tuple)) and gpu and devices:
        devices = max(int(d) for d in devices) + 1  # GPU indices: the highest must exist
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0:
        present = torch.cuda.device_count() if gpu else _cpu_cores()
        what = "CUDA GPUs" if gpu else "CPU cores (a CPU device is one process)"
        if devices > present:
            raise PtmError(f"trainer.devices {given}: this machine has {present} {what}; "
                           f"use devices: {present} or fewer")


def _cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def bf16_slowdown(size: int = 256, repeats: int = 3) -> float:
    """How many times slower a ``size``² bf16 matmul runs than an fp32 one on this CPU (medians; ~0.1 s)."""
    def seconds(dtype):
        a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
        a @ b
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        return sorted(times)[len(times) // 2]
    return seconds(torch.bfloat16) / max(seconds(torch.float32), 1e-9)


def warn_emulated_bf16(accelerator: Optional[str], precision) -> Optional[str]:
    """An explicit bf16 precision on a CPU without bf16 instructions runs, after one warning line with the measured
    slowdown and the fix; returns the line (None when there is nothing to say)."""
    if on_gpu(accelerator) or "bf16" not in str(precision or "") or cpu_has_native_bf16():
        return None
    line = (f"warning: precision {precision} on a CPU without bf16 instructions: bf16 matmuls run "
            f"{bf16_slowdown():.0f}x slower than fp32 here (measured); use trainer.precision: auto (the default) "
            f"or 32-true")
    print(line, flush=True)
    return line
