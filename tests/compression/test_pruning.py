"""Head pruning (Michel et al. 2019), layer dropping (Sajjad et al. 2020) and magnitude pruning (Zhu & Gupta 2017)
on tiny BERTs: exact equivalences, exact counts and hand-computed values."""
from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import pytest
import torch
import transformers

from ptm_app.backbones.build import build_backbone
from ptm_app.backbones.model_classes import from_config
from ptm_app.compression import heads as hp
from ptm_app.compression.magnitude import MagnitudeSpec, cubic_sparsity, magnitude_masks, prunable_weights, sparsity_of
from ptm_app.compression.pruning_policy import LayerDropSpec, HeadPruningSpec, drop_layers, layers_to_drop
from ptm_app.errors import PtmError

pytestmark = pytest.mark.usefixtures("one_thread")
CONFIG = {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 48,
          "vocab_size": 60, "max_position_embeddings": 32, "num_labels": 3, "hidden_dropout_prob": 0.0,
          "attention_probs_dropout_prob": 0.0, "initializer_range": 0.3}


def tiny_bert(seed: int = 0, dtype=torch.float32, **overrides):
    torch.manual_seed(seed)
    config = transformers.AutoConfig.for_model("bert", **{**CONFIG, **overrides})
    return from_config("sequence_classification", config).to(dtype).eval()


def batch(seed: int = 1, n: int = 3, length: int = 9) -> dict:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(n, length, dtype=torch.long)
    mask[0, 6:] = 0
    return {"input_ids": torch.randint(1, 60, (n, length), generator=g), "attention_mask": mask,
            "labels": torch.randint(0, 3, (n,), generator=g)}


def logits(model, b):
    return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits


def loss_fn(model, b):
    return torch.nn.functional.cross_entropy(logits(model, b), b["labels"])


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


CHOSEN = {0: [1, 3], 2: [0]}


def test_pruned_model_equals_the_unpruned_with_those_heads_masked():
    model = tiny_bert()
    b = batch()
    gates = [torch.ones(4) for _ in range(3)]
    for layer, heads in CHOSEN.items():
        gates[layer][heads] = 0.0
    with torch.no_grad(), hp.head_gates(model, gates):
        masked = logits(model, b)
    with torch.no_grad():
        full = logits(model, b)
    pruned = copy.deepcopy(model)
    hp.prune_heads(pruned, CHOSEN)
    with torch.no_grad():
        out = logits(pruned, b)
    assert not torch.allclose(masked, full, atol=1e-4)  # the heads mattered
    torch.testing.assert_close(out, masked, atol=1e-5, rtol=0)
    assert hp.heads_per_layer(pruned) == [2, 4, 3]
    assert pruned.config.pruned_heads == {"0": [1, 3], "2": [0]}
    d, hidden = 8, 32  # head size, model width: per head q,k,v rows (+bias) and the output projection's columns
    assert n_params(model) - n_params(pruned) == 3 * (3 * (d * hidden + d) + hidden * d)


def test_iterative_pruning_records_original_head_ids_and_reloads(tmp_path):
    model = tiny_bert()
    b = batch()
    hp.prune_heads(model, {0: [1]})
    hp.prune_heads(model, {0: [1]})  # position 1 is now original head 2
    assert model.config.pruned_heads == {"0": [1, 2]}
    assert hp.kept_heads(model)[0] == [0, 3]
    model.save_pretrained(tmp_path / "pruned")
    reloaded = build_backbone("sequence_classification", str(tmp_path / "pruned"), None).eval()
    assert hp.heads_per_layer(reloaded) == [2, 4, 4]
    with torch.no_grad():
        torch.testing.assert_close(logits(reloaded, b), logits(model, b), atol=1e-6, rtol=0)
    rebuilt = from_config("sequence_classification", model.config)  # the checkpoint path: config, then weights
    rebuilt.load_state_dict(model.state_dict())
    assert hp.heads_per_layer(rebuilt) == [2, 4, 4]


