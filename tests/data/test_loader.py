"""The resumable loader: rank shards, per-epoch order, skip-by-index resume, epoch roll-over."""
import pytest
import torch

from ptm_app.data.datasets import BlockDataset
from ptm_app.data.loader import EpochSampler, ResumableLoader
from ptm_app.errors import PtmError


def test_shards_are_disjoint_and_cover_everything():
    shards = [list(EpochSampler(10, shuffle=True, seed=0, rank=r, world_size=2)) for r in range(2)]
    a, b = ({i for _, i in s} for s in shards)
    assert not a & b and a | b == set(range(10)) and len(shards[0]) == len(shards[1]) == 5


def test_order_changes_per_epoch_and_is_seeded():
    s = EpochSampler(50, shuffle=True, seed=3)
    first = [i for _, i in s]
    s.set_epoch(1)
    second = [i for e, i in s]
    assert first != second and sorted(first) == sorted(second) == list(range(50))
    s.set_epoch(0)
    assert [i for _, i in s] == first


def collate(examples):
    return [e["key"] for e in examples]


def test_resume_skips_consumed_batches_without_loading_them():
    ds = BlockDataset([[i] for i in range(20)])
    full = ResumableLoader(ds, batch_size=4, shuffle=True, seed=5, collate_fn=collate)
    full.epoch_sampler.set_epoch(2)
    batches = list(full)
    resumed = ResumableLoader(ds, batch_size=4, shuffle=True, seed=5, collate_fn=collate)
    resumed.load_state_dict({"epoch": 2, "consumed": 3, "batch_size": 4})
    assert list(resumed) == batches[3:]
    assert resumed.consumed == 3  # the callback counts from here


def test_state_saved_at_epoch_end_resumes_at_next_epoch():
    ds = BlockDataset([[i] for i in range(8)])
    loader = ResumableLoader(ds, batch_size=4, shuffle=True, seed=5, collate_fn=collate)
    loader.load_state_dict({"epoch": 0, "consumed": 2, "batch_size": 4})
    keys = [k for b in loader for k in b]
    assert {e for e, _ in keys} == {1} and len(keys) == 8


def test_batch_size_change_is_refused():
    loader = ResumableLoader(BlockDataset([[1]] * 8), batch_size=4, shuffle=False, seed=0, collate_fn=collate)
    with pytest.raises(PtmError, match="batch_size=2"):
        loader.load_state_dict({"epoch": 0, "consumed": 1, "batch_size": 2})


def test_eval_loader_leaves_the_global_rng_alone():
    """A plain DataLoader draws its base seed from the global RNG at every iterator; ``eval_loader`` must not, or a
    validation between two training steps changes the next step's dropout (and a resume at that step differs)."""
    from torch.utils.data import DataLoader

    from ptm_app.data.loader import eval_loader

    state = torch.get_rng_state()
    iter(DataLoader(list(range(4))))
    assert not torch.equal(torch.get_rng_state(), state)  # what the helper guards against
    state = torch.get_rng_state()
    loader = eval_loader(list(range(10)), batch_size=3, seed=5)
    first, again = [b.tolist() for b in loader], [b.tolist() for b in loader]
    assert torch.equal(torch.get_rng_state(), state)
    assert first == again and sorted(sum(first, [])) == list(range(10)) and sum(first, []) != list(range(10))
    assert sum([b.tolist() for b in eval_loader(list(range(10)), batch_size=3, seed=5, seeded_order=False)], []) \
        == list(range(10))


def test_batches_are_page_locked_only_for_a_cuda_run(tiny_corpus):
    """On a GPU Lightning copies batches with ``non_blocking=True``, asynchronous only from page-locked memory."""
    from types import SimpleNamespace

    from ptm_app.data.datamodules import PretrainDataModule
    from ptm_app.data.tokenizer import TokenizerSpec

    dm = PretrainDataModule(TokenizerSpec(train="wordpiece", vocab_size=200, min_frequency=1), source=str(tiny_corpus),
                            max_length=32, batch_size=4, limit_documents=20)
    assert dm._pin_memory() is False  # no trainer: outside a run
    for device, pinned in (("cpu", False), ("cuda", True)):
        dm.trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)))
        assert dm._pin_memory() is pinned
    dm.trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cpu")), global_rank=0, world_size=1)
    dm.setup("fit")
    assert dm.train_dataloader().pin_memory is False and dm.val_dataloader().pin_memory is False
