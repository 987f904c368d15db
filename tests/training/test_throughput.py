"""The throughput monitor's numbers against the batches it saw, the FLOPs formula, and the cached peak probe."""
import time

import lightning.pytorch as pl
import pytest
import torch
import transformers

from ptm_app.training.trainer import PtmTrainer
from ptm_app.data.datamodules import PretrainDataModule
from ptm_app.data.tokenizer import TokenizerSpec
from ptm_app.objectives import MaskedLMModule
from ptm_app.training import throughput
from ptm_app.training.throughput import (ThroughputMonitor, non_embedding_parameters, peak_flops, precision_dtype,
                                         training_flops_per_token)
from tests.conftest import TINY_BERT


class BatchRecorder(pl.Callback):
    def __init__(self):
        self.batches = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches.append((batch["input_ids"].shape[0], int(batch["attention_mask"].sum()),
                             batch["input_ids"].numel()))

    def totals(self, batches=None):
        return tuple(sum(b[k] for b in (batches or self.batches)) for k in range(3))


def test_counts_match_the_batches_and_rates_match_the_wall_time(tiny_corpus, tmp_path):
    dm = PretrainDataModule(TokenizerSpec(train="wordpiece", vocab_size=200, min_frequency=1), source=str(tiny_corpus),
                            max_length=32, batch_size=4, packing="split_documents", limit_documents=20)
    monitor, recorder = ThroughputMonitor(), BatchRecorder()
    trainer = PtmTrainer(max_steps=9, accelerator="cpu", log_every_n_steps=3, limit_val_batches=0, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[monitor, recorder], use_distributed_sampler=False)
    module = MaskedLMModule(backbone_config=TINY_BERT, optim={"lr": 1e-3, "warmup": 1})
    start = time.perf_counter()
    trainer.fit(module, datamodule=dm)
    wall = time.perf_counter() - start
    samples, tokens, padded = recorder.totals()
    assert samples == 9 * 4
    assert (monitor.samples, monitor.tokens, monitor.padded_tokens) == (samples, tokens, padded)
    assert 0 < tokens < padded  # split documents: the short last blocks are padded
    assert 0 < monitor.seconds < wall
    logged = trainer.logged_metrics  # the last logging window: steps 7-9, three batches of 4
    window = monitor.last_metrics
    assert set(window) >= {"throughput/tokens_per_s", "throughput/samples_per_s", "train/padding_fraction",
                           "throughput/mfu", "throughput/peak_memory_mb"}
    for name, value in window.items():
        assert float(logged[name]) == pytest.approx(value, rel=1e-6), name
    w_samples, w_tokens, w_padded = recorder.totals(recorder.batches[-3:])
    seconds = w_samples / window["throughput/samples_per_s"]  # this window's duration, from samples/s
    assert 0 < seconds < monitor.seconds
    assert window["throughput/padded_tokens_per_s"] * seconds == pytest.approx(w_padded, rel=1e-6)
    assert window["throughput/tokens_per_s"] * seconds == pytest.approx(w_tokens, rel=1e-6)
    assert window["train/padding_fraction"] == pytest.approx(1 - w_tokens / w_padded, rel=1e-6)
    assert 0 < window["throughput/mfu"] < 1
    assert window["throughput/peak_memory_mb"] > 100  # a python process with torch loaded


