"""Packing with document-boundary attention: per-token document ids, no attention across documents,
position ids restarting per document, and fit runs from YAML for MLM and CLM."""
import csv
import math

import numpy as np
import pytest
import torch
import yaml

from ptm_app.backbones.attention import packed_document_inputs
from ptm_app.data.collators import CLMCollator, PadCollator
from ptm_app.data.corpus import TokenizedCorpus, pack_blocks
from ptm_app.data.datasets import BlockDataset
from ptm_app.errors import PtmError
from ptm_app.objectives import CausalLMModule, MaskedLMModule
from tests.conftest import TINY_BERT, TINY_GPT2, run_main

V = 50


def corpus(lengths=(5, 3, 9, 4)) -> TokenizedCorpus:
    """Documents of one line each; document d's tokens are 10*(d+1) + position (so they are recognisable)."""
    ids = np.concatenate([10 * (d + 1) + np.arange(n) for d, n in enumerate(lengths)]).astype(np.int32)
    line_offsets = np.concatenate([[0], np.cumsum(lengths)])
    return TokenizedCorpus(ids=ids, line_offsets=line_offsets, doc_offsets=np.arange(len(lengths) + 1))


def test_packed_blocks_carry_each_tokens_document():
    c = corpus()
    plain = pack_blocks(c, 8, [1], [2], [2], "pack")
    blocks, owners = pack_blocks(c, 8, [1], [2], [2], "pack", with_documents=True)
    assert [b.tolist() for b in blocks] == [b.tolist() for b in plain]  # the same blocks as without
    # stream: 10..14 [2] 20..22 [2] 30..38 [2] ...  cut into chunks of 6 between [CLS]=1 and [SEP]=2
    assert blocks[0].tolist() == [1, 10, 11, 12, 13, 14, 2, 2]
    assert owners[0].tolist() == [0, 0, 0, 0, 0, 0, 0, 0]
    assert blocks[1].tolist() == [1, 20, 21, 22, 2, 30, 31, 2]
    assert owners[1].tolist() == [1, 1, 1, 1, 1, 2, 2, 2]  # [CLS] to the first document, [SEP] to the last
    for block, owner in zip(blocks, owners):
        content = block[1:-1]
        assert len(owner) == len(block)
        for token, doc in zip(content, owner[1:-1]):
            assert token == 2 or token // 10 == doc + 1
    _, split_owners = pack_blocks(c, 8, [1], [2], [2], "split_documents", with_documents=True)
    assert all(len(set(o.tolist())) == 1 for o in split_owners)


