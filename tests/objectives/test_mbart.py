"""mBART (Liu et al. 2020 §2.2): the noised input / target layout with language tokens, whole-word masking
statistics (35 % of words, Poisson(3.5) spans), the language-tagged corpora and their re-balancing, and the
pre-train → export → translate → export → generate chain at tiny size."""
import json
import random
from pathlib import Path

import pytest
import torch
import yaml

from ptm_app.data.corruption.denoising import infilling_spans, text_infilling, word_to_token_spans
from ptm_app.data.corruption.spans import whole_word_spans
from ptm_app.data.language_corpora import (LanguageCorpus, MultilingualDenoisingDataModule, language_token,
                                           language_token_id, pack, resample, sampling_counts)
from ptm_app.data.tokenizer import TokenizerSpec
from ptm_app.errors import PtmError
from ptm_app.objectives.seq2seq import MBART_DEFAULT, Seq2SeqCollator
from tests.conftest import run_main

PAD, UNK, CLS, SEP, MASK, STOP, EN, ES = 0, 1, 2, 3, 4, 5, 6, 7
CONTINUATION = frozenset(range(50, 100))  # "##" pieces: 10..49 start a word, 50..99 continue one


def mbart_collator(**kw) -> Seq2SeqCollator:
    return Seq2SeqCollator(pad_token_id=PAD, eos_token_id=SEP, mask_token_id=MASK,
                           special_ids=(PAD, UNK, CLS, SEP, MASK, EN, ES), noise="mbart", seed=7,
                           bart_noises=list(MBART_DEFAULT), full_stop_ids=(STOP,), continuation_ids=CONTINUATION, **kw)


def unpadded(batch, name, row, pad):
    values = batch[name][row].tolist()
    while values and values[-1] == pad:
        values.pop()
    return values


def test_mbart_layout_language_token_ends_the_source_starts_the_decoder_and_ends_the_target():
    """Liu et al. Fig. 1: encoder `noised </s> <lang>`, decoder in `<lang> clean </s>`, target `clean </s> <lang>`."""
    text = [[10, 11, 50, STOP, 12, 13, 14, 15, STOP, 16, 51, 17, 18, 19, 20, 21, STOP],
            [30, 31, 32, STOP, 33, 34, 60, 61, 35, STOP]]
    examples = [{"input_ids": torch.tensor(t), "language_token_id": lang, "key": (0, i)}
                for i, (t, lang) in enumerate(zip(text, (EN, ES)))]
    batch = mbart_collator()(examples)
    for row, (clean, lang) in enumerate(zip(text, (EN, ES))):
        source, labels = unpadded(batch, "input_ids", row, PAD), unpadded(batch, "labels", row, -100)
        decoder = unpadded(batch, "decoder_input_ids", row, PAD)
        assert source[-2:] == [SEP, lang] and lang not in source[:-1]
        assert labels == clean + [SEP, lang]  # the clean text: the permutation and masks are undone
        assert decoder == [lang] + clean + [SEP] and decoder[1:] == labels[:-1]  # teacher forcing, <lang> first
        assert MASK in source  # 35 % of the words went
        kept = [t for t in source[:-2] if t != MASK]
        assert sorted(kept) == sorted(t for t in kept)  # nothing invented
        assert set(kept) <= set(clean)
    # the same keys draw the same noise (resume); other keys another
    assert torch.equal(batch["input_ids"], mbart_collator()(examples)["input_ids"])
    moved = [{**e, "key": (1, i)} for i, e in enumerate(examples)]
    assert not torch.equal(batch["input_ids"], mbart_collator()(moved)["input_ids"])


def test_golden_whole_word_infilling_replaces_whole_words_by_one_mask():
    # words: [10] [11 50] [12] [13 51 52] [14] [15]; the word span (1, 4) = tokens 1..6 ("11 ##50 12 13 ##51 ##52")
    ids = [10, 11, 50, 12, 13, 51, 52, 14, 15]
    words = whole_word_spans([t not in CONTINUATION for t in ids])
    assert words == [(0, 1), (1, 3), (3, 4), (4, 7), (7, 8), (8, 9)]
    assert word_to_token_spans([(1, 4)], words, len(ids)) == [(1, 7)]
    assert word_to_token_spans([(6, 6), (0, 0)], words, len(ids)) == [(9, 9), (0, 0)]  # inserted masks
    # seed 4: two whole words ("13 ##51 ##52 14") go under one mask; counted in tokens, the same draws cut "11 ##50"
    words_kept = text_infilling(ids, random.Random(4), rate=0.35, poisson_lambda=3.5, mask_token_id=MASK,
                                continuation_ids=CONTINUATION)
    assert words_kept == [10, 11, 50, 12, MASK, 15]
    assert text_infilling(ids, random.Random(4), rate=0.35, poisson_lambda=3.5, mask_token_id=MASK) == \
        [MASK, 50, 12, MASK]  # token-level (BART): "##50" is left without its word


