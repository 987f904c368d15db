"""UniLM attention masks (Dong et al. 2019 §2.2–2.3) and packing masks, as patterns and on tiny BERTs."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModel, BertConfig, BertForMaskedLM, BertModel, XLNetConfig, XLNetModel

from ptm_app.backbones.attention import (
    bidirectional_mask,
    causal_mask,
    document_mask,
    document_position_ids,
    encoder_attention_kwargs,
    prefix_mask,
    seq2seq_mask,
    to_additive,
)

IMPLEMENTATIONS = ("eager", "sdpa")
L = 8
SMALL = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             max_position_embeddings=64)
FAMILIES = {
    "roberta": SMALL,
    "electra": dict(SMALL, embedding_size=16),
    "albert": dict(SMALL, embedding_size=16),
    "distilbert": dict(vocab_size=50, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64),
}


def tiny_bert(implementation: str, cls=BertModel) -> torch.nn.Module:
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, attn_implementation=implementation)
    torch.manual_seed(0)
    return cls(config).eval()


def ids_batch(batch: int = 2, length: int = L, seed: int = 1) -> torch.Tensor:
    return torch.randint(5, 50, (batch, length), generator=torch.Generator().manual_seed(seed))


def change_token(ids: torch.Tensor, position: int) -> torch.Tensor:
    changed = ids.clone()
    changed[:, position] = 5 + (changed[:, position] - 5 + 7) % 45
    return changed


def hidden(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, **encoder_attention_kwargs(model, mask), **kwargs).last_hidden_state


def t(rows: list[str]) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in row] for row in rows])


# --- exact patterns -------------------------------------------------------------------------------------

def test_bidirectional_is_all_ones_inside_the_sequence():
    assert bidirectional_mask(torch.ones(1, 4, dtype=torch.long)).all()


def test_causal_is_lower_triangular():
    """j <= i, not the survey's reversed "A_ij = 0, i > j" (trap T21)."""
    expected = t(["1000", "1100", "1110", "1111"])
    assert torch.equal(causal_mask(torch.ones(1, 4, dtype=torch.long))[0], expected)


def test_seq2seq_block_pattern():
    """Source (3 tokens) fully visible to all; target (3 tokens) causal + sees the source; source never sees target."""
    expected = t(["111000", "111000", "111000", "111100", "111110", "111111"])
    source = torch.tensor([[1, 1, 1, 0, 0, 0]])
    got = seq2seq_mask(torch.ones(1, 6, dtype=torch.long), source)[0]
    assert torch.equal(got, expected)
    assert torch.equal(prefix_mask(torch.ones(1, 6, dtype=torch.long), torch.tensor([3]))[0], expected)


def test_prefix_lengths_per_row_and_edge_cases():
    masks = prefix_mask(torch.ones(2, 4, dtype=torch.long), torch.tensor([0, 4]))
    assert torch.equal(masks[0], causal_mask(torch.ones(1, 4, dtype=torch.long))[0])  # no prefix = causal
    assert masks[1].all()  # all prefix = bidirectional


def test_padding_keys_hidden_and_padded_rows_see_only_themselves():
    attention_mask = torch.tensor([[1, 1, 1, 0, 0]])
    source = torch.tensor([[1, 0, 0, 0, 0]])
    doc_ids = torch.tensor([[0, 0, 1, 1, 1]])
    for mask in (bidirectional_mask(attention_mask), causal_mask(attention_mask),
                 seq2seq_mask(attention_mask, source), document_mask(attention_mask, doc_ids, causal=True)):
        assert not mask[0, :3, 3:].any()  # real queries never see padding keys
        assert torch.equal(mask[0, 3:], t(["00010", "00001"]))  # padded rows: themselves only
        assert mask.any(dim=-1).all()  # no all-masked row
    assert torch.equal(bidirectional_mask(attention_mask)[0, :3, :3], torch.ones(3, 3, dtype=torch.bool))


def test_document_mask_is_block_diagonal_and_optionally_causal():
    doc_ids = torch.tensor([[0, 0, 1, 1, 1, 2]])
    ones = torch.ones(1, 6, dtype=torch.long)
    expected = t(["110000", "110000", "001110", "001110", "001110", "000001"])
    assert torch.equal(document_mask(ones, doc_ids)[0], expected)
    assert torch.equal(document_mask(ones, doc_ids, causal=True)[0], expected & torch.ones(6, 6).tril().bool())


def test_document_position_ids_restart_per_document():
    doc_ids = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [5, 5, 5, 5, 5, 5, 5, 5]])
    assert document_position_ids(doc_ids).tolist() == [[0, 1, 2, 0, 1, 0, 1, 2], list(range(8))]
    assert document_position_ids(doc_ids[:1], start=2).tolist() == [[2, 3, 4, 2, 3, 2, 3, 4]]