def tiny_llama(kv_heads: int, seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.AutoConfig.for_model("llama", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=kv_heads, vocab_size=60,
                                               max_position_embeddings=32, num_labels=3, pad_token_id=0,
                                               initializer_range=0.3)
    return from_config("sequence_classification", config).eval()


@pytest.mark.parametrize("kv_heads", [2, 4])  # grouped-query attention (2 query heads per key/value head), MHA
def test_llama_units_pruned_equal_the_masked_model_and_reload(kv_heads, tmp_path):
    """A unit is a key/value head with its query heads (one head without grouping): removing unit 1 of layer 0
    equals gating it to zero, drops exactly its rows and columns, and a save_pretrained directory reloads it."""
    model = tiny_llama(kv_heads)
    b = batch()
    units, group, d, hidden = kv_heads, 4 // kv_heads, 8, 32
    assert hp.heads_per_layer(model) == [units, units]
    gates = [torch.ones(units), torch.ones(units)]
    gates[0][1] = 0.0
    with torch.no_grad(), hp.head_gates(model, gates):
        masked = logits(model, b)
    with torch.no_grad():
        full = logits(model, b)
    pruned = copy.deepcopy(model)
    hp.prune_heads(pruned, {0: [1]})
    with torch.no_grad():
        out = logits(pruned, b)
    assert not torch.allclose(masked, full, atol=1e-4)
    torch.testing.assert_close(out, masked, atol=1e-5, rtol=0)
    assert hp.heads_per_layer(pruned) == [units - 1, units]
    # q rows and o columns of `group` heads, k and v rows of one head (no biases)
    assert n_params(model) - n_params(pruned) == 2 * group * d * hidden + 2 * d * hidden
    pruned.save_pretrained(tmp_path / "pruned")
    reloaded = build_backbone("sequence_classification", str(tmp_path / "pruned"), None).eval()
    assert hp.heads_per_layer(reloaded) == [units - 1, units]
    with torch.no_grad():
        torch.testing.assert_close(logits(reloaded, b), out, atol=1e-6, rtol=0)
    scores = hp.michel_scores(pruned, [b], loss_fn)
    assert [len(s) for s in scores] == [units - 1, units] and all(float(s.sum()) > 0 for s in scores)


def test_michel_scores_match_finite_differences():
    """I_h = Σ_batches |∂L/∂ξ_h|, checked against central differences of the loss in float64."""
    model = tiny_bert(dtype=torch.float64)
    batches = [batch(1), batch(2)]
    raw = hp.michel_scores(model, batches, loss_fn, normalize=False)
    eps = 1e-6
    for layer, head in [(0, 0), (1, 2), (2, 3)]:
        total = 0.0
        for b in batches:
            values = []
            for sign in (1, -1):
                gates = [torch.ones(4, dtype=torch.float64) for _ in range(3)]
                gates[layer][head] += sign * eps
                with torch.no_grad(), hp.head_gates(model, gates):
                    values.append(float(loss_fn(model, b)))
            total += abs((values[0] - values[1]) / (2 * eps))
        assert float(raw[layer][head]) == pytest.approx(total, rel=1e-5)
    normalized = hp.michel_scores(model, batches, loss_fn)
    for layer in range(3):
        torch.testing.assert_close(normalized[layer], raw[layer] / raw[layer].norm())
        assert float(normalized[layer].norm()) == pytest.approx(1.0)
    assert all(p.grad is None for p in model.parameters())  # only the gates' gradients were taken


def test_heads_to_prune_takes_the_lowest_and_keeps_one_per_layer():
    scores = [torch.tensor([0.1, 0.9, 0.05]), torch.tensor([0.01, 0.02]), torch.tensor([0.5, 0.6, 0.7])]
    assert hp.heads_to_prune(scores, 3) == {0: [0, 2], 1: [0]}  # 0.02 is spared: layer 1 keeps its last head
    assert hp.heads_to_prune(scores, 1) == {1: [0]}


def test_bad_head_requests_are_one_line():
    model = tiny_bert()
    with pytest.raises(PtmError, match="it has 4 heads"):
        hp.prune_heads(model, {0: [0, 1, 2, 3]})
    with pytest.raises(PtmError, match="it has 4 heads"):
        hp.prune_heads(model, {1: [7]})
    with pytest.raises(PtmError, match="layers 0..2"):
        hp.prune_heads(model, {5: [0]})
    with pytest.raises(PtmError, match="outside \\[0, 1\\)"):
        HeadPruningSpec(target=1.0)
    gpt2 = from_config("sequence_classification", transformers.AutoConfig.for_model("gpt2", n_embd=16, n_layer=1,
                                                                                      n_head=2, vocab_size=30))
    with pytest.raises(PtmError, match="BERT-style"):
        hp.heads_per_layer(gpt2)


def test_layer_dropping_top_alternate_and_listed():
    assert layers_to_drop(LayerDropSpec("top", 2), 6) == [5, 6]
    assert layers_to_drop(LayerDropSpec("alternate", 3), 6) == [2, 4, 6]
    assert layers_to_drop(LayerDropSpec([1, 3]), 6) == [1, 3]
    with pytest.raises(PtmError, match="layers 1..6"):
        layers_to_drop(LayerDropSpec([0, 7]), 6)
    with pytest.raises(PtmError, match="must keep one"):
        layers_to_drop(LayerDropSpec("top", 6), 6)
    model = tiny_bert()
    hp.prune_heads(model, {2: [1]})
    b = batch()
    skip = model.bert.encoder.layer[1].register_forward_hook(lambda module, args, out: args[0])  # block 2 skipped
    with torch.no_grad():
        expected = logits(model, b)
    skip.remove()
    before = n_params(model)
    drop_layers(model, [2])
    assert model.config.num_hidden_layers == 2 and model.config.dropped_layers == [2]
    assert model.config.pruned_heads == {"1": [1]}  # block 3 (index 2) is now index 1
    assert hp.heads_per_layer(model) == [4, 3]
    assert before - n_params(model) == 4 * (32 * 32 + 32) + 2 * 32 * 48 + 48 + 32 + 2 * 2 * 32  # attn, ffn, 2 LNs
    with torch.no_grad():
        torch.testing.assert_close(logits(model, b), expected, atol=1e-5, rtol=0)


def test_cubic_schedule_values():
    # s_t = s_f + (s_i − s_f)(1 − (t − t0)/(nΔt))³ with s_i=0, s_f=0.8, t0=10, n=4, Δt=5
    expected = {0: 0.0, 9: 0.0, 10: 0.0, 14: 0.0, 15: 0.8 - 0.8 * 0.75 ** 3, 20: 0.8 - 0.8 * 0.5 ** 3,
                27: 0.8 - 0.8 * 0.25 ** 3, 30: 0.8, 100: 0.8}
    for step, value in expected.items():
        assert cubic_sparsity(step, 0.0, 0.8, 10, 4, 5) == pytest.approx(value), step
    spec = MagnitudeSpec(sparsity=0.8, schedule="cubic", start_step=10, steps=4, every=5)
    assert spec.update_steps() == [10, 15, 20, 25, 30]
    assert spec.sparsity_at(20) == pytest.approx(0.7)
    for bad in (1.0, -0.1, 1.5):
        with pytest.raises(PtmError, match="outside \\[0, 1\\)"):
            MagnitudeSpec(sparsity=bad)


@pytest.mark.parametrize("scope", ["global", "layer"])
def test_magnitude_masks_reach_the_sparsity(scope):
    model = tiny_bert()
    weights = prunable_weights(model)
    assert len(weights) == 3 * 6  # q, k, v, attention output, intermediate, output per block
    masks = magnitude_masks(weights, 0.7, scope)
    pruned = {n: w.detach() * masks[n] for n, w in weights.items()}
    total = sum(w.numel() for w in weights.values())
    zeros = sum(int((m == 0).sum()) for m in masks.values())
    assert zeros == (round(0.7 * total) if scope == "global" else sum(round(0.7 * m.numel()) for m in masks.values()))
    assert sparsity_of(pruned.values()) == pytest.approx(0.7, abs=1e-3)
    if scope == "layer":
        for name, m in masks.items():
            assert int((m == 0).sum()) == round(0.7 * m.numel()), name
    else:  # one threshold: every kept weight is at least as large as every pruned one
        kept = torch.cat([weights[n].detach().abs()[masks[n].bool()] for n in weights])
        gone = torch.cat([weights[n].detach().abs()[~masks[n].bool()] for n in weights])
        assert float(kept.min()) >= float(gone.max())
        per_layer = [sparsity_of([w]) for w in pruned.values()]
        assert max(per_layer) - min(per_layer) > 0.01  # global: layers end up at different sparsities


# -- the shipped recipes, end to end (a substituted tiny "minilm_full_bbc" run: tests/compression/test_compress_configs) --
ROOT = Path(__file__).resolve().parents[2]
PRUNE_CONFIGS = sorted((ROOT / "configs" / "compress").glob("minilm_prune_*.yaml"))
FAST_SCHEDULE = {  # the recipes' schedule step counts, scaled to a 4-step run (nothing else changes)
    "minilm_prune_heads_bbc": ["--model.init_args.pruning.heads.every", "1", "--model.init_args.pruning.heads.score_batches",
                        "1"],
    "minilm_prune_magnitude_bbc": ["--model.init_args.pruning.magnitude.steps", "2",
                            "--model.init_args.pruning.magnitude.every", "1"],
}


def test_prune_catalogue():
    assert {c.stem for c in PRUNE_CONFIGS} == {"minilm_prune_heads_bbc", "minilm_prune_layers_bbc", "minilm_prune_magnitude_bbc"}


@pytest.mark.slow  # ~25-35 s each: a tiny starting run, then full, paused and resumed runs
@pytest.mark.parametrize("config", PRUNE_CONFIGS, ids=lambda c: c.stem)
def test_prune_config_runs_resumes_exactly_exports_and_predicts(config, tmp_path, capsys):
    from safetensors.torch import load_file

    from tests.compression.test_compress_configs import QUICK, tiny_teacher
    from tests.conftest import assert_resumes_exactly, run_main

    runs = tmp_path / "runs"
    tiny_teacher(runs, "minilm_full_bbc", tmp_path)  # 6 layers of 2 heads, width 32
    argv = ["fit", "--config", str(config), *QUICK, *FAST_SCHEDULE.get(config.stem, [])]
    assert_resumes_exactly(argv, runs, stop=2, steps=4)
    summary = json.loads((runs / "part" / "summary.json").read_text())["compression"]
    full = json.loads((runs / "full" / "summary.json").read_text())["compression"]
    assert summary == full
    out = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(runs / "part"), "--output_dir", str(out)], runs) == 0
    saved = json.loads((out / "config.json").read_text())
    weights = load_file(str(out / "model.safetensors"))
    assert not (out / "module_weights.safetensors").exists()  # the masks stay behind: the zeros are in the weights
    if config.stem == "minilm_prune_heads_bbc":
        # rounds at steps 0, 1, 2 to 0.5 of 12 heads: 2, 4, then 6 gone, one per layer (each keeps its last)
        assert summary["heads_per_layer"] == [1] * 6 and sum(len(v) for v in saved["pruned_heads"].values()) == 6
        assert weights["bert.encoder.layer.0.attention.self.query.weight"].shape == (16, 32)
        assert weights["bert.encoder.layer.0.attention.output.dense.weight"].shape == (32, 16)
    elif config.stem == "minilm_prune_layers_bbc":
        assert saved["num_hidden_layers"] == 3 and saved["dropped_layers"] == [4, 5, 6]
        assert summary["num_hidden_layers"] == 3 and "bert.encoder.layer.3.output.dense.weight" not in weights
    else:  # cubic to 0.9 over updates at steps 0, 1, 2 (n = 2): 0, 0.9·(1 − 1/8), 0.9
        assert summary["sparsity"] == pytest.approx(0.9, abs=1e-4)
        block = [w for k, w in weights.items() if ".encoder.layer." in k and k.endswith("weight") and w.dim() == 2]
        assert sparsity_of(block) == pytest.approx(0.9, abs=1e-4)  # permanent in the export
        rows = [float(r["train/loss"]) for r in csv.DictReader(open(runs / "part" / "logs" / "metrics.csv"))
                if r.get("train/loss")]
        assert len(rows) == 4
    assert summary["params"] == sum(w.numel() for k, w in weights.items())
    capsys.readouterr()
    for ref in (str(out), str(runs / "part")):  # the export and the run itself reload the smaller model
        assert run_main(["predict", "--ckpt_path", ref, "--text", "shares fell as the bank cut rates"], runs) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert len(lines) == 2 and lines[0]["label"] == lines[1]["label"]
    assert lines[0]["probs"] == pytest.approx(lines[1]["probs"], abs=1e-5)


