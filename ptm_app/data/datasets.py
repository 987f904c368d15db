"""Map-style datasets that accept the sampler's ``(epoch, index)`` keys (or plain indices)."""
from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset


def _index(key) -> int:
    return key[1] if isinstance(key, tuple) else int(key)


class BlockDataset(Dataset):
    """Token blocks for pre-training."""

    def __init__(self, blocks: list[np.ndarray]):
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, key) -> dict:
        return {"input_ids": torch.from_numpy(np.asarray(self.blocks[_index(key)], dtype=np.int64)), "key": key}


class EncodedDataset(Dataset):
    """Tokenized labelled examples: ``input_ids`` (+ ``token_type_ids``) and an integer ``label``."""

    def __init__(self, input_ids: list, labels: list[int] | None, token_type_ids: list | None = None):
        self.input_ids, self.labels, self.token_type_ids = input_ids, labels, token_type_ids

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, key) -> dict:
        i = _index(key)
        item = {"input_ids": torch.as_tensor(self.input_ids[i], dtype=torch.long), "key": key}
        if self.token_type_ids is not None:
            item["token_type_ids"] = torch.as_tensor(self.token_type_ids[i], dtype=torch.long)
        if self.labels is not None:
            item["label"] = self.labels[i]
        return item
