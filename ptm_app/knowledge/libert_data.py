"""Two training streams for one encoder: a pre-training corpus (MLM) and labelled word pairs (LIBERT's lexical
relation classification, Lauscher et al. 2020 §3).

LIBERT trains BERT's pre-training tasks and the LRC task "by alternating between batches" of the two; the
summed variant puts one batch of each in every step and adds the losses.  Both reuse the multitask loader
(``data.multitask.MultitaskLoader``): every stream keeps its own seeded, resumable order, and a checkpoint needs
only ``{epoch, consumed}`` to resume exactly.
"""
from __future__ import annotations

from typing import Iterator, Literal, Optional

import lightning.pytorch as pl

from ptm_app.data.collators import TaggedCollator
from ptm_app.data.contract import DataFacts, ModelHooks
from ptm_app.data.datamodules import PretrainDataModule, TaskDataModule, check_batch_sizes
from ptm_app.data.multitask import MultitaskLoader, TaskSchedule, nested_data_module
from ptm_app.data.tokenizer import TokenizerSpec
from ptm_app.errors import PtmError

Combine = Literal["alternate", "sum"]
STREAMS = ("mlm", "pairs")


class AlternatingSchedule(TaskSchedule):
    """Stream order of an epoch: mlm, pairs, mlm, pairs ... (LIBERT's batch alternation)."""

    def order(self, epoch: int) -> list[int]:
        return [i % len(self.rates) for i in range(self.length)]


class SummedLoader(MultitaskLoader):
    """One batch of every stream per step, ``{stream: batch}``; the k-th step of epoch e takes each stream's
    ``e * length + k``-th batch, so a resumed run continues exactly."""

    def __iter__(self) -> Iterator[dict]:
        start = self._begin()
        served = self.sampler.epoch * len(self) + start
        streams = [self._stream(self.loaders[name], served) for name in self.names]
        for _ in range(start, len(self)):
            yield {name: next(stream) for name, stream in zip(self.names, streams)}


class MLMPairsDataModule(pl.LightningDataModule):
    """A pre-training corpus and a word-pair task behind one tokenizer (trained on the corpus), for
    ``LexicalRelationMLMModule`` (LIBERT).

    Args:
        tokenizer: shared by both streams (a trained one is trained on the corpus).
        corpus: ``PretrainDataModule`` options (``source: brown``, ``max_length``, ``limit_documents`` ...).
        pairs: ``TaskDataModule`` options (``source: wordnet_lexrel``, ``text_pair_field: text_pair`` ...).
        combine: ``alternate`` (a corpus batch, then a pair batch, ...; LIBERT) or ``sum`` (one of each per step,
            the losses added).
        batch_size / eval_batch_size / num_workers / seed: defaults for both streams.
    """

    prepare_data_per_node = False

    def __init__(self, tokenizer: TokenizerSpec, corpus: Optional[dict] = None, pairs: Optional[dict] = None,
                 combine: Combine = "alternate", batch_size: int = 32, eval_batch_size: Optional[int] = None,
                 num_workers: int = 0, seed: int = 1234):
        super().__init__()
        check_batch_sizes(batch_size, eval_batch_size)
        shared = {"batch_size": batch_size, "eval_batch_size": eval_batch_size, "num_workers": num_workers,
                  "seed": seed}
        self.corpus = nested_data_module(PretrainDataModule, corpus or {"source": "brown"}, shared, tokenizer,
                                         "data.init_args.corpus")
        self.pairs = nested_data_module(TaskDataModule, pairs or {"source": "wordnet_lexrel",
                                                                  "text_pair_field": "text_pair"},
                                        shared, tokenizer, "data.init_args.pairs")
        if self.pairs.text_pair_field is None:
            raise PtmError("data.init_args.pairs needs text_pair_field (the second word, e.g. text_pair): "
                           "LIBERT classifies [CLS] w1 [SEP] w2 [SEP]")
        self.combine, self.seed = combine, seed
        self.tokenizer = None
        self.model_hooks: Optional[ModelHooks] = None
        self._attached = False

    def load_tokenizer(self):
        if self.tokenizer is None:
            self.tokenizer = self.corpus.load_tokenizer()
            self.pairs.tokenizer = self.tokenizer
        return self.tokenizer

    def prepare_data(self) -> None:
        self.load_tokenizer()
        self.corpus.prepare_data()
        self.pairs.prepare_data()

    def setup(self, stage: Optional[str] = None) -> None:
        self.load_tokenizer()
        self.corpus.setup(stage)
        self.pairs.setup(stage)

    def facts(self) -> DataFacts:
        return DataFacts(tokenizer=self.load_tokenizer, max_length=self.corpus.max_length,
                         labels=self.pairs.label_set)

    def connect_model(self, hooks: ModelHooks) -> None:
        self.model_hooks = hooks
        self.corpus.connect_model(hooks)

    def _attach(self) -> None:
        if self._attached:
            return
        hooks = self.model_hooks
        if hooks is None or hooks.collator is None or hooks.task_collator is None:
            raise PtmError("MLMPairsDataModule needs model.class_path: LexicalRelationMLMModule (its MLM and pair "
                           "collators); connect them with ptm_app.data.contract.connect(model, data)")
        for name, module in zip(STREAMS, (self.corpus, self.pairs)):
            module.trainer = self.trainer
            inner = hooks.collator(self.tokenizer, seed=self.seed) if name == "mlm" else \
                hooks.task_collator("sequence", self.tokenizer)
            module.collate_fn = TaggedCollator(inner, name)
        self._attached = True

    def train_dataloader(self) -> MultitaskLoader:
        self._attach()
        loaders = {"mlm": self.corpus.train_dataloader(), "pairs": self.pairs.train_dataloader()}
        if self.combine == "sum":
            return SummedLoader(loaders, [1.0, 1.0], len(loaders["mlm"]), self.seed)
        loader = MultitaskLoader(loaders, [0.5, 0.5], 2 * len(loaders["mlm"]), self.seed)
        loader.sampler = AlternatingSchedule(loader.sampler.rates, loader.sampler.length, self.seed)
        return loader

    def _eval_loaders(self, split: str) -> list:
        self._attach()
        return [self.corpus._eval_loader(split), self.pairs._eval_loader(split)]

    def val_dataloader(self) -> list:
        return self._eval_loaders("validation")

    def test_dataloader(self) -> list:
        return self._eval_loaders("test")