def test_mbart_masking_statistics_35_percent_of_words_in_poisson_3_5_spans():
    rng = random.Random(0)
    masked_words = total_words = span_words = n_spans = 0
    for _ in range(600):
        ids = [rng.choice(range(10, 50)) if rng.random() < 0.7 else rng.choice(range(50, 100)) for _ in range(160)]
        ids[0] = 10  # starts a word
        starts = [t not in CONTINUATION for t in ids]
        words = whole_word_spans(starts)
        state = rng.getstate()
        spans = infilling_spans(len(words), rng, rate=0.35, poisson_lambda=3.5)
        rng.setstate(state)
        out = text_infilling(ids, rng, rate=0.35, poisson_lambda=3.5, mask_token_id=MASK,
                             continuation_ids=CONTINUATION)
        assert out.count(MASK) == len(spans)  # one mask per span, empty spans included
        token_spans = word_to_token_spans(spans, words, len(ids))
        assert len(out) == len(ids) - sum(e - s for s, e in token_spans) + len(spans)
        assert all(s == len(ids) or starts[s] for s, _ in token_spans)  # spans start at word starts
        assert all(e == len(ids) or starts[e] for _, e in token_spans)  # ... and end at one
        masked_words += sum(e - s for s, e in spans)
        total_words += len(words)
        span_words += sum(e - s for s, e in spans)
        n_spans += len(spans)
    assert abs(masked_words / total_words - 0.35) < 0.01  # Liu et al. §2.2: 35 % of the words
    assert abs(span_words / n_spans - 3.5) < 0.1  # Poisson(3.5) span lengths (in words)


def test_mbart_noise_refuses_untagged_text_and_t5_refuses_tagged_text():
    plain = [{"input_ids": torch.tensor([10, 11, 12, 13]), "key": (0, 0)}]
    with pytest.raises(PtmError, match="noise: mbart needs language-tagged text"):
        mbart_collator()(plain)
    tagged = [{**plain[0], "language_token_id": EN}]
    mass = Seq2SeqCollator(pad_token_id=PAD, eos_token_id=SEP, mask_token_id=MASK, special_ids=(PAD,), noise="mass")
    with pytest.raises(PtmError, match="noise=mass does not take language-tagged examples"):
        mass(tagged)


# -- the corpora ------------------------------------------------------------------------------------------
def test_language_sampling_rates_follow_the_exponent():
    counts = sampling_counts({"en": 900, "sw": 100}, alpha=0.5)  # q = p^0.5 / sum: 0.75 / 0.25
    assert counts == {"en": 750, "sw": 250}
    assert sampling_counts({"en": 900, "sw": 100}, alpha=1.0) == {"en": 900, "sw": 100}  # natural shares
    assert sampling_counts({"en": 500, "es": 500}, alpha=0.7) == {"en": 500, "es": 500}
    assert resample([3, 4, 5], 7, random.Random(0)).count(3) in (2, 3)  # whole copies + a draw
    assert len(set(resample(list(range(10)), 4, random.Random(0)))) == 4  # down-sampling: no repeats
    with pytest.raises(PtmError, match="sampling_alpha=0"):
        sampling_counts({"en": 1}, alpha=0)
    assert pack([[1, 2], [3, 4, 5], [6] * 7, [8]], 5) == [[1, 2, 3, 4, 5], [6] * 5, [6, 6, 8]]
    assert language_token("en") == "[en]"
    with pytest.raises(PtmError, match="language code"):
        language_token("e n")


def write_bible(root: Path, n_train: int = 60, n_other: int = 12) -> Path:
    """A tiny verse-aligned set in bible_en_es's layout (fields en, es; train / validation / test)."""
    en = "the lord spoke to moses and said . go to the people of israel and tell them".split()
    es = "el señor habló a moisés y dijo . ve al pueblo de israel y diles".split()
    rng = random.Random(1)
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("validation", n_other), ("test", n_other)):
        with open(root / f"{split}.jsonl", "w") as fh:
            for i in range(n):
                k = rng.randrange(3, 9)
                start = rng.randrange(0, 6)
                fh.write(json.dumps({"id": f"{split}.{i}", "en": " ".join(en[start:start + k]).capitalize() + ".",
                                     "es": " ".join(es[start:start + k]).capitalize() + "."}) + "\n")
    return root


