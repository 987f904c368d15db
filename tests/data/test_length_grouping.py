"""Length-grouped batches for fine-tuning: less padding on the real tweets, seeded per epoch, sharded by rank,
and resumed exactly mid-epoch."""
import random

import pytest

from ptm_app.data.collators import PadCollator
from ptm_app.data.datamodules import TaskDataModule
from ptm_app.data.datasets import EncodedDataset
from ptm_app.data.loader import EpochSampler, ResumableLoader
from ptm_app.data.tokenizer import TokenizerSpec


def padding_fraction(loader) -> float:
    real = total = 0
    for batch in loader:
        real += int(batch["attention_mask"].sum())
        total += batch["attention_mask"].numel()
    return 1 - real / total


@pytest.fixture(scope="module")
def tweets():
    dm = TaskDataModule(tokenizer=TokenizerSpec(pretrained="minilm"), source="tweets", max_length=64, batch_size=32,
                        limit_train=4000, group_by_length=True)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_grouping_cuts_padding_on_the_tweets(tweets):
    grouped = tweets.train_dataloader()
    tweets.group_by_length = False
    try:
        plain = tweets.train_dataloader()
    finally:
        tweets.group_by_length = True
    assert grouped.epoch_sampler.lengths is not None and plain.epoch_sampler.lengths is None
    random_batches, grouped_batches = padding_fraction(plain), padding_fraction(grouped)
    # tweets vary from a few to 64 tokens: random batches pad ~40 %, grouped ones only a few %
    assert random_batches > 0.25, random_batches
    assert grouped_batches < 0.35 * random_batches, (grouped_batches, random_batches)
    seen = sorted(i for b in grouped for _, i in b["keys"])
    assert seen == list(range(len(tweets.datasets["train"])))  # every example once per epoch
    first = next(iter(grouped))["attention_mask"]
    assert first.shape[1] == max(tweets.datasets["train"].lengths())  # the longest batch comes first


def lengths_dataset(n=300, seed=0):
    rng = random.Random(seed)
    ids = [[5] * rng.randint(2, 60) for _ in range(n)]
    return EncodedDataset(ids, [0] * n)


def test_grouped_order_is_seeded_per_epoch_and_shards_by_rank():
    lengths = lengths_dataset().lengths()
    sampler = EpochSampler(300, shuffle=True, seed=4, lengths=lengths, batch_size=8)
    first = [i for _, i in sampler]
    sampler.set_epoch(1)
    second = [i for _, i in sampler]
    assert first != second and sorted(first) == sorted(second) == list(range(300))
    sampler.set_epoch(0)
    assert [i for _, i in sampler] == first
    assert [i for _, i in EpochSampler(300, True, 4, lengths=lengths, batch_size=8)] == first
    shards = [[i for _, i in EpochSampler(300, True, 4, r, 2, lengths=lengths, batch_size=8)] for r in range(2)]
    assert not set(shards[0]) & set(shards[1]) and set(shards[0]) | set(shards[1]) == set(range(300))
    plain = [[i for _, i in EpochSampler(300, True, 4, r, 2)] for r in range(2)]

    def mean_spread(shards):  # the k-th batches of both ranks together: one global batch
        spreads = [max(b) - min(b) for k in range(0, 144, 8)
                   for b in [[lengths[i] for s in shards for i in s[k: k + 8]]]]
        return sum(spreads) / len(spreads)
    assert mean_spread(shards) < 0.4 * mean_spread(plain), (mean_spread(shards), mean_spread(plain))


def test_grouped_loader_resumes_mid_epoch_exactly():
    ds = lengths_dataset()
    make = lambda: ResumableLoader(ds, batch_size=8, shuffle=True, seed=5, lengths=ds.lengths(),  # noqa: E731
                                   collate_fn=PadCollator(0))
    full = make()
    full.epoch_sampler.set_epoch(3)
    batches = [b["keys"] for b in full]
    resumed = make()
    resumed.load_state_dict({"epoch": 3, "consumed": 7, "batch_size": 8})
    assert [b["keys"] for b in resumed] == batches[7:]
