"""Translation language modelling (XLM §3.3): pair format, masking of both halves, the XLM loss, data errors,
and the xlm_tlm_bible.yaml recipe end to end (fit, export, reload, exact resume)."""
import csv
import json
import re
from pathlib import Path

import pytest
import torch

from ptm_app.data.corruption import mlm_mask
from ptm_app.data.collators import TLMCollator
from ptm_app.data.parallel import ParallelDataModule, ParallelDataset, fit_pair, tlm_example
from ptm_app.data.tokenizer import TokenizerSpec
from ptm_app.errors import PtmError
from ptm_app.objectives.tlm import TranslationLMModule
from tests.conftest import run_main

ROOT = Path(__file__).resolve().parents[2]
TINY_XLM = {"model_type": "xlm", "emb_dim": 32, "n_layers": 2, "n_heads": 2, "max_position_embeddings": 64}
SPECIAL = (0, 1, 2, 3, 4)  # pad unk cls sep mask
V = 60
PAIRS = [  # English–French, written for these tests (numbers, days, colours)
    ("I am happy", "je suis heureux"), ("I am tired", "je suis fatigué"), ("you are happy", "tu es heureux"),
    ("we are here", "nous sommes ici"), ("the cat is black", "le chat est noir"),
    ("the dog is white", "le chien est blanc"), ("the car is red", "la voiture est rouge"),
    ("the sky is blue", "le ciel est bleu"), ("the grass is green", "l'herbe est verte"),
    ("the sun is yellow", "le soleil est jaune"), ("today is Monday", "aujourd'hui c'est lundi"),
    ("today is Tuesday", "aujourd'hui c'est mardi"), ("today is Wednesday", "aujourd'hui c'est mercredi"),
    ("today is Thursday", "aujourd'hui c'est jeudi"), ("today is Friday", "aujourd'hui c'est vendredi"),
    ("today is Saturday", "aujourd'hui c'est samedi"), ("today is Sunday", "aujourd'hui c'est dimanche"),
    ("I have one cat", "j'ai un chat"), ("I have two dogs", "j'ai deux chiens"),
    ("I have three books", "j'ai trois livres"), ("she has four sisters", "elle a quatre sœurs"),
    ("he has five brothers", "il a cinq frères"), ("we have six apples", "nous avons six pommes"),
    ("they have seven houses", "ils ont sept maisons"), ("I see eight birds", "je vois huit oiseaux"),
    ("you see nine stars", "tu vois neuf étoiles"), ("ten children are playing", "dix enfants jouent"),
    ("how are you", "comment vas-tu"), ("good morning", "bonjour"), ("good evening", "bonsoir"),
    ("thank you very much", "merci beaucoup"), ("see you tomorrow", "à demain"),
    ("the house is big", "la maison est grande"), ("the garden is small", "le jardin est petit"),
    ("I like the red flowers", "j'aime les fleurs rouges"), ("she likes the blue sea", "elle aime la mer bleue"),
    ("he reads a green book", "il lit un livre vert"), ("we eat white bread", "nous mangeons du pain blanc"),
    ("the black cat sleeps", "le chat noir dort"),
    ("the little dog runs in the garden", "le petit chien court dans le jardin"),
]
WORDPIECE = TokenizerSpec(train="wordpiece", vocab_size=300, min_frequency=1)
# xlm_tlm_bible.yaml reads the prepared English-Spanish Bible; these tests give it their own en-fr pairs file
EN_FR = ["--data.init_args.source_field", "src", "--data.init_args.target_field", "tgt",
         "--data.init_args.target_lang", "fr"]


