"""Delta tuning: adapters / PALs (hand-written), peft LoRA / IA3 / prompts, BitFit (survey §5.6, T18)."""
from __future__ import annotations

import copy
import json
from dataclasses import asdict

import pytest
import torch
import transformers
from torch import nn

from ptm_app.backbones.adapters import (BottleneckAdapter, add_adapter, list_adapters, remove_adapter,
                                         set_active_adapter)
from ptm_app.backbones.delta import (METHODS, DeltaSpec, apply_delta, as_delta_spec, delta_state_dict, load_delta,
                                      load_delta_state_dict, merge_for_export, save_delta, trainable_report)
from ptm_app.errors import PtmError



pytestmark = pytest.mark.usefixtures("one_thread")

H, LAYERS, FFN, LABELS, VOCAB = 32, 2, 64, 3, 100
SMALL = dict(bottleneck=8, r=4, num_virtual_tokens=5)  # sizes used throughout
HEAD = H * LABELS + LABELS
ADAPTER = (H * 8 + 8) + (8 * H + H)  # one bottleneck adapter: down + up
PALS = (H * 8 + 8) + (8 * H + H) + LAYERS * 3 * (8 * 8 + 8)  # shared V_E, V_D + per-layer q, k, v
LORA = LAYERS * 2 * (4 * H + H * 4)  # query + value, A and B
IA3 = LAYERS * (H + H + H + FFN)  # key, value, attention.output.dense, output.dense (feed-forward: input dim)


