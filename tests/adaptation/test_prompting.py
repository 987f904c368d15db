"""Prompt-based learning (survey §5.7): PET cloze classification (Schick & Schütze 2021 §3), soft prompts
(Lester et al. 2021) and in-context learning (Brown et al. 2020 §2), on tiny models, then MiniLM on real BBC."""
import contextlib
import dataclasses
import json
import random
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml

from ptm_app.training.trainer import PtmTrainer
from ptm_app.adaptation.prompting import InContextEvalModule, PromptClassifierModule, label_scores
from ptm_app.backbones.delta import transformers_model
from ptm_app.data.prompts import PromptEncoder, Template, Verbalizer, longest_first
from ptm_app.data.prompt_data import PromptDataModule
from ptm_app.data.sources import prepared_dir
from ptm_app.data.tokenizer import TokenizerSpec
from ptm_app.errors import PtmError
from ptm_app.training.optim import OptimConfig
from tests.conftest import TINY_BERT, TINY_GPT2, run_main, write_jsonl

ADAPT = Path(__file__).resolve().parents[2] / "configs" / "adapt"
FILLER = "the cat sat on a mat while dogs ran in park and every morning".split()
CUES = {"pos": ["rose", "joy", "grew"], "neg": ["fell", "lost", "sank"]}
VERBALIZER = {"pos": ["rose", "joy"], "neg": "fell"}
GPT = {**TINY_GPT2, "n_positions": 512}


