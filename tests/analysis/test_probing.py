"""Layer-wise probing (Tenney et al. 2019), control tasks (Hewitt & Liang 2019), scalar mix and center of gravity."""
import json
from collections import Counter

import pytest
import torch

from ptm_app.analysis.probe_tasks import PROBE_TASKS, load_examples
from ptm_app.analysis.probes import (ProbeSettings, center_of_gravity, control_label, label_distribution,
                                     probe_accuracy, train_scalar_mix)
from ptm_app.analysis.probing import probe, probe_model_task
from ptm_app.analysis.representations import cached_layers, encode_layers, load_encoder
from ptm_app.paths import sha256_file
from tests.conftest import run_main

pytestmark = pytest.mark.usefixtures("one_thread")


def layered_case(n: int, seed: int):
    """Two layers over ``n`` rows of 4 classes: layer 1 holds the label (a class direction + noise), layer 0 is
    noise only."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    directions = torch.randn(4, 16, generator=torch.Generator().manual_seed(99)) * 3
    noise = torch.randn(n, 16, generator=g)
    return [torch.randn(n, 16, generator=g), directions[y] + noise], y


@pytest.mark.parametrize("settings", [ProbeSettings(), ProbeSettings(kind="mlp", optimizer="adam", steps=40,
                                                                     batch_size=64, hidden_size=32)],
                         ids=["linear-lbfgs", "mlp-adam"])
def test_the_layer_that_holds_the_label_is_found(settings):
    (noise_tr, signal_tr), y_tr = layered_case(400, 1)
    (noise_te, signal_te), y_te = layered_case(200, 2)
    assert probe_accuracy(signal_tr, y_tr, signal_te, y_te, 4, settings) > 0.95
    assert probe_accuracy(noise_tr, y_tr, noise_te, y_te, 4, settings) < 0.45  # chance is 0.25
    # the scalar mix puts its weight on layer 1, so the center of gravity moves towards 1
    weights, _ = train_scalar_mix([noise_tr, signal_tr], y_tr, 4, ProbeSettings())
    assert weights.sum().item() == pytest.approx(1.0) and weights[1] > 0.7
    assert center_of_gravity(weights.tolist(), [0, 1]) == pytest.approx(weights[1].item())
    # ELMo's L2 on the mix weights holds them near the average (Peters et al. 2018 §3.2)
    held, _ = train_scalar_mix([noise_tr, signal_tr], y_tr, 4, ProbeSettings(), mix_l2=1.0)
    assert held[1].item() == pytest.approx(0.5, abs=0.05) and held[1] < weights[1] - 0.1


def test_probes_are_seeded():
    (_, signal), y = layered_case(200, 3)
    runs = [probe_accuracy(signal, y, signal[:50], y[:50], 4, ProbeSettings(optimizer="adam", steps=3, seed=s))
            for s in (5, 5)]
    assert runs[0] == runs[1]


def test_control_labels_are_a_fixed_function_of_the_type_with_the_task_distribution():
    distribution = {"ADJ": 0.1, "NOUN": 0.5, "VERB": 0.3, "X": 0.1}
    types = [f"word{i}" for i in range(20000)]
    labels = [control_label(t, distribution, seed=0) for t in types]
    shares = Counter(labels)
    for label, share in distribution.items():
        assert shares[label] / len(types) == pytest.approx(share, abs=0.01)
    assert [control_label(t, distribution, seed=0) for t in types[:500]] == labels[:500]  # fixed
    other_seed = [control_label(t, distribution, seed=1) for t in types[:500]]
    assert 0.2 < sum(a != b for a, b in zip(other_seed, labels)) / 500 < 0.9  # a new function, same distribution
    assert label_distribution(["b", "a", "b", "b"]) == {"a": 0.25, "b": 0.75}


def test_one_pass_gives_every_layer_and_words_sit_on_their_first_sub_token(tiny_bert_dir):
    encoder = load_encoder(str(tiny_bert_dir))
    examples = load_examples(PROBE_TASKS["brown_pos"], "test", 6, seed=0)
    calls = []
    hook = encoder.model.register_forward_hook(lambda *a: calls.append(1))
    features = cached_layers(encoder, examples, max_length=128, batch_size=4)
    again = cached_layers(encoder, examples, max_length=128, batch_size=4)  # from the cache: no backbone pass
    hook.remove()
    assert len(calls) == 2  # 6 sentences in batches of 4: two passes for all 3 layers
    assert len(features.layers) == encoder.num_layers == 3
    assert all(torch.equal(a, b) for a, b in zip(features.layers, again.layers))
    words = sum(len(w) for w in examples.texts)
    assert features.layers[0].shape == (words, 32)  # every word of these short sentences fits in 128 tokens
    assert features.sentence.tolist() == [s for s, ws in enumerate(examples.texts) for _ in ws]
    # the row of word w of sentence s is the hidden state at that word's first sub-token
    s, w = features.sentence[5].item(), features.word[5].item()
    text = " ".join(examples.texts[s])
    enc = encoder.tokenizer(text, return_offsets_mapping=True)
    start = sum(len(x) + 1 for x in examples.texts[s][:w])
    position = next(i for i, (a, b) in enumerate(enc["offset_mapping"]) if a == start and b > a)
    direct = encoder.model(torch.tensor([enc["input_ids"]]), output_hidden_states=True).hidden_states
    assert torch.allclose(features.layers[2][5], direct[2][0, position], atol=1e-5)


def test_probing_leaves_the_backbone_bit_identical(tiny_bert_dir):
    encoder = load_encoder(str(tiny_bert_dir))
    before = {k: v.clone() for k, v in encoder.model.state_dict().items()}
    digest = sha256_file(tiny_bert_dir / "model.safetensors")
    rows, gravity = probe_model_task(
        encoder, PROBE_TASKS["brown_pos"], [0, 1, 2], ProbeSettings(steps=20), train_examples=20, test_examples=8,
        control=True, scalar_mix=True, mix_l2=0.001, max_length=64, encode_batch_size=8, cache_dtype="float32",
        seed=0)
    after = encoder.model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert not any(p.requires_grad for p in encoder.model.parameters())
    assert sha256_file(tiny_bert_dir / "model.safetensors") == digest
    assert [r["layer"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert 0 <= r["accuracy"] <= 1 and 0 <= r["control"] <= 1
        assert r["selectivity"] == pytest.approx(r["accuracy"] - r["control"])
    assert sum(r["mix_weight"] for r in rows) == pytest.approx(1.0)
    assert 0 <= gravity["center_of_gravity"] <= 2


def test_probe_command_on_an_elmo_bilstm_writes_tables_and_pictures(tiny_bilstm_dir, tmp_path, capsys):
    out = tmp_path / "probe_out"
    assert run_main(["probe", "--models", str(tiny_bilstm_dir), "--tasks", "brown_pos", "bbc", "--train_examples",
                     "12", "--test_examples", "6", "--steps", "10", "--max_length", "48",
                     "--output_dir", str(out)], tmp_path) == 0
    rows = json.loads((out / "probe.json").read_text())
    assert [(r["task"], r["layer"]) for r in rows] == [(t, l) for t in ("brown_pos", "bbc") for l in range(3)]
    assert rows[0]["control"] is not None and rows[3]["control"] is None  # control tasks are word-level
    gravity = json.loads((out / "center_of_gravity.json").read_text())
    assert [g["task"] for g in gravity] == ["brown_pos", "bbc"]
    for name in ("probe.png", "scalar_mix.png", "probe.md", "probe.csv", "center_of_gravity.md"):
        assert (out / name).stat().st_size > 100, name
    assert json.loads((out / "settings.json").read_text())["train_examples"] == 12
    assert "| tiny_bilstm" in capsys.readouterr().out


def test_probe_figure_has_one_curve_per_model_and_task():
    from ptm_app.analysis.probing import draw_probe

    rows = [{"model": m, "task": t, "layer": l, "accuracy": 0.5, "control": 0.3 if t == "brown_pos" else None,
             "mix_weight": 0.5} for m in ("a", "b") for t in ("brown_pos", "bbc") for l in (0, 1)]
    gravity = [{"model": m, "task": t, "center_of_gravity": 0.5} for m in ("a", "b") for t in ("brown_pos", "bbc")]
    fig = draw_probe(rows, gravity)
    pos, bbc = fig.axes[:2]
    assert [line.get_label() for line in pos.get_lines() if not line.get_label().endswith("gravity")] == \
        ["a", "a control", "b", "b control"]
    assert [line.get_label() for line in bbc.get_lines() if not line.get_label().endswith("gravity")] == ["a", "b"]


def test_chosen_layers_only(tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "o"
    assert run_main(["probe", "--models", str(tiny_bert_dir), "--tasks", "bbc", "--layers", "2", "0",
                     "--train_examples", "6", "--test_examples", "3", "--steps", "3", "--output_dir", str(out)],
                    tmp_path) == 0
    assert [r["layer"] for r in json.loads((out / "probe.json").read_text())] == [0, 2]
    assert json.loads((out / "center_of_gravity.json").read_text())[0]["layers"] == "0,2"
    capsys.readouterr()


def test_a_layer_the_backbone_lacks_is_one_line(tiny_bert_dir, tmp_path, capsys):
    assert run_main(["probe", "--models", str(tiny_bert_dir), "--tasks", "bbc", "--layers", "0", "7",
                     "--output_dir", str(tmp_path / "o")], tmp_path) == 2
    err = capsys.readouterr().err
    assert "layer 7 is not in tiny_bert" in err and "layers 0..2" in err and err.count("\n") == 1


def test_a_task_whose_data_is_not_prepared_is_one_line(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PTM_DATA_DIR", str(tmp_path / "empty"))
    assert run_main(["probe", "--models", str(tiny_bert_dir), "--tasks", "wordnet_pairs"], tmp_path) == 2
    err = capsys.readouterr().err
    assert "'wordnet_pairs' is not prepared" in err and "data prepare wordnet_pairs" in err and err.count("\n") == 1


def test_an_unknown_task_or_setting_is_one_line(tmp_path, capsys):
    assert run_main(["probe", "--tasks", "ner"], tmp_path) == 2
    assert run_main(["probe", "--probes", "mlp"], tmp_path) == 2
    first, second = capsys.readouterr().err.splitlines()
    assert first.startswith("error: tasks:") and "ner" in first and "brown_pos" in first
    assert "unknown command-line argument --probes" in second


def test_a_run_directory_is_a_backbone(tiny_corpus, tmp_path, capsys):
    """A ptm_app run (here a tiny MLM) is probed through its checkpoint's backbone and saved tokenizer."""
    from tests.conftest import tiny_mlm_config

    runs = tmp_path / "runs"
    config = tiny_mlm_config(tiny_corpus, tmp_path, max_steps=2, val_check_interval=2)
    assert run_main(["fit", "--config", str(config), "--run_name", "mlm"], runs) == 0
    out = tmp_path / "out"
    assert run_main(["probe", "--models", str(runs / "mlm"), "--tasks", "brown_pos", "--train_examples", "10",
                     "--test_examples", "5", "--steps", "5", "--output_dir", str(out)], runs) == 0
    rows = json.loads((out / "probe.json").read_text())
    assert [r["layer"] for r in rows] == [0, 1, 2] and all(r["model"] == "mlm" for r in rows)
    capsys.readouterr()


