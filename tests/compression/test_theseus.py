"""BERT-of-Theseus: the replacement draws follow p_t = min(1, k·t + b), the mixed model is the predecessor at p = 0
and the successor at p = 1, and a run trains, resumes exactly and exports the successor alone."""
import csv

import pytest
import torch

from tests.compression.test_distill_runs import QUIET, data  # noqa: F401
from tests.compression.test_distill_runs import teacher as predecessor  # noqa: F401  (4-layer tiny BERT run)
from tests.conftest import assert_resumes_exactly, run_main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_curriculum_rate_is_linear_then_one():
    from ptm_app.compression.theseus_policy import replacement_rate

    assert [replacement_rate(t, 0.1, 0.3) for t in (0, 1, 4, 7, 8, 100)] == pytest.approx([0.3, 0.4, 0.7, 1.0, 1.0,
                                                                                             1.0])
    assert replacement_rate(50, 0.0, 0.5) == 0.5  # k = 0: a constant rate


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.85])
def test_empirical_replacement_rate_matches_p_within_three_sigma(rate):
    """4000 steps × 3 modules: the replaced fraction is p within 3 standard errors (sqrt(p(1−p)/12000) ≤ 0.0046),
    the modules are drawn independently (each module's own rate also matches), and the draws repeat by step."""
    from ptm_app.compression.theseus_policy import draw_replacements

    draws = torch.stack([draw_replacements(step, 3, rate, seed=7) for step in range(4000)]).float()
    tolerance = 3 * (rate * (1 - rate) / draws.numel()) ** 0.5
    assert abs(draws.mean().item() - rate) < tolerance
    assert (draws.mean(0) - rate).abs().max().item() < 3 * (rate * (1 - rate) / 4000) ** 0.5
    both = (draws[:, 0] * draws[:, 1]).mean().item()  # independence of two modules: P(both) = p²
    assert abs(both - rate ** 2) < 3 * (rate ** 2 * (1 - rate ** 2) / 4000) ** 0.5
    assert torch.equal(draw_replacements(123, 3, rate, seed=7), draws[123].bool())
    assert draw_replacements(5, 3, 1.0, seed=7).all() and not draw_replacements(5, 3, 0.0, seed=7).any()


def theseus(predecessor, **kwargs):
    from ptm_app.adaptation import TheseusModule
    from ptm_app.compression.teacher import load_teacher

    model, _ = load_teacher(str(predecessor))
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    return TheseusModule(predecessor=str(predecessor), labels=labels, **kwargs).build().eval()


def test_mixed_model_is_the_successor_at_p1_and_the_predecessor_at_p0(predecessor):
    module = theseus(predecessor)  # 4 predecessor layers -> 2 successor layers from its layers 1, 2
    assert module.backbone.config.num_hidden_layers == 2
    batch = {"input_ids": torch.tensor([[2, 10, 11, 12, 3], [2, 13, 14, 3, 0]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])}
    with torch.no_grad():
        successor = module(batch)
        predecessor_logits = module.predecessor(**batch).logits
        all_replaced = module.mixed_logits(batch, torch.tensor([True, True]))
        none_replaced = module.mixed_logits(batch, torch.tensor([False, False]))
        first_only = module.mixed_logits(batch, torch.tensor([True, False]))
    assert torch.equal(all_replaced, successor)
    assert torch.allclose(none_replaced, predecessor_logits, atol=1e-5)  # embeddings and head are copies
    assert not torch.allclose(first_only, successor, atol=1e-4)
    assert not torch.allclose(first_only, predecessor_logits, atol=1e-4)
    # the swap is temporary: the successor's own blocks are back
    blocks = module.backbone.bert.encoder.layer
    assert len(blocks) == 2 and all(b is not p for b, p in zip(blocks, module.predecessor.bert.encoder.layer))
    # by hand: successor block 0, then predecessor blocks 3 and 4, between the successor's embeddings and head
    successor_blocks = list(module.backbone.bert.encoder.layer)
    module.backbone.bert.encoder.layer = torch.nn.ModuleList(
        [successor_blocks[0], *module.predecessor.bert.encoder.layer[2:4]])
    with torch.no_grad():
        assert torch.allclose(module(batch), first_only, atol=1e-6)
    module.backbone.bert.encoder.layer = torch.nn.ModuleList(successor_blocks)


def test_theseus_run_trains_resumes_exactly_and_exports_the_successor(tiny_corpus, predecessor, tmp_path):
    import yaml
    from transformers import AutoModelForSequenceClassification

    from ptm_app.adaptation import TheseusModule

    cfg = {"seed_everything": 5,
           "trainer": {"max_steps": 6, "val_check_interval": 3, "limit_val_batches": 1, "num_sanity_val_steps": 0,
                       **QUIET},
           "model": {"class_path": "TheseusModule",
                     "init_args": {"predecessor": str(predecessor), "curriculum_k": 0.25, "curriculum_b": 0.25,
                                   "optim": {"lr": 1e-3}}},
           "data": data(tiny_corpus)}
    path = tmp_path / "theseus.yaml"
    path.write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    assert_resumes_exactly(["fit", "--config", str(path)], runs, stop=3, steps=6)
    rows = [r for r in csv.DictReader(open(runs / "full" / "logs" / "metrics.csv")) if r.get("train/replace_rate")]
    assert [float(r["train/replace_rate"]) for r in rows] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    assert [float(r["train/replaced"]) for r in rows][3:] == [1.0, 1.0, 1.0]  # p = 1: the successor alone
    ckpt = torch.load(runs / "full" / "checkpoints" / "last.ckpt", weights_only=True)
    assert not any("predecessor" in k for k in ckpt["state_dict"])
    assert ckpt["hyper_parameters"]["predecessor"] == str(predecessor.resolve())
    module = TheseusModule.load_from_checkpoint(runs / "full" / "checkpoints" / "last.ckpt").eval()
    # the predecessor stayed frozen: its blocks are the run's originals
    original = theseus(predecessor).predecessor
    for a, b in zip(module.predecessor.parameters(), original.parameters()):
        assert torch.equal(a, b)
    assert run_main(["export", "--ckpt_path", str(runs / "full"), "--output_dir", str(tmp_path / "x")], runs) == 0
    exported = AutoModelForSequenceClassification.from_pretrained(tmp_path / "x").eval()
    assert exported.config.num_hidden_layers == 2
    batch = {"input_ids": torch.tensor([[2, 10, 11, 12, 3]]), "attention_mask": torch.ones(1, 5, dtype=torch.long)}
    with torch.no_grad():
        assert torch.allclose(exported(**batch).logits, module(batch), atol=1e-5)


def test_a_ratio_that_does_not_divide_the_layers_is_one_line(tiny_corpus, predecessor, tmp_path, capsys):
    import yaml

    cfg = {"trainer": {"max_steps": 1, **QUIET},
           "model": {"class_path": "TheseusModule", "init_args": {"predecessor": str(predecessor), "compress_ratio": 3}},
           "data": data(tiny_corpus)}
    path = tmp_path / "theseus.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert run_main(["fit", "--config", str(path)], tmp_path / "runs") != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "compress_ratio 3: the predecessor's 4 layers" in err[0], err
