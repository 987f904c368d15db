"""Link prediction by entity ranking, filtered setting (Bordes et al. 2013 §4.2; KEPLER, Wang et al. 2021 §4.3).

For a held-out triple (h, r, t) every candidate entity e is scored as the tail, ``-d(h, e)``, and as the head,
``-d(e, t)``; the true entity's rank counts the candidates scored higher, leaving out the *other* entities that
also form a true triple (in train, validation or test): the filtered setting.  A tie counts half (the mean of the
optimistic and the pessimistic rank), so a collapsed encoder that scores every entity the same ranks in the middle,
not first.  MRR = mean of 1/rank, Hits@k = share of ranks <= k, over both directions.
"""
from __future__ import annotations

import torch

HITS = (1, 3, 10)


def filtered_ranks(scores: torch.Tensor, target: torch.Tensor, others: list[torch.Tensor]) -> torch.Tensor:
    """Ranks (1-based, float) of ``target[i]`` in ``scores[i]`` (higher = better) with ``others[i]`` (candidate
    positions of the other true answers) left out."""
    scores = scores.float().clone()
    true = scores.gather(1, target[:, None])
    for i, other in enumerate(others):
        if len(other):
            scores[i, other] = float("-inf")
    scores.scatter_(1, target[:, None], true)
    higher = (scores > true).sum(1)
    ties = (scores == true).sum(1) - 1
    return 1.0 + higher.float() + ties.float() / 2


def ranking_metrics(ranks: torch.Tensor) -> dict[str, float]:
    """MRR and Hits@1/3/10 of a 1-D tensor of ranks."""
    ranks = ranks.float()
    out = {"mrr": float((1.0 / ranks).mean())}
    out.update({f"hits@{k}": float((ranks <= k).float().mean()) for k in HITS})
    return out


def rank_triples(triples: torch.Tensor, entity_vectors: torch.Tensor, candidates: torch.Tensor,
                 relation_vectors: torch.Tensor, known_tails: dict, known_heads: dict, p: int = 1) -> torch.Tensor:
    """Filtered ranks of the tails, then of the heads, of ``triples`` [B, 3] (entity and relation indices).

    ``entity_vectors`` [C, d] embed the ``candidates`` (entity indices, sorted); ``known_tails[(h, r)]`` /
    ``known_heads[(r, t)]``: every true tail / head (entity indices).  Heads and tails must be candidates."""
    position = {int(e): i for i, e in enumerate(candidates.tolist())}
    h = torch.tensor([position[int(x)] for x in triples[:, 0]])
    t = torch.tensor([position[int(x)] for x in triples[:, 2]])
    r = relation_vectors[triples[:, 1]]
    vectors = entity_vectors.float()
    tail_scores = -torch.cdist((vectors[h] + r.float())[None], vectors[None], p=p)[0]  # -d(h, e) for all e
    head_scores = -torch.cdist((vectors[t] - r.float())[None], vectors[None], p=p)[0]  # -d(e, t) = -||e-(t-r)||

    def others(known: dict, keys, answers) -> list[torch.Tensor]:
        out = []
        for key, answer in zip(keys, answers):
            out.append(torch.tensor([position[e] for e in known.get(key, ()) if e != answer and e in position],
                                    dtype=torch.long))
        return out

    hs, rs, ts = triples[:, 0].tolist(), triples[:, 1].tolist(), triples[:, 2].tolist()
    tail_ranks = filtered_ranks(tail_scores, t, others(known_tails, zip(hs, rs), ts))
    head_ranks = filtered_ranks(head_scores, h, others(known_heads, zip(rs, ts), hs))
    return torch.cat([tail_ranks, head_ranks])