def test_a_float16_cache_gives_the_same_numbers_on_a_miss_and_a_hit(tiny_bert_dir):
    encoder = load_encoder(str(tiny_bert_dir))
    examples = load_examples(PROBE_TASKS["bbc"], "test", 3, seed=1)
    first = cached_layers(encoder, examples, max_length=32, dtype="float16")
    second = cached_layers(encoder, examples, max_length=32, dtype="float16")
    exact = encode_layers(encoder, examples, max_length=32)
    for a, b, c in zip(first.layers, second.layers, exact.layers):
        assert torch.equal(a, b) and a.dtype == torch.float32
        assert torch.allclose(a, c, rtol=1e-2, atol=1e-3) and not torch.equal(a, c)


@pytest.mark.parametrize("model", ["minilm", "smollm2"])
def test_first_sub_tokens_of_word_piece_and_byte_level_tokenizers(model):
    """Each word maps to the first token that starts inside it, for BERT's WordPiece and for SmolLM2's byte-level
    BPE (whose tokens carry the leading space)."""
    from transformers import AutoTokenizer

    from ptm_app.analysis.representations import first_sub_tokens, word_spans
    from ptm_app.data.sources import prepared_dir

    tok = AutoTokenizer.from_pretrained(prepared_dir(model))
    words = ["The", "jury's", "unbelievably", "long", "report", "--", "``", "ok", "''", "."]
    text, owner = word_spans(words)
    enc = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    first = first_sub_tokens(enc["offset_mapping"], enc["special_tokens_mask"], owner)
    assert sorted(first) == list(range(len(words)))
    positions = [first[w] for w in range(len(words))]
    assert positions == sorted(positions) and len(set(positions)) == len(words)
    for w, pos in first.items():
        piece = tok.decode([enc["input_ids"][pos]]).strip().lower().replace("##", "")
        assert piece and words[w].lower().startswith(piece), (words[w], piece)