def bert(**overrides) -> nn.Module:
    """The same tiny BertForSequenceClassification every time (a 'fresh backbone')."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=2,
                                  intermediate_size=FFN, max_position_embeddings=64, num_labels=LABELS, **overrides)
    return transformers.BertForSequenceClassification(cfg)


def gpt2() -> nn.Module:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=H, n_layer=LAYERS, n_head=2, n_positions=64,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


@pytest.fixture(scope="module")
def batch() -> dict:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (4, 9), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[3, 4:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 2, 1])}


def logits(model: nn.Module, batch: dict) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def train(model: nn.Module, batch: dict, steps: int = 3) -> None:
    model.train()
    optim = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        if "labels" in batch and out.logits.dim() == 2:
            loss = nn.functional.cross_entropy(out.logits, batch["labels"])
        else:  # causal LM: next-token loss over the (possibly prompt-extended) logits' last positions
            n = batch["input_ids"].shape[1]
            loss = nn.functional.cross_entropy(out.logits[:, -n:-1].reshape(-1, VOCAB),
                                               batch["input_ids"][:, 1:].reshape(-1))
        optim.zero_grad()
        loss.backward()
        optim.step()


def trainable(model: nn.Module) -> dict[str, int]:
    return {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}


def bias_count(model: nn.Module) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if n.endswith("bias"))


def expected_trainable(method: str, model_before: nn.Module) -> int:
    layer_norms = (1 + 2 * LAYERS) * 2 * H
    return {"houlsby": 2 * LAYERS * ADAPTER + HEAD, "pfeiffer": LAYERS * ADAPTER + HEAD, "pals": PALS + HEAD,
            "lora": LORA + HEAD, "ia3": IA3 + HEAD, "prefix": 5 * LAYERS * 2 * H + HEAD, "prompt": 5 * H + HEAD,
            "bitfit": bias_count(model_before) + H * LABELS, "houlsby+ln": 2 * LAYERS * ADAPTER + HEAD + layer_norms,
            }.get(method, -1)


# -- which parameters are trainable ----------------------------------------------------------------
@pytest.mark.parametrize("method", [m for m in METHODS if m != "none"] + ["houlsby+ln"])
def test_exactly_the_delta_is_trainable(method):
    base = bert()
    spec = DeltaSpec(method=method.split("+")[0], train_layer_norm=method.endswith("+ln"), **SMALL)
    model = apply_delta(bert(), spec, "sequence_classification")
    names = trainable(model)
    heads = [n for n in names if "classifier" in n]
    assert len(heads) == 2 and all("original_module" not in n for n in heads)  # head trainable, peft's copy
    delta = [n for n in names if n not in heads]
    allowed = {"houlsby": ("delta_adapters.default.attn.", "delta_adapters.default.ffn."),
               "pfeiffer": ("delta_adapters.default.ffn.",), "pals": ("delta_adapters.default.pals.",),
               "lora": (".lora_A.default.", ".lora_B.default."), "ia3": (".ia3_l.default",),
               "prefix": ("prompt_encoder.default.embedding",), "prompt": ("prompt_encoder.default.embedding",),
               "ptuning": ("prompt_encoder.default.",), "bitfit": ("bias",)}[spec.method]
    ln_weights = [n for n in delta if "LayerNorm.weight" in n]
    assert len(ln_weights) == (1 + 2 * LAYERS if spec.train_layer_norm else 0)
    assert all(any(a in n for a in allowed) for n in delta if not (spec.train_layer_norm and "LayerNorm" in n)), delta
    report = trainable_report(model)
    assert report["trainable"] == sum(names.values())
    if method != "ptuning":  # P-tuning's MLP prompt encoder size is peft's business
        assert report["trainable"] == expected_trainable(method, base)
    assert 0 < report["percent"] < 15 and report["total"] >= sum(p.numel() for p in base.parameters())


def test_full_fine_tuning_and_frozen_head():
    assert trainable_report(apply_delta(bert(), DeltaSpec(method="none"), "sequence_classification"))["percent"] == 100
    model = apply_delta(bert(), DeltaSpec(method="houlsby", train_head=False, **SMALL))
    assert trainable_report(model)["trainable"] == 2 * LAYERS * ADAPTER
    model = apply_delta(bert(), DeltaSpec(method="lora", train_head=False, **SMALL), "SEQ_CLS")
    assert trainable_report(model)["trainable"] == LORA


# -- training touches only the delta ------------------------------------------------------------------
@pytest.mark.parametrize("method", [m for m in METHODS if m != "none"])
def test_steps_change_delta_and_keep_backbone_bit_identical(method, batch):
    model = apply_delta(bert(), DeltaSpec(method=method, **SMALL), "sequence_classification")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train(model, batch)
    for name, param in model.named_parameters():
        if not param.requires_grad:
            assert torch.equal(param, before[name]), f"frozen {name} changed"
        elif not name.endswith("key.bias"):  # softmax ignores key biases: they get round-off gradients only
            assert not torch.equal(param, before[name]), f"{name} did not move"


# -- adapters: identity at init, placement, switching ----------------------------------------------------
def _randomise(module: nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(std=0.5)


@pytest.mark.parametrize("kind", ["houlsby", "pfeiffer", "pals"])
def test_adapters_start_as_identity(kind, batch):
    model = bert()
    plain = logits(model, batch)
    add_adapter(model, "a", kind, bottleneck=8)
    assert torch.equal(logits(model, batch), plain)
    _randomise(model.delta_adapters["a"])
    assert not torch.allclose(logits(model, batch), plain)


@pytest.mark.parametrize("kind, per_layer", [("houlsby", 2), ("pfeiffer", 1)])
def test_bottleneck_adapters_sit_after_the_output_projections(kind, per_layer, batch):
    model = bert()
    adapter = add_adapter(model, "a", kind, bottleneck=8)
    _randomise(adapter)
    assert sum(isinstance(m, BottleneckAdapter) for m in adapter.modules()) == per_layer * LAYERS
    projected, seen = [], []
    for layer in model.bert.encoder.layer:
        sites = [layer.attention.output.dense, layer.output.dense][2 - per_layer:]
        for site in sites:
            site.register_forward_pre_hook(
                lambda m, args: projected.append(nn.functional.linear(args[0], m.weight, m.bias)))
    for m in adapter.modules():
        if isinstance(m, BottleneckAdapter):
            m.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    logits(model, batch)
    assert len(seen) == len(projected) == per_layer * LAYERS
    for got, want in zip(seen, projected):  # each adapter reads its projection's output
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_pals_run_in_parallel_with_every_layer(batch):
    model = bert()
    pals = add_adapter(model, "p", "pals", bottleneck=8).pals
    assert len(pals.attention) == LAYERS and isinstance(pals.encoder, nn.Linear)  # V_E, V_D shared
    _randomise(pals)
    layer_inputs, pal_inputs = [], []
    for layer in model.bert.encoder.layer:
        layer.register_forward_pre_hook(lambda m, args: layer_inputs.append(args[0]))
    pals.encoder.register_forward_pre_hook(lambda m, args: pal_inputs.append(args[0]))
    logits(model, batch)
    assert len(pal_inputs) == LAYERS
    for got, want in zip(pal_inputs, layer_inputs):
        assert got is want  # the PAL reads the layer's input, not the attention output


def test_named_adapters_switch_and_restore_exactly(batch):
    model = bert()
    plain = logits(model, batch)
    for name, kind in (("sentiment", "houlsby"), ("topic", "pfeiffer"), ("facts", "pals")):
        _randomise(add_adapter(model, name, kind, bottleneck=8))
    assert list_adapters(model) == {"sentiment": "houlsby", "topic": "pfeiffer", "facts": "pals"}
    outputs = {}
    for name in ("sentiment", "topic", "facts"):
        set_active_adapter(model, name)
        outputs[name] = logits(model, batch)
        assert not torch.allclose(outputs[name], plain)
    assert not torch.allclose(outputs["sentiment"], outputs["topic"])
    set_active_adapter(model, "sentiment")
    assert torch.equal(logits(model, batch), outputs["sentiment"])
    set_active_adapter(model, None)
    assert torch.equal(logits(model, batch), plain)
    with pytest.raises(PtmError, match="no adapter named 'nope'"):
        set_active_adapter(model, "nope")
    copied = copy.deepcopy(model)  # hooks follow the copy's own adapters
    set_active_adapter(copied, "topic")
    assert torch.equal(logits(copied, batch), outputs["topic"]) and torch.equal(logits(model, batch), plain)
    for name in ("sentiment", "topic", "facts"):
        remove_adapter(model, name)
    assert not hasattr(model, "delta_adapters") and set(model.state_dict()) == set(bert().state_dict())
    assert torch.equal(logits(model, batch), plain)


def test_training_one_named_adapter_keeps_the_others(batch):
    model = apply_delta(bert(), DeltaSpec(method="houlsby", name="first", **SMALL))
    train(model, batch)
    first = delta_state_dict(model)
    model = apply_delta(model, DeltaSpec(method="pfeiffer", name="second", **SMALL))
    assert all(n.startswith(("delta_adapters.second.", "classifier.")) for n in trainable(model))
    train(model, batch)
    assert all(torch.equal(model.get_parameter(n), v) for n, v in first.items() if "delta_adapters" in n)


@pytest.mark.parametrize("method", ["houlsby", "pals"])
def test_adapters_under_activation_checkpointing(method, batch):
    """The recompute in backward re-runs the adapter hooks (PALs re-capture the layer input)."""
    grads = []
    for checkpointing in (False, True):
        model = bert(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        if checkpointing:
            model.gradient_checkpointing_enable()
        model = apply_delta(model, DeltaSpec(method=method, **SMALL))
        _randomise(model.delta_adapters["default"])
        model.train()
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        nn.functional.cross_entropy(out.logits, batch["labels"]).backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[1].items():
        torch.testing.assert_close(grad, grads[0][name], msg=name)


@pytest.mark.parametrize("model_type", ["roberta", "electra", "albert", "distilbert"])
def test_other_bert_family_encoders(model_type, batch):
    torch.manual_seed(0)
    sizes = (dict(dim=H, n_layers=LAYERS, n_heads=2, hidden_dim=FFN) if model_type == "distilbert" else
             dict(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=2, intermediate_size=FFN,
                  embedding_size=16))
    cfg = transformers.AutoConfig.for_model(model_type, vocab_size=VOCAB, max_position_embeddings=64, num_labels=LABELS,
                                            pad_token_id=0, **sizes)
    model = transformers.AutoModelForSequenceClassification.from_config(cfg)
    plain = logits(model, batch)
    for kind in ("houlsby", "pals"):
        _randomise(add_adapter(model, kind, kind, bottleneck=8))
    set_active_adapter(model, None)
    assert torch.equal(logits(model, batch), plain)
    for kind in ("houlsby", "pals"):
        set_active_adapter(model, kind)
        assert not torch.allclose(logits(model, batch), plain)
    shared = 1 if model_type == "albert" else LAYERS  # ALBERT shares one layer (and its adapters) across depth
    assert len(model.delta_adapters["houlsby"].ffn) == shared


def test_unsupported_model_type_is_one_line():
    config = transformers.XLNetConfig(vocab_size=VOCAB, d_model=H, n_layer=1, n_head=2, d_inner=FFN)
    xlnet = lambda: transformers.XLNetModel(config)  # noqa: E731
    for call in (lambda: add_adapter(xlnet(), "a"), lambda: apply_delta(xlnet(), DeltaSpec(method="pfeiffer"))):
        with pytest.raises(PtmError) as err:
            call()
        message = str(err.value)
        assert "\n" not in message and "'xlnet'" in message and "bert" in message and "gpt2" in message
    with pytest.raises(PtmError, match="needs a peft task type"):
        apply_delta(bert(), DeltaSpec(method="prompt"), "masked_lm")
    with pytest.raises(PtmError, match="delta.method 'adapter' is unknown"):
        DeltaSpec(method="adapter")
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(vocab_size=VOCAB, d_model=H, d_kv=16, d_ff=FFN,
                                                                        num_layers=1, num_heads=2))
    with pytest.raises(PtmError, match="no bias terms"):
        apply_delta(t5, DeltaSpec(method="bitfit"), "seq2seq_lm")


# -- delta-only state ------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["houlsby", "pals", "lora", "ia3", "prefix", "ptuning", "bitfit"])
def test_delta_state_round_trips_into_a_fresh_backbone(method, batch, tmp_path):
    spec = DeltaSpec(method=method, **SMALL)
    model = apply_delta(bert(), spec, "sequence_classification")
    train(model, batch)
    want = logits(model, batch)
    state = delta_state_dict(model)
    assert set(state) == set(trainable(model))
    assert sum(v.numel() for v in state.values()) == trainable_report(model)["trainable"]
    fresh = apply_delta(bert(), spec, "sequence_classification")
    assert not torch.equal(logits(fresh, batch), want)
    load_delta_state_dict(fresh, state)
    assert torch.equal(logits(fresh, batch), want)
    save_delta(model, spec, tmp_path)  # delta.safetensors + delta_config.json
    assert {p.name for p in tmp_path.iterdir()} == {"delta.safetensors", "delta_config.json"}
    assert torch.equal(logits(load_delta(bert(), tmp_path), batch), want)


def test_spec_survives_plain_dicts():
    """Checkpoint hparams keep ``asdict(spec)`` (a dataclass breaks ``torch.load(weights_only=True)``)."""
    spec = DeltaSpec(method="lora", r=4, target_modules=["query", "value"])
    assert as_delta_spec(json.loads(json.dumps(asdict(spec)))) == spec and as_delta_spec(None) is None
    with pytest.raises(PtmError, match="the fields are method, name"):
        as_delta_spec({"method": "lora", "rank": 4})


def test_delta_state_must_fit():
    state = delta_state_dict(apply_delta(bert(), DeltaSpec(method="houlsby", **SMALL)))
    with pytest.raises(PtmError, match="delta state does not fit"):
        load_delta_state_dict(apply_delta(bert(), DeltaSpec(method="pfeiffer", **SMALL)), state)


def test_ia3_feedforward_modules_rescale_the_input():
    """IA3 (Liu et al. 2022 §3.3): l_k, l_v scale the keys' and values' outputs, l_ff the FFN's input."""
    spec = DeltaSpec(method="ia3", target_modules=["key", "value", "intermediate.dense"],
                     feedforward_modules=["intermediate.dense"])
    model = apply_delta(bert(), spec, "sequence_classification")
    layer = model.base_model.model.bert.encoder.layer[0]
    hidden, ffn = layer.attention.self.key.in_features, layer.intermediate.dense.out_features
    assert layer.intermediate.dense.ia3_l["default"].shape == (1, hidden)  # the FFN input: one scale per input
    assert layer.attention.self.key.ia3_l["default"].shape == (hidden, 1)  # an output scale
    assert ffn != hidden
    with pytest.raises(PtmError, match="must be among delta.target_modules"):
        DeltaSpec(method="ia3", target_modules=["key"], feedforward_modules=["intermediate.dense"])
    with pytest.raises(PtmError, match="for method ia3 with your own target_modules"):
        DeltaSpec(method="lora", target_modules=["key"], feedforward_modules=["key"])


