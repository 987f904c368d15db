"""BERT masking recipe: 15 % selected, 80/10/10, specials and padding never touched, dynamic draws."""
import torch

from ptm_app.data.collators import MLMCollator
from ptm_app.data import IGNORE_INDEX
from ptm_app.data.corruption import draw_generator, mlm_mask

V, MASK, PAD, CLS, SEP = 1000, 4, 0, 2, 3
SPECIALS = (PAD, 1, CLS, SEP, MASK)


def big_batch(n=512, length=128):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(10, V, (n, length), generator=gen)
    ids[:, 0], ids[:, -1] = CLS, SEP
    lengths = torch.randint(length // 2, length, (n,), generator=gen)
    for i, k in enumerate(lengths.tolist()):
        ids[i, k - 1], ids[i, k:] = SEP, PAD
    return ids


def test_golden_on_the_canonical_example():
    """"I am happy to join with you today", half the tokens selected: "am" replaced by a random token, "join",
    "with", "you" by [MASK]; the labels hold exactly the selected originals."""
    ids = torch.arange(10, 18)  # I am happy to join with you today
    out, labels = mlm_mask(ids, torch.ones(8, dtype=torch.bool), mask_token_id=MASK, vocab_size=40,
                           generator=torch.Generator().manual_seed(7), mlm_probability=0.5)
    assert out.tolist() == [10, 26, 12, 13, MASK, MASK, MASK, 17]
    assert labels.tolist() == [IGNORE_INDEX, 11, IGNORE_INDEX, IGNORE_INDEX, 14, 15, 16, IGNORE_INDEX]


def test_mask_statistics_follow_bert_recipe():
    ids = big_batch()
    maskable = ~torch.isin(ids, torch.tensor(SPECIALS))
    out, labels = mlm_mask(ids, maskable, mask_token_id=MASK, vocab_size=V, generator=draw_generator(1, [0]))
    selected = labels != IGNORE_INDEX
    rate = selected.sum().item() / maskable.sum().item()
    assert abs(rate - 0.15) < 0.005, rate
    n = selected.sum().item()
    masked = (out[selected] == MASK).sum().item() / n
    kept = (out[selected] == ids[selected]).sum().item() / n
    randomised = 1 - masked - kept
    assert abs(masked - 0.8) < 0.01 and abs(kept - 0.1) < 0.01 and abs(randomised - 0.1) < 0.01
    assert torch.equal(labels[selected], ids[selected])
    assert torch.equal(out[~selected], ids[~selected])  # nothing outside the selection changes


def test_specials_and_padding_never_selected_and_draws_are_dynamic():
    ids = big_batch(64)
    maskable = ~torch.isin(ids, torch.tensor(SPECIALS))
    a, la = mlm_mask(ids, maskable, mask_token_id=MASK, vocab_size=V, generator=draw_generator(1, [(0, 1)]))
    b, lb = mlm_mask(ids, maskable, mask_token_id=MASK, vocab_size=V, generator=draw_generator(1, [(1, 1)]))
    c, lc = mlm_mask(ids, maskable, mask_token_id=MASK, vocab_size=V, generator=draw_generator(1, [(0, 1)]))
    assert (la[~maskable] == IGNORE_INDEX).all()
    assert torch.equal(a[~maskable], ids[~maskable])
    assert not torch.equal(la, lb)  # another epoch/key: another mask
    assert torch.equal(la, lc) and torch.equal(a, c)  # same key: identical (exact resume)


def test_collator_pads_and_never_draws_special_replacements():
    col = MLMCollator(pad_token_id=PAD, mask_token_id=MASK, special_ids=SPECIALS, vocab_size=20, seed=3,
                      mlm_probability=1.0, mask_ratio=0.0, random_ratio=1.0)
    examples = [{"input_ids": torch.tensor([CLS] + list(range(5, 15)) + [SEP]), "key": (0, i)} for i in range(50)]
    examples.append({"input_ids": torch.tensor([CLS, 7, SEP]), "key": (0, 99)})
    batch = col(examples)
    assert batch["input_ids"].shape == (51, 12)
    assert (batch["attention_mask"][-1, 3:] == 0).all() and (batch["labels"][-1, 3:] == IGNORE_INDEX).all()
    replaced = batch["labels"] != IGNORE_INDEX
    assert replaced.sum() == 50 * 10 + 1
    assert not torch.isin(batch["input_ids"][replaced], torch.tensor(SPECIALS)).any()
