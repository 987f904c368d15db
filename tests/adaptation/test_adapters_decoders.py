"""Bottleneck adapters and PALs beyond BERT: GPT-2 (pre-LN, Conv1D), Llama-style decoders, BART and T5
encoder-decoders and a BERT2BERT EncoderDecoderModel.  Identity at init, Houlsby's placement (on the projection's
output, before the skip connection is added), causal PALs in decoder stacks (no peeking at later tokens, no NaN
under left padding, no KV cache), delta-only state round trips."""
from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn

from ptm_app.backbones.adapters import BottleneckAdapter, add_adapter, set_active_adapter
from ptm_app.backbones.delta import DeltaSpec, apply_delta, delta_state_dict, load_delta, save_delta
from ptm_app.errors import PtmError

H, LAYERS, FFN, VOCAB = 32, 2, 64, 60
FAMILIES = ["gpt2", "llama", "mistral", "qwen2", "bart", "t5", "bert2bert"]


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(family: str) -> nn.Module:
    """The same tiny model of ``family`` every time (dropout off: outputs compare exactly)."""
    torch.manual_seed(0)
    make = transformers.AutoConfig.for_model
    if family == "gpt2":
        return transformers.GPT2LMHeadModel(make("gpt2", vocab_size=VOCAB, n_embd=H, n_layer=LAYERS, n_head=2,
                                                 n_positions=64, bos_token_id=1, eos_token_id=2))
    if family in ("llama", "mistral", "qwen2"):
        return transformers.AutoModelForCausalLM.from_config(make(
            family, vocab_size=VOCAB, hidden_size=H, intermediate_size=FFN, num_hidden_layers=LAYERS,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1,
            eos_token_id=2, pad_token_id=0))
    if family == "bart":
        return transformers.BartForConditionalGeneration(make(
            "bart", vocab_size=VOCAB, d_model=H, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_ffn_dim=FFN,
            decoder_ffn_dim=FFN, encoder_attention_heads=2, decoder_attention_heads=2, max_position_embeddings=64,
            forced_eos_token_id=None))
    if family == "t5":
        return transformers.T5ForConditionalGeneration(make("t5", vocab_size=VOCAB, d_model=H, d_kv=16, d_ff=FFN,
                                                            num_layers=LAYERS, num_heads=2, decoder_start_token_id=0,
                                                            pad_token_id=0))
    encoder = transformers.BertConfig(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=2,
                                      intermediate_size=FFN, max_position_embeddings=64)
    decoder = transformers.BertConfig(**{**encoder.to_dict(), "is_decoder": True, "add_cross_attention": True})
    model = transformers.EncoderDecoderModel(transformers.EncoderDecoderConfig.from_encoder_decoder_configs(encoder,
                                                                                                         decoder))
    model.config.decoder_start_token_id, model.config.pad_token_id = 1, 0
    return model


def seq2seq(model: nn.Module) -> bool:
    return bool(model.config.is_encoder_decoder)


IDS = torch.randint(3, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))


def logits(model: nn.Module, ids: torch.Tensor = IDS, source: torch.Tensor = IDS) -> torch.Tensor:
    """Decoder logits for ``ids`` (an encoder-decoder reads ``source``)."""
    model.eval()
    with torch.no_grad():
        if seq2seq(model):
            return model(input_ids=source, decoder_input_ids=ids).logits
        return model(input_ids=ids).logits


def randomise(module: nn.Module, std: float = 0.5) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(std=std)


def layer_count(model: nn.Module) -> int:
    return 2 * LAYERS if seq2seq(model) else LAYERS


# -- identity at init, every family ---------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_adapters_start_as_identity_and_change_the_output_once_trained(family):
    model = tiny(family)
    plain = logits(model)
    sizes = {}
    for kind in ("houlsby", "pfeiffer", "pals"):
        adapter = add_adapter(model, kind, kind, bottleneck=8)
        assert torch.equal(logits(model), plain), kind
        sizes[kind] = sum(isinstance(m, BottleneckAdapter) for m in adapter.modules())
        randomise(adapter)
        assert not torch.allclose(logits(model), plain), kind
    n = layer_count(model)  # both stacks of an encoder-decoder
    assert sizes == {"houlsby": 2 * n, "pfeiffer": n, "pals": 0}
    assert len(model.delta_adapters["pals"].pals.attention) == n
    set_active_adapter(model, None)
    assert torch.equal(logits(model), plain)