# -- export ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["lora", "ia3"])
def test_merge_gives_a_plain_model_with_the_same_outputs(method, batch, tmp_path):
    model = apply_delta(bert(), DeltaSpec(method=method, **SMALL), "sequence_classification")
    train(model, batch)
    want = logits(model, batch)
    merged = merge_for_export(model)
    assert type(merged) is transformers.BertForSequenceClassification
    assert not any(k in n for n in merged.state_dict() for k in ("lora", "ia3", "modules_to_save", "original"))
    torch.testing.assert_close(logits(merged, batch), want, rtol=0, atol=1e-5)
    merged.save_pretrained(tmp_path)
    reloaded = transformers.BertForSequenceClassification.from_pretrained(tmp_path)
    torch.testing.assert_close(logits(reloaded, batch), want, rtol=0, atol=1e-5)


def test_what_cannot_be_merged():
    assert merge_for_export(apply_delta(bert(), DeltaSpec(method="houlsby", **SMALL))) is None
    assert merge_for_export(apply_delta(bert(), DeltaSpec(method="prefix", **SMALL), "SEQ_CLS")) is None
    bitfit = apply_delta(bert(), DeltaSpec(method="bitfit"))
    assert merge_for_export(bitfit) is bitfit


# -- causal LM (GPT-2) --------------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:fan_in_fan_out")  # peft: GPT-2's Conv1D needs fan_in_fan_out=True
@pytest.mark.parametrize("method", ["lora", "prompt"])
def test_gpt2_causal_lm(method, batch, tmp_path):
    lm_batch = {k: v for k, v in batch.items() if k != "labels"}
    model = apply_delta(gpt2(), DeltaSpec(method=method, **SMALL), "causal_lm")
    names = trainable(model)
    assert names and all(("lora_" in n) if method == "lora" else n.startswith("prompt_encoder.") for n in names)
    # c_attn is 32 -> 96: A 4x32 + B 96x4 per layer; the tied lm_head stays frozen
    assert sum(names.values()) == (LAYERS * (4 * H + 3 * H * 4) if method == "lora" else 5 * H)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    train(model, lm_batch)
    assert all(torch.equal(model.get_parameter(n), v) for n, v in before.items())
    want = logits(model, lm_batch)
    assert want.shape[1] == 9 + (5 if method == "prompt" else 0)
    if method == "lora":
        merged = merge_for_export(model)
        assert type(merged) is transformers.GPT2LMHeadModel
        torch.testing.assert_close(logits(merged, lm_batch), want, rtol=0, atol=1e-5)
    else:
        save_delta(model, DeltaSpec(method=method, **SMALL), tmp_path)
        assert torch.equal(logits(load_delta(gpt2(), tmp_path), lm_batch), want)
