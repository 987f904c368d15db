"""Shared LightningDataModules: pre-training corpora and labelled tasks.

Tokenization happens once, in ``prepare_data`` (global rank 0 only), into an on-disk cache;
``setup`` on every rank only reads it.  The training loader resumes mid-epoch exactly
(``ResumableLoader``); the objective's collator comes from the LightningModule
(``make_collator``), so one data module serves every objective.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Callable, Literal, Optional

import lightning.pytorch as pl
import numpy as np
from torch.utils.data import DataLoader, Dataset

from ptm_app.data.contract import DataFacts, ModelHooks
from ptm_app.data.collators import PadCollator
from ptm_app.data.corpus import Packing, iter_texts, load_corpus, tokenize_corpus
from ptm_app.data.datasets import EncodedDataset
from ptm_app.data.encoded import EncodedSplit, pick
from ptm_app.data.formats import split_files
from ptm_app.data.loader import ResumableLoader, eval_loader
from ptm_app.data.tasks import Overlong, Unlabelled, encode_split, label_ids, label_values
from ptm_app.data.tokenizer import TokenizerSpec, is_bert_style, load_tokenizer
from ptm_app.errors import PtmError


def resolve_source(source: str) -> dict[str, Path]:
    """A prepared dataset name, a directory of split files, a single file (train only), a glob (train only), a HF
    ``datasets`` directory written by ``save_to_disk`` (its Arrow files), or ``hf:NAME``."""
    if source.startswith("hf:"):
        from ptm_app.data.hub import hub_dataset_dir

        return split_files(hub_dataset_dir(source))
    path = Path(source).expanduser()
    if not path.exists() and any(ch in source for ch in "*?["):  # a glob: its files, in order, are the train split
        from ptm_app.data.corpus_key import expand_inputs

        return {"train": tuple(expand_inputs([source]))}
    if path.is_file():
        return {"train": path.resolve()}
    if path.is_dir():
        from ptm_app.data.corpus_key import hf_saved_splits

        return hf_saved_splits(path.resolve()) or split_files(path.resolve())
    from ptm_app.data.sources import SOURCES, prepared_dir

    if source in SOURCES:
        return split_files(prepared_dir(source))
    known = ", ".join(sorted(SOURCES))
    raise PtmError(f"data source '{source}' not found: not a file, a directory, nor a prepared dataset ({known}); "
                   f"check data.source or run: python main.py data prepare NAME")


def holdout_split(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Deterministically hold out ``fraction`` of ``n`` items (at least one, if n > 1)."""
    order = np.random.default_rng(seed).permutation(n).tolist()
    k = min(max(1, round(n * fraction)), n - 1) if n > 1 else 0
    return sorted(order[k:]), sorted(order[:k])