# -- Houlsby placement --------------------------------------------------------------------------------
# (stack of layers, attention output projection, FFN output projection, module whose input is the skip sum
#  ``layer input + attention sub-layer output`` in eval mode)
SITES = {
    "gpt2": ("transformer.h", "attn.c_proj", "mlp.c_proj", "ln_2"),  # pre-LN: x + c_proj(attn(ln_1(x)))
    "llama": ("model.layers", "self_attn.o_proj", "mlp.down_proj", "post_attention_layernorm"),
    "bart": ("model.encoder.layers", "self_attn.out_proj", "fc2", "self_attn_layer_norm"),  # post-LN: LN(x + ...)
    "t5": ("encoder.block", "layer.0.SelfAttention.o", "layer.1.DenseReluDense.wo", "layer.1.layer_norm"),
}


@pytest.mark.parametrize("family", SITES)
def test_houlsby_adapters_read_the_projection_and_feed_the_skip_connection(family):
    model = tiny(family)
    adapter = add_adapter(model, "a", "houlsby", bottleneck=8)
    randomise(adapter)
    stack, attn_out, ffn_out, summed = SITES[family]
    projected, adapter_in, adapter_out, layer_in, sums = [], [], [], [], []
    layers = model.get_submodule(stack)
    for layer in layers:
        layer.register_forward_pre_hook(lambda m, args, kwargs: layer_in.append(args[0] if args else
                                                                                kwargs["hidden_states"]),
                                        with_kwargs=True)
        layer.get_submodule(summed).register_forward_pre_hook(lambda m, args: sums.append(args[0]))
        for site in (attn_out, ffn_out):  # the projection alone, recomputed on its own input
            layer.get_submodule(site).register_forward_pre_hook(lambda m, args: projected.append(m.forward(args[0])))
    for module in adapter.modules():
        if isinstance(module, BottleneckAdapter):
            module.register_forward_hook(lambda m, args, out: adapter_in.append(args[0]) or adapter_out.append(out))
    logits(model)
    assert len(adapter_in) == 2 * layer_count(model) and len(projected) == 2 * len(layers)
    # adapters run in the order attn(0), ffn(0), attn(1) ... of this stack first
    for got, want in zip(adapter_in, projected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    for i, (x, total) in enumerate(zip(layer_in, sums)):  # residual + adapted attention output
        torch.testing.assert_close(total, x + adapter_out[2 * i], rtol=0, atol=1e-6)


# -- causal PALs in decoder stacks -----------------------------------------------------------------------
@pytest.mark.parametrize("family", ["gpt2", "llama", "bart", "t5", "bert2bert"])
def test_pals_in_a_decoder_do_not_see_later_tokens(family):
    model = tiny(family)
    randomise(add_adapter(model, "p", "pals", bottleneck=8), std=1.0)
    later = IDS.clone()
    later[:, 5:] = (later[:, 5:] + 7) % (VOCAB - 3) + 3  # change every token after position 4
    before, after = logits(model, IDS), logits(model, later)
    torch.testing.assert_close(after[:, :5], before[:, :5], rtol=0, atol=1e-6)
    assert not torch.allclose(after[:, 5:], before[:, 5:])
    # the test has teeth: the same PALs without the causal mask let positions <= 4 see the change
    bank = model.delta_adapters
    bank.stacks = [(stack._replace(causal=False), local) for stack, local in bank.stacks]
    assert not torch.allclose(logits(model, later)[:, :5], logits(model, IDS)[:, :5], atol=1e-4)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_left_padded_decoder_pals_give_each_row_its_unpadded_logits(family):
    model = tiny(family).eval()
    randomise(add_adapter(model, "p", "pals", bottleneck=8))
    rows = [IDS[0, :8], IDS[1, :5]]
    ids = torch.zeros(2, 8, dtype=torch.long)
    mask = torch.zeros(2, 8, dtype=torch.long)
    for r, row in enumerate(rows):  # left padding
        ids[r, 8 - len(row):], mask[r, 8 - len(row):] = row, 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        batched = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        assert not batched.isnan().any()
        for r, row in enumerate(rows):
            alone = model(input_ids=row[None]).logits[0]
            torch.testing.assert_close(batched[r, 8 - len(row):], alone, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["gpt2", "bart"])
def test_decoder_pals_refuse_the_kv_cache_and_generate_greedily_without_it(family):
    model = tiny(family)
    randomise(add_adapter(model, "p", "pals", bottleneck=8), std=0.2)
    model.eval()
    prompt = IDS[:1, :4]
    settings = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None)
    if seq2seq(model):
        settings["decoder_start_token_id"] = 1
    with pytest.raises(PtmError, match=r"use_cache=False"):
        model.generate(input_ids=prompt, use_cache=True, **settings)
    out = model.generate(input_ids=prompt, use_cache=False, **settings)
    start = torch.tensor([[1]]) if seq2seq(model) else prompt
    ids = start  # greedy decoding by hand, recomputing the whole prefix
    for _ in range(4):
        ids = torch.cat([ids, logits(model, ids, prompt)[:, -1:].argmax(-1)], dim=1)
    assert out.tolist() == ids.tolist()


