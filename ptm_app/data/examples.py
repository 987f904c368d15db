"""The example builders of ``PretrainDataModule``: one registry entry per kind of pre-training example, in place of
an if-chain over format names.

A module's targets each declare the examples they need (``objectives.targets.Target.examples``: ``nsp``, ``sop``,
``knowledge_spans``, ``supersenses``, or none); ``example_builder`` picks the one builder that provides all of them.
None does for a combination no builder makes (NSP pairs carry no knowledge spans): that is refused in one line when
the module is built, before any data is read.

- ``blocks``: packed token blocks (``corpus.pack_blocks``, or ``blocks.LazyBlocks`` when streaming);
- ``nsp`` / ``sop``: BERT's next-sentence / ALBERT's sentence-order pairs from document boundaries
  (``datasets.SentencePairDataset``);
- ``spans``: whole sentences of one document per block with ERNIE's phrase / entity spans and SenseBERT's
  supersenses (``knowledge_spans``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ptm_app.errors import PtmError

@dataclass(frozen=True)
class ExampleBuilder:
    """One kind of pre-training example: the needs it ``provides`` and how it prepares and builds the splits of a
    ``PretrainDataModule``."""

    name: str
    provides: frozenset = frozenset()

    def prepare(self, dm, needs: frozenset) -> None:
        """Tokenize every split once (global rank 0, in ``prepare_data``)."""
        for split, path in dm.files.items():
            dm._tokenized(split, path, progress=True)

    def datasets(self, dm, needs: frozenset) -> dict:
        raise NotImplementedError


class TokenBlocks(ExampleBuilder):
    """Packed token blocks (the default: MLM, CLM, RTD ...)."""

    def datasets(self, dm, needs: frozenset) -> dict:
        from ptm_app.data.blocks import BlockView, LazyBlocks
        from ptm_app.data.corpus import pack_blocks
        from ptm_app.data.datasets import BlockDataset

        corpora, docs, streaming = dm.split_corpora()
        prefix, suffix, sep = dm.block_frame()
        out = {}
        for split, corpus in corpora.items():
            if streaming:  # blocks cut on read, by index arithmetic over the prepared corpus
                blocks = LazyBlocks(corpus, dm.max_length, prefix, suffix, sep, dm.packing, docs[split])
                out[split] = BlockDataset(BlockView(blocks, 0), BlockView(blocks, 1) if dm.document_attention else None)
            else:
                packed = pack_blocks(corpus, dm.max_length, prefix, suffix, sep, dm.packing, docs[split],
                                     with_documents=dm.document_attention)
                out[split] = BlockDataset(*packed) if dm.document_attention else BlockDataset(packed)
        return out


class SentencePairs(ExampleBuilder):
    """NSP (BERT §3.1 task 2) or SOP (ALBERT §4.1) sentence pairs; with static masking each pair is one of the
    module's k fixed draws (``ModelHooks.static_copies``)."""

    def datasets(self, dm, needs: frozenset) -> dict:
        from ptm_app.data.corpus import CorpusDocuments
        from ptm_app.data.datasets import SentencePairDataset
        from ptm_app.data.tokenizer import is_bert_style

        kind, tok = self.name, dm.load_tokenizer()
        if dm.document_attention:
            raise PtmError(f"document_attention applies to packed blocks, not {kind} sentence pairs; "
                           f"set data.init_args.document_attention: false")
        if not is_bert_style(tok):
            raise PtmError(f"{kind} examples need a BERT-style tokenizer ([CLS]/[SEP]); use train: wordpiece")
        corpora, docs, _ = dm.split_corpora()
        static = dm.model_hooks.static_copies if dm.model_hooks is not None else None
        return {split: SentencePairDataset(CorpusDocuments(corpus, docs[split]), kind, dm.max_length, dm.seed,
                                           tok.cls_token_id, tok.sep_token_id, static_copies=static)
                for split, corpus in corpora.items()}  # documents read on demand


class SpanBlocks(ExampleBuilder):
    """Sentence blocks with knowledge spans and / or supersenses (ERNIE, SenseBERT; ``data.knowledge_spans``): only
    the annotation the targets need is required of the corpus."""

    def _kinds(self, needs: frozenset) -> tuple[str, ...]:
        return tuple(kind for kind in ("knowledge_spans", "supersenses") if kind in needs)

    def _check(self, dm) -> None:
        if dm.document_attention or dm.use_streaming():
            raise PtmError(f"{'+'.join(sorted(dm.example_needs()))} examples are sentence blocks read in memory; set "
                           f"data.init_args.document_attention: false and streaming: false")

    def prepare(self, dm, needs: frozenset) -> None:
        from ptm_app.data.knowledge_spans import span_datasets

        self._check(dm)
        span_datasets(dm, self._kinds(needs), dm.holdout_documents, progress=True)

    def datasets(self, dm, needs: frozenset) -> dict:
        from ptm_app.data.knowledge_spans import span_datasets

        self._check(dm)
        return span_datasets(dm, self._kinds(needs), dm.holdout_documents)


EXAMPLE_BUILDERS: dict[str, ExampleBuilder] = {
    "blocks": TokenBlocks("blocks"),
    "nsp": SentencePairs("nsp", frozenset({"nsp"})),
    "sop": SentencePairs("sop", frozenset({"sop"})),
    "spans": SpanBlocks("spans", frozenset({"knowledge_spans", "supersenses"})),
}


def example_builder(needs: frozenset, who: Optional[str] = None) -> ExampleBuilder:
    """The builder that provides every one of ``needs`` (the fewest extras: plain blocks when nothing is needed);
    a combination no builder makes is one line naming it (``who``: the targets that asked)."""
    fits = [b for b in EXAMPLE_BUILDERS.values() if needs <= b.provides]
    if not fits:
        makes = "; ".join(f"{name}: {', '.join(sorted(b.provides)) or 'plain blocks'}"
                          for name, b in EXAMPLE_BUILDERS.items())
        raise PtmError(f"{who or 'the targets'} need {' and '.join(sorted(needs))} examples, which no example builder "
                       f"makes together ({makes}); drop one of those targets")
    return min(fits, key=lambda b: len(b.provides))