def rows(n: int, seed: int) -> list[dict]:
    """Filler words plus two cue words of the label: learnable from a handful of examples."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        label = ("pos", "neg")[i % 2]
        words = [rng.choice(FILLER) for _ in range(rng.randint(4, 9))]
        for _ in range(2):
            words.insert(rng.randrange(len(words) + 1), rng.choice(CUES[label]))
        out.append({"id": f"{seed}-{i}", "text": " ".join(words), "label": label})
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("prompt_corpus")
    train = rows(40, 1)
    write_jsonl(root / "train.jsonl", train + [{**train[0], "id": "duplicate"}])
    write_jsonl(root / "validation.jsonl", rows(16, 2))
    write_jsonl(root / "test.jsonl", rows(16, 3))
    return root


def data(corpus: Path, kind: str = "wordpiece", max_length: int = 64, **kwargs) -> PromptDataModule:
    spec = TokenizerSpec(train=kind, vocab_size=200 if kind == "wordpiece" else 300, min_frequency=1)
    dm = PromptDataModule(spec, source=str(corpus), max_length=max_length, batch_size=8, **kwargs)
    dm.setup()
    return dm


@pytest.fixture(scope="module")
def bert_data(corpus) -> PromptDataModule:
    return data(corpus)


def trainer(**kwargs) -> pl.Trainer:
    return PtmTrainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, **kwargs)


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


# -- templates and verbalizers ----------------------------------------------------------------------------
def test_cloze_input_is_the_rendered_template_with_one_mask(bert_data):
    tok = bert_data.tokenizer
    template = Template("{text} It was {mask}.")
    assert template.render("[MASK]", "the cat sat") == "the cat sat It was [MASK]."
    encoded, at = PromptEncoder(template, tok).cloze({"text": ids(tok, "the cat sat")}, max_length=64)
    assert encoded == tok(template.render(tok.mask_token, "the cat sat"))["input_ids"]
    assert encoded[at] == tok.mask_token_id and encoded.count(tok.mask_token_id) == 1
    assert encoded[0] == tok.cls_token_id and encoded[-1] == tok.sep_token_id

    pair = Template("{text} ? {mask} , {text_pair}")  # PET's pattern for sentence pairs (§4.1)
    fields = {"text": ids(tok, "the cat sat"), "text_pair": ids(tok, "dogs ran")}
    encoded, at = PromptEncoder(pair, tok).cloze(fields, max_length=64)
    assert encoded == tok(pair.render(tok.mask_token, "the cat sat", "dogs ran"))["input_ids"]
    assert encoded[at] == tok.mask_token_id
    with pytest.raises(PtmError, match="text_pair_field"):
        PromptEncoder(pair, tok).cloze({"text": fields["text"], "text_pair": None}, max_length=64)


@pytest.mark.parametrize("pattern", ["{text} It was {mask}.", "{mask} News: {text}"])
def test_truncation_cuts_the_text_never_the_mask(bert_data, pattern):
    tok = bert_data.tokenizer
    encoder = PromptEncoder(Template(pattern), tok)
    long = ids(tok, " ".join(["the cat sat on a mat"] * 20))
    encoded, at = encoder.cloze({"text": long}, max_length=16)
    room = 16 - len(encoder.cloze({"text": []}, max_length=64)[0])
    assert len(encoded) == 16 and encoded[at] == tok.mask_token_id
    assert (encoded, at) == encoder.cloze({"text": long[:room]}, max_length=64)  # the text keeps its beginning
    with pytest.raises(PtmError, match="leaving no room for the text"):
        PromptEncoder(Template("{text} " + "and the cat sat " * 4 + "{mask}"), tok).cloze({"text": long}, 16)


def test_sentence_pairs_are_cut_longest_first():
    assert longest_first([30, 5], 20) == [15, 5]
    assert longest_first([30, 25], 20) == [10, 10]
    assert longest_first([3, 4], 20) == [3, 4]


@pytest.mark.parametrize("pattern", ["{text}", "{text} {mask} {mask}", "{mask} {review}", "{mask} {text:>5}",
                                     "{mask} {text"])
def test_bad_templates_are_refused(pattern):
    with pytest.raises(PtmError, match="template"):
        Template(pattern)


def test_label_words_must_be_single_known_tokens(bert_data):
    tok, labels = bert_data.tokenizer, ["neg", "pos"]
    token = tok.convert_tokens_to_ids
    assert Verbalizer.of(VERBALIZER, labels).token_ids(tok, labels) == [[token("fell")], [token("rose"), token("joy")]]
    assert Verbalizer.of(None, ["cat", "dogs"]).words == {"cat": ["cat"], "dogs": ["dogs"]}
    assert len(ids(tok, "catdog")) > 1
    with pytest.raises(PtmError, match=r"word 'catdog' of label 'pos' is \d tokens \(cat ##"):
        Verbalizer({"pos": ["rose", "catdog"], "neg": "fell"}).token_ids(tok, labels)
    with pytest.raises(PtmError, match="word 'zebra' of label 'neg' is not in the tokenizer's vocabulary"):
        Verbalizer({"pos": "rose", "neg": "zebra"}).token_ids(tok, labels)
    with pytest.raises(PtmError, match="differ from the task's labels"):
        Verbalizer({"pos": "rose"}).token_ids(tok, labels)


# -- PET scoring and training ---------------------------------------------------------------------------
@pytest.mark.parametrize("scoring", ["mean", "max"])
def test_label_scores_are_the_label_words_mlm_logits_at_the_mask(bert_data, scoring):
    tok = bert_data.tokenizer
    torch.manual_seed(0)
    module = PromptClassifierModule(backbone_config={**TINY_BERT, "vocab_size": len(tok)}, labels=["neg", "pos"],
                                    verbalizer=VERBALIZER, scoring=scoring).build()
    module.tokenizer = tok
    module.eval()
    batch = module.make_collator(tok)([bert_data.datasets["validation"][i] for i in range(4)])
    projected = []  # the vocabulary projection sees one row per example: the mask's
    decoder = module.backbone.get_output_embeddings()
    handle = decoder.register_forward_hook(lambda _m, args, _out: projected.append(tuple(args[0].shape)))
    with torch.no_grad():
        scores = module(batch)
        handle.remove()
        logits = module.backbone(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert projected == [(4, 1, TINY_BERT["hidden_size"])]
    rows_, cols = (batch["input_ids"] == tok.mask_token_id).nonzero(as_tuple=True)
    assert rows_.tolist() == [0, 1, 2, 3] and cols.tolist() == batch["mask_positions"].tolist()
    at_mask = logits[rows_, cols]
    pos = at_mask[:, tok.convert_tokens_to_ids(["rose", "joy"])]
    expected = torch.stack([at_mask[:, tok.convert_tokens_to_ids("fell")],
                            pos.mean(-1) if scoring == "mean" else pos.max(-1).values], dim=1)
    assert torch.allclose(scores, expected, atol=1e-5)


@pytest.fixture(scope="module")
def fixed_vocab(tmp_path_factory) -> TokenizerSpec:
    """A WordPiece tokenizer over the fixture's words from a fixed vocab.txt: training one with `tokenizers`
    is not deterministic across fresh trainings, and 150 optimiser steps amplify any difference."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("vocab")
    words = sorted(set(FILLER) | {w for cue in CUES.values() for w in cue} | {"it", "was", "."})
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {w: i for i, w in enumerate(specials + words)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = normalizers.BertNormalizer(), pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.BertProcessing(("[SEP]", vocab["[SEP]"]), ("[CLS]", vocab["[CLS]"]))
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]").save_pretrained(root / "tokenizer")
    return TokenizerSpec(pretrained=str(root / "tokenizer"))