def test_corpora_get_language_tokens_packed_instances_and_rebalanced_training(tmp_path):
    data = write_bible(tmp_path / "bible")
    (tmp_path / "sw.txt").write_text("\n\n".join(f"habari ya asubuhi {i}" for i in range(15)))
    corpora = [{"language": "en", "source": str(data), "text_field": "en"},
               {"language": "es", "source": str(data), "text_field": "es"},
               {"language": "sw", "source": str(tmp_path / "sw.txt"), "text_field": "text"}]
    dm = MultilingualDenoisingDataModule(corpora, TokenizerSpec(train="wordpiece", vocab_size=200, min_frequency=1),
                                         max_length=16, sampling_alpha=0.3, batch_size=4, holdout=0.2)
    dm.prepare_data()
    dm.setup()
    tok = dm.load_tokenizer()
    ids = {code: language_token_id(tok, code) for code in ("en", "es", "sw")}
    assert len(set(ids.values())) == 3 and all(tok.convert_ids_to_tokens(i) == f"[{c}]" for c, i in ids.items())
    assert tok("hola [es] x", add_special_tokens=False)["input_ids"].count(ids["es"]) == 1  # kept whole
    item = dm.datasets["train"][(0, 0)]
    assert set(item) == {"input_ids", "language_token_id", "key"} and item["language_token_id"] in ids.values()
    sizes = {}
    for split in ("train", "validation"):
        for ids_, lang in dm.datasets[split].instances:
            assert 0 < len(ids_) <= 14  # max_length - [SEP] - <lang>
    natural = {}
    for corpus in dm.corpora:  # the instances before re-balancing: sw (no validation file) lost its holdout
        files = dm.corpus_files(corpus)
        natural[corpus.language] = len(dm._instances(files["train"], corpus.text_field, None))
    sizes = {c: round(share * len(dm.datasets["train"])) for c, share in dm.language_shares("train").items()}
    expected = sampling_counts({"en": natural["en"], "es": natural["es"], "sw": natural["sw"] - 1}, 0.3)
    assert sizes == expected and sizes["sw"] > natural["sw"]  # the small language is up-sampled
    assert "test" in dm.datasets and {lang for _, lang in dm.datasets["test"].instances} == {ids["en"], ids["es"]}


def test_corpora_bad_input_is_one_line(tmp_path):
    data = write_bible(tmp_path / "bible", 8, 2)
    spec = TokenizerSpec(train="wordpiece", vocab_size=100, min_frequency=1)
    with pytest.raises(PtmError, match="names a language twice"):
        MultilingualDenoisingDataModule([{"language": "en", "source": str(data), "text_field": "en"}] * 2, spec)
    with pytest.raises(PtmError, match="corpora is empty"):
        MultilingualDenoisingDataModule([], spec)
    corpora = [{"language": "en", "source": str(data), "text_field": "en"}]
    minilm = MultilingualDenoisingDataModule(corpora, TokenizerSpec(pretrained="minilm"))
    with pytest.raises(PtmError, match=r"language 'en': the tokenizer has no token \[en\]"):
        minilm.load_tokenizer()


@pytest.fixture(scope="module")
def bible(tmp_path_factory) -> Path:
    return write_bible(tmp_path_factory.mktemp("mt") / "bible")