def test_flops_per_token_is_six_n_plus_the_attention_term():
    model = transformers.BertForMaskedLM(transformers.BertConfig(vocab_size=500, **{
        k: v for k, v in TINY_BERT.items() if k != "model_type"}))
    embeddings = model.bert.embeddings
    n_embedding = sum(p.numel() for e in (embeddings.word_embeddings, embeddings.position_embeddings,
                                          embeddings.token_type_embeddings) for p in e.parameters())
    n = sum(p.numel() for p in model.parameters()) - n_embedding  # the tied decoder weight is the word table
    assert non_embedding_parameters(model) == n
    attention = 2 * 32 * 32  # L=2 layers, d=32, T=32
    assert training_flops_per_token(model, 32) == 6 * n + 12 * attention  # everything trains
    # frozen weights need no weight gradients, but gradients still flow through them (LoRA-like)
    model.bert.encoder.requires_grad_(False)
    trainable = non_embedding_parameters(model, trainable_only=True)
    assert 0 < trainable < n
    assert training_flops_per_token(model, 32) == 4 * n + 12 * attention + 2 * trainable
    # a backbone run without gradients (feature extraction): the forward pass plus the head's weight gradients
    model.backbone_runs_without_grad = True
    assert training_flops_per_token(model, 32) == 2 * n + 4 * attention + 2 * trainable


def test_peak_is_measured_once_per_device_dtype_and_cached(monkeypatch):
    cpu = torch.device("cpu")
    fp32 = peak_flops(cpu, torch.float32, sizes=(256,), repeats=2)
    assert 1e8 < fp32 < 1e13
    monkeypatch.setattr(throughput, "measure_peak_flops", lambda *a: pytest.fail("probed again"))
    # the plausibility check's one quick matmul, made deterministic: a busy CI machine can slow the first probe
    # enough that a quick product beats it (then the peak is measured again, by design: the next test)
    monkeypatch.setattr(throughput, "matmul_flops", lambda *a, **k: fp32)
    assert peak_flops(cpu, torch.float32, sizes=(256,), repeats=2) == fp32
    with pytest.raises(BaseException, match="probed again"):
        peak_flops(cpu, torch.bfloat16, sizes=(256,), repeats=2)  # another dtype is another measurement
    before = torch.get_num_threads()
    torch.set_num_threads(1 if before > 1 else 2)
    try:
        with pytest.raises(BaseException, match="probed again"):
            peak_flops(cpu, torch.float32, sizes=(256,), repeats=2)  # another thread count too
    finally:
        torch.set_num_threads(before)


def test_an_implausible_cached_peak_is_measured_again():
    import json

    cpu = torch.device("cpu")
    peak_flops(cpu, torch.float32, sizes=(192,), repeats=2)
    path = throughput.cache_root() / "flops_peak.json"
    cache = json.loads(path.read_text())
    key = next(k for k in cache if k.endswith("|192") and "float32" in k)
    assert f"threads={torch.get_num_threads()}" in key and throughput.device_name(cpu) in key
    for bad in (1e6, -1.0, float("nan")):  # far below what one matmul achieves; not a peak at all
        cache[key] = bad
        path.write_text(json.dumps(cache))
        again = peak_flops(cpu, torch.float32, sizes=(192,), repeats=2)
        assert again > 1e8 and json.loads(path.read_text())[key] == again


@pytest.mark.slow  # ~10 s on a quiet 2-core machine, far more on a busy one
def test_fp32_peak_agrees_with_a_fresh_measurement():
    """The peak MFU divides by is what the CPU does now, in this process, within 20 %: the old probe (one size,
    best of 5) had cached 79 GFLOP/s on a CPU doing 166-174 GFLOP/s, doubling every fp32 MFU."""
    cpu = torch.device("cpu")
    peak = peak_flops(cpu, torch.float32)
    fresh = throughput.measure_peak_flops(cpu, torch.float32)
    assert abs(peak - fresh) <= 0.2 * fresh, (peak / 1e9, fresh / 1e9)


def test_precision_names_map_to_dtypes():
    assert [precision_dtype(p) for p in ("bf16-mixed", "bf16-true", "16-mixed", "32-true", None, "64")] == [
        torch.bfloat16, torch.bfloat16, torch.float16, torch.float32, torch.float32, torch.float64]


