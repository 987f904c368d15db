"""KEPLER's two data streams (Wang et al. 2021, TACL §2.3): corpus blocks for MLM and knowledge-graph triples
whose entities are their tokenized descriptions, for the knowledge-embedding loss.

Every training step takes one batch of each: the corpus batch's fields, plus the triple batch under ``kg``.  The
corpus loader sets the epochs; the triple loader rolls over its own epochs, and its position is a pure function of
the corpus loader's (``epoch × batches per epoch + consumed``), so a resumed run continues both streams exactly.
Negatives are drawn when a batch is built, from a generator seeded by the batch's keys (dynamic, and the same on
resume), among the training triples' entities only (unseen entities stay unseen).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Iterator, Literal, Optional

import torch
from torch.utils.data import DataLoader, Dataset

from ptm_app.data.collators import pad
from ptm_app.data.contract import DataFacts
from ptm_app.data.corpus import Packing
from ptm_app.data.corruption import draw_generator
from ptm_app.data.datamodules import PretrainDataModule
from ptm_app.data.datasets import _index
from ptm_app.data.loader import ResumableLoader, eval_loader
from ptm_app.data.tokenizer import TokenizerSpec
from ptm_app.errors import PtmError
from ptm_app.knowledge.graph import FILES, EntityText, KnowledgeGraph, load_graph


class TripleDataset(Dataset):
    """``(head, relation, tail)`` index triples; items carry the sampler's key."""

    def __init__(self, triples: torch.Tensor):
        self.triples = triples

    def __len__(self) -> int:
        return len(self.triples)

    def __getitem__(self, key) -> dict:
        return {"triple": self.triples[_index(key)], "key": key}


@dataclass
class TripleCollator:
    """A batch of positives, ``negatives`` corruptions of each (head or tail, with probability 1/2 each, replaced
    by one of ``pool``), and the token ids of the batch's distinct entities' descriptions.

    Emits ``entity_input_ids`` / ``entity_attention_mask`` [U, L], ``head``/``relation``/``tail`` [B] and
    ``negative_head``/``negative_tail`` [B, n] (positions among the U entities; relation: its index), ``keys``."""

    entity_tokens: list[torch.Tensor]
    pool: torch.Tensor
    negatives: int
    pad_token_id: int
    seed: int = 0

    def __call__(self, examples: list[dict]) -> dict:
        keys = [e["key"] for e in examples]
        triples = torch.stack([e["triple"] for e in examples])
        gen = draw_generator(self.seed, keys)
        n = self.negatives
        replace = self.pool[torch.randint(len(self.pool), (len(triples), n), generator=gen)]
        corrupt_head = torch.rand(len(triples), n, generator=gen) < 0.5
        heads = torch.where(corrupt_head, replace, triples[:, :1].expand(-1, n))
        tails = torch.where(corrupt_head, triples[:, 2:].expand(-1, n), replace)
        unique, inverse = torch.unique(torch.cat([triples[:, 0], triples[:, 2], heads.flatten(), tails.flatten()]),
                                       return_inverse=True)
        b = len(triples)
        ids = [self.entity_tokens[i] for i in unique.tolist()]
        return {"entity_input_ids": pad(ids, self.pad_token_id),
                "entity_attention_mask": pad([torch.ones_like(i) for i in ids], 0),
                "head": inverse[:b], "tail": inverse[b:2 * b], "relation": triples[:, 1],
                "negative_head": inverse[2 * b:2 * b + b * n].view(b, n),
                "negative_tail": inverse[2 * b + b * n:].view(b, n), "keys": keys}


def triples_batch(examples: list[dict]) -> dict:
    """A batch of held-out triples for ranking: ``triples`` [B, 3] (entity and relation indices)."""
    return {"triples": torch.stack([e["triple"] for e in examples]), "keys": [e["key"] for e in examples]}


def rolling_batches(loader: ResumableLoader, served: int) -> Iterator[dict]:
    """``loader``'s batches from its ``served``-th on, rolling over its epochs forever."""
    epoch, offset = divmod(served, len(loader))
    loader.load_state_dict({"epoch": epoch, "consumed": offset, "batch_size": loader.batch_size})
    while True:
        yield from loader
        epoch += 1
        loader.epoch_sampler.set_epoch(epoch)