def test_few_shot_training_raises_accuracy_and_lowers_loss(corpus, fixed_vocab):
    pl.seed_everything(0)
    dm = PromptDataModule(fixed_vocab, source=str(corpus), max_length=64, batch_size=8, limit_train=32)
    dm.setup()
    assert len(dm.datasets["train"]) == 32 and set(dm.datasets["train"].labels) == {0, 1}
    module = PromptClassifierModule(backbone_config=TINY_BERT, verbalizer=VERBALIZER,
                                    optim=OptimConfig(lr=3e-3, warmup=0))
    before = trainer().validate(module, datamodule=dm, verbose=False)[0]
    trainer(max_steps=150, limit_val_batches=0).fit(module, datamodule=dm)
    after = trainer().validate(module, datamodule=dm, verbose=False)[0]
    assert module.hparams.labels == ["neg", "pos"]
    # a from-scratch tiny BERT starts at chance (loss ~0.69); seeds 0-4 end at loss <= 0.31, accuracy >= 15/16
    assert after["val/loss"] < before["val/loss"] - 0.3, (before, after)
    assert after["val/acc"] >= 0.85 and after["val/acc"] > before["val/acc"], (before, after)


def test_soft_prompt_is_peft_prompt_tuning_before_cls_and_trains_only_the_prompt(corpus, tmp_path):
    """``soft_prompt_tokens`` is the ``prompt`` delta (peft's prompt tuning): N vectors sampled from the word table
    go before the whole input ([CLS] included), the [MASK] logit is read N positions later, and with
    ``freeze_backbone`` only the prompt trains (the masked LM, its head included, stays bit-identical)."""
    pl.seed_everything(0)
    dm = data(corpus, max_length=60, limit_train=16)  # + 4 prompt vectors = TINY_BERT's 64 positions
    module = PromptClassifierModule(backbone_config=TINY_BERT, verbalizer=VERBALIZER, soft_prompt_tokens=4,
                                    freeze_backbone=True, optim=OptimConfig(lr=1e-2, warmup=0))
    trainer(limit_val_batches=1).validate(module, datamodule=dm, verbose=False)
    assert [n for n, p in module.named_parameters() if p.requires_grad] == [
        "backbone.prompt_encoder.default.embedding.weight"]
    assert module.delta.method == "prompt" and module.virtual_positions() == 4
    model = transformers_model(module.backbone)
    table = model.get_input_embeddings().weight
    prompt = module.backbone.prompt_encoder["default"].embedding.weight
    assert (prompt[:, None, :] == table[None]).all(-1).any(-1).all()  # sample_vocab: each vector is a word's row

    module.eval()
    batch = module.make_collator(dm.tokenizer)([dm.datasets["validation"][i] for i in range(3)])
    with torch.no_grad():  # by hand: the prompt, then [CLS] and the rest; the mask 4 positions further on
        embeds = torch.cat([prompt.expand(3, -1, -1), table[batch["input_ids"]]], dim=1)
        mask = torch.cat([torch.ones(3, 4, dtype=batch["attention_mask"].dtype), batch["attention_mask"]], dim=1)
        logits = model(inputs_embeds=embeds, attention_mask=mask).logits
        expected = label_scores(logits[torch.arange(3), batch["mask_positions"] + 4], module.label_words())
        assert torch.allclose(module(batch), expected, atol=1e-6)

    base = {k: v.clone() for k, v in model.state_dict().items()}
    before = prompt.detach().clone()
    fitted = trainer(max_steps=5, limit_val_batches=0)
    fitted.fit(module, datamodule=dm)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in base.items())
    assert not torch.equal(prompt.detach(), before)

    fitted.save_checkpoint(tmp_path / "soft.ckpt")  # self-contained: backbone config, tokenizer, the prompt
    loaded = PromptClassifierModule.load_from_checkpoint(tmp_path / "soft.ckpt", weights_only=True).eval()
    assert torch.equal(loaded.backbone.prompt_encoder["default"].embedding.weight, prompt)
    assert loaded.hparams.labels == ["neg", "pos"]
    with torch.no_grad():
        assert torch.equal(loaded(batch), module.eval()(batch))
    with pytest.raises(PtmError, match="leaves nothing to train"):
        PromptClassifierModule(backbone_config=TINY_BERT, freeze_backbone=True)


