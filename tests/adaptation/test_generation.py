"""Seq2seq generation: source/target data, the exact token layouts (teacher forcing, prompt masking), ROUGE-L and
BLEU on hand-computed cases, left-padded batched generation, BERT2BERT warm start, and tiny runs through main.py
that overfit, resume exactly, test, predict and export."""
import csv
import json
from pathlib import Path

import pytest
import torch
import yaml

from ptm_app.adaptation.generation import EncoderDecoderCollator, GenerationModule, PromptCollator, left_pad
from ptm_app.data.generation_data import Seq2SeqDataModule
from ptm_app.data.tokenizer import TokenizerSpec
from ptm_app.errors import DataFormatError, PtmError
from ptm_app.task_kinds.metrics import GenerationScores
from tests.conftest import TINY_BERT, TINY_GPT2, run_main, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
MINILM = TokenizerSpec(pretrained="minilm")
TINY_BART = {"model_type": "bart", "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
             "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
             "max_position_embeddings": 64}
WORDS = "red green blue cat dog bird runs sleeps sings fast slow loud quiet big small old new".split()
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


def pairs(n: int, seed: int = 0) -> list[dict]:
    """Copy-the-lead pairs: the target is the source's first five words (learnable by a tiny model)."""
    import random

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(7, 10))]
        rows.append({"id": f"p{i}", "text": " ".join(words), "target": " ".join(words[:5])})
    return rows


def item(source: list[int], target: list[int], text: str = "", key: int = 0) -> dict:
    """A ``PairDataset`` item."""
    return {"source_ids": torch.tensor(source), "target_ids": torch.tensor(target), "target": text, "key": key}


def metrics_rows(run: Path) -> list[dict]:
    return list(csv.DictReader(open(run / "logs" / "metrics.csv")))


def column(run: Path, name: str) -> dict[int, float]:
    return {int(r["step"]): float(r[name]) for r in metrics_rows(run) if r.get(name)}


# -- data ---------------------------------------------------------------------------------------------
def test_pairs_are_tokenized_once_without_specials_and_references_stay_whole(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"id": "a", "body": "the cat sat on the mat today", "title": "cat sits down"},
                                           *[{"body": f"filler {i}", "title": "x"} for i in range(9)]])
    dm = Seq2SeqDataModule(source=str(tmp_path / "train.jsonl"), tokenizer=MINILM, source_field="body",
                           target_field="title", max_source_length=4, max_target_length=2, holdout=0.2, limit_train=3)
    dm.prepare_data()
    dm.setup("fit")
    enc = dm._encode(dm.files["train"])
    tok = dm.tokenizer
    assert tok.convert_ids_to_tokens(enc.columns["source_ids"][0]) == ["the", "cat", "sat", "on"]  # cut, no specials
    assert tok.convert_ids_to_tokens(enc.columns["target_ids"][0]) == ["cat", "sits"]
    assert enc.fields["target"][0] == "cat sits down"
    assert enc.stats == {"truncated_sources": 1, "truncated_targets": 1}
    # no validation file: 2 of 10 held out (seeded), then 3 of the other 8 drawn for training
    assert len(dm.datasets["validation"]) == 2 and len(dm.datasets["train"]) == 3
    assert not set(dm.records("validation")["ids"]) & set(dm.records("train")["ids"])
    item = dm.datasets["train"][0]
    assert set(item) == {"source_ids", "target_ids", "target", "key"}
    again = Seq2SeqDataModule(source=str(tmp_path / "train.jsonl"), tokenizer=MINILM, source_field="body",
                              target_field="title", max_source_length=4, max_target_length=2, holdout=0.2, limit_train=3)
    again.setup("fit")
    assert again.records("train") == dm.records("train")  # same seed, same split and subset


