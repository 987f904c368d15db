"""MLM variants as configs of one module: whole-word, span + SBO, static vs dynamic masks, NSP/SOP."""
import pytest
import torch

from ptm_app.data.collators import MLMCollator
from ptm_app.data.datasets import SentencePairDataset
from ptm_app.objectives import MaskedLMModule
from ptm_app.objectives.targets import MaskedLM, NextSentence, SpanBoundary
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


def ragged(n=40, epoch=0, seed=5):
    """Examples of different lengths (so padding depends on the batch), keyed ``(epoch, index)``."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(6, 30, (n,), generator=gen).tolist()
    return [{"input_ids": torch.cat([torch.tensor([2]), torch.randint(5, V, (k,), generator=gen), torch.tensor([3])]),
             "key": (epoch, i)} for i, k in enumerate(lengths)]


def row_of(batch, i, examples_in_batch):
    """Example i's (inputs, labels) as placed in ``batch``, without its padding."""
    at = [e["key"][1] for e in examples_in_batch].index(i)
    n = len(examples_in_batch[at]["input_ids"])
    return batch["input_ids"][at, :n].tolist(), batch["labels"][at, :n].tolist()


@pytest.mark.parametrize("masking", ["token", "whole_word", "span"])
def test_static_mask_is_the_examples_own_whatever_the_batch_and_epoch(masking):
    """BERT's static masking (RoBERTa §4.1): an example masked alone gets exactly the mask it gets inside 20
    shuffled batches of other sizes and paddings, in any epoch; dynamic masks change with the batch and epoch."""
    static = collator(masking=masking, static=True, mlm_probability=0.3)
    pool = ragged()
    alone = {i: row_of(static([pool[i]]), i, [pool[i]]) for i in range(len(pool))}
    order = torch.Generator().manual_seed(0)
    for trial in range(20):
        epoch = trial % 4
        chosen = torch.randperm(len(pool), generator=order)[: 3 + trial].tolist()
        members = [dict(pool[i], key=(epoch, i)) for i in chosen]
        b = static(members)
        for i in chosen:
            assert row_of(b, i, members) == alone[i], (masking, trial, i)
    dynamic = collator(masking=masking, mlm_probability=0.3)
    members = [dict(e, key=(1, e["key"][1])) for e in pool]
    moved = sum(row_of(dynamic(members), i, members) != row_of(dynamic([pool[i]]), i, [pool[i]])
                for i in range(len(pool)))
    assert moved > len(pool) // 2  # dynamic: another batch and epoch, another mask


def test_static_copies_cycle_k_masks_per_example():
    """``static_copies`` = k (BERT's dupe_factor): epoch e uses copy e % k, each one fixed."""
    static = collator(static=True, static_copies=3, mlm_probability=0.3)
    labels = [static(examples(epoch=e))["labels"] for e in range(6)]
    assert all(torch.equal(labels[e], labels[e + 3]) for e in range(3))
    assert not torch.equal(labels[0], labels[1]) and not torch.equal(labels[1], labels[2])


def test_static_masking_fixes_each_sentence_pair_too():
    """BERT's pre-built data fixes the NSP/SOP pair with the mask: with static masking the module asks the data for
    static pairs, and the same key index gives the same pair in every epoch (dynamic: drawn anew each epoch)."""
    docs = [[[10 + d, 11 + d, 12], [13, 14 + d], [15, 16, 17 + d], [18]] for d in range(0, 20, 4)]
    static = SentencePairDataset(docs, "nsp", max_length=16, seed=3, cls_id=2, sep_id=3, static_copies=1)
    dynamic = SentencePairDataset(docs, "nsp", max_length=16, seed=3, cls_id=2, sep_id=3)

    def pairs(ds, epoch):
        return [(ds[(epoch, i)]["input_ids"].tolist(), ds[(epoch, i)]["sentence_label"]) for i in range(len(ds))]

    assert all(pairs(static, e) == pairs(static, 0) for e in range(1, 6))
    assert any(pairs(dynamic, e) != pairs(dynamic, 0) for e in range(1, 6))
    module = MaskedLMModule(backbone_config={**TINY_BERT, "vocab_size": V},
                            targets=[MaskedLM(static_masking=True), NextSentence()])
    assert module.hooks().static_copies == 1
    assert MaskedLMModule(backbone_config={**TINY_BERT, "vocab_size": V}).hooks().static_copies is None


def test_the_data_module_builds_static_pairs_for_static_masking(tiny_corpus):
    from ptm_app.data.contract import connect
    from ptm_app.data.datamodules import PretrainDataModule
    from ptm_app.data.tokenizer import TokenizerSpec

    dm = PretrainDataModule(TokenizerSpec(train="wordpiece", vocab_size=200, min_frequency=1), source=str(tiny_corpus),
                            max_length=32, batch_size=4, limit_documents=20)
    module = MaskedLMModule(backbone_config=TINY_BERT, targets=[MaskedLM(static_masking=2), NextSentence()])
    connect(module, dm)
    dm.prepare_data()
    dm.setup("fit")
    pairs = dm.datasets["train"]
    assert pairs.static_copies == 2
    assert all(torch.equal(pairs[(0, i)]["input_ids"], pairs[(2, i)]["input_ids"]) for i in range(len(pairs)))