def test_a_frozen_pretrained_backbone_checkpoint_keeps_the_prompt_and_the_fresh_mlm_head_only(bert_data, tmp_path):
    """Prompt tuning on a backbone saved without an MLM head (as all-MiniLM-L6-v2): the checkpoint holds the prompt
    and the freshly initialised head, not the frozen encoder (rebuilt from its source), and reloads to the same
    scores whatever the RNG then draws."""
    import transformers

    config = transformers.BertConfig(**{k: v for k, v in TINY_BERT.items() if k != "model_type"},
                                     vocab_size=len(bert_data.tokenizer))
    config.max_position_embeddings = 68  # bert_data's 64 + the 4 virtual positions
    transformers.BertModel(config).save_pretrained(tmp_path / "bert")
    pl.seed_everything(0)
    module = PromptClassifierModule(backbone=str(tmp_path / "bert"), verbalizer=VERBALIZER, soft_prompt_tokens=4,
                                    freeze_backbone=True, optim=OptimConfig(lr=1e-2, warmup=0))
    fitted = trainer(max_steps=2, limit_val_batches=0)
    fitted.fit(module, datamodule=bert_data)
    fitted.save_checkpoint(tmp_path / "soft.ckpt")
    saved = torch.load(tmp_path / "soft.ckpt", weights_only=True)["state_dict"]
    kept = sorted(k for k in saved if k.startswith("backbone."))
    assert "backbone.prompt_encoder.default.embedding.weight" in kept
    assert kept and all(k.startswith(("backbone.prompt_encoder.", "backbone.base_model.cls.predictions."))
                        for k in kept), kept
    torch.manual_seed(123)  # a rebuild draws a different fresh head: the saved one must replace it
    loaded = PromptClassifierModule.load_from_checkpoint(tmp_path / "soft.ckpt").eval()
    batch = next(iter(bert_data.val_dataloader()))
    with torch.no_grad():
        assert torch.equal(loaded(batch), module.eval()(batch))