def packed_batch(collator, change_a=False):
    """Two blocks; in each, document A (6 tokens) then document B (the rest); ``change_a`` edits A's tokens."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, V, (2, 16), generator=gen)
    if change_a:
        ids[:, 1:5] = (ids[:, 1:5] + 7) % (V - 5) + 5
    docs = torch.tensor([[0] * 6 + [1] * 10, [3] * 6 + [4] * 10])
    ds = BlockDataset([r.numpy() for r in ids], [d.numpy() for d in docs])
    return collator([ds[(0, 0)], ds[(0, 1)]])


@pytest.mark.parametrize("module_cls,config", [
    (MaskedLMModule, TINY_BERT),
    (MaskedLMModule, {**TINY_BERT, "model_type": "roberta", "max_position_embeddings": 66, "pad_token_id": 1}),
    (CausalLMModule, TINY_GPT2),
])
def test_document_b_ignores_document_a_and_starts_at_position_zero(module_cls, config):
    torch.manual_seed(0)
    m = module_cls(backbone_config={**config, "vocab_size": V}).build().eval()
    collate = PadCollator(pad_token_id=0)
    base, changed = packed_batch(collate), packed_batch(collate, change_a=True)
    inputs = m.model_inputs(base)
    assert inputs["attention_mask"].shape == (2, 1, 16, 16)  # 4-D: transformers uses it as-is
    start = 2 if config["model_type"] == "roberta" else 0
    assert inputs["position_ids"][0].tolist() == [start + i for i in range(6)] + [start + i for i in range(10)]
    with torch.no_grad():
        logits = m.backbone(**inputs).logits
        logits_changed = m.backbone(**m.model_inputs(changed)).logits
        b_alone = m.backbone(input_ids=base["input_ids"][:, 6:]).logits  # document B encoded on its own
        leaky = m.backbone(input_ids=base["input_ids"]).logits  # plain packing, for contrast
    assert not torch.allclose(logits_changed[:, :6], logits[:, :6], atol=1e-3)  # A did change
    torch.testing.assert_close(logits_changed[:, 6:], logits[:, 6:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[:, 6:], b_alone, atol=1e-4, rtol=1e-4)  # same mask and positions as alone
    assert not torch.allclose(leaky[:, 6:], b_alone, atol=1e-3)


def test_padding_is_masked_and_clm_does_not_predict_across_documents():
    ds = BlockDataset([np.array([5, 6, 7, 8, 9]), np.array([5, 6, 7])],
                      [np.array([0, 0, 1, 1, 1]), np.array([2, 2, 2])])
    batch = CLMCollator(pad_token_id=0)([ds[(0, 0)], ds[(0, 1)]])
    assert batch["document_ids"].tolist() == [[0, 0, 1, 1, 1], [2, 2, 2, -1, -1]]
    assert batch["labels"].tolist() == [[5, 6, -100, 8, 9], [5, 6, 7, -100, -100]]  # B's first token: no target
    torch.manual_seed(0)
    m = CausalLMModule(backbone_config={**TINY_GPT2, "vocab_size": V}).build().eval()
    mask = m.model_inputs(batch)["attention_mask"][:, 0]
    blocked = torch.finfo(mask.dtype).min
    assert (mask[1, :3, 3:] == blocked).all()  # real tokens never see padding
    assert (mask[0, 2:, :2] == blocked).all() and (mask[0, 3, 2:4] == 0).all()  # B sees B only, causally
    assert (mask[0, 2, 3:] == blocked).all()


def test_models_that_cannot_take_the_mask_get_one_line():
    m = MaskedLMModule(backbone_config={**TINY_BERT, "vocab_size": V}).build()
    m.backbone.config._attn_implementation = "flash_attention_2"  # takes only 2-D padding masks
    with pytest.raises(PtmError, match="document_attention"):
        packed_document_inputs(m.backbone, torch.ones(1, 4), torch.zeros(1, 4))


def pretrain_config(corpus_dir, tmp_path, kind):
    model = ({"class_path": "MaskedLMModule", "init_args": {"backbone_config": TINY_BERT}} if kind == "mlm" else
             {"class_path": "CausalLMModule", "init_args": {"backbone_config": TINY_GPT2}})
    tokenizer = {"train": "wordpiece" if kind == "mlm" else "bpe", "vocab_size": 300, "min_frequency": 1}
    cfg = {"seed_everything": 3,
           "trainer": {"max_steps": 3, "accelerator": "cpu", "devices": 1, "val_check_interval": 3,
                       "limit_val_batches": 2, "log_every_n_steps": 1, "enable_progress_bar": False,
                       "enable_model_summary": False},
           "model": {**model, "init_args": {**model["init_args"], "optim": {"lr": 1e-3, "warmup": 1}}},
           "data": {"class_path": "PretrainDataModule",
                    "init_args": {"source": str(corpus_dir), "max_length": 48, "batch_size": 4, "limit_documents": 24,
                                  "packing": "pack", "document_attention": True, "tokenizer": tokenizer}}}
    path = tmp_path / f"doc_attention_{kind}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("kind", ["mlm", "clm"])
def test_document_attention_runs_from_yaml(kind, tiny_corpus, tmp_path, runs_dir, monkeypatch):
    import ptm_app.backbones.attention as attention

    seen = []
    original = attention.packed_document_inputs

    def spy(model, attention_mask, doc_ids):
        out = original(model, attention_mask, doc_ids)
        seen.append((out["attention_mask"].dim(), int((doc_ids[:, 1:] != doc_ids[:, :-1]).sum())))
        return out

    monkeypatch.setattr(attention, "packed_document_inputs", spy)
    assert run_main(["fit", "--config", str(pretrain_config(tiny_corpus, tmp_path, kind))], runs_dir) == 0
    assert len(seen) >= 3 + 2  # every training and validation batch went through the document mask
    assert {dim for dim, _ in seen} == {4} and sum(boundaries for _, boundaries in seen) > 0
    run = runs_dir / f"doc_attention_{kind}"
    rows = list(csv.DictReader(open(run / "logs" / "metrics.csv")))
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    val = [float(r["val/loss"]) for r in rows if r.get("val/loss")]
    assert len(losses) == 3 and all(math.isfinite(v) and 0 < v < 10 for v in losses)
    assert val and math.isfinite(val[-1])
    logged = [r for r in rows if r.get("throughput/tokens_per_s")]  # the CLI's throughput monitor, every step
    assert len(logged) == 3 and all(float(r["throughput/tokens_per_s"]) > 0 for r in logged)
    assert all(0 <= float(r["train/padding_fraction"]) < 0.5 for r in logged)  # full packed blocks
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["data"]["init_args"]["document_attention"] is True
