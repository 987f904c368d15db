"""Dynamic int8 (torch.ao, with a weight-only fallback) and Q8BERT quantization-aware fine-tuning: exact reloads,
the symmetric fake quantization and its straight-through gradient by hand, and the shipped recipe end to end."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from ptm_app.backbones.model_classes import from_config
from ptm_app.compression import quantization as qz
from ptm_app.errors import PtmError

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[2]


def tiny_classifier(seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.AutoConfig.for_model("bert", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                               intermediate_size=64, vocab_size=80, max_position_embeddings=32,
                                               num_labels=3, initializer_range=0.2)
    return from_config("sequence_classification", config).eval()


def inputs(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(1, 80, (4, 10), generator=g), "attention_mask": torch.ones(4, 10, dtype=torch.long)}


def test_the_chosen_int8_api_still_exists():
    """torch.ao.quantization.quantize_dynamic is deprecated: when this fails, make weight_only (or torchao /
    ONNX Runtime, measured again) the default backend in compression.quantization."""
    assert qz.torch_ao_available()
    model = qz.quantize_dynamic_int8(tiny_classifier())
    dynamic = qz._dynamic_linear_type()
    assert sum(isinstance(m, dynamic) for m in model.modules()) == 2 * 6 + 2  # 6 per block, pooler, classifier


@pytest.mark.parametrize("backend", qz.BACKENDS)
def test_quantized_save_and_reload_give_identical_outputs(backend, tmp_path):
    fp32 = tiny_classifier()
    int8 = qz.quantize_dynamic_int8(fp32, backend)
    with torch.no_grad():
        before, reference = int8(**inputs()).logits, fp32(**inputs()).logits
    out = qz.save_quantized(int8, backend, tmp_path / "int8", "sequence_classification")
    assert not list(out.glob("*.bin")) and not list(out.glob("*.pt"))  # safetensors + JSON only
    reloaded = qz.load_quantized(out)
    with torch.no_grad():
        after = reloaded(**inputs()).logits
    assert torch.equal(before, after)
    assert not torch.equal(before, reference)  # it is quantized ...
    assert float((before - reference).abs().max()) < 0.1 * float(reference.abs().max())  # ... and close to fp32
    from ptm_app.compression.pruning_policy import on_disk_mb

    linear = sum(m.weight.numel() for m in fp32.modules() if isinstance(m, torch.nn.Linear))
    saved = (out / qz.QUANT_WEIGHTS).stat().st_size
    assert on_disk_mb(fp32) * 2**20 - saved == pytest.approx(3 * linear, rel=0.05)  # 4 bytes -> 1 per weight


def qat_ranges_on(model, batch) -> dict[str, float]:
    """The input ranges a QAT run would learn from ``batch`` (its first batch sets the EMA), with the model's fake
    quantization left on (eval mode): the arithmetic the run trained with."""
    ranges = qz.ActivationRanges(list(qz.quantizable_linears(model)))
    qz.enable_fake_quant(model, ranges, qz.QATSpec())
    model.train()
    with torch.no_grad():
        model(**batch)
    model.eval()
    return {name: float(ranges.get(name)) for name in qz.quantizable_linears(model)}


def test_q8bert_static_int8_computes_what_qat_simulated_and_reloads(tmp_path):
    """Static int8 with the learned input ranges (int8 inputs x int8 weights, int32 sums, fp32 out) gives the fake-
    quantized model's outputs up to float rounding, much closer than dynamic int8 (each batch's own range, 7 bits)
    does; it saves and reloads exactly."""
    fp32 = tiny_classifier()
    batch = inputs()
    with torch.no_grad():
        plain = fp32(**batch).logits
    simulated_model = tiny_classifier()
    input_max = qat_ranges_on(simulated_model, batch)
    with torch.no_grad():
        simulated = simulated_model(**batch).logits
        static = qz.quantize_static_q8bert(fp32, input_max)
        assert sum(isinstance(m, qz.StaticInt8Linear) for m in static.modules()) == 2 * 6 + 2
        got = static(**batch).logits
        dynamic = qz.quantize_dynamic_int8(fp32)(**batch).logits
    assert not torch.equal(simulated, plain)
    assert float((got - simulated).abs().max()) < 1e-4 * max(1.0, float(simulated.abs().max()))
    assert float((got - simulated).abs().max()) < float((dynamic - simulated).abs().max())
    from ptm_app.experiments.compression_report import counts

    assert counts([static])[0] == counts([fp32])[0] == sum(p.numel() for p in fp32.parameters())  # int8 weights count
    out = qz.save_quantized(static, qz.STATIC, tmp_path / "int8", "sequence_classification")
    info = json.loads((out / qz.QUANT_CONFIG).read_text())
    assert info["method"] == "static_int8" and len(info["modules"]) == 14
    with torch.no_grad():
        assert torch.equal(qz.load_quantized(out)(**batch).logits, got)
    with pytest.raises(PtmError, match="no learned input range for"):
        qz.quantize_static_q8bert(fp32, {})


def test_a_head_pruned_model_quantizes_and_reloads(tmp_path):
    from ptm_app.backbones.pruned_heads import heads_per_layer, prune_heads

    fp32 = tiny_classifier()
    prune_heads(fp32, {0: [1]})
    int8 = qz.quantize_dynamic_int8(fp32)
    reloaded = qz.load_quantized(qz.save_quantized(int8, "torch_ao", tmp_path / "int8", "sequence_classification"))
    assert heads_per_layer(reloaded) == [1, 2]
    with torch.no_grad():
        assert torch.equal(reloaded(**inputs()).logits, int8(**inputs()).logits)


def test_int8_weights_are_q8bert_symmetric():
    fp32 = tiny_classifier()
    int8 = qz.quantize_dynamic_int8(fp32)
    name = "bert.encoder.layer.0.attention.self.query"
    w = fp32.get_submodule(name).weight.detach()
    q, _ = int8.get_submodule(name)._weight_bias()
    assert q.q_zero_point() == 0 and q.q_scale() == pytest.approx(float(w.abs().max()) / 127)
    assert int(q.int_repr().abs().max()) == 127
    torch.testing.assert_close(q.dequantize(), qz.fake_quantize(w))  # the int8 weight = QAT's fake-quantized one


def test_no_quantized_kernels_is_one_line(monkeypatch):
    monkeypatch.setattr(qz, "quantized_engines", lambda: ["none"])
    with pytest.raises(PtmError, match="no quantized CPU kernels"):
        qz.quantize_dynamic_int8(tiny_classifier())


def test_fake_quantization_is_symmetric_with_straight_through_gradients():
    x = torch.tensor([-2.0, -0.7, 0.0, 0.3, 1.0], requires_grad=True)
    y = qz.fake_quantize(x)  # S = 127 / 2
    s = 127 / 2.0
    assert y.tolist() == pytest.approx([round(v * s) / s for v in [-2.0, -0.7, 0.0, 0.3, 1.0]])
    assert y.tolist() == pytest.approx([-127 / s, -44 / s, 0.0, 19 / s, 64 / s])  # 63.5 rounds to even
    torch.testing.assert_close(qz.fake_quantize(-x.detach()), -qz.fake_quantize(x.detach()))  # symmetric
    (y * torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])).sum().backward()
    assert x.grad.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]  # ∂x_q/∂x = 1
    clipped = qz.fake_quantize(torch.tensor([3.0, -1.0]), torch.tensor(1.0))  # a range of 1: 3 clips to 1
    assert clipped.tolist() == [1.0, -1.0]


def test_qat_linear_tracks_the_input_range_by_ema():
    linear = torch.nn.Linear(3, 2)
    ranges = qz.ActivationRanges(["fc"])
    spec = qz.QATSpec(ema=0.5)
    holder = torch.nn.Sequential()
    holder.add_module("fc", linear)
    qz.enable_fake_quant(holder, ranges, spec)
    linear.train()
    linear(torch.tensor([[1.0, -4.0, 2.0]]))
    assert float(ranges.get("fc")) == 4.0  # the first batch sets it
    out = linear(torch.tensor([[2.0, 0.5, -1.0]]))
    assert float(ranges.get("fc")) == pytest.approx(0.5 * 4.0 + 0.5 * 2.0)
    x = qz.fake_quantize(torch.tensor([[2.0, 0.5, -1.0]]), torch.tensor(3.0))
    expected = torch.nn.functional.linear(x, qz.fake_quantize(linear.weight.detach()), linear.bias.detach())
    torch.testing.assert_close(out.detach(), expected)
    linear.eval()
    linear(torch.tensor([[100.0, 0.0, 0.0]]))
    assert float(ranges.get("fc")) == pytest.approx(3.0)  # frozen in eval mode
    qz.disable_fake_quant(holder)
    torch.testing.assert_close(linear(torch.ones(1, 3)), torch.nn.functional.linear(torch.ones(1, 3), linear.weight,
                                                                                    linear.bias))
    with pytest.raises(PtmError, match="outside \\[0, 1\\)"):
        qz.QATSpec(ema=1.0)


@pytest.mark.slow  # ~40 s: a tiny starting run, full / paused / resumed QAT runs, quantize, predict
def test_qat_recipe_resumes_exactly_quantizes_and_predicts(tmp_path, capsys):
    from safetensors.torch import load_file

    from tests.compression.test_compress_configs import QUICK, tiny_teacher
    from tests.conftest import assert_resumes_exactly, run_main

    runs = tmp_path / "runs"
    tiny_teacher(runs, "minilm_full_bbc", tmp_path)
    config = ROOT / "configs" / "compress" / "minilm_qat_bbc.yaml"
    assert_resumes_exactly(["fit", "--config", str(config), *QUICK], runs, stop=2, steps=4)
    ckpt = torch.load(runs / "part" / "checkpoints" / "last.ckpt", weights_only=True)
    ranges = {k: v for k, v in ckpt["state_dict"].items() if k.startswith("qat_ranges.") and v.dim() == 0
              and v.is_floating_point()}
    assert ranges and all(float(v) > 0 for v in ranges.values())  # every linear layer saw inputs
    export = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(runs / "part"), "--output_dir", str(export)], runs) == 0
    assert not (export / "module_weights.safetensors").exists()
    int8 = tmp_path / "int8"
    capsys.readouterr()
    assert run_main(["quantize", "--ckpt_path", str(runs / "part"), "--output_dir", str(int8), "--eval_source", "bbc",
                     "--eval_limit", "8", "--repeats", "2", "--max_length", "32"], runs) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("quantized ") and "test_acc" in out[0]
    summary = json.loads((int8 / "summary.json").read_text())
    assert summary["int8_mb"] < summary["fp32_mb"] and summary["metric"]["examples"] == 8
    assert set(summary["latency_ms"]["int8"]) == {"batch_1", "batch_32"}
    fp32 = load_file(str(export / "model.safetensors"))["bert.encoder.layer.0.intermediate.dense.weight"]
    q = load_file(str(int8 / qz.QUANT_WEIGHTS))
    scale = float(q["bert.encoder.layer.0.intermediate.dense.weight_scale"])
    dequantized = q["bert.encoder.layer.0.intermediate.dense.weight_int8"].float() * scale
    torch.testing.assert_close(dequantized, qz.fake_quantize(fp32))  # the weights the QAT run computed with
    text = "shares fell as the bank cut rates"
    for ref in (str(int8), str(export)):
        assert run_main(["predict", "--ckpt_path", ref, "--text", text], runs) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert len(rows) == 2 and set(rows[0]["probs"]) == set(rows[1]["probs"])
    assert max(abs(rows[0]["probs"][k] - rows[1]["probs"][k]) for k in rows[0]["probs"]) < 0.05
    # Q8BERT's own int8: the run's learned input ranges become the int8 input scales; predict runs on it
    static = tmp_path / "int8_static"
    assert run_main(["quantize", "--ckpt_path", str(runs / "part"), "--output_dir", str(static), "--backend",
                     "q8bert_static", "--repeats", "1", "--max_length", "32"], runs) == 0
    q = load_file(str(static / qz.QUANT_WEIGHTS))
    learned = ckpt["state_dict"]["qat_ranges.bert__encoder__layer__0__intermediate__dense"]
    assert float(q["bert.encoder.layer.0.intermediate.dense.input_scale"]) == pytest.approx(float(learned) / 127)
    assert run_main(["predict", "--ckpt_path", str(static), "--text", text], runs) == 0
    capsys.readouterr()
    assert run_main(["quantize", "--ckpt_path", str(export), "--output_dir", str(tmp_path / "no"), "--backend",
                     "q8bert_static"], runs) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a quantization-aware run's learned input ranges" in err[0], err