@pytest.mark.parametrize("family", ["gpt2", "t5"])
def test_decoder_pals_under_activation_checkpointing(family):
    """The recompute in backward re-runs the hooks: PALs re-capture the (normalised) layer input."""
    grads = []
    for checkpointing in (False, True):
        model = tiny(family)
        if checkpointing:
            model.gradient_checkpointing_enable()
        model = apply_delta(model, DeltaSpec(method="pals", bottleneck=8), "causal_lm")
        randomise(model.delta_adapters["default"], std=0.2)
        model.train()
        for module in model.modules():  # dropout off: both passes must compute the same thing
            if isinstance(module, nn.Dropout):
                module.p = 0.0
        model(input_ids=IDS, labels=IDS).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 4
    for name, grad in grads[1].items():
        torch.testing.assert_close(grad, grads[0][name], msg=name)


# -- delta tuning on decoders: training, state round trip --------------------------------------------------------
@pytest.mark.parametrize("family, method", [("gpt2", "houlsby"), ("gpt2", "pals"), ("llama", "pfeiffer"),
                                            ("t5", "houlsby"), ("bert2bert", "pals")])
def test_delta_trains_alone_and_round_trips_onto_a_fresh_backbone(family, method, tmp_path):
    task = "seq2seq_lm" if family in ("t5", "bert2bert") else "causal_lm"
    spec = DeltaSpec(method=method, bottleneck=8)
    model = apply_delta(tiny(family), spec, task)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    new = [n for n in names if not n.startswith("delta_adapters.")]
    if family == "bert2bert":  # the warm-started decoder's new cross-attention and LM-head transform train too
        assert new and all("crossattention" in n or n.startswith("decoder.cls.") for n in new), new
    else:
        assert not new, new
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.train()
    optim = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        loss = model(input_ids=IDS, labels=IDS).loss  # a decoder shifts the labels, an encoder-decoder its input
        optim.zero_grad()
        loss.backward()
        optim.step()
    for name, param in model.named_parameters():
        if not param.requires_grad:
            assert torch.equal(param, before[name]), f"frozen {name} changed"
        elif not name.endswith("key.bias"):
            assert not torch.equal(param, before[name]), f"{name} did not move"
    want = logits(model)
    save_delta(model, spec, tmp_path)
    assert set(delta_state_dict(model)) == set(names)
    fresh = load_delta(tiny(family), tmp_path)
    assert torch.equal(logits(fresh), want)


def test_unsupported_families_and_mismatched_halves_are_one_line():
    torch.manual_seed(0)
    xlnet = transformers.XLNetLMHeadModel(transformers.XLNetConfig(vocab_size=VOCAB, d_model=H, n_layer=1, n_head=2,
                                                                    d_inner=FFN))
    with pytest.raises(PtmError) as err:
        apply_delta(xlnet, DeltaSpec(method="houlsby"), "causal_lm")
    message = str(err.value)
    assert "\n" not in message and "'xlnet'" in message and "gpt2" in message and "lora" in message
    encoder = transformers.BertConfig(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=FFN)
    decoder = transformers.GPT2Config(vocab_size=VOCAB, n_embd=2 * H, n_layer=1, n_head=2, add_cross_attention=True,
                                      is_decoder=True)
    bert2gpt = transformers.EncoderDecoderModel(transformers.EncoderDecoderConfig.from_encoder_decoder_configs(encoder,
                                                                                                             decoder))
    with pytest.raises(PtmError, match=r"one hidden size.*32 / 64; use delta method lora"):
        add_adapter(bert2gpt, "a", "houlsby")