class JointLoader:
    """One corpus batch and one triple batch per step (the corpus batch's fields, the triples under ``kg``).

    Resumable like ``ResumableLoader``: its state is the corpus loader's, the triple stream's position follows."""

    resumable = True

    def __init__(self, text: ResumableLoader, kg: ResumableLoader):
        self.text, self.kg = text, kg
        self.sampler = text.epoch_sampler  # Lightning sets the epoch here

    def __len__(self) -> int:
        return len(self.text)

    @property
    def consumed(self) -> int:
        return self.text.consumed

    @consumed.setter
    def consumed(self, value: int) -> None:  # DataPositionCallback counts the steps taken
        self.text.consumed = value

    @property
    def restored(self) -> bool:
        return self.text.restored

    def __iter__(self) -> Iterator[dict]:
        texts = iter(self.text)  # applies a pending resume: the epoch and the batches consumed in it
        served = self.text.epoch_sampler.epoch * len(self.text) + self.text.consumed
        triples = rolling_batches(self.kg, served)
        for batch in texts:
            yield {**batch, "kg": next(triples)}

    def state_dict(self) -> dict:
        return {**self.text.state_dict(), "kg_batch_size": self.kg.batch_size}

    def load_state_dict(self, state: dict) -> None:
        if state.get("kg_batch_size", self.kg.batch_size) != self.kg.batch_size:
            raise PtmError(f"cannot resume: the checkpoint was written with kg_batch_size={state['kg_batch_size']}, "
                           f"this run uses {self.kg.batch_size}; resume with the same kg_batch_size")
        self.text.load_state_dict({k: v for k, v in state.items() if k != "kg_batch_size"})


@dataclass(frozen=True)
class KnowledgeFacts(DataFacts):
    """``DataFacts`` plus the graph (relations, triples, the ranking filter) and the evaluated files."""

    graph: Callable[[], KnowledgeGraph] = lambda: None
    entity_tokens: Callable[[], list[torch.Tensor]] = list
    link_prediction: tuple[str, ...] = ()
    candidates: Callable[[str], torch.Tensor] = lambda name: None  # the entities a held-out file is ranked among