def test_a_checkpoint_with_the_former_soft_prompt_is_refused_in_one_line(corpus, tmp_path):
    pl.seed_everything(0)
    dm = data(corpus, max_length=60, limit_train=8)
    module = PromptClassifierModule(backbone_config=TINY_BERT, verbalizer=VERBALIZER, soft_prompt_tokens=4,
                                    freeze_backbone=True)
    fitted = trainer(max_steps=1, limit_val_batches=0)
    fitted.fit(module, datamodule=dm)
    fitted.save_checkpoint(tmp_path / "new.ckpt")
    ckpt = torch.load(tmp_path / "new.ckpt", weights_only=True)
    ckpt["state_dict"] = {k: v for k, v in ckpt["state_dict"].items() if "prompt_encoder" not in k}
    ckpt["state_dict"]["soft_prompt"] = torch.zeros(4, TINY_BERT["hidden_size"])  # as the former module saved it
    torch.save(ckpt, tmp_path / "old.ckpt")
    with pytest.raises(PtmError, match="former soft prompt .* train the prompt again") as err:
        PromptClassifierModule.load_from_checkpoint(tmp_path / "old.ckpt")
    assert "\n" not in str(err.value)


# -- in-context learning --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def icl(corpus):
    dm = data(corpus, "bpe")
    tok = dm.tokenizer
    torch.manual_seed(0)
    module = InContextEvalModule(backbone_config={**GPT, "vocab_size": len(tok), "bos_token_id": tok.eos_token_id,
                                                  "eos_token_id": tok.eos_token_id},
                                 labels=dm.label_set(), verbalizer={"pos": "good news", "neg": "bad"}, k_shot=3, seed=5).build()
    module.tokenizer = tok
    module.eval()
    return dm, module, module.build_collator(tok, dm.datasets["train"])


def test_demonstrations_are_k_distinct_other_training_examples_fixed_per_seed(icl):
    dm, module, collator = icl
    pool = dm.datasets["train"]
    draws = []
    for i in range(len(pool)):
        demos = collator.demonstrations(pool.fields(i))
        assert len(set(demos)) == 3
        assert all(pool.text_ids[d] != pool.text_ids[i] for d in demos)  # never itself, nor its duplicate
        draws.append(demos)
    assert draws == [module.build_collator(dm.tokenizer, pool).demonstrations(pool.fields(i)) for i in range(len(pool))]
    assert len({tuple(d) for d in draws}) > len(pool) // 2  # drawn per example, not one fixed set
    reseeded = dataclasses.replace(collator, seed=6)
    assert sum(d != reseeded.demonstrations(pool.fields(i)) for i, d in enumerate(draws)) > len(pool) // 2


def test_prompt_is_demonstrations_then_the_query(icl):
    dm, _, collator = icl
    tok, pool, texts = dm.tokenizer, dm.datasets["train"], dm.records("train")["texts"]
    example = dm.datasets["test"][0]
    demos = collator.demonstrations(example["fields"])
    context, shots = collator.prompt(example["fields"])
    words = [" bad", " good news"]  # labels ["neg", "pos"]; the template's space before {label} moves into them
    expected = "".join(f"{texts[d]}\nLabel:{words[pool.labels[d]]}\n\n" for d in demos)
    assert shots == 3 and tok.decode(context) == expected + dm.records("test")["texts"][0] + "\nLabel:"

    fits_one = len(context) - sum(len(collator.encoder.encode(pool.fields(d), collator.answers[pool.labels[d]])[0])
                                  for d in demos[:2]) + max(map(len, collator.answers))
    context, shots = dataclasses.replace(collator, max_length=fits_one).prompt(example["fields"])
    assert shots == 1 and tok.decode(context).startswith(texts[demos[2]])  # the earliest ones are dropped


@pytest.mark.parametrize("normalize", [True, False])
def test_label_scores_are_summed_token_log_probs(icl, normalize):
    dm, module, collator = icl
    module.hparams.length_normalize = normalize
    examples = [dm.datasets["test"][i] for i in range(3)]
    assert len({len(a) for a in collator.answers}) == 2  # the labels have different token counts
    with torch.no_grad():
        scores = module(collator(examples))
        for b, example in enumerate(examples):
            context, _ = collator.prompt(example["fields"])
            for c, answer in enumerate(collator.answers):
                logp = torch.log_softmax(module.backbone(input_ids=torch.tensor([context + answer])).logits[0], -1)
                total = sum(logp[len(context) + j - 1, t] for j, t in enumerate(answer))
                expected = total / len(answer) if normalize else total
                assert scores[b, c].item() == pytest.approx(expected.item(), abs=1e-4)


