"""KEPLER: the TransE score and KE loss by hand, filtered ranking on a hand-built graph, the WordNet graph's splits,
bad input, and a tiny KEPLER run (steps, exact resume, export, link prediction in summary.json)."""
import json
import math
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml

from ptm_app.errors import PtmError
from ptm_app.knowledge.link_prediction import filtered_ranks, rank_triples, ranking_metrics
from ptm_app.knowledge.transe import ke_loss, transe_distance
from tests.conftest import TINY_BERT, WORDS, assert_resumes_exactly, run_main, write_jsonl

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[2]


# -- TransE and the KE loss --------------------------------------------------------------------------------------
def test_transe_distance_on_hand_computed_vectors():
    h, r, t = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), torch.tensor([2.0, 3.0])
    # h + r - t = (-1, -2): L1 = 3, L2 = sqrt(5)
    assert transe_distance(h, r, t, p=1).item() == pytest.approx(3.0)
    assert transe_distance(h, r, t, p=2).item() == pytest.approx(math.sqrt(5))


def test_ke_loss_on_hand_computed_distances():
    positive = torch.tensor([0.0, 1.0])
    negative = torch.tensor([[1.0, 5.0], [3.0, 3.0]])
    gamma = 2.0
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    row0 = -math.log(sig(2 - 0)) - (math.log(sig(1 - 2)) + math.log(sig(5 - 2))) / 2
    row1 = -math.log(sig(2 - 1)) - (math.log(sig(3 - 2)) + math.log(sig(3 - 2))) / 2
    assert ke_loss(positive, negative, gamma).item() == pytest.approx((row0 + row1) / 2, rel=1e-6)
    # a positive far inside the margin and negatives far outside cost almost nothing
    assert ke_loss(torch.tensor([0.0]), torch.tensor([[40.0]]), 20.0).item() < 1e-8


# -- filtered ranking --------------------------------------------------------------------------------------------
def test_filtered_ranking_leaves_out_the_other_true_triples():
    """Four entities on a line (e_i = i), one relation r = +1; held-out (0, r, 3).  Tail scores -|0 + 1 - e| =
    (-1, 0, -1, -2): raw rank of e3 is 4; (0, r, 1) and (0, r, 2) are true too, so filtered rank 2.  Head scores
    -|e + 1 - 3| = (-2, -1, 0, -1): raw rank of e0 is 4; (2, r, 3) is true, so filtered rank 3."""
    vectors = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    relation = torch.tensor([[1.0]])
    triples = torch.tensor([[0, 0, 3]])
    known_tails = {(0, 0): {1, 2, 3}}
    known_heads = {(0, 3): {0, 2}, (0, 1): {0}, (0, 2): {0}}
    ranks = rank_triples(triples, vectors, torch.arange(4), relation, known_tails, known_heads, p=1)
    assert ranks.tolist() == [2.0, 3.0]
    unfiltered = rank_triples(triples, vectors, torch.arange(4), relation, {}, {}, p=1)
    assert unfiltered.tolist() == [4.0, 4.0]
    metrics = ranking_metrics(ranks)
    assert metrics["mrr"] == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert (metrics["hits@1"], metrics["hits@3"], metrics["hits@10"]) == (0.0, 1.0, 1.0)


def test_ties_count_half_so_a_collapsed_encoder_ranks_in_the_middle():
    scores = torch.zeros(1, 5)
    assert filtered_ranks(scores, torch.tensor([2]), [torch.tensor([], dtype=torch.long)]).item() == 3.0
    assert filtered_ranks(scores, torch.tensor([2]), [torch.tensor([0, 1])]).item() == 2.0


# -- the prepared WordNet graph ----------------------------------------------------------------------------------
def _triples(path: Path) -> list[tuple[str, str, str]]:
    return [(r["head"], r["relation"], r["tail"]) for r in map(json.loads, path.read_text().splitlines())]