class KeplerDataModule(PretrainDataModule):
    """A pre-training corpus (see ``PretrainDataModule``) plus a knowledge graph for KEPLER.

    Args:
        graph: the graph: a prepared name (``wordnet_kg``) or a folder (``knowledge.graph`` describes the layout).
        relations: keep only these relations (all when null); a name the graph lacks is an error.
        entity_text: what encodes an entity: ``names_gloss`` (``"lemma, lemma: definition"``) or ``gloss``.
        description_length: entity descriptions are cut to this many tokens (specials included).
        kg_batch_size: positive triples per step; negatives: corruptions per positive (KEPLER's n).
        link_prediction: held-out triple files ranked by ``test`` (``validation``/``test``: transductive,
            ``inductive/validation``/``inductive/test``: unseen entities).
        eval_candidates: rank among at most this many entities: every entity of the evaluated file's triples plus a
            seeded sample of the other candidates (quicker on a CPU, and easier than the full protocol: say so when
            reporting); null ranks among all candidates (``KnowledgeGraph.candidates``), the papers' protocol.
    """

    def __init__(self, tokenizer: TokenizerSpec, source: str = "brown", text_field: str = "text",
                 max_length: int = 128, packing: Packing = "pack", batch_size: int = 16,
                 eval_batch_size: Optional[int] = None, num_workers: int = 0, seed: int = 1234,
                 holdout: float = 0.05, limit_documents: Optional[int] = None,
                 examples: Optional[Literal["blocks", "knowledge_spans"]] = None, document_attention: bool = False,
                 streaming: Optional[bool] = None, prepare_workers: Optional[int] = None,
                 shard_dir: Optional[str] = None, graph: str = "wordnet_kg", relations: Optional[list[str]] = None,
                 entity_text: EntityText = "names_gloss", description_length: int = 64, kg_batch_size: int = 16,
                 negatives: int = 1, link_prediction: tuple[str, ...] = ("test", "inductive/test"),
                 eval_candidates: Optional[int] = None):
        super().__init__(tokenizer, source, text_field, max_length, packing, batch_size, eval_batch_size,
                         num_workers, seed, holdout, limit_documents, examples, document_attention, streaming,
                         prepare_workers, shard_dir)
        unknown = [name for name in link_prediction if name not in FILES or name == "train"]
        if unknown:
            raise PtmError(f"data.init_args.link_prediction: '{unknown[0]}' is not a held-out triple file; use "
                           f"{', '.join(n for n in FILES if n != 'train')}")
        if negatives < 1 or kg_batch_size < 1:
            raise PtmError("data.init_args.negatives and kg_batch_size must be >= 1")
        self.graph_source, self.relations, self.entity_text = graph, relations, entity_text
        self.description_length, self.kg_batch_size, self.negatives = description_length, kg_batch_size, negatives
        self.link_prediction, self.eval_candidates = tuple(link_prediction), eval_candidates
        self._graph: Optional[KnowledgeGraph] = None
        self._entity_tokens: Optional[list[torch.Tensor]] = None

    # -- the graph -------------------------------------------------------------------------------------
    def graph(self) -> KnowledgeGraph:
        if self._graph is None:
            self._graph = load_graph(self.graph_source, self.relations, self.entity_text)
            missing = [n for n in self.link_prediction if n not in self._graph.triples]
            if missing:
                raise PtmError(f"knowledge graph {self._graph.root} has no {FILES[missing[0]]}; remove "
                               f"'{missing[0]}' from data.init_args.link_prediction")
        return self._graph

    def entity_tokens(self) -> list[torch.Tensor]:
        """Every entity's description, tokenized once (truncated to ``description_length``)."""
        if self._entity_tokens is None:
            tok = self.load_tokenizer()
            enc = tok(self.graph().texts, truncation=True, max_length=self.description_length)["input_ids"]
            self._entity_tokens = [torch.tensor(ids, dtype=torch.long) for ids in enc]
        return self._entity_tokens

    def candidates(self, name: str) -> torch.Tensor:
        """The entities (sorted indices) the triples of held-out file ``name`` are ranked among (``eval_candidates``)."""
        graph = self.graph()
        every = graph.candidates(name)
        if self.eval_candidates is None or self.eval_candidates >= len(every):
            return every
        rows = graph.triples[name]
        own = torch.unique(torch.cat([rows[:, 0], rows[:, 2]]))
        rest = every[~torch.isin(every, own)]
        n = max(0, self.eval_candidates - len(own))
        sample = rest[torch.randperm(len(rest), generator=torch.Generator().manual_seed(self.seed))[:n]]
        return torch.sort(torch.cat([own, sample])).values

    def facts(self) -> KnowledgeFacts:
        base = super().facts()
        return KnowledgeFacts(**{f.name: getattr(base, f.name) for f in fields(base)}, graph=self.graph,
                              entity_tokens=self.entity_tokens, link_prediction=self.link_prediction,
                              candidates=self.candidates)

    def prepare_data(self) -> None:
        super().prepare_data()
        self.graph()

    def _kg_collator(self) -> TripleCollator:
        g = self.graph()
        train = g.triples["train"]
        pool = torch.unique(torch.cat([train[:, 0], train[:, 2]]))
        return TripleCollator(self.entity_tokens(), pool, self.negatives, self.load_tokenizer().pad_token_id,
                              seed=self.seed)

    def _triple_loader(self, name: str, collate_fn) -> DataLoader:
        return eval_loader(TripleDataset(self.graph().triples[name]), batch_size=self.eval_batch_size, seed=self.seed,
                           collate_fn=collate_fn, num_workers=self.num_workers)

    # -- loaders ---------------------------------------------------------------------------------------
    def train_dataloader(self) -> JointLoader:
        rank, world = self._rank()
        kg = ResumableLoader(TripleDataset(self.graph().triples["train"]), batch_size=self.kg_batch_size,
                             shuffle=True, seed=self.seed, rank=rank, world_size=world,
                             collate_fn=self._kg_collator(), num_workers=self.num_workers)
        return JointLoader(super().train_dataloader(), kg)

    def val_dataloader(self) -> list[DataLoader]:
        """The corpus's validation blocks (MLM), then the validation triples (the KE loss)."""
        return [super().val_dataloader(), self._triple_loader("validation", self._kg_collator())]

    def test_dataloader(self) -> list[DataLoader]:
        """The corpus's test blocks (MLM), then one loader per ``link_prediction`` file (ranked)."""
        return [super().test_dataloader(), *(self._triple_loader(n, triples_batch) for n in self.link_prediction)]