def one_token_words(tokenizer) -> dict[str, str]:
    """Two words the tiny BPE vocabulary holds as one token each (with the template's space before them)."""
    words = [w for w in ("the", "a", "and", "of", "in", "on", "cat", "dogs")
             if len(tokenizer(" " + w, add_special_tokens=False)["input_ids"]) == 1]
    assert len(words) >= 2, words
    return {"neg": words[0], "pos": words[1]}


def test_one_token_labels_are_scored_in_one_row_with_the_same_scores(icl):
    """Every label one token: one row per example (not one per label), the same label scores."""
    dm, module, _ = icl
    module.hparams.verbalizer = one_token_words(dm.tokenizer)
    try:
        collator = module.build_collator(dm.tokenizer, dm.datasets["train"])
        assert collator.one_row and all(len(a) == 1 for a in collator.answers)
        examples = [dm.datasets["test"][i] for i in range(4)]
        batch, per_label = collator(examples), dataclasses.replace(collator, one_row=False)(examples)
        assert len(batch["input_ids"]) == 4 and len(per_label["input_ids"]) == 8
        with torch.no_grad():
            fast, slow = module(batch), module(per_label)
        assert fast.shape == (4, 2) and torch.allclose(fast, slow, atol=1e-5)
    finally:
        module.hparams.verbalizer = {"pos": "good news", "neg": "bad"}


@pytest.mark.parametrize("one_token", [True, False])
def test_contextual_calibration_divides_by_the_content_free_label_distribution(icl, one_token):
    """Zhao et al. 2021 §5: log p(y|x) - log p(y|"N/A"), both normalised over the labels, same demonstrations."""
    dm, module, _ = icl
    module.hparams.calibrate, module.hparams.length_normalize = True, True  # the fixture is shared: set both
    if one_token:
        module.hparams.verbalizer = one_token_words(dm.tokenizer)
    try:
        collator = module.build_collator(dm.tokenizer, dm.datasets["train"])
        plain = dataclasses.replace(collator, content_free=None)
        examples = [dm.datasets["test"][i] for i in range(3)]
        (real, blank), shots = collator.prompts(examples[0]["fields"])
        demos = real[: len(real) - len(collator.encoder.encode(examples[0]["fields"], [], until_slot=True)[0])]
        assert shots == 3 and blank[: len(demos)] == demos and dm.tokenizer.decode(blank[len(demos):]) == "N/A\nLabel:"
        with torch.no_grad():
            calibrated = module(collator(examples))
            raw = module(plain(examples))
            blank_scores = torch.stack([module(plain([{**e, "fields": {"text": collator.content_free}}]))[0]
                                        for e in examples])
        # a blank query drawn from its own text would get other demonstrations: rebuild it with the example's
        expected = []
        for e in examples:
            (real, blank), _ = collator.prompts(e["fields"])
            rows = [blank + a for a in collator.answers]
            logp = [torch.log_softmax(module.backbone(input_ids=torch.tensor([r])).logits[0], -1) for r in rows]
            score = torch.stack([sum(lp[len(blank) + j - 1, t] for j, t in enumerate(a)) / len(a)
                                 for lp, a in zip(logp, collator.answers)])
            expected.append(score)
        cf = torch.stack(expected)
        assert torch.allclose(calibrated, torch.log_softmax(raw, -1) - torch.log_softmax(cf, -1), atol=1e-4)
        assert not torch.allclose(cf, blank_scores, atol=1e-3)  # the same demonstrations matter
        assert module.style() == "in-context 3-shot, calibrated"
    finally:
        module.hparams.calibrate = False
        module.hparams.verbalizer = {"pos": "good news", "neg": "bad"}


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())["metrics"]


