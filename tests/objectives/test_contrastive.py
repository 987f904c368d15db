"""SimCSE and InfoWord (DIM + MLM): dropout views, n-gram contexts, InfoNCE with logsumexp, recipes run."""
import csv
import math
from pathlib import Path

import pytest
import torch

from ptm_app.errors import PtmError
from ptm_app.objectives.contrastive import ContrastiveModule, DropoutPairCollator, NgramContextCollator
from tests.conftest import TINY_BERT, run_main

ROOT = Path(__file__).resolve().parents[2]
V, CLS, SEP, MASK = 60, 2, 3, 4
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


pytestmark = pytest.mark.usefixtures("one_thread")


def examples(n=8, length=20, epoch=0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.cat([torch.tensor([CLS]), torch.randint(5, V, (length,), generator=gen),
                                     torch.tensor([SEP])]), "key": (epoch, i)} for i in range(n)]


def module(objective, **kw):
    torch.manual_seed(0)
    config = {**TINY_BERT, "vocab_size": V, **kw.pop("config", {})}
    return ContrastiveModule(backbone_config=config, objective=objective, **kw).build()


def ngram_collator(**kw):
    return NgramContextCollator(pad_token_id=0, mask_token_id=MASK, special_ids=(0, 1, CLS, SEP, MASK), vocab_size=V,
                                seed=1, cls_token_id=CLS, sep_token_id=SEP, **kw)


def manual_info_nce(scores):
    """-(s_ii - log Σ_j exp s_ij): the DIM/InfoNCE loss with the exp the survey omits (trap T4)."""
    return (torch.logsumexp(scores, dim=1) - scores.diagonal()).mean()


def train(m, batch, steps, lr=3e-3):
    opt = torch.optim.AdamW(m.parameters(), lr=lr)
    m.train()
    for _ in range(steps):
        opt.zero_grad()
        m._total(m._losses(m._forward(batch))).backward()
        opt.step()


def evaluate(m, batch):
    m.eval()
    with torch.no_grad():
        return m._losses(m._forward(batch))


# -- SimCSE ------------------------------------------------------------------------------------
def test_simcse_views_differ_only_by_dropout_drawn_from_the_batch_keys():
    m = module("simcse")
    b = DropoutPairCollator(0, seed=1)(examples())
    out = m._forward(b)
    assert not torch.allclose(out.anchors, out.candidates, atol=1e-4)  # two dropout masks
    assert torch.equal(out.anchors, m._forward(b).anchors)  # the masks are a function of the keys ...
    other = DropoutPairCollator(0, seed=1)(examples(epoch=1))
    assert not torch.equal(out.anchors, m._forward(other).anchors)  # ... and change with them


def test_simcse_without_dropout_has_identical_views_and_the_manual_info_nce():
    m = module("simcse", config=NO_DROPOUT)
    b = DropoutPairCollator(0, seed=1)(examples())
    out = m._forward(b)
    assert torch.allclose(out.anchors, out.candidates, atol=1e-6)
    z = torch.nn.functional.normalize(out.anchors.detach(), dim=-1)
    cos = z @ z.T
    loss = m._losses(out)["nce"].item()
    assert torch.allclose(out.scores, cos / 0.05, atol=1e-4)
    assert loss == pytest.approx(manual_info_nce(cos / 0.05).item(), abs=1e-5)
    # identical views: s_ii = 1/τ, so loss = log B - mean_i [log B - logsumexp_j (cos_ij - 1)/τ]
    margin = (math.log(len(z)) - torch.logsumexp((cos - 1) / 0.05, dim=1)).mean()
    assert loss == pytest.approx(math.log(len(z)) - margin.item(), abs=1e-4)
    assert out.scores.diagonal().allclose(torch.full((len(z),), 1 / 0.05), atol=1e-3)
    assert 0 < loss < math.log(len(z))


def test_simcse_steps_on_a_fixed_batch_raise_retrieval_and_lower_the_loss():
    m = module("simcse")
    b = DropoutPairCollator(0, seed=1)(examples(16))  # its keys fix its dropout masks, in eval mode too
    before = evaluate(m, b)
    assert before["acc"] < 0.3
    train(m, b, 15)
    after = evaluate(m, b)
    assert after["nce"] < before["nce"] - 1.0
    assert after["acc"] >= 0.75


# -- InfoWord ----------------------------------------------------------------------------------
def test_ngram_lengths_follow_clipped_normal():
    collate = ngram_collator(mlm_probability=0.0)
    lengths = torch.cat([collate(examples(64, length=30, epoch=e))["ngram_mask"].sum(1) for e in range(40)]).float()
    assert abs(lengths.mean().item() - 5.0) < 0.2
    assert lengths.min() >= 1 and lengths.max() <= 10
    assert 0.8 < lengths.std().item() < 1.2