def test_static_masking_is_dynamic_or_a_count_of_fixed_copies():
    """``static_masking``: false (dynamic), true (one fixed mask) or k (k fixed copies, BERT's dupe_factor): one
    setting, so no count without static masking can be written; a count below 1 is refused by its type."""
    from jsonargparse import ArgumentParser

    assert [MaskedLM(static_masking=s).static_copies for s in (False, True, 10)] == [None, 1, 10]
    drawn = MaskedLM(static_masking=10).collator(MLMCollator, pad_token_id=0, vocab_size=V)
    assert drawn.static and drawn.static_copies == 10
    assert not MaskedLM().collator(MLMCollator, pad_token_id=0, vocab_size=V).static
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(MaskedLM, "mlm")
    assert parser.parse_args(["--mlm.static_masking", "10"]).mlm.static_masking == 10
    with pytest.raises(Exception, match="static_masking"):
        parser.parse_args(["--mlm.static_masking", "0"])


BIG_V = 1000
BIG_WORD_START = torch.tensor([i < 5 or i % 3 != 0 for i in range(BIG_V)])  # a third of the pieces continue a word


def big_examples(n=512, pairs=False):
    gen = torch.Generator().manual_seed(11)
    out = []
    for i in range(n):
        if pairs:
            a, b = (torch.randint(5, BIG_V, (int(k),), generator=gen) for k in torch.randint(8, 60, (2,), generator=gen))
            ids = torch.cat([torch.tensor([2]), a, torch.tensor([3]), b, torch.tensor([3])])
        else:
            ids = torch.cat([torch.tensor([2]), torch.randint(5, BIG_V, (126,), generator=gen), torch.tensor([3])])
        out.append({"input_ids": ids, "key": (0, i)})
    return out


def big_collator(**kw):
    return MLMCollator(pad_token_id=0, mask_token_id=4, special_ids=SPECIAL, vocab_size=BIG_V, seed=1,
                       word_start=BIG_WORD_START, **kw)


@pytest.mark.parametrize("masking", ["token", "whole_word", "span"])
def test_configured_ratios_are_realised(masking):
    """mlm_probability, mask_ratio and random_ratio as configured (0.2 / 0.5 / 0.3, kept 0.2) for every masking,
    SpanBERT's spans included (its decision is per span, §3.1)."""
    exs = big_examples()
    b = big_collator(masking=masking, mlm_probability=0.2, mask_ratio=0.5, random_ratio=0.3)(exs)
    original = torch.stack([e["input_ids"] for e in exs])
    selected = b["labels"] != -100
    assert torch.equal(b["labels"][selected], original[selected])
    rate = selected.sum().item() / (len(exs) * 126)
    masked = (b["input_ids"][selected] == 4).float().mean().item()
    kept = (b["input_ids"][selected] == original[selected]).float().mean().item()
    assert abs(rate - 0.2) < 0.02, rate
    assert abs(masked - 0.5) < 0.04 and abs(kept - 0.2) < 0.04 and abs(1 - masked - kept - 0.3) < 0.04, (masked, kept)


def test_no_span_crosses_a_sep():
    """SpanBERT draws spans within a segment: in [CLS] A [SEP] B [SEP] rows no span (and so no SBO pair of
    boundaries) straddles the inner [SEP]; spans fall in both segments."""
    b = big_collator(masking="span")(big_examples(256, pairs=True))
    sbo, ids = b["sbo"], b["input_ids"]
    sep_at = [(row == 3).nonzero().squeeze(1)[0].item() for row in torch.where(b["labels"] != -100, b["labels"], ids)]
    inner = torch.tensor(sep_at)[sbo["rows"]]
    crossing = (sbo["left"] < inner) & (inner < sbo["right"])
    assert crossing.sum() == 0
    assert (sbo["pos"] < inner).any() and (sbo["pos"] > inner).any()
    assert torch.equal(sbo["pos"] - sbo["left"] - 1, sbo["offset"])  # each span contiguous in the row


def test_sbo_offsets_past_max_span_length_keep_their_own_position():
    """Span lengths are capped in words (10) while SBO offsets count tokens: a 10-word span of 3-piece words has
    offsets up to 29, and each keeps its own position embedding (none folded onto the last one)."""
    long_words = torch.tensor([i < 5 or i % 3 == 0 for i in range(V)])  # ids 6,7 / 9,10 ... continue a word
    exs = [{"input_ids": torch.tensor([2] + [6, 7, 8] * 15 + [3]), "key": (0, i)} for i in range(32)]  # 15 words
    b = MLMCollator(pad_token_id=0, mask_token_id=4, special_ids=SPECIAL, vocab_size=V, seed=1, masking="span",
                    word_start=long_words, mlm_probability=0.5, span_p=0.05)(exs)
    assert b["sbo"]["offset"].max() >= 10
    m = MaskedLMModule(backbone_config={**TINY_BERT, "vocab_size": V},
                       targets=[MaskedLM(masking="span"), SpanBoundary()]).build()
    head = m.target_layers["sbo"]
    assert head.positions.num_embeddings == TINY_BERT["max_position_embeddings"]
    hidden = torch.randn(1, 40, TINY_BERT["hidden_size"])
    one = torch.zeros(4, dtype=torch.long)
    with torch.no_grad():
        out = head(hidden, one, one, one + 39, torch.tensor([9, 10, 20, 29]), m.backbone.get_output_embeddings().weight)
    assert all(not torch.allclose(out[i], out[j]) for i in range(4) for j in range(i + 1, 4))
    assert torch.isfinite(m._losses(b)["sbo"])


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
    m = MaskedLMModule(backbone_config={**TINY_BERT, "vocab_size": V},
                       targets=[MaskedLM(weight=1.0), NextSentence(weight=0.5)]).build()
    b = collator()(examples(8))
    b["token_type_ids"] = torch.zeros_like(b["input_ids"])
    b["sentence_labels"] = torch.tensor([0, 1] * 4)
    losses = m._losses(b)
    assert set(losses) == {"mlm", "nsp", "nsp_acc"}
    assert torch.allclose(m._total(losses), losses["mlm"] + 0.5 * losses["nsp"])
