"""Throughput monitor: tokens/s, samples/s, padding fraction, model FLOPs utilisation and peak memory.

FLOPs per trained token follow Kaplan et al. 2020 ("Scaling laws for neural language models") §2.1,
Table 1, as written out in PaLM (Chowdhery et al. 2022) appendix B:

    6·N + 12·L·d·T

``N`` is the number of non-embedding parameters (each one costs a multiply-add forward, 2 FLOPs, and twice
that backward: 6N), ``L`` the layers, ``d`` the attention width and ``T`` the sequence length (the
``Q·Kᵀ`` and ``A·V`` products: 2 matmuls × 2 FLOPs × 3 for forward + backward = 12·L·d·T).  Embedding
look-ups and the vocabulary projection are left out, as Kaplan does, so the MFU is a conservative figure;
frozen weights are counted as trained.  MFU = achieved model FLOPs per second ÷ the device's peak, which
is *measured* once per device, dtype and thread count (the best median of a few large square matmuls,
``peak_flops``) and cached under the PTM cache directory: vendor peaks do not exist for most CPUs.

Lightning's own ``ThroughputMonitor`` needs a FLOPs-per-batch figure and knows peaks for GPUs only; this
one counts non-padding tokens from ``attention_mask`` and needs nothing from the module.
"""
from __future__ import annotations

import json
import math
import platform
import resource
import statistics
import time
from typing import Optional

import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from ptm_app.paths import atomic_file, cache_root

PROBE_SIZES = (1024, 2048, 3072)  # square matmuls: large enough for the BLAS's full-speed kernels
CUDA_PROBE_SIZES = (4096, 8192)  # a data-centre GPU's tensor cores fill up only from ~4096 (8192: ~1.4 ms on an H100)
CUDA_PRODUCTS = 10  # products per timed sample on a GPU, queued back to back: one launch and sync cost for ten
PROBE_REPEATS = 3
PROBE_METHOD = "median-of-squares-v2"  # in the cache key: peaks measured the old way (best of one size) are not reused
WARMUP_SECONDS = 0.2
PLAUSIBLE_MARGIN = 1.15  # a cached peak that one quick matmul beats by more than this was measured too low


def precision_dtype(precision) -> torch.dtype:
    """The matmul dtype a Lightning ``precision`` setting runs at (``bf16-mixed`` → bfloat16 ...)."""
    text = str(precision or "32")
    if "bf16" in text:
        return torch.bfloat16
    if "16" in text:
        return torch.float16
    if "64" in text:
        return torch.float64
    return torch.float32


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name with its family/model/stepping (one marketing name, e.g. "AMD EPYC",
    covers generations whose peaks differ by 2x)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "cpu family", "model", "stepping") and key not in fields:
                    fields[key] = value.strip()
                if not line.strip() and fields:
                    break  # the first processor's block is enough
    except OSError:
        pass
    if "model name" not in fields:
        return platform.processor() or platform.machine()
    generation = "/".join(fields.get(k, "?") for k in ("cpu family", "model", "stepping"))
    return f"{fields['model name']} ({generation})"


def probe_sizes(device: torch.device) -> tuple[int, ...]:
    """The square sizes the peak probe times on ``device``: ``CUDA_PROBE_SIZES`` on a GPU, else ``PROBE_SIZES``."""
    return CUDA_PROBE_SIZES if device.type == "cuda" else PROBE_SIZES


