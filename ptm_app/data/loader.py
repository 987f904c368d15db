"""A DataLoader that resumes mid-epoch exactly, without replaying what it already served.

The sampler hands out ``(epoch, index)`` keys: a seeded permutation per epoch, sharded by rank.
The loader counts the batches the training loop has *consumed* (``DataPositionCallback``; Lightning
prefetches one batch, so "served" would be off by one) and saves ``{epoch, consumed}`` in the
checkpoint through Lightning's stateful-dataloader protocol.  On resume it skips ``consumed``
batches by index arithmetic, so resuming at step 10 or 10,000 costs the same.

With ``lengths`` the sampler groups examples of similar length into the same batches (dynamic padding
then pads far less); the grouped order is still a pure function of (seed, epoch), so resume stays exact.
"""
from __future__ import annotations

import math
from typing import Any, Iterator, Optional, Sequence

import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, Sampler


class EpochSampler(Sampler):
    """Yields ``(epoch, index)``: a fresh seeded order every epoch, this rank's shard only.

    ``lengths`` (one per example) turns on length grouping, as transformers' ``LengthGroupedSampler``
    (``group_by_length``): the shuffled order is cut into megabatches of ``MEGABATCH`` global batches, each
    sorted by length (longest first) and cut into global batches (``batch_size`` × ``world_size``); the
    global batches are then shuffled, and the one holding the longest example goes first, so an
    out-of-memory shows at the first step.  Rank ``r`` takes every ``world_size``-th example, so each
    global batch gives every rank one batch of similar lengths.
    """

    MEGABATCH = 50  # global batches per sorted window (transformers' default ``mega_batch_mult``)

    def __init__(self, size: int, shuffle: bool, seed: int, rank: int = 0, world_size: int = 1,
                 lengths: Optional[Sequence[int]] = None, batch_size: int = 1):
        if lengths is not None and len(lengths) != size:
            raise ValueError(f"lengths has {len(lengths)} entries for {size} examples")
        self.size, self.shuffle, self.seed = size, shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.lengths = torch.as_tensor(lengths, dtype=torch.long) if lengths is not None else None
        self.batch_size = batch_size
        self.epoch = 0
        self.skip = 0  # samples to skip at the start of the next iteration (resume)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return math.ceil(self.size / self.world_size)

    def order(self) -> torch.Tensor:
        """This rank's indices for the epoch (a tensor: 8 bytes an example, never a Python list of the epoch)."""
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.size, generator=gen) if self.shuffle else torch.arange(self.size)
        order = torch.cat([order, order[: len(self) * self.world_size - self.size]])  # every rank the same count
        if self.lengths is not None:
            order = torch.as_tensor(self._grouped(order.tolist(), gen), dtype=torch.long)
        return order[self.rank:: self.world_size]

    def _grouped(self, order: list[int], gen: torch.Generator) -> list[int]:
        step = self.batch_size * self.world_size
        window = min(self.MEGABATCH, max(1, len(order) // (4 * step))) * step
        batches: list[list[int]] = []
        for start in range(0, len(order), window):
            mega = sorted(order[start: start + window], key=lambda i: -int(self.lengths[i]))  # stable
            batches.extend(mega[b: b + step] for b in range(0, len(mega), step))
        full = [b for b in batches if len(b) == step]
        partial = [b for b in batches if len(b) < step]  # at most one: it stays last, after the full ones
        full = [full[i] for i in torch.randperm(len(full), generator=gen).tolist()] if self.shuffle else full
        if full:
            longest = max(range(len(full)), key=lambda k: int(self.lengths[full[k][0]]))
            full.insert(0, full.pop(longest))
        return [i for b in full + partial for i in b]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        skip, self.skip = self.skip, 0
        epoch = self.epoch
        order = self.order()[skip:]
        for start in range(0, len(order), 1 << 16):  # converted a slice at a time
            for index in order[start: start + (1 << 16)].tolist():
                yield epoch, index


def eval_loader(dataset, *, batch_size: int, seed: int, seeded_order: bool = True, **kwargs: Any) -> DataLoader:
    """A validation/test loader over ``dataset`` in one fixed seeded order (so ``limit_val/test_batches`` take the
    same random subset every time; prepared files are sorted by label, where a prefix is one class), or in file
    order.  Its own generator: creating an iterator of a plain ``DataLoader`` draws a seed from the global RNG, so a
    validation between two training steps would shift the next step's dropout and a resumed run would differ."""
    from torch.utils.data import Subset

    if seeded_order:
        dataset = Subset(dataset, torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist())
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, generator=torch.Generator().manual_seed(seed),
                      **kwargs)


class ResumableLoader(DataLoader):
    """``DataLoader`` over an ``EpochSampler`` with ``state_dict``/``load_state_dict``."""

    resumable = True  # DataPositionCallback counts its consumed batches (so does data.multitask.MultitaskLoader)

    def __init__(self, dataset, *, batch_size: int, shuffle: bool, seed: int, rank: int = 0, world_size: int = 1,
                 lengths: Optional[Sequence[int]] = None, **kwargs: Any):
        self.epoch_sampler = EpochSampler(len(dataset), shuffle, seed, rank, world_size, lengths, batch_size)
        kwargs.setdefault("generator", torch.Generator().manual_seed(seed))  # never touch the global RNG
        super().__init__(dataset, batch_size=batch_size, sampler=self.epoch_sampler, **kwargs)
        self.consumed = 0
        self._resume: dict | None = None
        self.restored = False  # load_state_dict was called (by Lightning, or by DataPositionCallback)

    def __iter__(self):
        if self._resume is not None:
            self.epoch_sampler.set_epoch(self._resume["epoch"])
            self.consumed = self._resume["consumed"]
            self.epoch_sampler.skip = self.consumed * self.batch_size
            self._resume = None
        else:
            self.consumed = 0
        return super().__iter__()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch_sampler.epoch, "consumed": self.consumed, "batch_size": self.batch_size,
                "world_size": self.epoch_sampler.world_size}

    def load_state_dict(self, state: dict) -> None:
        if state.get("batch_size", self.batch_size) != self.batch_size:
            # positions are counted in batches; a new batch size cannot continue the same order exactly
            from ptm_app.errors import PtmError

            raise PtmError(
                f"cannot resume: the checkpoint was written with batch_size={state['batch_size']}, "
                f"this run uses {self.batch_size}; resume with the same batch size"
            )
        state = dict(state, consumed=self._consumed_here(state))
        self.restored = True
        if state["consumed"] >= len(self):  # saved at the last step of an epoch: start the next one
            self._resume = {"epoch": state["epoch"] + 1, "consumed": 0}
        else:
            self._resume = {"epoch": state["epoch"], "consumed": state["consumed"]}


    def _consumed_here(self, state: dict) -> int:
        """Batches this rank has consumed, from a checkpoint written with ``world_size`` ranks.

        The ranks interleave one seeded order (``EpochSampler``), so together they consumed its first
        ``consumed × batch_size × old_ranks`` examples; another rank count continues exactly when that is a whole
        number of its global batches (2 → 1 ranks always, 1 → 2 after an even step ...), else it is refused."""
        old, new = state.get("world_size", self.epoch_sampler.world_size), self.epoch_sampler.world_size
        if old == new:
            return state["consumed"]
        if self.epoch_sampler.lengths is not None or (state["consumed"] * old) % new:
            from ptm_app.errors import PtmError

            raise PtmError(f"cannot resume: the checkpoint was written by {old} ranks after {state['consumed']} "
                           f"batches each, which {new} ranks cannot continue exactly; resume with {old} ranks")
        return state["consumed"] * old // new


class DataPositionCallback(Callback):
    """Counts batches consumed by the training loop (runs before ModelCheckpoint saves), and makes sure a
    resumed run restores the loader position.

    Lightning restores loader states only when it builds the train loader after the checkpoint; with
    ``max_epochs`` set, ``trainer.estimated_stepping_batches`` (used by ``configure_optimizers``) builds
    and starts iterating it before the restore, and the saved position would be silently dropped.
    """

    def __init__(self) -> None:
        self._pending: dict | None = None

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        states = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {}).get("combined_loader")
        self._pending = states[0] if states else None

    def on_train_start(self, trainer, pl_module) -> None:
        loader = trainer.train_dataloader
        if self._pending is not None and getattr(loader, "resumable", False) and not loader.restored:
            loader.load_state_dict(self._pending)
            iter(trainer.fit_loop._data_fetcher)  # discard the iterator (and its prefetched batch) built too early
        self._pending = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loader = trainer.train_dataloader
        if getattr(loader, "resumable", False):
            loader.consumed += 1