def write_tsv(path: Path, pairs) -> Path:
    path.write_text("src\ttgt\n" + "".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def parallel(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("parallel")
    (root / "train.en").write_text("".join(s + "\n" for s, _ in PAIRS), encoding="utf-8")
    (root / "train.fr").write_text("".join(t + "\n" for _, t in PAIRS), encoding="utf-8")
    return {"tsv": write_tsv(root / "en-fr.tsv", PAIRS), "en": root / "train.en", "fr": root / "train.fr"}


def toy_tokenizer(where: Path) -> Path:
    """A fixed, case-sensitive WordPiece vocabulary holding the survey example's words."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "How", "are", "you", "Comment", "vas", "-", "tu"]
    backend = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]").save_pretrained(where)
    return where


def test_golden_format_of_the_survey_tlm_example(tmp_path):
    """Liu Table 2: `How [MASK] you [SEP] [MASK] vas-tu` → `are Comment`, with XLM's language and position ids."""
    tsv = write_tsv(tmp_path / "golden.tsv", [("How are you", "Comment vas-tu")])
    dm = ParallelDataModule(TokenizerSpec(pretrained=str(toy_tokenizer(tmp_path / "toy"))), source_file=str(tsv),
                            swap_probability=0.0)
    dm.prepare_data()
    dm.setup("fit")
    tok, ex = dm.tokenizer, dm.datasets["train"][(0, 0)]
    tokens = tok.convert_ids_to_tokens(ex["input_ids"].tolist())
    assert tokens == ["[CLS]", "How", "are", "you", "[SEP]", "Comment", "vas", "-", "tu", "[SEP]"]
    assert ex["langs"].tolist() == [0] * 5 + [1] * 5
    assert ex["position_ids"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]  # reset at the target sentence

    chosen = torch.tensor([t in ("are", "Comment") for t in tokens])
    ids, labels = mlm_mask(ex["input_ids"], chosen, mask_token_id=tok.mask_token_id, vocab_size=len(tok),
                           generator=torch.Generator().manual_seed(0), mlm_probability=1.0, mask_ratio=1.0,
                           random_ratio=0.0)
    assert tok.convert_ids_to_tokens(ids.tolist()) == ["[CLS]", "How", "[MASK]", "you", "[SEP]", "[MASK]", "vas",
                                                       "-", "tu", "[SEP]"]
    assert tok.convert_ids_to_tokens(labels[labels != -100].tolist()) == ["are", "Comment"]

    swapped = ParallelDataset(dm.datasets["train"].pairs, [0], cls_id=tok.cls_token_id, sep_id=tok.sep_token_id,
                              max_length=32, seed=0, swap_probability=1.0)[(0, 0)]
    assert tok.convert_ids_to_tokens(swapped["input_ids"].tolist()) == [
        "[CLS]", "Comment", "vas", "-", "tu", "[SEP]", "How", "are", "you", "[SEP]"]
    assert swapped["langs"].tolist() == [1] * 6 + [0] * 4
    assert swapped["position_ids"].tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2, 3]


def test_truncation_cuts_the_longer_sentence_first():
    assert fit_pair(5, 4, 13) == (5, 4)
    assert fit_pair(20, 3, 13) == (10, 3)
    assert fit_pair(30, 25, 13) == (7, 6) and fit_pair(25, 30, 13) == (6, 7)
    ex = tlm_example(list(range(10, 40)), [50, 51], (0, 1), cls_id=2, sep_id=3, max_length=16)
    assert len(ex["input_ids"]) == 16 and ex["input_ids"][-3:].tolist() == [50, 51, 3]
    assert ex["position_ids"].tolist() == list(range(13)) + [0, 1, 2]


def random_pairs(n: int, epoch: int = 0) -> list[dict]:
    gen = torch.Generator().manual_seed(3)
    out = []
    for i in range(n):
        a, b = (torch.randint(5, V, (int(torch.randint(20, 30, (1,), generator=gen)),), generator=gen).tolist()
                for _ in range(2))
        out.append({**tlm_example(a, b, (i % 2, 1 - i % 2), cls_id=2, sep_id=3, max_length=64), "key": (epoch, i)})
    return out


def collator(**kw) -> TLMCollator:
    return TLMCollator(pad_token_id=0, mask_token_id=4, special_ids=SPECIAL, vocab_size=V, seed=1, **kw)


def test_masks_land_in_both_sentences_never_on_specials_and_follow_the_keys():
    examples = random_pairs(256)
    batch = collator()(examples)
    original = torch.nn.utils.rnn.pad_sequence([e["input_ids"] for e in examples], batch_first=True)
    selected = batch["labels"] != -100
    special = torch.isin(original, torch.tensor(SPECIAL))  # [CLS], both [SEP]s and the padding
    assert not selected[special].any() and torch.equal(batch["input_ids"][special], original[special])
    assert torch.equal(batch["labels"][selected], original[selected])
    rate = selected.sum() / (~special).sum()
    assert abs(rate - 0.15) < 0.02
    assert abs((batch["input_ids"][selected] == 4).float().mean() - 0.8) < 0.05
    in_first, in_second = ((selected & (batch["langs"] == lang)).any(1) for lang in (0, 1))
    assert (in_first & in_second).float().mean() > 0.9  # most pairs have masked tokens in both sentences
    padded = ~batch["attention_mask"].bool()
    assert (batch["langs"][padded] == 0).all() and (batch["position_ids"][padded] == 0).all()
    assert torch.equal(batch["position_ids"][0, : len(examples[0]["position_ids"])], examples[0]["position_ids"])

    again = collator()(random_pairs(256))
    assert torch.equal(again["labels"], batch["labels"]) and torch.equal(again["input_ids"], batch["input_ids"])
    assert not torch.equal(collator()(random_pairs(256, epoch=1))["labels"], batch["labels"])


def test_xlm_takes_langs_and_positions_and_its_loss_is_masked_cross_entropy():
    torch.manual_seed(0)
    module = TranslationLMModule(backbone_config={**TINY_XLM, "vocab_size": V, "n_langs": 2}).build().eval()
    assert type(module.backbone).__name__ == "XLMWithLMHeadModel"
    batch = collator()(random_pairs(8))
    inputs = module.model_inputs(batch)
    assert set(inputs) == {"input_ids", "attention_mask", "langs", "position_ids"}
    with torch.no_grad():
        out = module.backbone(**inputs, labels=batch["labels"])
        selected = batch["labels"] != -100
        manual = torch.nn.functional.cross_entropy(out.logits[selected], batch["labels"][selected])
        assert torch.allclose(out.loss, manual, atol=1e-6)
        assert torch.allclose(module._losses(batch)["mlm"], manual, atol=1e-6)
        for name, other in (("langs", 1 - inputs["langs"]), ("position_ids", torch.zeros_like(inputs["position_ids"]))):
            changed = module.backbone(**{**inputs, name: other}).logits
            assert not torch.allclose(changed[selected], out.logits[selected]), name


def test_languages_map_onto_the_backbones_language_ids():
    module = TranslationLMModule(backbone_config={**TINY_XLM, "vocab_size": V, "n_langs": 2,
                                                  "lang2id": {"fr": 0, "en": 1}}).build()
    assert module._language_ids(["en", "fr"]) == [1, 0]  # the data's en (0) is the backbone's language 1
    module.language_ids = [1, 0]
    batch = collator()(random_pairs(2))
    assert torch.equal(module.model_inputs(batch)["langs"], 1 - batch["langs"])
    for languages, problem in ((["en", "de"], "no language id for ['de']"), (None, "needs parallel sentence pairs")):
        with pytest.raises(PtmError, match=re.escape(problem)):
            module._language_ids(languages)
    one = TranslationLMModule(backbone_config={**TINY_XLM, "vocab_size": V, "n_langs": 1}).build()
    with pytest.raises(PtmError, match="n_langs=1"):  # XLM would silently skip its language embeddings
        one._language_ids(["en", "fr"])


def test_two_files_and_one_tsv_give_the_same_pairs_with_a_stable_holdout(parallel, tmp_path):
    two = ParallelDataModule(WORDPIECE, source_file=str(parallel["en"]), target_file=str(parallel["fr"]), holdout=0.1)
    two.prepare_data()
    two.setup("fit")
    tok = two.tokenizer  # one vocabulary trained on both languages: no word of either side is unknown
    assert two.languages == ["en", "fr"]
    assert tok.unk_token_id not in {i for s, t in PAIRS for i in tok(s + " " + t)["input_ids"]}
    tok.save_pretrained(tmp_path / "tok")  # the same tokenizer for the one-file layout
    one = ParallelDataModule(TokenizerSpec(pretrained=str(tmp_path / "tok")), source_file=str(parallel["tsv"]),
                             holdout=0.1)
    one.prepare_data()
    one.setup("fit")
    train, val = one.datasets["train"], one.datasets["validation"]
    assert len(train) == 36 and len(val) == 4 and not set(train.index) & set(val.index)
    assert train.index == two.datasets["train"].index
    for ours, theirs, key in ((train, two.datasets["train"], (0, 0)), (train, two.datasets["train"], (3, 7)),
                              (val, two.datasets["validation"], 2)):
        assert all(torch.equal(ours[key][k], theirs[key][k]) for k in ("input_ids", "langs", "position_ids"))
    firsts = [int(train[(epoch, i)]["langs"][0]) for epoch in range(10) for i in range(len(train))]
    assert abs(sum(firsts) / len(firsts) - 0.5) < 0.08  # the French sentence comes first half of the time


def test_misaligned_files_are_one_line_naming_both_files(tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\nthree\n", encoding="utf-8")
    (tmp_path / "b.fr").write_text("un\ndeux\n", encoding="utf-8")
    dm = ParallelDataModule(WORDPIECE, source_file=str(tmp_path / "a.en"), target_file=str(tmp_path / "b.fr"))
    with pytest.raises(PtmError) as err:
        dm.prepare_data()
    message = str(err.value)
    assert "\n" not in message and "a.en has 3 lines" in message and "b.fr has 2" in message


def test_malformed_tsv_line_is_reported_as_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.tsv"
    bad.write_text("src\ttgt\nI am happy\tje suis heureux\ngood morning\tbonjour\textra\n", encoding="utf-8")
    code = run_main(["fit", "--config", str(ROOT / "configs/pretrain/xlm_tlm_bible.yaml"), "--data.init_args.source_file",
                     str(bad), *EN_FR, "--trainer.enable_progress_bar", "false"], tmp_path)
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and err[-1] == errors[0], err  # one line, and the last thing said
    assert errors[0].startswith(f"error: {bad}:3: more columns than the header")


def test_xlm_recipe_runs_exports_and_reloads(parallel, tmp_path):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    quick = ["--trainer.max_steps", "3", "--trainer.val_check_interval", "3", "--trainer.limit_val_batches", "2",
             "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    data = ["--data.init_args.source_file", str(parallel["tsv"]), *EN_FR,
            "--data.init_args.batch_size", "8"]  # 5 batches/epoch
    assert run_main(["fit", "--config", str(ROOT / "configs/pretrain/xlm_tlm_bible.yaml"), *data, *quick], tmp_path) == 0
    run = tmp_path / "xlm_tlm_bible"
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3

    out = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(run), "--output_dir", str(out)], tmp_path) == 0
    hf = AutoModelForMaskedLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "XLMWithLMHeadModel"
    assert hf.config.n_langs == 2 and hf.config.lang2id == {"en": 0, "fr": 1} and not hf.config.causal
    tok = AutoTokenizer.from_pretrained(out)
    assert (hf.config.pad_index, hf.config.mask_index) == (tok.pad_token_id, tok.mask_token_id)

    module = TranslationLMModule.load_from_checkpoint(run / "checkpoints" / "last.ckpt").eval()
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    examples = [tlm_example(ids(s), ids(t), (0, 1), cls_id=tok.cls_token_id, sep_id=tok.sep_token_id, max_length=64)
                for s, t in PAIRS[:3]]
    batch = module.make_collator(tok).pad_batch([{**e, "key": i} for i, e in enumerate(examples)])
    inputs = module.model_inputs(batch)
    with torch.no_grad():
        assert torch.equal(module.backbone(**inputs).logits, hf(**inputs).logits)