def test_a_gpu_peak_is_probed_with_large_products_and_cached_per_gpu_name(monkeypatch):
    """No GPU needed: the probe is replaced by a recorder.  A GPU's key names the GPU, its probe multiplies
    4096 and 8192 squares (an H100/H200 is far from its peak at the CPU's 1024-3072), and another GPU model (or
    dtype) is another measurement."""
    import json

    probed = []
    names = {"name": "NVIDIA H200"}
    monkeypatch.setattr(throughput, "device_name", lambda device: names["name"])
    monkeypatch.setattr(throughput, "matmul_flops",
                        lambda device, dtype, size, repeats: probed.append((device.type, dtype, size)) or 7e14)
    cuda = torch.device("cuda")
    assert throughput.probe_sizes(cuda) == throughput.CUDA_PROBE_SIZES == (4096, 8192)
    assert peak_flops(cuda, torch.bfloat16) == 7e14
    assert probed == [("cuda", torch.bfloat16, 4096), ("cuda", torch.bfloat16, 8192)]
    cache = json.loads((throughput.cache_root() / "flops_peak.json").read_text())
    key = next(k for k in cache if k.startswith("cuda|"))
    assert "NVIDIA H200" in key and "bfloat16" in key and "4096,8192" in key and "threads=0" in key
    probed.clear()
    assert peak_flops(cuda, torch.bfloat16) == 7e14 and probed == []  # measured in this process: trusted
    monkeypatch.setattr(throughput, "_CHECKED_THIS_PROCESS", set())  # another process, the same cache file
    assert peak_flops(cuda, torch.bfloat16) == 7e14 and probed == [("cuda", torch.bfloat16, 4096)]  # cached: one check
    probed.clear()
    assert peak_flops(cuda, torch.bfloat16) == 7e14 and probed == []  # checked once per process
    names["name"] = "NVIDIA H100 80GB HBM3"
    probed.clear()
    peak_flops(cuda, torch.bfloat16)
    assert [size for *_, size in probed] == [4096, 8192]  # another GPU: measured again


class LossOffTheBar(MaskedLMModule):
    """What a run on a GPU does (``loss_on_progress_bar`` is false there), on the CPU."""

    loss_on_progress_bar = False


def test_progress_bar_values_are_cpu_tensors_and_the_loss_joins_them_at_logging_steps(tiny_corpus):
    """Lightning reads every progress-bar value back after each batch: a GPU tensor there is a host sync per step.
    The monitor hands Lightning CPU tensors (a Python number would become a tensor on the module's device), and a
    module that keeps its loss off the bar gets it there at logging steps."""
    dm = PretrainDataModule(TokenizerSpec(train="wordpiece", vocab_size=200, min_frequency=1), source=str(tiny_corpus),
                            max_length=32, batch_size=4, limit_documents=20)
    trainer = PtmTrainer(max_steps=4, accelerator="cpu", log_every_n_steps=2, limit_val_batches=0, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[ThroughputMonitor(measure_peak=False)], use_distributed_sampler=False)
    module = LossOffTheBar(backbone_config=TINY_BERT, optim={"lr": 1e-3, "warmup": 1})
    logged = []
    log = module.log
    module.log = lambda name, value, **kw: logged.append((name, value, kw.get("prog_bar"))) or log(name, value, **kw)
    trainer.fit(module, datamodule=dm)
    from_monitor = [(n, v) for n, v, _ in logged if n.startswith("throughput/") or n == "loss"]
    assert {n for n, _ in from_monitor} >= {"loss", "throughput/tokens_per_s"}
    assert all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for _, v in from_monitor)
    assert [n for n, _, bar in logged if bar] == ["throughput/tokens_per_s", "loss"] * 2  # steps 2 and 4 only
    assert "train/loss" not in trainer.progress_bar_metrics and "train/loss" in trainer.callback_metrics
    assert trainer.progress_bar_metrics["loss"] == pytest.approx(float(trainer.callback_metrics["train/loss"]), rel=1e-5)
    assert MaskedLMModule(backbone_config=TINY_BERT).loss_on_progress_bar  # on a CPU: every step, as before