@pytest.fixture(scope="module")
def wordnet_kg() -> Path:
    from ptm_app.paths import data_root

    root = data_root() / "wordnet_kg"
    if not (root / "manifest.json").is_file():
        pytest.skip("wordnet_kg is not prepared (python main.py data prepare wordnet_kg)")
    return root


def test_wn18rr_style_split_has_no_test_triple_whose_inverse_is_in_train(wordnet_kg):
    from ptm_app.data.sources.wordnet_kg import INVERSE

    train = set(_triples(wordnet_kg / "train.jsonl"))
    train_pairs = {frozenset((h, t)) for h, _, t in train}
    seen = {e for h, _, t in train for e in (h, t)}
    manifest = json.loads((wordnet_kg / "manifest.json").read_text())
    for split in ("validation", "test"):
        held = _triples(wordnet_kg / f"{split}.jsonl")
        assert len(held) == manifest["counts"][split]["records"] > 1000
        assert not [x for x in held if (x[2], INVERSE[x[1]], x[0]) in train]
        assert not [x for x in held if frozenset((x[0], x[2])) in train_pairs]  # nor any link of the same pair
        assert all(h in seen and t in seen for h, _, t in held)  # transductive: every entity seen in training
        assert not set(held) & train
    relations = {r for _, r, _ in train}
    assert {"hypernym", "hyponym", "part_meronym", "member_holonym", "antonym", "derivation", "similar_to",
            "verb_group", "also_see"} <= relations
    # inverse pairs both present: the split groups them, it does not drop a direction
    assert sum(r == "hypernym" for _, r, _ in train) == sum(r == "hyponym" for _, r, _ in train)


def test_inductive_split_entities_are_unseen_in_train(wordnet_kg):
    train_entities = {e for h, _, t in _triples(wordnet_kg / "train.jsonl") for e in (h, t)}
    entity_sets = []
    for split in ("validation", "test"):
        held = _triples(wordnet_kg / "inductive" / f"{split}.jsonl")
        assert len(held) > 1000
        entities = {e for h, _, t in held for e in (h, t)}
        assert not entities & train_entities
        entity_sets.append(entities)
    assert not entity_sets[0] & entity_sets[1]


def test_split_functions_on_a_hand_built_graph_keep_inverses_together():
    """The splitters themselves (not only the prepared files): 60 hypernym/hyponym pairs and 20 symmetric antonym
    pairs; each pair's two directions share a split, nothing held out is in train, and with seed fixed the split
    is the same twice."""
    import random

    from ptm_app.data.sources.wordnet_kg import inductive_split, transductive_split

    rng = random.Random(0)
    graph = set()
    for i in range(60):
        h, t = f"s{i}", f"s{rng.randrange(60, 80)}"
        graph |= {(h, "hypernym", t), (t, "hyponym", h)}
    for i in range(20):
        a, b = f"s{i}", f"s{i + 20}"
        graph |= {(a, "antonym", b), (b, "antonym", a)}
    graph = sorted(graph)
    split, stats = transductive_split(graph, seed=3)
    assert split == transductive_split(graph, seed=3)[0]
    train = set(split["train"])
    held = split["validation"] + split["test"]
    assert held and not set(held) & train
    for x in held:  # the mirror of a held-out triple is held out with it, never in train
        mirror = {"hypernym": "hyponym", "hyponym": "hypernym", "antonym": "antonym"}[x[1]]
        assert (x[2], mirror, x[0]) not in train
    dropped = sum(stats[s]["unseen_entity_removed"] for s in ("validation", "test"))
    assert len(train) + len(held) + dropped == len(graph)  # every triple in exactly one place
    assert stats["validation"]["inverse_in_train_removed"] == stats["test"]["inverse_in_train_removed"] == 0

    parts, i_stats = inductive_split(graph, seed=3)
    owners = {name: {e for h, _, t in rows for e in (h, t)} for name, rows in parts.items()}
    assert not owners["train"] & owners["test"] and not owners["train"] & owners["validation"]
    assert sum(map(len, parts.values())) + i_stats["triples_across_entity_sets_dropped"] == len(graph)