def test_xlm_recipe_resumes_exactly(parallel, tmp_path):
    """Masks and side swaps are drawn from the sample keys, so a paused run continues with the same losses."""

    def losses(run: Path) -> dict[int, float]:
        rows = csv.DictReader(open(run / "logs" / "metrics.csv"))
        return {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}

    args = ["fit", "--config", str(ROOT / "configs/pretrain/xlm_tlm_bible.yaml"), "--model.init_args.backbone_config",
            json.dumps(TINY_XLM), "--data.init_args.source_file", str(parallel["tsv"]), *EN_FR,
            "--data.init_args.batch_size", "8", "--data.init_args.max_length", "32", "--trainer.precision", "32-true",
            "--trainer.max_steps", "8", "--trainer.val_check_interval", "4", "--trainer.limit_val_batches", "1",
            "--trainer.log_every_n_steps", "1", "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false"]
    assert run_main([*args, "--run_name", "full"], tmp_path) == 0
    assert run_main([*args, "--run_name", "part", "--stop_at_step", "3"], tmp_path) == 0
    assert run_main([*args, "--run_name", "part", "--ckpt_path", "last"], tmp_path) == 0
    full, part = losses(tmp_path / "full"), losses(tmp_path / "part")
    assert sorted(full) == sorted(part) == list(range(8))  # 5 batches per epoch: the resumed run crosses an epoch
    assert all(part[step] == pytest.approx(full[step], rel=1e-5, abs=1e-6) for step in range(3, 8))