TINY = {"model_type": "bart", "d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
        "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "max_position_embeddings": 64}
TRAINER = {"accelerator": "cpu", "devices": 1, "log_every_n_steps": 1, "num_sanity_val_steps": 0,
           "enable_progress_bar": False, "enable_model_summary": False, "max_steps": 4, "val_check_interval": 2,
           "check_val_every_n_epoch": None, "limit_val_batches": 1}


def test_pretrain_export_translate_export_generate_with_language_tokens(bible, tmp_path):
    runs = tmp_path / "runs"
    shipped = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs/pretrain/mbart_dae_bible.yaml").read_text())
    pre = {"seed_everything": 1, "trainer": TRAINER,
           "model": {"class_path": "Seq2SeqDenoisingModule",
                     "init_args": {**shipped["model"]["init_args"], "backbone_config": TINY}},
           "data": {"class_path": "MultilingualDenoisingDataModule",
                    "init_args": {**shipped["data"]["init_args"], "max_length": 32, "batch_size": 4,
                                  "tokenizer": {"train": "wordpiece", "vocab_size": 200, "min_frequency": 1,
                                                "lowercase": False},
                                  "corpora": [{"language": c, "source": str(bible), "text_field": c}
                                              for c in ("en", "es")]}}}
    (tmp_path / "pre.yaml").write_text(yaml.safe_dump(pre))
    assert run_main(["fit", "--config", str(tmp_path / "pre.yaml"), "--run_name", "mbart"], runs) == 0
    export = runs / "mbart" / "export"
    assert run_main(["export", "--ckpt_path", str(runs / "mbart"), "--output_dir", str(export)], runs) == 0

    mt = {"seed_everything": 1, "trainer": TRAINER,
          "model": {"class_path": "GenerationModule",
                    "init_args": {"backbone": str(export), "source_language": "en", "target_language": "es",
                                  "bleu_lowercase": False, "max_new_tokens": 8}},
          "data": {"class_path": "Seq2SeqDataModule",
                   "init_args": {"source": str(bible), "source_field": "en", "target_field": "es",
                                 "tokenizer": {"pretrained": str(export)}, "max_source_length": 24,
                                 "max_target_length": 24, "batch_size": 4}}}
    (tmp_path / "mt.yaml").write_text(yaml.safe_dump(mt))
    assert run_main(["fit", "--config", str(tmp_path / "mt.yaml"), "--run_name", "mt"], runs) == 0
    assert run_main(["test", "--config", str(tmp_path / "mt.yaml"), "--run_name", "mt", "--ckpt_path", "last"],
                    runs) == 0
    metrics = json.loads((runs / "mt" / "summary.json").read_text())["metrics"]
    assert {"test/bleu", "test/chrf", "test/loss"} <= set(metrics)
    out = runs / "mt" / "export"
    assert run_main(["export", "--ckpt_path", str(runs / "mt"), "--output_dir", str(out)], runs) == 0

    from ptm_app.inference.generate import decoding_settings, generate, prompt_inputs
    from ptm_app.inference.loading import load_for_inference

    loaded = load_for_inference(str(out))
    tok = loaded.tokenizer
    en, es = tok.convert_tokens_to_ids("[en]"), tok.convert_tokens_to_ids("[es]")
    assert (loaded.module.hparams.source_language, loaded.module.hparams.target_language) == ("en", "es")
    inputs = prompt_inputs(loaded, "The lord spoke to moses.")
    assert inputs["input_ids"][0, -2:].tolist() == [tok.sep_token_id, en]  # source [SEP] [en]
    settings = decoding_settings(loaded, 8, False, None, None, None, 1)
    assert settings["decoder_start_token_id"] == es  # the decoder starts from [es]
    text = generate(str(out), "The lord spoke to moses.", max_new_tokens=8, stream=False)
    with torch.no_grad():
        raw = loaded.model.generate(**inputs, max_new_tokens=8, do_sample=False, num_beams=1,
                                    decoder_start_token_id=es, eos_token_id=tok.sep_token_id,
                                    pad_token_id=tok.pad_token_id)
    assert raw[0, 0].item() == es
    assert text == tok.decode(raw[0], skip_special_tokens=True)


def test_random_init_control_is_the_mbart_architecture_with_the_same_settings():
    root = Path(__file__).resolve().parents[2] / "configs"
    mbart, pre, scratch = (yaml.safe_load((root / p).read_text()) for p in
                           ("pretrain/mbart_dae_bible.yaml", "adapt/mbart_full_bible_en_es.yaml", "adapt/bart_scratch_bible_en_es.yaml"))
    assert scratch["model"]["init_args"]["backbone_config"] == mbart["model"]["init_args"]["backbone_config"]
    same = {k: v for k, v in pre["model"]["init_args"].items() if k != "backbone"}
    assert {k: v for k, v in scratch["model"]["init_args"].items() if k != "backbone_config"} == same
    assert scratch["data"] == pre["data"] and scratch["trainer"] == pre["trainer"]


def test_mbart_collator_settings_from_the_module():
    from ptm_app.data.tokenizer import load_tokenizer
    from ptm_app.objectives.seq2seq import Seq2SeqDenoisingModule

    tok = load_tokenizer(TokenizerSpec(pretrained="minilm"))
    made = Seq2SeqDenoisingModule(backbone_config=TINY, noise="mbart").make_collator(tok)
    assert made.bart_noises == MBART_DEFAULT and made.noise == "mbart"
    assert tok.convert_tokens_to_ids("##s") in made.continuation_ids and tok.convert_tokens_to_ids("the") \
        not in made.continuation_ids
    misplaced = [{"name": "token_masking", "rate": 0.1, "whole_words": True}]
    with pytest.raises(PtmError, match="whole_words is a text_infilling setting, not token_masking's"):
        Seq2SeqDenoisingModule(backbone_config=TINY, noise="bart", bart_noises=misplaced).make_collator(tok)