def test_to_additive_shape_and_values():
    additive = to_additive(t(["10", "11"])[None], torch.float16)
    assert additive.shape == (1, 1, 2, 2) and additive.dtype == torch.float16
    assert additive[0, 0].tolist() == [[0.0, torch.finfo(torch.float16).min], [0.0, 0.0]]


# --- behaviour on real transformers v5 encoders ---------------------------------------------------------

@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_causal_mask_blocks_the_future(implementation):
    model, ids = tiny_bert(implementation), ids_batch()
    mask = causal_mask(torch.ones_like(ids))
    base = hidden(model, ids, mask)
    for k in (2, 5):
        out = hidden(model, change_token(ids, k), mask)
        assert torch.allclose(out[:, :k], base[:, :k], atol=1e-5)
        assert not torch.allclose(out[:, k], base[:, k], atol=1e-3)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_seq2seq_mask_source_ignores_target_and_target_is_causal(implementation):
    model, ids = tiny_bert(implementation), ids_batch()
    source = torch.zeros_like(ids)
    source[:, :3] = 1
    mask = seq2seq_mask(torch.ones_like(ids), source)
    base = hidden(model, ids, mask)
    for k in range(3, L):  # each target token
        out = hidden(model, change_token(ids, k), mask)
        assert torch.allclose(out[:, :k], base[:, :k], atol=1e-5)  # source outputs and earlier targets
        assert not torch.allclose(out[:, k:], base[:, k:], atol=1e-3)
    out = hidden(model, change_token(ids, 1), mask)  # a source token is seen by every position
    assert not torch.allclose(out[:, -1], base[:, -1], atol=1e-3)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_document_mask_isolates_packed_documents(implementation):
    model, ids = tiny_bert(implementation, BertForMaskedLM), ids_batch()
    doc_ids = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]] * 2)
    position_ids = document_position_ids(doc_ids)
    for causal in (False, True):
        mask = document_mask(torch.ones_like(ids), doc_ids, causal=causal)
        kwargs = dict(position_ids=position_ids, **encoder_attention_kwargs(model, mask))
        with torch.no_grad():
            base = model(input_ids=ids, **kwargs).logits
            out = model(input_ids=change_token(ids, 6), **kwargs).logits
            alone = model(input_ids=ids[:, :3]).logits  # document 1 encoded on its own
        assert torch.allclose(out[:, :3], base[:, :3], atol=1e-5)
        assert not torch.allclose(out[:, 3:], base[:, 3:], atol=1e-3)
        if not causal:
            assert torch.allclose(base[:, :3], alone, atol=1e-4)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_bidirectional_mask_equals_the_plain_2d_call(implementation):
    model, ids = tiny_bert(implementation), ids_batch()
    attention_mask = torch.tensor([[1] * L, [1] * 5 + [0] * 3])
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=attention_mask).last_hidden_state
    ours = hidden(model, ids, bidirectional_mask(attention_mask))
    valid = attention_mask.bool()
    assert torch.allclose(ours[valid], plain[valid], atol=1e-5)
    assert torch.isfinite(ours).all()


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_other_encoder_families_respect_the_mask(model_type, implementation):
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **FAMILIES[model_type])
    model = AutoModel.from_config(config, attn_implementation=implementation).eval()
    ids = ids_batch()
    mask = causal_mask(torch.ones_like(ids))
    base, out = hidden(model, ids, mask), hidden(model, change_token(ids, 5), mask)
    assert torch.allclose(out[:, :5], base[:, :5], atol=1e-5)
    assert not torch.allclose(out[:, 5:], base[:, 5:], atol=1e-3)


def test_bool_4d_mask_is_misread_by_eager():
    """Why we pass an additive float mask: eager adds a bool mask as 1/0, so it does not mask anything."""
    model, ids = tiny_bert("eager"), ids_batch()
    mask = causal_mask(torch.ones_like(ids))
    with torch.no_grad():
        raw = model(input_ids=ids, attention_mask=mask[:, None]).last_hidden_state
        raw_changed = model(input_ids=change_token(ids, 5), attention_mask=mask[:, None]).last_hidden_state
    assert not torch.allclose(raw[:, :5], raw_changed[:, :5], atol=1e-3)


def test_unsupported_models_and_implementations_are_rejected():
    model = tiny_bert("eager")
    mask = bidirectional_mask(torch.ones(1, 4, dtype=torch.long))
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="flash_attention_2"):
        encoder_attention_kwargs(model, mask)
    model.config._attn_implementation = "sdpa"
    with pytest.raises(ValueError, match=r"\[B, L, L\]"):
        encoder_attention_kwargs(model, mask[0])
    xlnet = XLNetModel(XLNetConfig(vocab_size=50, d_model=32, n_layer=1, n_head=2, d_inner=64))
    with pytest.raises(ValueError, match="xlnet"):
        encoder_attention_kwargs(xlnet, mask)
