"""XLNet permutation-LM inputs (Yang et al. 2019 §2.2–2.3): mask invariants and a tiny XLNetLMHeadModel."""
from __future__ import annotations

import pytest
import torch
from transformers import XLNetConfig, XLNetLMHeadModel

from ptm_app.data import IGNORE_INDEX
from ptm_app.data.corruption.permutation import plm_inputs

VOCAB = 50


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def tiny_xlnet() -> XLNetLMHeadModel:
    torch.manual_seed(0)
    config = XLNetConfig(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=2, d_inner=64, dropout=0.0)
    return XLNetLMHeadModel(config).eval()


def batch(size: int = 4, length: int = 24, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, VOCAB, (size, length), generator=gen(seed))


def targets_of(out: dict[str, torch.Tensor]) -> torch.Tensor:
    return out["target_mapping"].sum(dim=1).bool()


def test_golden_on_the_canonical_example():
    """"I am happy to join with you today": two spans of targets (I am happy, you) predicted in the order
    you, happy, I, am; a target sees the context and the targets before it, never itself; the context sees no
    target."""
    ids = torch.arange(10, 18)[None]  # I am happy to join with you today
    out = plm_inputs(ids, None, gen(0), plm_probability=0.5, max_span_length=3)
    assert out["labels"].tolist() == [[10, 11, 12, 16]]
    assert out["target_mapping"][0].argmax(-1).tolist() == [0, 1, 2, 6]
    rows = ["".join(str(int(x)) for x in row) for row in out["perm_mask"][0]]
    assert rows == ["11000000", "01000000", "11100000", "11100010", "11100010", "11100010", "11100010", "11100010"]


def test_shapes_and_labels_follow_target_mapping():
    ids = batch()
    out = plm_inputs(ids, torch.ones_like(ids), gen(1))
    b, k, length = out["target_mapping"].shape
    assert (b, length) == ids.shape and out["perm_mask"].shape == (b, length, length)
    assert out["labels"].shape == (b, k) and out["labels"].dtype == torch.long
    used = out["target_mapping"].sum(dim=2).bool()
    assert torch.equal(used, out["labels"] != IGNORE_INDEX)
    position = out["target_mapping"].argmax(dim=2)
    assert torch.equal(out["labels"][used], ids.gather(1, position)[used])
    for row in range(b):  # one row per target, in natural order
        assert (position[row][used[row]].diff() > 0).all()


@pytest.mark.parametrize("seed", range(5))
def test_perm_mask_is_a_leak_free_single_order(seed):
    ids = batch(length=30)
    out = plm_inputs(ids, torch.ones_like(ids), gen(seed), plm_probability=0.3)
    sees = out["perm_mask"] == 0
    for row in range(ids.shape[0]):
        target = targets_of(out)[row]
        s = sees[row]
        assert s.diagonal()[target].logical_not().all()  # a target never sees itself
        assert not s[~target][:, target].any()  # context never sees a target
        assert s[:, ~target].all()  # everyone sees the whole context
        pair_with_target = target[:, None] | target[None, :]
        assert not (s & s.T & pair_with_target).any()  # antisymmetric wherever a target is involved
        # The targets form one total order: the i-th target in z sees exactly the i-1 earlier ones.
        seen = s[target][:, target].sum(dim=1)
        assert sorted(seen.tolist()) == list(range(int(target.sum())))
        ranked = seen[:, None] > seen[None, :]
        assert torch.equal(s[target][:, target], ranked)


def test_padding_and_special_tokens():
    ids = batch(size=2, length=20)
    attention_mask = torch.ones_like(ids)
    attention_mask[1, 14:] = 0
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, -1] = True
    for seed in range(20):
        out = plm_inputs(ids, attention_mask, gen(seed), plm_probability=0.5, special_mask=special)
        target = targets_of(out)
        assert not target[special].any() and not target[attention_mask == 0].any()
        assert (out["perm_mask"][1, :, 14:] == 1).all()  # padding keys hidden from everybody


def test_target_ratio_matches_plm_probability():
    ids = batch(size=32, length=256)
    for probability in (1 / 6, 0.3):
        ratios = [targets_of(plm_inputs(ids, None, gen(s), plm_probability=probability)).float().mean()
                  for s in range(10)]
        assert abs(float(torch.stack(ratios).mean()) - probability) < 0.02


def test_inputs_untouched_and_seeding():
    ids = batch()
    original = ids.clone()
    a = plm_inputs(ids, torch.ones_like(ids), gen(7))
    b = plm_inputs(ids, torch.ones_like(ids), gen(7))
    c = plm_inputs(ids, torch.ones_like(ids), gen(8))
    assert torch.equal(ids, original)
    assert set(a) == {"perm_mask", "target_mapping", "labels"}  # no re-ordered ids or positions
    assert all(torch.equal(a[key], b[key]) for key in a)
    assert not torch.equal(a["perm_mask"], c["perm_mask"])


def test_odd_length_is_supported():
    ids = batch(length=23)
    out = plm_inputs(ids, None, gen(0))
    assert out["perm_mask"].shape == (4, 23, 23)
    with torch.no_grad():
        assert torch.isfinite(tiny_xlnet()(input_ids=ids, **out).loss)


def test_changing_a_target_does_not_change_its_own_prediction():
    """No leak through the two-stream attention: target k's logits ignore x_k (and later targets)."""
    model, ids = tiny_xlnet(), batch(size=2, length=16)
    attention_mask = torch.ones_like(ids)
    attention_mask[1, 13:] = 0
    out = plm_inputs(ids, attention_mask, gen(3), plm_probability=0.4)
    with torch.no_grad():
        base = model(input_ids=ids, attention_mask=attention_mask, **out).logits
        for row in range(2):
            positions = out["target_mapping"][row].argmax(dim=1)[out["labels"][row] != IGNORE_INDEX]
            for slot, position in enumerate(positions.tolist()):
                changed = ids.clone()
                changed[row, position] = 3 + (changed[row, position] - 3 + 11) % (VOCAB - 3)
                logits = model(input_ids=changed, attention_mask=attention_mask, **out).logits
                assert torch.allclose(logits[row, slot], base[row, slot], atol=1e-5)
            sees_first = out["perm_mask"][row, positions][:, positions] == 0
            assert sees_first.any()  # some target does see another one, so the check above is not vacuous


def test_model_trains_on_plm_inputs():
    model, ids = tiny_xlnet(), batch(size=4, length=32)
    out = plm_inputs(ids, torch.ones_like(ids), gen(0))
    model.train()
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(10):
        loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), **out).loss
        assert torch.isfinite(loss)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
