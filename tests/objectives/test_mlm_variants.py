"""MLM variants as configs of one module: whole-word, span + SBO, static vs dynamic masks, NSP/SOP."""
import torch

from ptm_app.data.collators import MLMCollator
from ptm_app.data.datasets import SentencePairDataset
from ptm_app.objectives import MaskedLMModule
from tests.conftest import TINY_BERT

SPECIAL = (0, 1, 2, 3, 4)  # pad unk cls sep mask
V = 40
WORD_START = torch.tensor([True] * 5 + [True, False, False] * 11 + [True] * 2)  # ids 6,7 / 9,10 ... continue a word


def examples(n=64, length=30, epoch=0):
    gen = torch.Generator().manual_seed(5)
    return [{"input_ids": torch.cat([torch.tensor([2]), torch.randint(5, V, (length,), generator=gen),
                                     torch.tensor([3])]), "key": (epoch, i)} for i in range(n)]


def collator(**kw):
    return MLMCollator(pad_token_id=0, mask_token_id=4, special_ids=SPECIAL, vocab_size=V, seed=1,
                       word_start=WORD_START, **kw)


def test_whole_word_masking_never_splits_a_word():
    b = collator(masking="whole_word")(examples())
    ids = torch.where(b["labels"] != -100, b["labels"], b["input_ids"])
    selected = b["labels"] != -100
    for row in range(ids.shape[0]):
        for pos in range(2, ids.shape[1] - 1):
            if not WORD_START[ids[row, pos]]:  # a continuation piece shares the fate of the piece before it
                assert selected[row, pos] == selected[row, pos - 1], (row, pos)
    rate = selected.sum() / (b["attention_mask"].sum() - 2 * len(ids))
    assert 0.12 < rate < 0.17


def test_span_masking_gives_sbo_targets_outside_the_spans():
    b = collator(masking="span")(examples())
    sbo = b["sbo"]
    selected = b["labels"] != -100
    assert len(sbo["pos"]) == int(selected.sum())
    assert selected[sbo["rows"], sbo["pos"]].all()
    assert not selected[sbo["rows"], sbo["left"]].any() and not selected[sbo["rows"], sbo["right"]].any()
    assert (sbo["left"] < sbo["pos"]).all() and (sbo["pos"] < sbo["right"]).all()
    assert torch.equal(sbo["pos"] - sbo["left"] - 1, sbo["offset"])  # contiguous spans


def test_static_masks_repeat_across_epochs_dynamic_ones_do_not():
    dyn, static = collator(), collator(static=True)
    assert not torch.equal(dyn(examples(epoch=0))["labels"], dyn(examples(epoch=1))["labels"])
    assert torch.equal(static(examples(epoch=0))["labels"], static(examples(epoch=1))["labels"])


def test_sentence_pairs_format_and_balance():
    docs = [[[10 + d, 11 + d, 12], [13, 14 + d], [15, 16, 17 + d], [18]] for d in range(0, 20, 4)]
    for kind in ("nsp", "sop"):
        ds = SentencePairDataset(docs, kind, max_length=16, seed=3, cls_id=2, sep_id=3)
        labels = []
        for epoch in range(40):
            for i in range(len(ds)):
                ex = ds[(epoch, i)]
                ids, types = ex["input_ids"].tolist(), ex["token_type_ids"].tolist()
                assert ids[0] == 2 and ids[-1] == 3 and ids.count(3) == 2
                first_sep = ids.index(3)
                assert set(types[: first_sep + 1]) == {0} and set(types[first_sep + 1:]) == {1}
                labels.append(ex["sentence_label"])
        assert abs(sum(labels) / len(labels) - 0.5) < 0.05, kind
        assert ds[(0, 1)]["input_ids"].tolist() == ds[(0, 1)]["input_ids"].tolist()  # a key fixes the pair


def test_nsp_loss_is_the_weighted_sum_of_targets():
    m = MaskedLMModule(backbone_config={**TINY_BERT, "vocab_size": V}, sentence_objective="nsp",
                       loss_weights={"mlm": 1.0, "sentence": 0.5}).build()
    b = collator()(examples(8))
    b["token_type_ids"] = torch.zeros_like(b["input_ids"])
    b["sentence_labels"] = torch.tensor([0, 1] * 4)
    losses = m._losses(b)
    assert set(losses) == {"mlm", "sentence", "sentence_acc"}
    assert torch.allclose(m._total(losses), losses["mlm"] + 0.5 * losses["sentence"])