def assert_predictions(run: Path, test_file: Path, labels: set[str], accuracy: float) -> None:
    """predictions.jsonl: every test record in order, a distribution over the labels, the test accuracy."""
    predicted = [json.loads(line) for line in open(run / "predictions.jsonl")]
    gold = [json.loads(line) for line in open(test_file)]
    assert [p["id"] for p in predicted] == [g["id"] for g in gold]
    for p in predicted:
        assert set(p["probs"]) == labels and abs(sum(p["probs"].values()) - 1) < 1e-3
        assert p["label"] == max(p["probs"], key=p["probs"].get)
    hits = sum(p["label"] == g["label"] for p, g in zip(predicted, gold)) / len(gold)
    assert hits == pytest.approx(accuracy, abs=1e-6)


def icl_config(corpus: Path, tmp_path: Path) -> Path:
    cfg = yaml.safe_load((ADAPT / "gpt2_icl_tweets.yaml").read_text())
    cfg["model"]["init_args"].update(backbone=None, backbone_config=GPT, k_shot=3)
    cfg["data"]["init_args"].update(source=str(corpus),
                                    tokenizer={"train": "bpe", "vocab_size": 300, "min_frequency": 1})
    cfg["trainer"].update(enable_progress_bar=False, enable_model_summary=False)
    path = tmp_path / "icl_tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_in_context_learning_runs_test_and_refuses_fit(icl, corpus, tmp_path, capsys):
    with pytest.raises(PtmError, match="no gradient steps"):
        icl[1].setup("fit")
    config = icl_config(corpus, tmp_path)
    assert run_main(["test", "--config", str(config)], tmp_path) == 0
    metrics = summary(tmp_path / "icl_tiny")
    assert 0 <= metrics["test/acc"] <= 1 and metrics["test/shots"] == 3 and "test/f1_macro" in metrics
    assert run_main(["predict", "--config", str(config)], tmp_path) == 0
    assert_predictions(tmp_path / "icl_tiny", corpus / "test.jsonl", {"neg", "pos"}, metrics["test/acc"])
    capsys.readouterr()
    assert run_main(["fit", "--config", str(config)], tmp_path) == 2
    err = capsys.readouterr().err
    assert "no gradient steps" in err and "'main.py test' instead of fit" in err


# -- MiniLM on the real BBC topics through main.py -------------------------------------------------------
FAST = ["--trainer.enable_progress_bar", "false", "--data.init_args.max_length", "64"]

@pytest.mark.slow  # ~45 s on MiniLM and BBC; the PET configs run as shipped in make test-slow too
def test_pet_zero_shot_then_few_shot_on_bbc(tmp_path):
    prepared_dir("bbc"), prepared_dir("minilm")  # fail loudly (with the fix) if `make data` was not run
    zero, few = ADAPT / "minilm_pet_zero_shot_bbc.yaml", ADAPT / "minilm_pet_few_shot_bbc.yaml"
    assert run_main(["test", "--config", str(zero), *FAST], tmp_path) == 0
    zero_shot = summary(tmp_path / "minilm_pet_zero_shot_bbc")
    assert run_main(["fit", "--config", str(few), *FAST, "--trainer.max_steps", "25", "--trainer.limit_val_batches",
                     "0"], tmp_path) == 0
    assert run_main(["test", "--config", str(few), *FAST, "--ckpt_path", "last"], tmp_path) == 0
    few_shot = summary(tmp_path / "minilm_pet_few_shot_bbc")
    assert run_main(["predict", "--config", str(few), *FAST, "--ckpt_path", "last"], tmp_path) == 0
    topics = {"business", "entertainment", "politics", "sports", "tech"}
    assert_predictions(tmp_path / "minilm_pet_few_shot_bbc", prepared_dir("bbc") / "test.jsonl", topics, few_shot["test/acc"])
    print(f"BBC test accuracy: zero-shot {zero_shot['test/acc']:.3f}, few-shot (32 examples, 25 steps) "
          f"{few_shot['test/acc']:.3f}")
    # MiniLM's MLM head transform is freshly initialised, so zero-shot sits near chance (5 topics);
    # 25 steps on 32 articles must lift it clearly.
    assert 0 <= zero_shot["test/acc"] <= 1
    assert few_shot["test/acc"] >= zero_shot["test/acc"] + 0.1
    assert few_shot["test/f1_macro"] > zero_shot["test/f1_macro"]


