"""Seq2SeqCollator (T5, MASS, BART inputs and targets) and MASS's decoder positions reaching the model."""
import pytest
import torch

from ptm_app.data.corruption.seq2seq import t5_reconstruct
from ptm_app.errors import PtmError
from ptm_app.objectives.seq2seq import Seq2SeqCollator, Seq2SeqDenoisingModule

PAD, UNK, CLS, SEP, MASK, EOS, FULL_STOP = 0, 1, 2, 3, 4, 5, 6
SPECIAL = (PAD, UNK, CLS, SEP, MASK)
SENTINELS = tuple(range(90, 100))
V = 100
TINY_BART = {"model_type": "bart", "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
             "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
             "max_position_embeddings": 64, "vocab_size": V, "pad_token_id": PAD, "eos_token_id": EOS,
             "bos_token_id": CLS, "decoder_start_token_id": CLS, "dropout": 0.0}


def examples(epoch=0, n=6):
    gen = torch.Generator().manual_seed(3)
    out = []
    for i in range(n):
        words = torch.randint(10, 90, (int(torch.randint(6, 20, (1,), generator=gen)),), generator=gen)
        words[torch.rand(len(words), generator=gen) < 0.2] = FULL_STOP
        out.append({"input_ids": torch.cat([torch.tensor([CLS]), words, torch.tensor([SEP])]), "key": (epoch, i)})
    return out


def content(e) -> list[int]:
    return e["input_ids"][1:-1].tolist()


def collator(noise, **kw) -> Seq2SeqCollator:
    return Seq2SeqCollator(pad_token_id=PAD, eos_token_id=EOS, mask_token_id=MASK, special_ids=SPECIAL, noise=noise,
                           seed=4, sentinel_ids=SENTINELS, full_stop_ids=(FULL_STOP,), **kw)


def unpadded(batch, name, row, pad):
    values = batch[name][row].tolist()
    while values and values[-1] == pad:
        values.pop()
    return values


@pytest.mark.parametrize("noise", ["t5_span", "mass", "bart"])
def test_collator_strips_specials_ends_with_eos_pads_and_follows_the_keys(noise):
    exs = examples()
    b = collator(noise)(exs)
    assert b["keys"] == [e["key"] for e in exs]
    for row, e in enumerate(exs):
        enc, tgt = unpadded(b, "input_ids", row, PAD), unpadded(b, "labels", row, -100)
        assert enc[-1] == EOS and tgt[-1] == EOS
        assert not set(enc[:-1]) & {CLS, SEP, EOS} and not set(tgt[:-1]) & {CLS, SEP, EOS}
        assert b["attention_mask"][row].tolist() == [1] * len(enc) + [0] * (b["input_ids"].shape[1] - len(enc))
        if noise == "t5_span":  # putting every span back gives the text
            assert t5_reconstruct(enc, tgt, SENTINELS, eos_id=EOS) == content(e)
        elif noise == "bart":  # the target is the clean text
            assert tgt == content(e) + [EOS]
        else:  # MASS: one fragment of half the tokens, [MASK] per token in the encoder, decoded at its positions
            positions = b["decoder_position_ids"][row, : len(tgt)].tolist()
            start, length = positions[0], len(tgt) - 1
            assert length == int(len(content(e)) / 2 + 0.5) and positions == list(range(start, start + length + 1))
            assert enc[:-1] == content(e)[:start] + [MASK] * length + content(e)[start + length:]
            assert tgt[:-1] == content(e)[start:start + length]
            assert b["decoder_input_ids"][row, : len(tgt)].tolist() == [MASK] + tgt[:-1]  # teacher forcing
    assert ("decoder_input_ids" in b) == ("decoder_position_ids" in b) == (noise == "mass")
    again = collator(noise)(examples())
    assert all(torch.equal(again[k], b[k]) for k in b if torch.is_tensor(b[k]))  # same keys: same corruption
    other = collator(noise)(examples(epoch=1))
    assert not torch.equal(other["input_ids"], b["input_ids"])  # another epoch: another corruption


def test_mass_decoder_reads_the_fragments_original_positions():
    """MASS §2.2: the decoder's position embedding at step k is the fragment's position start + k, not k."""
    torch.manual_seed(0)
    module = Seq2SeqDenoisingModule(backbone_config=TINY_BART, noise="mass").build().eval()
    b = collator("mass")(examples())
    assert (b["decoder_position_ids"][:, 0] > 0).any()  # some fragments do not start the row
    decoder = module.backbone.get_decoder()
    seen = {}
    hook = decoder.layernorm_embedding.register_forward_pre_hook(lambda mod, args: seen.update(embedded=args[0]))
    try:
        with torch.no_grad():
            loss, n = module._loss(b)
    finally:
        hook.remove()
    tokens = decoder.embed_tokens(b["decoder_input_ids"])
    positions = decoder.embed_positions.weight[b["decoder_position_ids"] + decoder.embed_positions.offset]
    assert torch.allclose(seen["embedded"], tokens + positions, atol=1e-6)
    assert n == int((b["labels"] != -100).sum()) and torch.isfinite(loss)
    plain = decoder.embed_positions.weight[torch.arange(b["decoder_input_ids"].shape[1]) + 2]
    hook = decoder.layernorm_embedding.register_forward_pre_hook(lambda mod, args: seen.update(embedded=args[0]))
    try:  # outside _loss the positions hook is gone: a plain forward reads positions 0..T-1
        with torch.no_grad():
            module.backbone(**module.model_inputs(b))
    finally:
        hook.remove()
    assert torch.allclose(seen["embedded"], tokens + plain, atol=1e-6)


def test_mass_needs_a_decoder_with_absolute_positions():
    t5 = {"model_type": "t5", "d_model": 32, "d_kv": 16, "d_ff": 64, "num_layers": 1, "num_heads": 2,
          "vocab_size": V, "pad_token_id": PAD, "eos_token_id": EOS, "decoder_start_token_id": PAD}
    module = Seq2SeqDenoisingModule(backbone_config=t5, noise="mass").build()
    with pytest.raises(PtmError, match="absolute positions"):
        module._loss(collator("mass")(examples()))