def matmul_flops(device: torch.device, dtype: torch.dtype, size: int, repeats: int) -> float:
    """FLOP/s of ``size``×``size`` matmuls on ``device`` in ``dtype``: the median of ``repeats`` timed samples
    after a warm-up (untimed samples for at least ``WARMUP_SECONDS`` and at least two: the BLAS starts its
    threads, picks and warms its kernel, the memory is touched; a process's first product can be 100x slower).

    A CPU sample is one product.  A GPU sample is ``CUDA_PRODUCTS`` products queued back to back into one output,
    between two ``torch.cuda.synchronize`` calls (kernels run asynchronously: without them the clock would time the
    launch, not the product); the operands are random (zeros would draw less power and read up to ~13 % faster on
    an H200), made on the device by a seeded generator of its own."""
    cuda = device.type == "cuda"
    if cuda:
        gen = torch.Generator(device=device).manual_seed(0)
        a, b = (torch.randn(size, size, generator=gen, device=device, dtype=torch.float32).to(dtype)
                for _ in range(2))
    else:
        gen = torch.Generator(device="cpu").manual_seed(0)  # never the global RNG: a resumed run must draw what it would have
        a, b = (torch.randn(size, size, generator=gen).to(device=device, dtype=dtype) for _ in range(2))
    products = CUDA_PRODUCTS if cuda else 1
    out = torch.empty(size, size, device=device, dtype=dtype)

    def timed() -> float:
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(products):
            torch.mm(a, b, out=out)
        if cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    warm, count = 0.0, 0
    while count < 2 or warm < WARMUP_SECONDS:
        warm, count = warm + timed(), count + 1
    return 2 * size ** 3 * products / statistics.median(timed() for _ in range(repeats))


def measure_peak_flops(device: torch.device, dtype: torch.dtype, sizes: tuple[int, ...] | None = None,
                       repeats: int = PROBE_REPEATS) -> float:
    """The device's matmul peak in ``dtype`` at the current thread count: the best of the sizes' medians
    (a median is robust to a repeat slowed by another process; the sizes cover the BLAS's kernel choices)."""
    return max(matmul_flops(device, dtype, size, repeats) for size in (sizes or probe_sizes(device)))


_CHECKED_THIS_PROCESS: set[tuple[str, str, float]] = set()  # (cache file, key, value) measured or checked here


def peak_flops(device: torch.device, dtype: torch.dtype, sizes: tuple[int, ...] | None = None,
               repeats: int = PROBE_REPEATS) -> float:
    """Measured peak FLOP/s of ``device`` in ``dtype`` with the run's torch thread count (``measure_peak_flops``;
    ``sizes`` default to ``probe_sizes(device)``).

    Cached in ``<cache>/flops_peak.json`` by device (the CPU model or GPU name), dtype, thread count (CPU) and probe
    method and sizes, so a run pays the probe (a few seconds on a CPU, about one on a GPU) once.  A cached value is
    re-measured if it is implausible: not a positive number, or beaten by one quick matmul of the smallest size by
    more than ``PLAUSIBLE_MARGIN`` (a peak probed while the machine was busy), once per process: a value this
    process measured or checked is not checked again while the file still holds it (the check's warm-up costs
    ~0.2 s a run).  docs/design.md "Platform notes" §9 has the figures for the reference machine.
    """
    sizes = tuple(sizes or probe_sizes(device))
    threads = torch.get_num_threads() if device.type == "cpu" else 0
    key = f"{device.type}|{device_name(device)}|{dtype}|threads={threads}|{PROBE_METHOD}|{','.join(map(str, sizes))}"
    if device.type == "cuda":
        key += f"|products={CUDA_PRODUCTS}"
    path = cache_root() / "flops_peak.json"
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    cached = cache.get(key)
    if (str(path), key, cached) in _CHECKED_THIS_PROCESS:  # a later run in this process (a sweep, the test suite)
        return float(cached)
    if isinstance(cached, (int, float)) and math.isfinite(cached) and cached > 0:
        quick = matmul_flops(device, dtype, min(sizes), repeats=1)
        if quick <= PLAUSIBLE_MARGIN * cached:
            _CHECKED_THIS_PROCESS.add((str(path), key, cached))
            return float(cached)
    value = measure_peak_flops(device, dtype, sizes, repeats)
    _CHECKED_THIS_PROCESS.add((str(path), key, value))
    cache[key] = value
    try:
        with atomic_file(path, "w") as fh:
            json.dump(cache, fh, indent=1, sort_keys=True)
    except OSError:
        pass  # a read-only cache only costs the probe next time
    return value