def test_soft_prompt_and_the_trained_masked_lm_survive_export_and_reload_from_the_directory(corpus, tmp_path):
    """Without ``freeze_backbone`` the masked LM trains with the prompt: the checkpoint keeps both, and export
    writes the trained model (``save_pretrained``) plus the prompt (``delta.safetensors``); load_exported_module
    rebuilds the prompt classifier from the directory alone, with the same scores."""
    from ptm_app.backbones.delta import CONFIG_FILE, DELTA_FILE
    from ptm_app.inference.export import MODULE_CONFIG, export_checkpoint, load_exported_module

    pl.seed_everything(0)
    dm = data(corpus, max_length=60, limit_train=16)
    module = PromptClassifierModule(backbone_config=TINY_BERT, verbalizer=VERBALIZER, soft_prompt_tokens=4,
                                    optim=OptimConfig(lr=5e-2, warmup=0))
    fitted = trainer(max_steps=5, limit_val_batches=0)
    model = None

    class Snapshot(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            nonlocal model
            model = {k: v.clone() for k, v in transformers_model(pl_module.backbone).state_dict().items()}

    fitted.callbacks.append(Snapshot())
    fitted.fit(module, datamodule=dm)
    assert all(p.requires_grad for p in module.backbone.parameters())  # the prompt and the whole masked LM
    trained = transformers_model(module.backbone).state_dict()
    assert any(not torch.equal(v, trained[k]) for k, v in model.items())  # the base trained too
    fitted.save_checkpoint(tmp_path / "soft.ckpt")
    out = export_checkpoint(tmp_path / "soft.ckpt", tmp_path / "export")
    assert all((out / name).is_file() for name in ("config.json", DELTA_FILE, CONFIG_FILE, MODULE_CONFIG))
    loaded = load_exported_module(out).eval()
    assert torch.equal(loaded.backbone.prompt_encoder["default"].embedding.weight,
                       module.backbone.prompt_encoder["default"].embedding.weight)
    batch = next(iter(dm.val_dataloader()))
    with torch.no_grad():
        assert torch.allclose(loaded(batch), module.eval()(batch), atol=1e-6)


@pytest.mark.parametrize("saved_as", ["BertModel", "BertForMaskedLM"])
def test_a_backbone_without_a_trained_mlm_head_is_named_before_zero_shot(saved_as, bert_data, tmp_path):
    """all-MiniLM-L6-v2 (sentence-transformers) ships no ``cls.predictions``: zero-shot cloze scores come from a
    freshly initialised transform, so ``validate``/``test`` say so once; a saved MLM head says nothing."""
    import transformers

    config = transformers.BertConfig(**{k: v for k, v in TINY_BERT.items() if k != "model_type"},
                                     vocab_size=len(bert_data.tokenizer))
    getattr(transformers, saved_as)(config).save_pretrained(tmp_path / "bert")
    module = PromptClassifierModule(backbone=str(tmp_path / "bert"), verbalizer=VERBALIZER).build()
    with pytest.warns(UserWarning) if saved_as == "BertModel" else contextlib.nullcontext() as caught:
        trainer(limit_val_batches=1).validate(module, datamodule=bert_data, verbose=False)
    fresh = [str(w.message) for w in (caught or []) if "no trained MLM head" in str(w.message)]
    if saved_as == "BertModel":
        assert len(fresh) == 1 and "cls.predictions." in fresh[0] and "few-shot fit" in fresh[0]
        assert module.fresh_head_warning() is not None
        module.on_train_start()  # few-shot fine-tuning trains the head: nothing to warn about any more
        assert module.fresh_head_warning() is None
    else:
        assert module.fresh_head_warning() is None