# -- a hand-built graph: bad input and a tiny KEPLER run ----------------------------------------------------------
def make_graph(root: Path) -> Path:
    """Twelve entities with word descriptions; e0-e7 in training, e8-e11 only in the inductive files."""
    entities = [{"id": f"e{i}", "names": [WORDS[i]], "description": " ".join(WORDS[i:i + 6])} for i in range(12)]
    write_jsonl(root / "entities.jsonl", entities)
    train = [("e0", "is_a", "e1"), ("e1", "is_a", "e2"), ("e2", "is_a", "e3"), ("e3", "is_a", "e4"),
             ("e4", "part_of", "e5"), ("e5", "part_of", "e6"), ("e6", "part_of", "e7"), ("e7", "is_a", "e0"),
             ("e1", "part_of", "e3"), ("e2", "part_of", "e4"), ("e5", "is_a", "e7"), ("e6", "is_a", "e1")]
    rows = lambda ts: [{"head": h, "relation": r, "tail": t} for h, r, t in ts]  # noqa: E731
    write_jsonl(root / "train.jsonl", rows(train))
    write_jsonl(root / "validation.jsonl", rows([("e0", "part_of", "e2"), ("e3", "part_of", "e5")]))
    write_jsonl(root / "test.jsonl", rows([("e4", "is_a", "e6"), ("e0", "part_of", "e7"), ("e2", "is_a", "e5")]))
    write_jsonl(root / "inductive" / "validation.jsonl", rows([("e8", "is_a", "e9")]))
    write_jsonl(root / "inductive" / "test.jsonl", rows([("e10", "is_a", "e11"), ("e11", "part_of", "e10")]))
    return root


def test_a_relation_not_in_the_graph_is_one_line(tmp_path):
    from ptm_app.knowledge.graph import load_graph

    graph = make_graph(tmp_path / "kg")
    with pytest.raises(PtmError, match=r"relations: 'hypernym' is not a relation of the graph .*is_a, part_of"):
        load_graph(str(graph), ["is_a", "hypernym"])
    kept = load_graph(str(graph), ["part_of"])
    assert kept.relations == ["part_of"] and len(kept.triples["train"]) == 5


def test_a_triple_file_with_an_unknown_entity_is_file_and_line(tmp_path):
    from ptm_app.knowledge.graph import load_graph

    graph = make_graph(tmp_path / "kg")
    with open(graph / "test.jsonl", "a") as fh:
        fh.write(json.dumps({"head": "e1", "relation": "is_a", "tail": "e99"}) + "\n")
    with pytest.raises(PtmError) as err:
        load_graph(str(graph))
    assert str(err.value).startswith(f"{graph / 'test.jsonl'}:4: unknown entity 'e99'")
    assert "\n" not in str(err.value)


def test_relation_errors_through_main_are_one_line(tiny_corpus, tmp_path, capsys):
    """From the CLI: a config naming a relation the graph lacks, and a triple file using a relation its manifest
    does not declare (file:line), each end the run with one line."""
    from ptm_app.main import main

    graph = make_graph(tmp_path / "kg")
    cfg = kepler_config(tiny_corpus, graph, tmp_path)

    def one_error(*extra) -> str:
        assert main(["fit", "--config", str(cfg), *extra]) != 0
        err = capsys.readouterr().err.strip().splitlines()
        errors = [line for line in err if line.startswith("error:")]
        assert len(errors) == 1 and err[-1] == errors[0], err
        return errors[0]

    line = one_error("--data.init_args.relations", '["is_a", "hypernym"]')
    assert "data.init_args.relations: 'hypernym' is not a relation of the graph" in line and "is_a, part_of" in line
    (graph / "manifest.json").write_text(json.dumps({"relations": {"pointer_symbols": {"@": "is_a", "%p": "part_of"}}}))
    with open(graph / "validation.jsonl", "a") as fh:
        fh.write(json.dumps({"head": "e1", "relation": "sibling", "tail": "e2"}) + "\n")
    line = one_error()
    assert f"{graph / 'validation.jsonl'}:3: unknown relation 'sibling' (the graph's: is_a, part_of)" in line


