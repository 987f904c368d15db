"""Validation and test loaders visit a split in one fixed seeded order, so ``limit_val_batches`` /
``limit_test_batches`` evaluate a random sample across classes (the prepared files are sorted by label: a prefix
of bbc's test split is all 'business'); ``predict`` keeps the file order that predictions.jsonl follows."""
from collections import Counter

from ptm_app.data.datamodules import TaskDataModule
from ptm_app.data.tokenizer import TokenizerSpec


def _labels(loader, n_batches: int) -> list[int]:
    return [int(label) for _, batch in zip(range(n_batches), loader) for label in batch["labels"]]


def test_limited_eval_batches_sample_every_class_predict_keeps_file_order():
    dm = TaskDataModule(tokenizer=TokenizerSpec(pretrained="minilm"), source="bbc", max_length=16, eval_batch_size=16,
                        group_by_length=False)
    dm.setup()
    test = dm.datasets["test"]
    assert Counter(test.labels[:16]) == {0: 16}  # the file: sorted by label
    for loader in (dm.test_dataloader, dm.val_dataloader):
        first = _labels(loader(), 2)  # limit_*_batches: 2
        assert len(set(first)) == 5 and max(Counter(first).values()) <= 12, Counter(first)
        order = loader().dataset.indices
        assert sorted(order) == list(range(len(loader().dataset))) and order == loader().dataset.indices
    assert sorted(_labels(dm.test_dataloader(), 100)) == sorted(test.labels)  # every example once
    assert [k for batch in dm.predict_dataloader() for k in batch["keys"]] == list(range(len(test)))