def test_context_masks_exactly_the_ngram_which_is_the_positive():
    exs = examples(16)
    b = ngram_collator(mlm_probability=0.0)(exs)
    for row, ex in enumerate(exs):
        original, span = ex["input_ids"], b["ngram_mask"][row]
        pos = span.nonzero().squeeze(1)
        n = len(pos)
        assert torch.equal(pos, torch.arange(pos[0], pos[0] + n))  # one contiguous span of content tokens
        assert CLS not in original[pos] and SEP not in original[pos]
        assert (b["input_ids"][row] == MASK).sum() == n and (b["input_ids"][row][pos] == MASK).all()
        assert torch.equal(b["input_ids"][row][~span], original[~span])
        assert torch.equal(b["labels"][row][pos], original[pos]) and (b["labels"][row][~span] == -100).all()
        ngram = b["ngram_ids"][row][b["ngram_attention_mask"][row].bool()]
        assert ngram.tolist() == [CLS, *original[pos].tolist(), SEP]
    with_mlm = ngram_collator(mlm_probability=0.3)(exs)  # BERT masking elsewhere, the n-gram unchanged
    assert torch.equal(with_mlm["ngram_mask"], b["ngram_mask"])
    assert ((with_mlm["labels"] != -100) & ~b["ngram_mask"]).any()


def test_dim_loss_is_logsumexp_info_nce_on_first_token_dot_products():
    m = module("infoword").eval()
    b = ngram_collator()(examples())
    out = m._forward(b)
    with torch.no_grad():
        first = lambda ids, mask: m.backbone.bert(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]  # noqa: E731
        ngram_cls = first(b["ngram_ids"], b["ngram_attention_mask"])
        context_cls = first(b["input_ids"], b["attention_mask"])
    assert torch.allclose(out.candidates, ngram_cls, atol=1e-5) and torch.allclose(out.anchors, context_cls, atol=1e-5)
    assert torch.allclose(out.scores, context_cls @ ngram_cls.T, atol=1e-3)
    assert m._losses(out)["dim"].item() == pytest.approx(manual_info_nce(out.scores).item(), abs=1e-5)


def test_infoword_total_respects_loss_weights():
    m = module("infoword", loss_weights={"dim": 0.3, "mlm": 2.0})
    losses = m._losses(m._forward(ngram_collator()(examples())))
    assert set(losses) == {"dim", "mlm", "acc", "alignment"}
    assert torch.allclose(m._total(losses), 0.3 * losses["dim"] + 2.0 * losses["mlm"])
    with pytest.raises(PtmError, match="not parts"):
        module("infoword", loss_weights={"nce": 1.0})


def test_infoword_loss_falls_on_a_fixed_batch():
    m = module("infoword", config=NO_DROPOUT)  # a tiny model's collapsed [CLS] states drown in dropout noise
    b = ngram_collator()(examples(16))
    before = evaluate(m, b)
    train(m, b, 30)
    after = evaluate(m, b)
    assert m._total(after) < m._total(before) - 2.0
    assert after["dim"] < before["dim"] - 1.0 and after["mlm"] < before["mlm"]
    assert after["acc"] >= 0.75 > before["acc"]


# -- recipes through main.py -------------------------------------------------------------------
@pytest.mark.parametrize("name", ["simcse_contrastive_brown", pytest.param("infoword_dim_mlm_brown", marks=pytest.mark.slow)])
def test_recipe_runs_and_exports_a_plain_transformers_model(name, tmp_path):
    from transformers import AutoModel

    cfg = str(ROOT / "configs" / "pretrain" / f"{name}.yaml")
    assert run_main(["fit", "--config", cfg, "--trainer.max_steps", "3", "--trainer.val_check_interval", "3",
                     "--trainer.limit_val_batches", "2", "--trainer.enable_progress_bar", "false"], tmp_path) == 0
    assert torch.load(tmp_path / name / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3
    rows = list(csv.DictReader(open(tmp_path / name / "logs" / "metrics.csv")))
    val = next(r for r in rows if r.get("val/loss"))
    assert 0.0 <= float(val["val/acc"]) <= 1.0 and -1.0 <= float(val["val/alignment"]) <= 1.0
    assert math.isfinite(float(val["val/loss"]))
    export = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(tmp_path / name), "--output_dir", str(export)], tmp_path) == 0
    encoder = AutoModel.from_pretrained(export)  # SimCSE: BertModel; InfoWord: the encoder of BertForMaskedLM
    state = torch.load(tmp_path / name / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    key = {"simcse_contrastive_brown": "backbone.embeddings.word_embeddings.weight",
           "infoword_dim_mlm_brown": "backbone.bert.embeddings.word_embeddings.weight"}[name]
    assert torch.equal(encoder.embeddings.word_embeddings.weight, state[key].float())