def kepler_config(corpus: Path, graph: Path, tmp: Path, **trainer) -> Path:
    cfg = {
        "seed_everything": 7,
        "trainer": {"max_steps": 8, "accelerator": "cpu", "devices": 1, "precision": "32-true",
                    "val_check_interval": 4, "log_every_n_steps": 1, "enable_progress_bar": False, **trainer},
        "model": {"class_path": "KeplerModule",
                  "init_args": {"backbone_config": TINY_BERT, "optim": {"lr": 1e-3, "warmup": 2}, "gamma": 2.0}},
        "data": {"class_path": "KeplerDataModule",
                 "init_args": {"source": str(corpus), "max_length": 32, "batch_size": 4, "limit_documents": 20,
                               "tokenizer": {"train": "wordpiece", "vocab_size": 200, "min_frequency": 1},
                               "graph": str(graph), "kg_batch_size": 5, "negatives": 2,
                               "description_length": 12}},
    }
    path = tmp / "kepler_tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_kepler_trains_resumes_exactly_exports_and_ranks(tiny_corpus, tmp_path):
    """Both losses are logged; paused at step 3 (inside the second triple epoch: 12 triples, 5 a batch) and resumed,
    it logs the full run's losses; the export rebuilds the relation table; ``test`` writes the filtered
    link-prediction metrics of both settings, equal to ranking the held-out triples with the exported model."""
    from ptm_app.inference.export import load_exported_module
    from ptm_app.knowledge.graph import load_graph

    graph = make_graph(tmp_path / "kg")
    cfg = kepler_config(tiny_corpus, graph, tmp_path)
    runs = tmp_path / "runs"
    assert_resumes_exactly(["fit", "--config", str(cfg)], runs, stop=3, steps=8)
    rows = (runs / "full" / "logs" / "metrics.csv").read_text()
    assert "train/ke" in rows and "val/ke" in rows and "train/mlm" in rows

    export = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(runs / "full"), "--output_dir", str(export)], runs) == 0
    module = load_exported_module(export)
    state = torch.load(runs / "full" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert module.relation_names == ["is_a", "part_of"]
    assert torch.equal(module.relation_embeddings.weight, state["relation_embeddings.weight"])

    assert run_main(["test", "--config", str(cfg), "--run_name", "full", "--ckpt_path", "last"], runs) == 0
    metrics = json.loads((runs / "full" / "summary.json").read_text())["metrics"]
    g = load_graph(str(graph))
    tokens = module.tokenizer(g.texts, truncation=True, max_length=12, padding=True, return_tensors="pt")
    with torch.no_grad():
        vectors = module.encode_entities(tokens["input_ids"], tokens["attention_mask"])
    tails, heads = g.known()
    for name in ("test", "inductive/test"):
        candidates = g.candidates(name)
        ranks = rank_triples(g.triples[name], vectors[candidates], candidates, module.relation_embeddings.weight,
                             tails, heads, p=1)
        expected = ranking_metrics(ranks)
        assert len(ranks) == 2 * len(g.triples[name])
        for key in ("mrr", "hits@1", "hits@3", "hits@10"):
            assert metrics[f"test/{name}/{key}"] == pytest.approx(expected[key], abs=1e-4), (name, key)
    assert len(g.candidates("inductive/test")) == 2  # ranked among the unseen entities of that file
    assert "test/loss" in metrics


def test_eval_candidates_keeps_every_evaluated_entity_and_samples_the_rest(tmp_path, tiny_corpus):
    from ptm_app.knowledge.data import KeplerDataModule

    graph = make_graph(tmp_path / "kg")
    full = KeplerDataModule(tokenizer={"pretrained": "minilm"}, source=str(tiny_corpus), graph=str(graph))
    ids = full.graph().entity_ids
    assert [ids[i] for i in full.candidates("test").tolist()] == sorted(f"e{i}" for i in range(8))  # transductive
    some = KeplerDataModule(tokenizer={"pretrained": "minilm"}, source=str(tiny_corpus), graph=str(graph),
                            eval_candidates=7)
    picked = some.candidates("test").tolist()
    index = {e: i for i, e in enumerate(some.graph().entity_ids)}
    own = {index[e] for e in ("e0", "e2", "e4", "e5", "e6", "e7")}  # the test triples' entities
    assert len(picked) == 7 and own <= set(picked) and picked == sorted(picked)
    assert picked == some.candidates("test").tolist()  # seeded
    assert some.candidates("inductive/test").tolist() == full.candidates("inductive/test").tolist()  # 2 < 7


class SigtermAtLinkPrediction(pl.Callback):
    """What Lightning's SIGTERM handler sets, at the first link-prediction batch of ``test``."""

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if dataloader_idx > 0:
            trainer._signal_connector.received_sigterm = True


def test_a_sigterm_stops_the_entity_embedding_at_once(tiny_corpus, tmp_path, monkeypatch):
    """Embedding every candidate entity takes tens of minutes on WordNet: a SIGTERM stops it between chunks (exit
    143) instead of after the whole evaluation batch."""
    from ptm_app.knowledge.kepler import KeplerModule

    graph = make_graph(tmp_path / "kg")
    cfg = kepler_config(tiny_corpus, graph, tmp_path, max_steps=2)
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", str(cfg), "--run_name", "k"], runs) == 0
    calls = []
    encode = KeplerModule.encode_entities
    monkeypatch.setattr(KeplerModule, "encode_entities", lambda self, *a: calls.append(1) or encode(self, *a))
    data = yaml.safe_load(cfg.read_text())
    data["model"]["init_args"]["entity_batch_size"] = 2  # several chunks for the tiny graph's candidates
    data["trainer"]["callbacks"] = [{"class_path": f"{__name__}.SigtermAtLinkPrediction"}]
    cfg.write_text(yaml.safe_dump(data))
    assert run_main(["test", "--config", str(cfg), "--run_name", "k", "--ckpt_path", "last"], runs) == 143
    assert calls == []  # not one chunk embedded after the signal


def test_entity_vectors_are_encoded_shortest_first_and_returned_in_candidate_order(tiny_corpus, tmp_path):
    """Link prediction embeds the candidates in chunks of like-length descriptions (less padding), and every vector
    lands at its candidate's place: equal to encoding each description alone."""
    from types import SimpleNamespace

    from ptm_app.inference.export import load_exported_module

    graph = make_graph(tmp_path / "kg")
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", str(kepler_config(tiny_corpus, graph, tmp_path, max_steps=2)),
                     "--run_name", "k"], runs) == 0
    export = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(runs / "k"), "--output_dir", str(export)], runs) == 0
    module = load_exported_module(export).eval()
    texts = ["a", "a b c d e f g h", "a b", "a b c d e f", "a b c", "a b c d e f g h i j"]
    tokens = [torch.tensor(module.tokenizer(t)["input_ids"]) for t in texts]
    assert len({len(t) for t in tokens}) == len(tokens)  # six lengths, so the order is checkable
    candidates = torch.tensor([0, 1, 3, 4, 5])  # not every entity: indices into the description list
    module.data_facts = SimpleNamespace(candidates=lambda name: candidates, entity_tokens=lambda: tokens)
    module.entity_batch_size = 2
    widths, encode = [], module.encode_entities
    module.encode_entities = lambda ids, mask: widths.append(ids.shape[1]) or encode(ids, mask)
    kept, vectors = module.entity_vectors("test")
    by_length = sorted(len(tokens[i]) for i in candidates.tolist())
    assert widths == [by_length[1], by_length[3], by_length[4]]  # each chunk as wide as its longest, shortest first
    assert torch.equal(kept, candidates) and vectors.shape[0] == len(candidates)
    with torch.no_grad():
        alone = torch.cat([encode(tokens[i][None], torch.ones_like(tokens[i])[None]) for i in candidates.tolist()])
    assert torch.allclose(vectors, alone, atol=1e-5)
    assert not torch.allclose(vectors, alone.flip(0), atol=1e-3)  # the vectors differ, so the order is tested