def _transformer_shapes(module: nn.Module) -> list[tuple[int, int]]:
    """(layers, attention width) of every transformers model inside ``module`` (ELECTRA has two)."""
    from transformers import PreTrainedModel

    shapes = []
    for sub in module.modules():
        if not isinstance(sub, PreTrainedModel) or sub.base_model is not sub:
            continue  # count each model once: at its base model, not again at its head wrapper
        cfg = sub.config
        layers = next((getattr(cfg, n) for n in ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
                       if isinstance(getattr(cfg, n, None), int)), None)
        width = next((getattr(cfg, n) for n in ("hidden_size", "n_embd", "d_model", "dim", "emb_dim")
                      if isinstance(getattr(cfg, n, None), int)), None)
        if layers and width:
            shapes.append((layers, width))
    return shapes


def non_embedding_parameters(module: nn.Module, trainable_only: bool = False) -> int:
    """Parameters outside ``nn.Embedding`` tables (Kaplan et al.'s N); shared tensors counted once."""
    embedding = {id(p) for m in module.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    seen, total = set(), 0
    for p in module.parameters():
        if trainable_only and not p.requires_grad:
            continue
        if id(p) not in seen and id(p) not in embedding:
            seen.add(id(p))
            total += p.numel()
    return total


def training_flops_per_token(module: nn.Module, seq_len: int) -> float:
    """Model FLOPs of one training token: ``6·N + 12·L·d·T`` when every weight trains (Kaplan et al. 2020 §2.1;
    PaLM appendix B), summed over the module's models.  Split as the forward pass ``2·N + 4·L·d·T``, the
    backward pass's input gradients ``2·N + 8·L·d·T`` (only if gradients flow through the network: not for
    a backbone run without gradients, ``backbone_runs_without_grad``, as in feature extraction) and its
    weight gradients ``2·N_trainable`` (frozen weights need none: LoRA costs about ``4·N``)."""
    attention = sum(layers * width * seq_len for layers, width in _transformer_shapes(module))
    n = non_embedding_parameters(module)
    trainable = non_embedding_parameters(module, trainable_only=True)
    flows = not getattr(module, "backbone_runs_without_grad", False) and any(p.requires_grad for p in module.parameters())
    return (2 * n + 4 * attention) + ((2 * n + 8 * attention) if flows else 0) + 2 * trainable


def peak_memory_mb(device: torch.device) -> float:
    """CUDA: the most memory torch has allocated; CPU: the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2 ** 20 if platform.system() == "Darwin" else rss / 2 ** 10  # bytes on macOS, KiB on Linux


class ThroughputMonitor(Callback):
    """Logs, every ``trainer.log_every_n_steps`` training batches, for the whole job (every rank):

    ``throughput/tokens_per_s`` (non-padding tokens, from ``attention_mask``), ``throughput/padded_tokens_per_s``
    (every position of ``input_ids``), ``throughput/samples_per_s``, ``train/padding_fraction`` (of that
    window), ``throughput/mfu`` (model FLOPs utilisation, see the module docstring) and
    ``throughput/peak_memory_mb`` (this process's).  Times are wall clock between batch ends, so data loading
    counts.  Under DDP, FSDP or DeepSpeed the counts (samples, tokens, model FLOPs) and the window's seconds are
    summed over the ranks with one ``all_reduce`` of a 5-number tensor at logging steps only: the rates are the
    global counts over the ranks' mean window time (so about world size × one rank's), and the MFU is per
    device, the global FLOP/s over world size × the device peak.  ``last_window`` keeps this process's own
    window (``samples``, ``tokens``, ``padded_tokens``, ``flops``, ``seconds``), and the running totals
    (``samples``, ``tokens``, ``padded_tokens``, ``seconds``) are this process's too.
    Cheap: two tensor sums per batch, one host sync per logging step, one cached matmul probe per run.  The values
    are logged as CPU tensors: Lightning reads every progress-bar value back after each batch, which for a GPU tensor
    would wait for the GPU every step.  For a module that keeps its loss off the progress bar on a GPU
    (``PtmModule.loss_on_progress_bar``) the last batch's loss goes there at the logging steps (``loss``).

    Args:
        measure_peak: measure the device peak for MFU (otherwise MFU is not logged).
    """

    def __init__(self, measure_peak: bool = True):
        self.measure_peak = measure_peak
        self.peak: Optional[float] = None
        self.flops_per_token: dict[int, float] = {}
        self.samples = self.tokens = self.padded_tokens = 0
        self.seconds = 0.0
        self._window: list = []
        self._loss = None  # the last training batch's loss (a tensor), for the progress bar at logging steps
        self._last: Optional[float] = None
        self.last_metrics: dict[str, float] = {}
        self.last_window: dict[str, float] = {}
        self._validation_start = 0.0

    def on_train_start(self, trainer, pl_module) -> None:
        if self.measure_peak and trainer.is_global_zero:
            self.peak = peak_flops(pl_module.device, precision_dtype(trainer.precision))
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        self._window, self._last = [], None

    def on_validation_start(self, trainer, pl_module) -> None:
        self._validation_start = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._last is not None and trainer.training:  # validation inside the epoch: not training time
            self._last += time.perf_counter() - self._validation_start

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._last is None:  # the first batch: its data loading happened before this, unmeasured
            self._last = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not isinstance(batch, dict) or "input_ids" not in batch:
            return
        ids = batch["input_ids"]
        mask = batch.get("attention_mask")
        real = mask.sum() if mask is not None and mask.dim() == 2 else torch.tensor(ids.numel())
        self._window.append((ids.shape[0], ids.numel(), ids.shape[1], real))
        if isinstance(outputs, dict) and not getattr(pl_module, "loss_on_progress_bar", True):
            self._loss = outputs.get("loss")
        if _writes_logs_now(trainer):
            self._flush(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._window:  # batches since the last logging step: into the totals, not logged
            self._flush(trainer, pl_module, log=False)

    def _flush(self, trainer, pl_module, log: bool = True) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        now = time.perf_counter()
        elapsed, self._last = max(now - self._last, 1e-9), now
        samples = sum(w[0] for w in self._window)
        padded = sum(w[1] for w in self._window)
        real_per_batch = [int(w[3]) for w in self._window]  # the one host sync of the window
        real = sum(real_per_batch)
        flops = sum(r * self._flops_per_token(pl_module, w[2]) for r, w in zip(real_per_batch, self._window))
        self._window = []
        self.samples, self.tokens = self.samples + samples, self.tokens + real
        self.padded_tokens += padded
        self.seconds += elapsed
        if not log:  # the tail after the last logging step: totals only, and no collective
            return
        self.last_window = {"samples": samples, "tokens": real, "padded_tokens": padded, "flops": flops,
                            "seconds": elapsed}
        world = trainer.world_size
        if world > 1:  # every rank logs at the same steps: one small all_reduce
            local = torch.tensor([samples, real, padded, flops, elapsed], dtype=torch.float64, device=pl_module.device)
            samples, real, padded, flops, elapsed = trainer.strategy.reduce(local, reduce_op="sum").tolist()
            elapsed /= world  # the ranks' mean window
        metrics = {
            "throughput/tokens_per_s": real / elapsed,
            "throughput/padded_tokens_per_s": padded / elapsed,
            "throughput/samples_per_s": samples / elapsed,
            "train/padding_fraction": 1.0 - real / max(padded, 1),
            "throughput/peak_memory_mb": peak_memory_mb(pl_module.device),
        }
        if self.peak:
            metrics["throughput/mfu"] = flops / elapsed / world / self.peak
        self.last_metrics = metrics
        for name, value in metrics.items():  # CPU tensors: see the class docstring
            pl_module.log(name, torch.tensor(float(value), dtype=torch.float64), on_step=True, on_epoch=False,
                          batch_size=int(samples), prog_bar=name == "throughput/tokens_per_s")
        if self._loss is not None:  # Lightning divides the step's output by the accumulated batches
            loss = float(self._loss) * trainer.accumulate_grad_batches
            pl_module.log("loss", torch.tensor(loss, dtype=torch.float64), on_step=True, on_epoch=False,
                          prog_bar=True, logger=False, batch_size=int(samples))

    def _flops_per_token(self, pl_module, seq_len: int) -> float:
        if seq_len not in self.flops_per_token:
            self.flops_per_token[seq_len] = training_flops_per_token(pl_module, seq_len)
        return self.flops_per_token[seq_len]


def _writes_logs_now(trainer) -> bool:
    """Will Lightning write this training step's logged metrics (``log_every_n_steps``, not accumulating)?"""
    try:
        return trainer._logger_connector.should_update_logs and not trainer.fit_loop._should_accumulate()
    except AttributeError:  # another Lightning layout: every ``log_every_n_steps`` optimizer steps
        return trainer.log_every_n_steps > 0 and (trainer.global_step + 1) % trainer.log_every_n_steps == 0


class TrainingFlops(Callback):
    """Counts the training FLOPs of a run (``training_flops_per_token`` × each batch's non-padding tokens, ELECTRA's
    generator and every objective's extra layers included: they are parameters of the module) and, with
    ``max_flops``, stops it at the first optimizer step at or past that budget (the compute-equal comparisons of
    Clark et al. 2020 Figure 1; ``PtmTrainer(max_flops=...)``, ``trainer.max_flops`` in a config).

    The count is this process's tokens × world size (the ranks train equal batches; with dynamic padding their real
    tokens differ a little), kept on the device between optimizer steps.  With a budget it is read at every optimizer
    step (one host sync), and the ranks stop together (one boolean reduce).  It is saved in checkpoints, so a resumed
    run keeps counting from where it stopped, and ``summary.json`` records ``train_flops`` and ``train_tokens``.
    """

    def __init__(self, max_flops: Optional[float] = None):
        from ptm_app.errors import PtmError

        if max_flops is not None and not max_flops > 0:
            raise PtmError(f"trainer.max_flops must be a positive number of FLOPs (got {max_flops}), e.g. 1.0e15")
        self.max_flops = max_flops
        self.spent = False
        self._before = {"flops": 0.0, "tokens": 0.0}  # from the checkpoint of a resumed run
        self._local: Optional[torch.Tensor] = None  # [flops, tokens] of this process since the start or resume
        self._per_token: dict[int, float] = {}
        self._world = 1

    def totals(self) -> dict[str, float]:
        """``{"flops": ..., "tokens": ...}`` over the whole run (every rank, every resumed session)."""
        local = self._local.tolist() if self._local is not None else [0.0, 0.0]
        return {"flops": self._before["flops"] + local[0] * self._world,
                "tokens": self._before["tokens"] + local[1] * self._world}

    def on_train_start(self, trainer, pl_module) -> None:
        self._world = trainer.world_size

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        from ptm_app.training.callbacks import optimizer_stepped

        if not isinstance(batch, dict) or "input_ids" not in batch:
            return
        ids, mask = batch["input_ids"], batch.get("attention_mask")
        real = mask.sum() if mask is not None and mask.dim() == 2 else torch.tensor(ids.numel(), device=ids.device)
        if ids.shape[1] not in self._per_token:
            self._per_token[ids.shape[1]] = training_flops_per_token(pl_module, ids.shape[1])
        step = torch.stack([real.double() * self._per_token[ids.shape[1]], real.double()])
        self._local = step if self._local is None else self._local + step.to(self._local.device)
        if self.max_flops is None or not optimizer_stepped(trainer):
            return
        flops = self.totals()["flops"]
        if trainer.global_step == 1 and flops > self.max_flops and not self._before["flops"]:
            from ptm_app.errors import PtmError

            raise PtmError(f"trainer.max_flops={self.max_flops:.3g} is smaller than one optimizer step "
                           f"({flops:.3g} FLOPs here); raise it or make the batch smaller")
        spent = flops >= self.max_flops
        if trainer.world_size > 1:
            spent = trainer.strategy.reduce_boolean_decision(spent, all=False)
        if spent:
            self.spent = trainer.should_stop = True

    def state_dict(self) -> dict:
        return self.totals()

    def load_state_dict(self, state_dict: dict) -> None:
        self._before = {"flops": float(state_dict.get("flops", 0.0)), "tokens": float(state_dict.get("tokens", 0.0))}