@pytest.mark.parametrize("override, message", [
    (["--model.init_args.pruning.magnitude.sparsity", "1.0"], "pruning.magnitude.sparsity=1.0 is outside [0, 1)"),
    (["--model.init_args.pruning.layers", "{drop: [2, 9]}"], "names layer(s) [9], but the model has layers 1..6"),
    (["--model.init_args.pruning.heads", "{heads: {0: [0, 1, 2]}}"], "cannot prune heads [0, 1, 2] of layer 0"),
    (["--model.init_args.pruning.heads", "{target: 0.9}"], "asks for 11 of 12 heads, but each of the 6 layers keeps one"),
])
def test_bad_pruning_settings_are_one_line(override, message, tmp_path, capsys):
    from tests.compression.test_compress_configs import QUICK, tiny_teacher
    from tests.conftest import run_main

    runs = tmp_path / "runs"
    tiny_teacher(runs, "minilm_full_bbc", tmp_path)
    capsys.readouterr()
    config = ROOT / "configs" / "compress" / "minilm_prune_magnitude_bbc.yaml"
    assert run_main(["fit", "--config", str(config), *QUICK, *override], runs) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_prune_command_one_shot_without_fine_tuning(tmp_path, capsys):
    """Heads (2 rounds to half), the top 2 layers and 50 % magnitude, then predict on the result."""
    from tests.compression.test_compress_configs import tiny_teacher
    from tests.conftest import run_main

    runs = tmp_path / "runs"
    teacher = tiny_teacher(runs, "minilm_full_bbc", tmp_path)  # 6 layers of 2 heads
    out = tmp_path / "pruned"
    capsys.readouterr()
    assert run_main(["prune", "--ckpt_path", str(teacher), "--output_dir", str(out), "--drop_layers", "top:2",
                     "--heads", "0.5", "--rounds", "2", "--score_batches", "2", "--batch_size", "4", "--sparsity",
                     "0.5", "--eval_source", "bbc", "--eval_limit", "8", "--repeats", "1", "--max_length", "32"],
                    runs) == 0
    printed = [line for line in capsys.readouterr().out.strip().splitlines()
               if "real_accelerator" not in line]  # DeepSpeed's import notice (transformers' save_pretrained)
    assert len(printed) == 1 and printed[0].startswith("pruned ") and "4 layers" in printed[0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_hidden_layers"] == 4 and summary["heads_per_layer"] == [1, 1, 1, 1]  # 4 of 8 heads gone
    assert summary["sparsity"] == pytest.approx(0.5, abs=1e-4)
    d, width, ffn = 16, 32, 64
    per_layer = 4 * (width * width + width) + 2 * width * ffn + ffn + width + 4 * width
    per_head = 3 * (d * width + d) + width * d
    assert summary["params"]["before"] - summary["params"]["after"] == 2 * per_layer + 4 * per_head
    assert summary["metric"]["examples"] == 8 and 0 <= summary["metric"]["after"] <= 1
    assert run_main(["predict", "--ckpt_path", str(out), "--text", "shares fell as the bank cut rates"], runs) == 0
    row = json.loads(capsys.readouterr().out.strip())
    assert sum(row["probs"].values()) == pytest.approx(1.0, abs=1e-4)
    assert run_main(["prune", "--ckpt_path", str(teacher), "--output_dir", str(out), "--sparsity", "1.2"], runs) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "outside [0, 1)" in err[0], err


@pytest.mark.slow  # ~30 s
def test_heads_and_magnitude_together_resume_exactly(tmp_path):
    """Slicing heads slices their magnitude masks too (in the run and on resume), so the two compose."""
    from tests.compression.test_compress_configs import QUICK, tiny_teacher
    from tests.conftest import assert_resumes_exactly

    runs = tmp_path / "runs"
    tiny_teacher(runs, "minilm_full_bbc", tmp_path)
    config = ROOT / "configs" / "compress" / "minilm_prune_heads_bbc.yaml"
    assert_resumes_exactly(["fit", "--config", str(config), *QUICK, *FAST_SCHEDULE["minilm_prune_heads_bbc"],
                            "--model.init_args.pruning.magnitude", "{sparsity: 0.5, schedule: cubic, steps: 3, every: 1}"],
                           runs, stop=2, steps=4)
    summary = json.loads((runs / "part" / "summary.json").read_text())["compression"]
    assert summary["heads_per_layer"] == [1] * 6 and summary["sparsity"] == pytest.approx(0.5, abs=1e-3)