def test_overlong_error_names_file_line_and_the_fix(tmp_path, capsys):
    write_jsonl(tmp_path / "data" / "train.jsonl", [{"text": "a b", "target": "c"}, {"text": "a b c d e f", "target": "c"}])
    dm = Seq2SeqDataModule(source=str(tmp_path / "data"), tokenizer=MINILM, max_source_length=3, overlong="error")
    with pytest.raises(DataFormatError, match=r"train\.jsonl:2: source is 6 tokens, longer than max_source_length=3"):
        dm.prepare_data()
    cfg = {"seed_everything": 1, "trainer": {"max_steps": 1, "accelerator": "cpu", "enable_progress_bar": False},
           "model": {"class_path": "GenerationModule", "init_args": {"backbone_config": TINY_BART}},
           "data": {"class_path": "Seq2SeqDataModule",
                    "init_args": {"source": str(tmp_path / "data"), "tokenizer": {"pretrained": "minilm"},
                                  "max_source_length": 3, "overlong": "error"}}}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(cfg))
    assert run_main(["fit", "--config", str(tmp_path / "bad.yaml")], tmp_path / "runs") == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]
    assert err[-1].startswith("error: ") and "train.jsonl:2: source is 6 tokens" in err[-1], err
    assert "set data.overlong: truncate" in err[-1] and not any("Traceback" in line for line in err)