def holdout_split_array(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``holdout_split`` as arrays (the same documents), for corpora too large for Python lists."""
    order = np.random.default_rng(seed).permutation(n)
    k = min(max(1, round(n * fraction)), n - 1) if n > 1 else 0
    return np.sort(order[k:]), np.sort(order[:k])


def seeded_subset(index: list[int], n: int, seed: int) -> list[int]:
    """``n`` of ``index`` drawn with ``seed``, kept in file order (prepared sets are sorted by label, so the
    first N would often be a single class); all of them if there are fewer."""
    if n >= len(index):
        return list(index)
    return sorted(random.Random(seed).sample(index, n))


def check_batch_sizes(batch_size: int, eval_batch_size: Optional[int] = None) -> None:
    """Batch sizes of at least one example, refused in one line (a DataLoader's own check is a long traceback from
    inside Lightning's loops); every data module checks them when it is built."""
    for name, value in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise PtmError(f"data.init_args.{name}={value!r}: a batch holds at least one example; set it to 1 or more"
                           + (" (or leave it out: the training batch_size)" if name == "eval_batch_size" else ""))


class _Base(pl.LightningDataModule):
    group_by_length = False  # labelled data modules take it as an argument (see ``EpochSampler``)
    kind: Optional[str] = None  # the task kind of labelled data (task_kinds.registry.TASK_KINDS)

    def __init__(self, source: str, tokenizer: TokenizerSpec, batch_size: int, eval_batch_size: Optional[int],
                 num_workers: int, seed: int, holdout: float):
        super().__init__()
        check_batch_sizes(batch_size, eval_batch_size)
        self.source, self.tokenizer_spec = source, tokenizer
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.num_workers, self.seed, self.holdout = num_workers, seed, holdout
        self.tokenizer = None
        self.collate_fn: Optional[Callable] = None
        self.model_hooks: Optional[ModelHooks] = None  # from data.contract.connect
        self.datasets: dict = {}
        # tokenize once per job, on global rank 0; the other ranks wait at Lightning's setup barrier and read the
        # cache (a shared filesystem; without one, each node's setup builds its own cache)
        self.prepare_data_per_node = False

    # -- helpers ---------------------------------------------------------------------------
    @property
    def files(self) -> dict[str, Path]:
        return resolve_source(self.source)

    def _tokenizer_corpus(self):
        train = self.files["train"]
        field = getattr(self, "text_field", "text")
        files = train if isinstance(train, tuple) else (train,)  # a glob source: the tokenizer trains on all its files
        return (lambda: iter_texts(files, field)), f"{':'.join(map(str, files))}:{field}"  # streamed, never a list

    def load_tokenizer(self):
        if self.tokenizer is None:
            corpus, key = self._tokenizer_corpus()
            self.tokenizer = load_tokenizer(self.tokenizer_spec, corpus, key)
        return self.tokenizer

    # -- the data contract (data.contract.connect) ----------------------------------------------------
    def facts(self) -> DataFacts:
        """What the module may know of this data; the callables are answered once the data is prepared."""
        return DataFacts(tokenizer=self.load_tokenizer, max_length=getattr(self, "max_length", None),
                         max_source_length=getattr(self, "max_source_length", None),
                         max_target_length=getattr(self, "max_target_length", None),
                         task=getattr(self, "task", None), kind=getattr(self, "kind", None),
                         languages=getattr(self, "languages", None),
                         unanswerable=getattr(self, "unanswerable", False),
                         labels=getattr(self, "label_set", DataFacts.labels),
                         label_priors=getattr(self, "label_priors", DataFacts.label_priors),
                         records=getattr(self, "records", DataFacts.records),
                         train_examples=lambda: self.datasets.get("train"))

    def connect_model(self, hooks: ModelHooks) -> None:
        """Take the module's collator factory and example format."""
        self.model_hooks = hooks

    def _rank(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _collate(self) -> Callable:
        if self.collate_fn is not None:
            return self.collate_fn
        hooks = self.model_hooks
        if hooks is not None and hooks.collator is not None:
            self.collate_fn = hooks.collator(self.tokenizer, seed=self.seed)
            return self.collate_fn
        return self.default_collator()

    def default_collator(self) -> Callable:
        """The collator when the module gives none: pad the inputs per batch."""
        return PadCollator(self.tokenizer.pad_token_id)


    def setup_labelled(self, to_ids) -> None:
        """Encode every split (cached), map its labels to ids with ``to_ids(enc, labels, from_training)``,
        hold out validation from train when there is no validation file, subsample train (``limit_train``),
        and hand each split to ``self._add(split, enc, ids, index)``."""
        if self.datasets:
            return
        from_training = self.labels is None
        labels = self.label_set()
        for split, path in self.files.items():
            enc = self._encode(path)
            ids = to_ids(enc, labels, from_training)
            index = list(range(len(ids)))
            if split == "train" and "validation" not in self.files:
                index, held = holdout_split(len(ids), self.holdout, self.seed)
                self._add("validation", enc, ids, held)
            if split == "train" and self.limit_train:
                index = seeded_subset(index, self.limit_train, self.seed)
            self._add(split, enc, ids, index)

    def train_dataloader(self) -> DataLoader:
        rank, world = self._rank()
        train = self.datasets["train"]
        lengths = None
        if self.group_by_length:
            if not hasattr(train, "lengths"):
                raise PtmError(f"group_by_length is not available for {type(self).__name__}; "
                               f"set data.init_args.group_by_length: false")
            lengths = train.lengths()
        return ResumableLoader(train, batch_size=self.batch_size, shuffle=True, seed=self.seed, lengths=lengths,
                               rank=rank, world_size=world, collate_fn=self._collate(),
                               num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
                               pin_memory=self._pin_memory())

    def _eval_loader(self, split: str, seeded_order: bool = True) -> DataLoader:
        if split not in self.datasets:
            raise PtmError(f"data source '{self.source}' has no {split} split; add a {split}.jsonl file")
        return eval_loader(self.datasets[split], batch_size=self.eval_batch_size, seed=self.seed,
                           seeded_order=seeded_order, collate_fn=self._collate(), num_workers=self.num_workers,
                           pin_memory=self._pin_memory())

    def _pin_memory(self) -> bool:
        """Page-locked batches when the run's device is a CUDA GPU: Lightning copies batches with
        ``non_blocking=True``, which is asynchronous only from page-locked memory (then the copy overlaps the step
        before it instead of waiting for it)."""
        trainer = self.trainer  # LightningDataModule's: None outside a run
        return trainer is not None and trainer.strategy.root_device.type == "cuda"

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("validation")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._eval_loader("test", seeded_order=False)  # predictions.jsonl follows the test file


class PretrainDataModule(_Base):
    """Raw-text corpus → packed token blocks, with documents and lines (sentences) kept.

    Args:
        source: prepared dataset name (``bbc``), a directory with ``train``/``validation`` files, or one file.
        tokenizer: a pretrained tokenizer or one trained on this corpus (see ``TokenizerSpec``).
        text_field: the field holding a document's text (lines inside it are its sentences).
        max_length: block length in tokens, special tokens included.
        packing: ``pack`` (full blocks across documents) or ``split_documents`` (no block spans two documents).
        document_attention: with ``pack``, keep the documents inside a block apart: every block carries its
            tokens' document ids, and the model gets a block-diagonal attention mask (causal blocks for decoders)
            with position ids restarting at each document (``backbones.attention.packed_document_inputs``).
            Full blocks without cross-document attention (Krell et al. 2021).
        holdout: fraction of documents held out for validation perplexity when the source has no validation split.
        limit_documents: use only the first N training documents (quick runs).
        examples: ``blocks`` (packed token blocks), ``nsp``/``sop`` sentence pairs, or ``knowledge_spans``
            (whole sentences of one document per block, padded: what ERNIE and SenseBERT read from a span corpus
            such as ``brown_spans``, so a plain-MLM control can read the same); by default what the LightningModule
            asks for (its targets' needs; the builders are ``data.examples.EXAMPLE_BUILDERS``).
        streaming: tokenize with litdata into chunk files on disk (``data.litcorpus``) instead of one in-memory
            cache, so the corpus is bounded by disk, not RAM; blocks are cut by index arithmetic (``data.blocks``).
            By default on when a split's files exceed ``STREAM_ABOVE`` bytes, the source is a glob or a HF
            ``datasets`` directory (``save_to_disk``).
        prepare_workers: tokenizer processes for ``streaming`` preparation (default: all cores).
        shard_dir: where ``streaming`` writes its prepared corpus (one sub-directory per split); default the cache.
        verify_chunks: before reading a ``streaming`` corpus, check every chunk file against the sha256 recorded
            when it was prepared (``checksums.json``), not only its size: catches a flipped bit, at the cost of
            reading the whole corpus once per run (about 1 s per GB from the page cache).
    """

    STREAM_ABOVE = 100 << 20  # bytes of input above which ``streaming`` switches on by itself

    def __init__(self, tokenizer: TokenizerSpec, source: str = "bbc", text_field: str = "text", max_length: int = 128,
                 packing: Packing = "pack", batch_size: int = 16,
                 eval_batch_size: Optional[int] = None, num_workers: int = 0, seed: int = 1234,
                 holdout: float = 0.05, limit_documents: Optional[int] = None,
                 examples: Optional[Literal["blocks", "nsp", "sop", "knowledge_spans"]] = None,
                 document_attention: bool = False,
                 streaming: Optional[bool] = None, prepare_workers: Optional[int] = None,
                 shard_dir: Optional[str] = None, verify_chunks: bool = False):
        super().__init__(source, tokenizer, batch_size, eval_batch_size, num_workers, seed, holdout)
        self.streaming, self.prepare_workers, self.shard_dir = streaming, prepare_workers, shard_dir
        self.verify_chunks = verify_chunks
        self.text_field, self.max_length, self.packing = text_field, max_length, packing
        self.document_attention = document_attention
        self.limit_documents, self.examples = limit_documents, examples

    def example_needs(self) -> frozenset:
        """The example kinds to build: ``examples`` when set, else what the module's targets need
        (``ModelHooks.example_format``); empty for plain token blocks."""
        if self.examples:
            return frozenset() if self.examples == "blocks" else frozenset({self.examples})
        hooks = self.model_hooks
        return frozenset(hooks.example_format or ()) if hooks is not None else frozenset()

    def example_builder(self):
        """The registry entry that builds these examples (``data.examples.EXAMPLE_BUILDERS``)."""
        from ptm_app.data.examples import example_builder

        return example_builder(self.example_needs())

    def use_streaming(self) -> bool:
        files = self.files
        if self.streaming is not None:
            if not self.streaming and any(isinstance(p, tuple) for p in files.values()):
                raise PtmError(f"data source '{self.source}' is a glob of several files; set "
                               f"data.init_args.streaming: true (or null) to read them")
            return self.streaming
        return any(isinstance(p, tuple) or p.stat().st_size > self.STREAM_ABOVE for p in files.values())

    def _tokenized(self, split: str, path, progress: bool):
        """The split's corpus: litdata chunks (``streaming``) or the in-memory cache, prepared once."""
        tok = self.load_tokenizer()
        if not self.use_streaming():
            return load_corpus(tokenize_corpus(path, self.text_field, tok, progress=progress))
        from ptm_app.data.litcorpus import open_corpus, prepare_corpus

        files = list(path) if isinstance(path, tuple) else [path]
        target = Path(self.shard_dir).expanduser() / split if self.shard_dir else None
        prepared = prepare_corpus(files, self.text_field, tok, self.prepare_workers, target, progress=progress)
        return open_corpus(prepared, verify=self.verify_chunks)

    def prepare_data(self) -> None:
        self.example_builder().prepare(self, self.example_needs())

    def setup(self, stage: str | None = None) -> None:
        if not self.datasets:
            self.datasets = self.example_builder().datasets(self, self.example_needs())

    # -- what the example builders (data.examples) read ------------------------------------------------
    def split_corpora(self) -> tuple[dict, dict, bool]:
        """Every split's tokenized corpus, its documents (validation held out of train when there is no validation
        file; train cut to ``limit_documents``), and whether the corpora are streamed."""
        files = self.files
        streaming = self.use_streaming()
        corpora = {split: self._tokenized(split, path, progress=False) for split, path in files.items()}
        docs = {split: (np.arange(c.num_documents) if streaming else list(range(c.num_documents)))
                for split, c in corpora.items()}
        if "validation" not in files:
            split_docs = holdout_split_array if streaming else holdout_split
            docs["train"], docs["validation"] = split_docs(corpora["train"].num_documents, self.holdout, self.seed)
            corpora["validation"] = corpora["train"]
        if self.limit_documents:
            docs["train"] = docs["train"][: self.limit_documents]
        return corpora, docs, streaming

    def block_frame(self) -> tuple[list[int], list[int], list[int]]:
        """The ids a block starts and ends with and the separator between documents: [CLS] ... [SEP] for a
        BERT-style tokenizer, else none and EOS."""
        tok = self.load_tokenizer()
        if is_bert_style(tok):
            return [tok.cls_token_id], [tok.sep_token_id], [tok.sep_token_id]
        return [], [], [tok.eos_token_id]

    @staticmethod
    def holdout_documents(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
        return holdout_split(n, fraction, seed)


class TaskDataModule(_Base):
    """Labelled text classification or regression: single sentences or sentence pairs, padded per batch.

    Args:
        source: prepared dataset name (``bbc``, ``tweets``), a directory with split files, or one file.
        text_field / text_pair_field / label_field / id_field: column names.
        task: ``classification`` (label names) or ``regression`` (the label field holds a number).
        labels: the label set, in order; by default the sorted labels of the training split.
        max_length: longest input in tokens; longer ones are truncated or refused (``overlong``).
        limit_train: use only N training examples (few-shot and quick runs).
        unlabelled: ``error`` (a record without a label is a ``file:line`` error) or ``skip`` (leave such records
            out, counted on stdout; e.g. the tweets whose annotator confidence is null).
        group_by_length: batch training examples of similar length together (shuffled windows, exact resume;
            see ``loader.EpochSampler``), so per-batch padding shrinks; the padding fraction is logged.  On by
            default (about 1.4x the samples/s of plain shuffling on the tweets, same accuracy: benchmarks/);
            ``false`` gives plain shuffled batches.
    """

    def __init__(self, tokenizer: TokenizerSpec, source: str = "bbc", text_field: str = "text", text_pair_field: Optional[str] = None, label_field: str = "label",
                 id_field: str = "id", labels: Optional[list[str]] = None, max_length: int = 128,
                 overlong: Overlong = "truncate", batch_size: int = 32, eval_batch_size: Optional[int] = None,
                 num_workers: int = 0, seed: int = 1234, holdout: float = 0.1, limit_train: Optional[int] = None,
                 task: Literal["classification", "regression"] = "classification", group_by_length: bool = True,
                 unlabelled: Unlabelled = "error"):
        super().__init__(source, tokenizer, batch_size, eval_batch_size, num_workers, seed, holdout)
        self.group_by_length = group_by_length
        if task == "regression" and labels is not None:
            raise PtmError("data.labels is for classification; remove it, or set data.task: classification")
        self.task, self.unlabelled = task, unlabelled
        self.text_field, self.text_pair_field, self.label_field = text_field, text_pair_field, label_field
        self.id_field, self.labels, self.max_length, self.overlong = id_field, labels, max_length, overlong
        self.limit_train = limit_train
        self.splits: dict = {}

    def _encode(self, path: Path) -> EncodedSplit:
        return encode_split(path, self.load_tokenizer(), text_field=self.text_field,
                            text_pair_field=self.text_pair_field, label_field=self.label_field,
                            max_length=self.max_length, overlong=self.overlong, id_field=self.id_field,
                            unlabelled=self.unlabelled)

    def prepare_data(self) -> None:
        for path in self.files.values():
            self._encode(path)

    def label_set(self) -> list[str]:
        """The label names (empty for regression)."""
        if self.task == "regression":
            return []
        if self.labels is None:
            self.labels = sorted(set(self._encode(self.files["train"]).fields["label"]))
        return list(self.labels)

    @property
    def num_labels(self) -> int:
        return len(self.label_set()) or 1

    def setup(self, stage: str | None = None) -> None:
        self.setup_labelled(label_values if self.task == "regression" else label_ids)

    def _add(self, split: str, enc: EncodedSplit, ids: list[int], index: list[int]) -> None:
        self.splits[split] = {"ids": pick(enc.ids, index), "texts": pick(enc.fields["text"], index), "path": enc.path}
        self.datasets[split] = self._dataset(enc, pick(ids, index), index)

    def _dataset(self, enc: EncodedSplit, labels: list, index: list[int]) -> Dataset:
        """The examples at ``index`` with their label ids (or regression values)."""
        return EncodedDataset(pick(enc.columns["input_ids"], index), labels,
                              pick(enc.columns.get("token_type_ids"), index))

    @property
    def kind(self) -> str:
        return "regression" if self.task == "regression" else "sequence"

    def records(self, split: str) -> dict:
        """Ids and texts of a split, aligned with its dataset (for writing predictions)."""
        return self.splits[split]