# -- exact token layouts ------------------------------------------------------------------------------
def test_encoder_decoder_layout_teacher_forcing_is_the_target_shifted_right():
    collate = EncoderDecoderCollator(pad_token_id=0, eos_token_id=2, decoder_start_token_id=1, source_suffix=(2,))
    batch = collate([item([5, 6, 7], [8, 9], "t0", 0), item([5], [8, 9, 10], "t1", 1)])
    assert batch["input_ids"].tolist() == [[5, 6, 7, 2], [5, 2, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch["decoder_input_ids"].tolist() == [[1, 8, 9, 0], [1, 8, 9, 10]]
    assert batch["labels"].tolist() == [[8, 9, 2, -100], [8, 9, 10, 2]]
    assert batch["decoder_attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert batch["targets"] == ["t0", "t1"] and batch["keys"] == [0, 1]


def test_decoder_prompt_layout_masks_source_and_prompt_and_left_pads_for_generation():
    collate = PromptCollator(pad_token_id=0, eos_token_id=2, prompt_ids=(3, 4), prefix=(1,))
    batch = collate([item([5, 6, 7], [8, 9], "t", 0), item([5], [8], "u", 1)])
    # [BOS] source prompt target [EOS]; loss only on target + EOS
    assert batch["input_ids"].tolist() == [[1, 5, 6, 7, 3, 4, 8, 9, 2], [1, 5, 3, 4, 8, 2, 0, 0, 0]]
    assert batch["labels"].tolist() == [[-100] * 6 + [8, 9, 2], [-100] * 4 + [8, 2, -100, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1] * 9, [1] * 6 + [0] * 3]
    assert batch["prompt_input_ids"].tolist() == [[1, 5, 6, 7, 3, 4], [0, 0, 1, 5, 3, 4]]
    assert batch["prompt_attention_mask"].tolist() == [[1] * 6, [0, 0, 1, 1, 1, 1]]
    assert left_pad([torch.tensor([7])], 0).tolist() == [[7]]


def test_bert2bert_layout_with_minilm_tokens(tmp_path):
    module = GenerationModule(backbone=str(tiny_bert_dir(tmp_path)), architecture="bert2bert").build()
    tok = module.tokenizer = _minilm()
    content = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    batch = module.make_collator(tok)([item(content("the cat sat"), content("on a mat"), "on a mat")])
    show = lambda ids: tok.convert_ids_to_tokens(ids[0].tolist())  # noqa: E731
    assert show(batch["input_ids"]) == ["[CLS]", "the", "cat", "sat", "[SEP]"]
    assert show(batch["decoder_input_ids"]) == ["[CLS]", "on", "a", "mat"]
    assert show(batch["labels"]) == ["on", "a", "mat", "[SEP]"]


def _minilm():
    from ptm_app.data.tokenizer import load_tokenizer

    return load_tokenizer(MINILM)


def test_losses_match_transformers_own_label_shifting():
    """Our explicit layouts give exactly the loss transformers computes from ``labels`` alone (it shifts them
    right for the decoder / left for a causal LM): the target is what is learned, nothing else."""
    torch.manual_seed(0)
    tok = _minilm()
    seq2seq = GenerationModule(backbone_config={**TINY_BART, "vocab_size": len(tok), "pad_token_id": 0,
                                                "decoder_start_token_id": 101, "eos_token_id": 102}).build().eval()
    seq2seq.tokenizer = tok
    items = [item([2000, 2001, 2002], [3000, 3001]), item([2003], [3002, 3003, 3004], key=1)]
    batch = seq2seq.make_collator(tok)(items)
    with torch.no_grad():
        ours = seq2seq.loss(seq2seq(batch), batch["labels"])
        theirs = seq2seq.backbone(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                  labels=batch["labels"]).loss
    assert ours == pytest.approx(float(theirs), rel=1e-5)

    gpt = GenerationModule(backbone_config={**TINY_GPT2, "vocab_size": 40, "eos_token_id": 2, "bos_token_id": 1,
                                            "pad_token_id": 0}).build().eval()
    assert gpt.architecture == "decoder" and seq2seq.architecture == "encoder_decoder"
    batch = PromptCollator(pad_token_id=0, eos_token_id=2, prompt_ids=(3, 4), prefix=(1,))(
        [item([5, 6, 7], [8, 9]), item([5], [8], key=1)])
    with torch.no_grad():
        ours = gpt.loss(gpt(batch), batch["labels"])
        theirs = gpt.backbone(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                              labels=batch["labels"]).loss
        logits = gpt(batch)
    assert ours == pytest.approx(float(theirs), rel=1e-5)
    # by hand: the 3 + 2 target/EOS positions, each predicted from the previous position
    logp = logits.log_softmax(-1)
    by_hand = -(logp[0, 5, 8] + logp[0, 6, 9] + logp[0, 7, 2] + logp[1, 3, 8] + logp[1, 4, 2]) / 5
    assert ours == pytest.approx(float(by_hand), rel=1e-5)


def test_left_padded_batched_generation_equals_one_by_one():
    torch.manual_seed(0)
    module = GenerationModule(backbone_config={**TINY_GPT2, "vocab_size": 40, "eos_token_id": 2, "bos_token_id": 1,
                                               "pad_token_id": 0}, max_new_tokens=6).build().eval()

    class Tok:  # decoding only: ids as text
        pad_token_id, bos_token_id, eos_token_id, cls_token_id, sep_token_id = 0, 1, 2, None, None

        def batch_decode(self, seqs, skip_special_tokens=True):
            return [" ".join(str(i) for i in s.tolist() if i not in (0, 1, 2)) for s in seqs]

    module.tokenizer = Tok()
    collate = PromptCollator(pad_token_id=0, eos_token_id=2, prompt_ids=(3, 4), prefix=(1,))
    items = [item(source, [8], key=i) for i, source in enumerate(([5, 6, 7, 9, 10], [11], [12, 13]))]
    together = module.generate(collate(items))
    alone = [module.generate(collate([item]))[0] for item in items]
    assert together == alone and any(together)


# -- metrics ------------------------------------------------------------------------------------------
def test_rouge_l_and_bleu_on_hand_computed_cases():
    scores = GenerationScores()
    # LCS("the cat sat on the mat", "the cat was on the mat") = 5 of 6 words: P = R = F = 5/6
    scores.update(["the cat sat on the mat"], ["the cat was on the mat"])
    assert float(scores.compute()["rougeL"]) == pytest.approx(5 / 6, abs=1e-4)
    scores.reset()
    # pred "the cat sat on the mat" vs ref "the cat sat on a mat": n-gram precisions 5/6, 3/5, 2/4, 1/3; equal
    # lengths (BP = 1): BLEU = (5/6 · 3/5 · 2/4 · 1/3) ** (1/4) = (1/12) ** 0.25
    scores.update(["the cat sat on the mat"], ["the cat sat on a mat"])
    out = scores.compute()
    assert float(out["bleu"]) == pytest.approx((1 / 12) ** 0.25, abs=1e-4)
    assert float(out["rougeL"]) == pytest.approx(5 / 6, abs=1e-4)  # LCS: the cat sat on mat
    scores.reset()
    # ROUGE-L is a mean over pairs; ROUGE lowercases and drops punctuation; BLEU is lowercased by default
    scores.update(["Cats sleep.", "dogs bark loudly"], ["cats sleep", "birds sing"])
    out = scores.compute()
    assert float(out["rougeL"]) == pytest.approx((1.0 + 0.0) / 2, abs=1e-4)
    scores.reset()
    scores.update(["A b c d e"], ["a b c d e"])
    assert float(scores.compute()["bleu"]) == pytest.approx(1.0)
    cased = GenerationScores(bleu_lowercase=False)
    cased.update(["A b c d e"], ["a b c d e"])
    assert float(cased.compute()["bleu"]) < 1.0
    with pytest.raises(ValueError):
        scores.update(["one"], ["one", "two"])


# -- BERT2BERT warm start (Rothe et al. 2020) ---------------------------------------------------------
def tiny_bert_dir(tmp_path: Path) -> Path:
    """A tiny BERT encoder with MiniLM's tokenizer, saved like any pre-trained checkpoint."""
    from transformers import BertConfig, BertModel

    out = tmp_path / "tiny_bert"
    if not (out / "config.json").exists():
        torch.manual_seed(0)
        config = BertConfig(**{k: v for k, v in TINY_BERT.items() if k != "model_type"}, vocab_size=30522)
        BertModel(config).save_pretrained(out)
        _minilm().save_pretrained(out)
    return out


def test_bert2bert_initialises_encoder_and_decoder_from_the_encoder_checkpoint(tmp_path):
    from transformers import BertModel

    source = tiny_bert_dir(tmp_path)
    bert = BertModel.from_pretrained(source)
    model = GenerationModule(backbone=str(source), architecture="bert2bert").build().backbone
    assert model.config.decoder.is_decoder and model.config.decoder.add_cross_attention
    assert (model.config.decoder_start_token_id, model.config.eos_token_id, model.config.pad_token_id) == (101, 102, 0)
    key = "encoder.layer.1.attention.self.query.weight"
    assert torch.equal(model.encoder.state_dict()[key], bert.state_dict()[key])
    assert torch.equal(model.decoder.bert.state_dict()[key], bert.state_dict()[key])  # warm-started decoder
    assert any("crossattention" in n for n, _ in model.decoder.named_parameters())  # new, random
    with pytest.raises(PtmError, match="bert2bert warm-starts from a pre-trained encoder"):
        GenerationModule(backbone_config=TINY_BERT, architecture="bert2bert").build()
    for architecture in (None, "decoder"):  # a bidirectional encoder as a "decoder" would see its target
        with pytest.raises(PtmError, match="bidirectional encoder \\(bert\\).*architecture: bert2bert"):
            GenerationModule(backbone=str(source), architecture=architecture).build()


# -- end to end through main.py -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def copy_task(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("copy_task")
    write_jsonl(root / "train.jsonl", pairs(6, 0) * 20)  # 6 pairs, 20 copies: fewer epoch-end checkpoints
    write_jsonl(root / "validation.jsonl", pairs(6, 0))  # train as validation: measures fitting
    write_jsonl(root / "test.jsonl", pairs(6, 1))
    return root


def config(tmp: Path, data: Path, name: str, model: dict, tokenizer: dict, **trainer) -> Path:
    cfg = {"seed_everything": 3,
           "trainer": {"accelerator": "cpu", "devices": 1, "log_every_n_steps": 1, "num_sanity_val_steps": 0,
                       "enable_progress_bar": False, "enable_model_summary": False, **trainer},
           "model": {"class_path": "GenerationModule", "init_args": {"optim": {"lr": 3e-3, "warmup": 2}, **model}},
           "data": {"class_path": "Seq2SeqDataModule",
                    "init_args": {"source": str(data), "tokenizer": tokenizer, "max_source_length": 24,
                                  "max_target_length": 16, "batch_size": 4, "eval_batch_size": 6}}}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_tiny_encoder_decoder_overfits_a_handful_of_pairs(copy_task, tmp_path):
    cfg = config(tmp_path, copy_task, "bart_copy", {"backbone_config": TINY_BART, "optim": {"lr": 1e-2, "warmup": 5}},
                 {"train": "wordpiece", "vocab_size": 60, "min_frequency": 1},
                 max_steps=90, check_val_every_n_epoch=3)  # 30 steps an epoch: validation at the last step
    runs = tmp_path / "runs"
    assert run_main(["validate", "--config", str(cfg)], runs) == 0  # the untrained model, same seed
    before = json.loads((runs / "bart_copy" / "summary.json").read_text())["metrics"]["val/rougeL"]
    assert run_main(["fit", "--config", str(cfg)], runs) == 0
    rouge = column(runs / "bart_copy", "val/rougeL")
    assert before < 0.3 and rouge[max(rouge)] > 0.9 and rouge[max(rouge)] > before + 0.6, (before, rouge)
    assert column(runs / "bart_copy", "val/bleu")[max(rouge)] > 0.8
    best = torch.load(runs / "bart_copy" / "checkpoints" / "best.ckpt", weights_only=True)
    assert float(next(v for k, v in best["callbacks"].items() if k.startswith("ModelCheckpoint"))["best_model_score"]) \
        == pytest.approx(max(rouge.values()))  # best.ckpt = the highest val/rougeL


def test_tiny_decoder_resumes_exactly_tests_predicts_and_exports(copy_task, tmp_path):
    cfg = config(tmp_path, copy_task, "gpt_copy", {"backbone_config": TINY_GPT2, "prompt": " =>", "max_new_tokens": 4},
                 {"train": "bpe", "vocab_size": 300, "min_frequency": 1}, max_steps=8, val_check_interval=2,
                 check_val_every_n_epoch=None)
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", str(cfg), "--run_name", "full"], runs) == 0
    assert run_main(["fit", "--config", str(cfg), "--run_name", "part", "--stop_at_step", "4"], runs) == 0
    assert run_main(["fit", "--config", str(cfg), "--run_name", "part", "--ckpt_path", "last"], runs) == 0
    for name in ("train/loss", "val/loss", "val/rougeL"):
        full, part = column(runs / "full", name), column(runs / "part", name)
        assert sorted(part) == sorted(full) and len(full) >= 4, name
        for step in full:
            assert part[step] == pytest.approx(full[step], rel=1e-5, abs=1e-7), (name, step)

    run = runs / "full"
    assert run_main(["test", "--config", str(cfg), "--run_name", "full", "--ckpt_path", "best"], runs) == 0
    summary = json.loads((run / "summary.json").read_text())["metrics"]
    assert {"test/rougeL", "test/bleu", "test/loss"} <= set(summary)
    assert run_main(["predict", "--config", str(cfg), "--run_name", "full", "--ckpt_path", "best"], runs) == 0
    rows = [json.loads(line) for line in open(run / "predictions.jsonl")]
    gold = pairs(6, 1)
    assert [r["id"] for r in rows] == [g["id"] for g in gold]
    assert [r["target"] for r in rows] == [g["target"] for g in gold]
    assert all(isinstance(r["generated"], str) for r in rows)

    module = GenerationModule.load_from_checkpoint(run / "checkpoints" / "last.ckpt").eval()
    assert module.architecture == "decoder" and module.model_class == "causal_lm"
    out = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(run), "--output_dir", str(out)], runs) == 0
    from transformers import AutoModelForCausalLM, AutoTokenizer

    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = AutoTokenizer.from_pretrained(out)(["red cat runs =>"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.allclose(module.backbone(ids).logits, exported(ids).logits, atol=1e-5)

    # the shipped decoder-with-prompt config, on this exported GPT (it names an exported gpt2_clm_bbc run)
    shipped = ROOT / "configs" / "adapt" / "gpt2_tldr_prompt_bbc_headlines.yaml"
    argv = ["fit", "--config", str(shipped), "--model.init_args.backbone", str(out), "--data.init_args.tokenizer.pretrained",
            str(out), "--data.init_args.source", str(copy_task), "--data.init_args.max_source_length", "24",
            "--data.init_args.max_target_length", "16", "--model.init_args.max_new_tokens", "8", "--trainer.max_steps", "2",
            "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1", "--data.init_args.batch_size", "4",
            "--data.init_args.eval_batch_size", "4", "--trainer.log_every_n_steps", "1", *QUIET]
    assert run_main(argv, runs) == 0
    assert column(runs / shipped.stem, "val/rougeL") and len(column(runs / shipped.stem, "train/loss")) == 2


def test_tiny_bert2bert_checkpoint_reloads_and_exports_as_a_seq2seq_model(copy_task, tmp_path):
    cfg = config(tmp_path, copy_task, "b2b", {"backbone": str(tiny_bert_dir(tmp_path)), "architecture": "bert2bert",
                                              "max_new_tokens": 4},
                 {"pretrained": str(tiny_bert_dir(tmp_path))}, max_steps=2, limit_val_batches=1, val_check_interval=2)
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", str(cfg)], runs) == 0
    assert {"val/rougeL", "val/bleu", "val/loss"} <= set(metrics_rows(runs / "b2b")[0])
    module = GenerationModule.load_from_checkpoint(runs / "b2b" / "checkpoints" / "last.ckpt").eval()
    assert module.architecture == "bert2bert" and type(module.backbone).__name__ == "EncoderDecoderModel"
    out = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(runs / "b2b"), "--output_dir", str(out)], runs) == 0
    from transformers import AutoModelForSeq2SeqLM

    exported = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    src, dec = torch.tensor([[101, 2000, 2001, 102]]), torch.tensor([[101, 3000]])
    with torch.no_grad():
        assert torch.allclose(module.backbone(input_ids=src, decoder_input_ids=dec).logits,
                              exported(input_ids=src, decoder_input_ids=dec).logits, atol=1e-5)


def test_lengths_beyond_the_position_embeddings_are_refused(copy_task, tmp_path, capsys):
    cfg = config(tmp_path, copy_task, "too_long", {"backbone_config": TINY_GPT2},
                 {"train": "bpe", "vocab_size": 300, "min_frequency": 1}, max_steps=1)
    argv = ["fit", "--config", str(cfg), "--data.init_args.max_source_length", "60"]
    assert run_main(argv, tmp_path / "runs") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and "more than the backbone allows (64)" in err, err


@pytest.mark.slow
def test_shipped_config_runs_a_few_steps_on_bbc_headlines(tmp_path):
    from ptm_app.data.sources import prepared_dir

    prepared_dir("bbc_headlines"), prepared_dir("minilm")
    cfg = ROOT / "configs" / "adapt" / "bert2bert_full_bbc_headlines.yaml"
    quick = ["--trainer.max_steps", "2", "--trainer.max_epochs", "1", "--trainer.val_check_interval", "2",
             "--trainer.limit_val_batches", "1", "--trainer.num_sanity_val_steps", "0", "--trainer.log_every_n_steps",
             "1", "--data.init_args.batch_size", "2", "--data.init_args.eval_batch_size", "4",
             "--data.init_args.max_source_length", "32", "--model.init_args.max_new_tokens", "4", *QUIET]
    assert run_main(["fit", "--config", str(cfg), *quick], tmp_path) == 0
    rows = metrics_rows(tmp_path / cfg.stem)
    assert any(r.get("val/rougeL") for r in rows) and any(r.get("train/loss") for r in rows)


def test_encoder_decoder_starts_from_our_own_bart_pretraining_run(copy_task, tmp_path):
    """Stage chaining: a BART denoising run (``Seq2SeqDenoisingModule``), exported, is the generator's backbone."""
    pre = {"seed_everything": 1,
           "trainer": {"max_steps": 2, "accelerator": "cpu", "log_every_n_steps": 1, "limit_val_batches": 0,
                       "enable_progress_bar": False, "enable_model_summary": False},
           "model": {"class_path": "Seq2SeqDenoisingModule", "init_args": {"backbone_config": TINY_BART, "noise": "bart"}},
           "data": {"class_path": "PretrainDataModule",
                    "init_args": {"source": str(copy_task), "max_length": 24, "batch_size": 4,
                                  "tokenizer": {"train": "wordpiece", "vocab_size": 120, "min_frequency": 1}}}}
    (tmp_path / "bart_pre.yaml").write_text(yaml.safe_dump(pre))
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", str(tmp_path / "bart_pre.yaml")], runs) == 0
    export = tmp_path / "bart_export"
    assert run_main(["export", "--ckpt_path", str(runs / "bart_pre"), "--output_dir", str(export)], runs) == 0
    module = GenerationModule(backbone=str(export)).build()
    assert module.architecture == "encoder_decoder" and type(module.backbone).__name__ == "BartForConditionalGeneration"
    pretrained = torch.load(runs / "bart_pre" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    key = "model.encoder.layers.0.self_attn.q_proj.weight"
    assert torch.equal(module.backbone.state_dict()[key], pretrained[f"backbone.{key}"])
    cfg = config(tmp_path, copy_task, "bart_gen", {"backbone": str(export), "max_new_tokens": 4},
                 {"pretrained": str(export)}, max_steps=2, limit_val_batches=1, val_check_interval=2)
    assert run_main(["fit", "--config", str(cfg)], runs) == 0
    assert column(runs / "bart_gen", "val/rougeL") and column(runs / "bart_gen", "train/loss")
