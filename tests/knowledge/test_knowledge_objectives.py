"""Knowledge through the objective (issue 16 part A): ERNIE (Baidu) phrase/entity masking, SenseBERT's supersense
loss, LIBERT's lexical relation pairs; the prepared brown_spans and wordnet_lexrel sets; the recipes' bad input."""
import json
import math
import random
from collections import Counter
from pathlib import Path

import pytest
import torch

from ptm_app.data import IGNORE_INDEX
from ptm_app.errors import PtmError
from ptm_app.data.corruption.knowledge import knowledge_mask, knowledge_units
from ptm_app.main import main
from ptm_app.backbones.sense_input import allowed_from_masks
from ptm_app.knowledge.sensebert import Supersense, allowed_senses_losses
from ptm_app.objectives.targets import MaskedLM
from tests.conftest import TINY_BERT, assert_resumes_exactly, run_main, write_jsonl

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"
MASK = 0

# "he ate ice cream in new york with anna smith ." as WordPiece-like tokens:
#   0 he | 1 ate | 2 ice | 3 cream | 4 in | 5 new | 6 yo 7 ##rk | 8 with | 9 ann 10 ##a | 11 smith | 12 .
TOKENS = ["he", "ate", "ice", "cream", "in", "new", "yo", "##rk", "with", "ann", "##a", "smith", "."]
IDS = list(range(100, 113))
STARTS = [not t.startswith("##") for t in TOKENS]
PHRASES = [-1, -1, 0, 0, -1, 1, 1, 1, -1, -1, -1, -1, -1]  # ice cream, new york (WordNet multiword lemmas)
ENTITIES = [-1, -1, -1, -1, -1, 0, 0, 0, -1, 1, 1, 1, -1]  # new york, anna smith (proper-noun runs)


def masked_words(labels: list[int]) -> str:
    return " ".join(t if y != IGNORE_INDEX else "_" for t, y in zip(TOKENS, labels))


def test_units_per_level_golden():
    assert knowledge_units(STARTS, PHRASES, ENTITIES, "word") == [
        (0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 8), (8, 9), (9, 11), (11, 12), (12, 13)]
    assert knowledge_units(STARTS, PHRASES, ENTITIES, "phrase") == [
        (0, 1), (1, 2), (2, 4), (4, 5), (5, 8), (8, 9), (9, 11), (11, 12), (12, 13)]
    assert knowledge_units(STARTS, PHRASES, ENTITIES, "entity") == [
        (0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 8), (8, 9), (9, 12), (12, 13)]
    assert knowledge_units(STARTS, PHRASES, ENTITIES, "mixed") == [
        (0, 1), (1, 2), (2, 4), (4, 5), (5, 8), (8, 9), (9, 12), (12, 13)]


def test_phrase_and_entity_masks_golden():
    """Budget round(0.25 * 13) = 3 tokens, all [MASK]: a three-token unit fits only alone."""
    kw = dict(mask_token_id=MASK, vocab_size=200, rate=0.25, mask_ratio=1.0, random_ratio=0.0)
    ids, labels = knowledge_mask(IDS, STARTS, PHRASES, ENTITIES, random.Random(5), level="phrase", **kw)
    assert masked_words(labels) == "_ _ ice cream in _ _ _ _ _ _ _ _"  # the phrase whole, then one word
    assert ids == IDS[:2] + [MASK, MASK, MASK] + IDS[5:]
    ids, labels = knowledge_mask(IDS, STARTS, PHRASES, ENTITIES, random.Random(1), level="entity", **kw)
    assert masked_words(labels) == "_ _ _ _ _ new yo ##rk _ _ _ _ _"  # an entity fills the budget alone
    ids, labels = knowledge_mask(IDS, STARTS, PHRASES, ENTITIES, random.Random(0), level="entity", **kw)
    assert masked_words(labels) == "_ _ _ _ _ _ _ _ _ ann ##a smith _"
    assert ids == IDS[:9] + [MASK] * 3 + IDS[12:]


def test_units_are_whole_or_absent_over_many_draws():
    kw = dict(mask_token_id=MASK, vocab_size=200, rate=0.25, mask_ratio=0.8, random_ratio=0.1)
    rng = random.Random(0)
    for level, runs in (("phrase", [(2, 4), (5, 8)]), ("entity", [(5, 8), (9, 12)]), ("word", [(6, 8), (9, 11)])):
        seen = Counter()
        for _ in range(300):
            _, labels = knowledge_mask(IDS, STARTS, PHRASES, ENTITIES, rng, level=level, **kw)
            chosen = [y != IGNORE_INDEX for y in labels]
            for a, b in runs:
                assert len(set(chosen[a:b])) == 1, (level, labels)  # the whole unit or none of it
                seen[(a, b)] += chosen[a]
            assert 1 <= sum(chosen) <= 3
        assert all(seen[r] > 20 for r in runs), (level, seen)  # and each unit does get masked


def test_masking_statistics_budget_and_80_10_10():
    """Random 120-token sequences with words of 1-3 sub-tokens, phrases and entities: the masked share is the 15 %
    budget (a little under: a unit that would overflow it is skipped), 80/10/10 per token, no unit split."""
    rng = random.Random(7)
    picked = total = masked = randomised = 0
    for draw in range(400):
        starts = [True]
        while len(starts) < 120:
            starts += [True] + [False] * rng.choice([0, 0, 0, 1, 2])
        starts = starts[:120]
        words = [i for i, s in enumerate(starts) if s] + [120]
        phrase, entity = [-1] * 120, [-1] * 120
        for k in range(0, len(words) - 8, 9):  # a 2-word phrase, then a 3-word entity, every 9 words
            phrase[words[k]:words[k + 2]] = [k] * (words[k + 2] - words[k])
            entity[words[k + 4]:words[k + 7]] = [k] * (words[k + 7] - words[k + 4])
        ids = [rng.randrange(5, 1000) for _ in range(120)]
        level = ("word", "phrase", "entity", "mixed")[draw % 4]
        out, labels = knowledge_mask(ids, starts, phrase, entity, rng, level=level, mask_token_id=1,
                                     vocab_size=1000, random_ids=list(range(5, 1000)))
        chosen = [y != IGNORE_INDEX for y in labels]
        for a, b in knowledge_units(starts, phrase, entity, level):
            assert len(set(chosen[a:b])) == 1
        assert sum(chosen) <= 18  # round(0.15 * 120)
        picked += sum(chosen)
        total += 120
        masked += sum(o == 1 for o, c in zip(out, chosen) if c)
        randomised += sum(o != i and o != 1 for o, i, c in zip(out, ids, chosen) if c)
    assert 0.14 <= picked / total <= 0.15
    assert masked / picked == pytest.approx(0.8, abs=0.02)
    assert randomised / picked == pytest.approx(0.1, abs=0.02)


# -- SenseBERT ---------------------------------------------------------------------------------------------------
def test_allowed_senses_loss_hand_computed():
    """p = softmax(log [1, 2, 3]) = [1/6, 2/6, 3/6].  Word 1: A = {0, 1}: allowed loss -log(1/6 + 2/6) = log 2,
    regulariser -(log 1/6 + log 2/6) / 2 = (log 6 + log 3) / 2.  Word 2: A = {2}: both -log(1/2) = log 2."""
    logits = torch.log(torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]))
    allowed = allowed_from_masks(torch.tensor([0b011, 0b100]), num_supersenses=3)
    assert allowed.tolist() == [[True, True, False], [False, False, True]]
    loss, reg = allowed_senses_losses(logits, allowed)
    assert loss.item() == pytest.approx(math.log(2), rel=1e-6)
    assert reg.item() == pytest.approx(((math.log(6) + math.log(3)) / 2 + math.log(2)) / 2, rel=1e-6)
    assert allowed_from_masks(torch.tensor([1 << 44]))[0].nonzero().tolist() == [[44]]  # adj.ppl, the last file


def test_sense_aware_input_adds_the_allowed_supersense_embeddings():
    """SenseBERT §3.2: the input vector is (W + S M) x + p, M a table over the vocabulary.  Token 11 (A = {0, 2})
    gets W x + S_0 + S_2; where the collator put [MASK] (12 -> 4) the input is W [MASK] only; token 13 (no WordNet
    word) W x; S is the supersense head's output matrix, so both sides train it."""
    from ptm_app.objectives.mlm import MaskedLMModule

    module = MaskedLMModule(backbone_config={**TINY_BERT, "vocab_size": 50},
                            targets=[MaskedLM(), Supersense(sense_input=True)])
    module.configure_model()
    S = module.target_layers["supersense"].classifier.weight  # [45, H]: row s = the embedding of supersense s
    with torch.no_grad():
        S.copy_(torch.arange(45 * 32, dtype=torch.float32).reshape(45, 32) / 1000)
    module.word_senses[11], module.word_senses[12] = 0b101, 0b010
    batch = {"input_ids": torch.tensor([[2, 11, 4, 13, 3]]), "attention_mask": torch.ones(1, 5, dtype=torch.long),
             "labels": torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 12, IGNORE_INDEX, IGNORE_INDEX]])}
    inputs = module.model_inputs(batch)
    assert "input_ids" not in inputs
    W = module.backbone.get_input_embeddings().weight
    expected = W[batch["input_ids"][0]].clone()
    expected[1] += S[0] + S[2]
    torch.testing.assert_close(inputs["inputs_embeds"][0], expected)
    assert (inputs["inputs_embeds"][0, 1] - W[11]).abs().sum() > 1.0  # the addition is not negligible
    # the same token kept in place by the 10 % rule (input = label) keeps its senses
    kept = {**batch, "input_ids": torch.tensor([[2, 11, 12, 13, 3]])}
    torch.testing.assert_close(module.model_inputs(kept)["inputs_embeds"][0, 2], W[12] + S[1])
    module.model_inputs(batch)["inputs_embeds"].sum().backward()
    assert S.grad[[0, 2]].abs().sum() > 0 and S.grad[1].abs().sum() == 0  # only the visible senses' rows
    plain = MaskedLMModule(backbone_config={**TINY_BERT, "vocab_size": 50}, targets=[MaskedLM(), Supersense()])
    plain.configure_model()
    assert "inputs_embeds" not in plain.model_inputs(batch)


def test_m_is_the_senses_of_tokens_that_stand_alone_as_words():
    """Two sentences of ids 1 2 ##3 4 | 4 2: token 2 begins a longer word in the first (its annotation belongs to
    the word 2##3, not to 2) and stands alone in the second; 4 ends both sentences; 1 appears once."""
    from ptm_app.backbones.sense_input import vocabulary_senses

    word_start = [True, True, True, False, True, True]  # id 3 is a continuation piece
    ids, senses = [1, 2, 3, 4, 4, 2], [0b1, 0b10, 0, 0b100, 0b100, 0b1000]
    table = vocabulary_senses(ids, senses, [0, 4, 6], word_start, 6)
    assert table.tolist() == [0, 0b1, 0b1000, 0, 0b100, 0]


# -- prepared sets -------------------------------------------------------------------------------------------------
def needs(name: str) -> Path:
    if not (DATA / name / "manifest.json").is_file():
        pytest.skip(f"{name} is not prepared (python main.py data prepare {name})")
    return DATA / name


def test_brown_spans_golden_first_sentence():
    first = json.loads((needs("brown_spans") / "train.jsonl").open().readline())
    text = first["text"]
    assert first["id"] == "ca01:1"
    assert [text[a:b] for a, b in first["phrases"]] == ["Grand Jury", "primary election", "took place"]
    assert [text[a:b] for a, b in first["entities"]] == ["Fulton", "Atlanta's"]
    senses = {text[a:b]: mask for a, b, mask in first["senses"]}
    assert "The" not in senses and "investigation" in senses  # function words are not in WordNet
    assert allowed_from_masks(torch.tensor([senses["jury"] if "jury" in senses else senses["Jury"]])).sum() >= 1
    from ptm_app.data.sources.wordnet import LEXNAMES

    names = {LEXNAMES[k] for k in allowed_from_masks(torch.tensor([senses["investigation"]]))[0].nonzero().flatten().tolist()}
    assert names == {"noun.act", "noun.cognition"}  # investigation, probe (act) / inquiry (cognition)


def test_lexrel_split_has_no_pair_in_two_splits_and_is_balanced():
    root = needs("wordnet_lexrel")
    owner, counts = {}, Counter()
    for split in ("train", "validation", "test"):
        for line in (root / f"{split}.jsonl").open():
            rec = json.loads(line)
            pair = tuple(sorted((rec["text"], rec["text_pair"])))
            assert owner.setdefault(pair, split) == split, (pair, owner[pair], split)
            counts[rec["label"], rec["relation"]] += 1
    assert counts["related", "synonym"] + counts["related", "hypernym"] == counts["unrelated", "none"]
    assert counts["related", "synonym"] > 50_000 and counts["related", "hypernym"] > 100_000


# -- corpus spans through the data module to the collator -------------------------------------------------------
SENTENCE = "we ate ice cream in new york with anna smith ."


def span_corpus(root: Path, n: int = 24) -> Path:
    """Sentences whose phrases / entities / senses are given as character spans (the brown_spans format)."""
    rows = []
    for i in range(n):
        text = SENTENCE if i % 2 == 0 else "the cat sat on the mat in new york ."
        phrase = [[7, 16], [20, 28]] if i % 2 == 0 else [[27, 35]]
        entity = [[20, 28], [34, 44]] if i % 2 == 0 else [[27, 35]]
        senses = [[3, 6, 1 << 34], [7, 10, 1 << 13]] if i % 2 == 0 else [[4, 7, 1 << 5]]
        rows.append({"id": f"d{i // 4}:{i}", "doc": f"d{i // 4}", "text": text, "phrases": phrase,
                     "entities": entity, "senses": senses})
    write_jsonl(root / "train.jsonl", rows)
    write_jsonl(root / "validation.jsonl", rows[:8])
    return root


def connected(source: Path, **model_args):
    from ptm_app.data.contract import connect
    from ptm_app.data.datamodules import PretrainDataModule
    from ptm_app.data.tokenizer import TokenizerSpec
    from ptm_app.objectives.mlm import MaskedLMModule

    dm = PretrainDataModule(TokenizerSpec(train="wordpiece", vocab_size=120, min_frequency=1), source=str(source),
                            max_length=32, batch_size=4)
    model = MaskedLMModule(backbone_config=TINY_BERT, **model_args)
    connect(model, dm)
    dm.prepare_data()
    dm.setup("fit")
    return dm, model


def test_char_spans_become_token_units_and_masks_keep_them_whole(tmp_path):
    dm, model = connected(span_corpus(tmp_path / "corpus"), targets=[MaskedLM(masking="knowledge"), Supersense()])
    assert model.example_format == {"knowledge_spans", "supersenses"}
    tok = dm.tokenizer
    item = dm.datasets["train"][0]
    words = tok.convert_ids_to_tokens(item["input_ids"].tolist())
    # two sentences of d0 packed in one block (16 + 12 tokens fit in 30)
    phrase, entity = item["phrase_ids"].tolist(), item["entity_ids"].tolist()
    first = words.index("ice")
    assert phrase[first] == phrase[first + 1] >= 0 and words[first + 1] == "cream"
    york = [i for i, w in enumerate(words) if w == "new"]
    assert len(york) == 2 and all(entity[i] == entity[i + 1] >= 0 and phrase[i] >= 0 for i in york)
    assert entity[york[0]] != entity[york[1]]  # two entities, two units
    assert phrase[0] == entity[0] == -1 and words[0] == "[CLS]"
    senses = item["senses"].tolist()
    assert senses[words.index("ate")] == 1 << 34 and senses[words.index("cat")] == 1 << 5
    assert sum(s != 0 for s in senses) == 3  # ate, ice / cat: one mask per annotated word

    collate = model.make_collator(tok, seed=3)
    batch = collate([dm.datasets["train"][(0, k)] for k in range(len(dm.datasets["train"]))])
    assert set(batch["knowledge_views"]) == {"word", "phrase", "entity"}
    for level, kind in (("phrase", "phrase_ids"), ("entity", "entity_ids")):
        labels, units = batch["knowledge_views"][level]["labels"], batch[kind]
        for row in range(len(labels)):
            for u in set(units[row].tolist()) - {-1}:
                chosen = labels[row][units[row] == u] != IGNORE_INDEX
                assert chosen.all() or not chosen.any()
    assert torch.equal(batch["input_ids"], batch["knowledge_views"]["word"]["input_ids"])

    model.mlm.knowledge_levels = "mixed"  # one draw with entities, phrases and words as units
    mixed = model.make_collator(tok, seed=3)([dm.datasets["train"][(0, k)] for k in range(4)])
    assert "knowledge_views" not in mixed
    for row in range(4):
        chosen = mixed["labels"][row] != IGNORE_INDEX
        for kind in ("entity_ids", "phrase_ids"):
            for u in set(mixed[kind][row].tolist()) - {-1}:
                inside = chosen[mixed[kind][row] == u]
                assert inside.all() or not inside.any() or kind == "phrase_ids" and (mixed["entity_ids"][row][
                    mixed[kind][row] == u] >= 0).any()  # a phrase overlapping an entity follows the entity


def test_staged_levels_follow_the_step_fractions():
    from ptm_app.objectives.mlm import MaskedLMModule

    model = MaskedLMModule(backbone_config=TINY_BERT, targets=[MaskedLM(masking="knowledge", knowledge_stages=[0.25, 0.5])])

    class Trainer:  # what knowledge_stage reads of Lightning's trainer
        max_steps, estimated_stepping_batches, global_step = 8, 8, 0

    model._trainer = Trainer()
    stages = []
    for step in range(8):
        Trainer.global_step = step
        stages.append(model.knowledge_stage())
    assert stages == [0, 0, 1, 1, 2, 2, 2, 2]  # word, phrase from 2/8, entity from 4/8
    with pytest.raises(Exception, match="knowledge_stages"):
        MaskedLMModule(backbone_config=TINY_BERT, targets=[MaskedLM(masking="knowledge", knowledge_stages=[0.7, 0.2])])


def test_knowledge_level_options_are_refused_where_they_would_be_ignored():
    from ptm_app.objectives.mlm import MaskedLMModule

    with pytest.raises(PtmError, match="apply to masking: knowledge only"):
        MaskedLMModule(backbone_config=TINY_BERT, targets=[MaskedLM(masking="whole_word", knowledge_stages=[0.25, 0.5])])
    with pytest.raises(PtmError, match="apply to masking: knowledge only"):
        MaskedLMModule(backbone_config=TINY_BERT, targets=[MaskedLM(masking="span", knowledge_levels="mixed")])
    with pytest.raises(PtmError, match="remove knowledge_stages"):
        MaskedLMModule(backbone_config=TINY_BERT, targets=[MaskedLM(masking="knowledge", knowledge_levels="mixed",
                                                                    knowledge_stages=[0.1, 0.2])])
    defaults = MaskedLMModule(backbone_config=TINY_BERT, targets=[MaskedLM(masking="whole_word")])  # what every checkpoint holds
    assert defaults.mlm.knowledge_levels == "staged" and defaults.mlm.knowledge_stages == (1 / 3, 2 / 3)


def bad_line(argv, capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and err[-1] == errors[0], err
    return errors[0]


def test_knowledge_masking_on_a_corpus_without_spans_is_one_line(tiny_corpus, capsys):
    line = bad_line(["fit", "--config", str(ROOT / "configs" / "knowledge" / "ernie_entity_mlm_brown.yaml"),
                     "--data.init_args.source", str(tiny_corpus), "--trainer.max_steps", "1"], capsys)
    assert "no 'phrases' span field" in line and "data prepare brown_spans" in line and "train.jsonl:1" in line


# -- the recipes at tiny size: train, resume exactly, export ------------------------------------------------------
def recipe_args(recipe: str, corpus: Path, tmp_path: Path) -> list[str]:
    """The shipped recipe at tiny size, its examples read from the span corpus ``corpus`` (brown_spans as shipped:
    test_configs), KEPLER's graph a hand-built one, LIBERT's pairs hand-built ones."""
    from tests.cli.test_recipes import tiny_args

    config = ROOT / "configs" / "knowledge" / f"{recipe}.yaml"
    if recipe == "libert_mlm_lexrel_brown":  # two streams: the control's sentence blocks and the pairs
        args = libert_args(corpus, pair_files(tmp_path / "pairs"), "alternate", 6)
        return [*args, "--data.init_args.corpus", json.dumps({"source": str(corpus), "examples": "knowledge_spans",
                                                              "max_length": 32})]
    args = ["fit", *tiny_args(config, steps=6), "--data.init_args.source", str(corpus)]
    if recipe == "kepler_mlm_transe_brown":
        from tests.knowledge.test_kepler import make_graph

        args += ["--data.init_args.graph", str(make_graph(tmp_path / "kg")), "--data.init_args.kg_batch_size", "5",
                 "--data.init_args.description_length", "12"]
    return args


@pytest.mark.parametrize("recipe", ["bert_wwm_mlm_brown", "ernie_entity_mlm_brown", "sensebert_mlm_supersense_brown", "libert_mlm_lexrel_brown", "kepler_mlm_transe_brown"])
def test_recipe_resumes_exactly_and_exports(recipe, tmp_path):
    """Each pre-training of the knowledge table, from its shipped config: 6 steps, paused at 3 and resumed to the
    same losses, exported to a plain masked LM."""
    from transformers import AutoModelForMaskedLM

    from tests.cli.test_recipes import losses

    runs = tmp_path / "runs"
    corpus = span_corpus(tmp_path / "corpus", n=96)
    args = recipe_args(recipe, corpus, tmp_path)
    assert_resumes_exactly(args, runs, stop=3, steps=6)  # ERNIE: stages change at steps 2 and 4
    rows = (runs / "full" / "logs" / "metrics.csv").read_text()
    assert ("train/knowledge_stage" in rows) == (recipe == "ernie_entity_mlm_brown")
    if recipe == "ernie_entity_mlm_brown":  # stages [0.33, 0.66] of 6 steps: word, word, phrase, phrase, entity, entity
        import csv

        stages = {int(r["step"]): float(r["train/knowledge_stage"])
                  for r in csv.DictReader(open(runs / "full" / "logs" / "metrics.csv")) if r.get("train/knowledge_stage")}
        assert [stages[s] for s in range(6)] == [0, 0, 1, 1, 2, 2]
    assert ("val/supersense_acc" in rows) == (recipe == "sensebert_mlm_supersense_brown")
    out = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(runs / "full"), "--output_dir", str(out)], runs) == 0
    exported = AutoModelForMaskedLM.from_pretrained(out).eval()
    assert exported.config.hidden_size == TINY_BERT["hidden_size"]
    assert sorted(losses(runs / "full")) == list(range(6))
    if recipe == "sensebert_mlm_supersense_brown":
        assert_sense_input_is_folded_into_the_export(runs / "full" / "checkpoints" / "last.ckpt", exported, out)


def assert_sense_input_is_folded_into_the_export(ckpt, exported, out):
    """SenseBERT's M is the corpus's single-token words with their A(w) (word pieces and specials: none); the
    plain exported model given token ids computes what the module computed from (W + S M) x, and its MLM decoder
    is still W (untied from the folded input table)."""
    from transformers import AutoTokenizer

    from ptm_app.objectives.mlm import MaskedLMModule

    module = MaskedLMModule.load_from_checkpoint(ckpt, weights_only=True).eval()
    tok = AutoTokenizer.from_pretrained(out)
    senses = {w: int(module.word_senses[tok.convert_tokens_to_ids(w)]) for w in ("ate", "ice", "cat", "cream")}
    assert senses == {"ate": 1 << 34, "ice": 1 << 13, "cat": 1 << 5, "cream": 0}
    assert module.word_senses.count_nonzero() == 3
    enc = tok(["we ate ice cream in new york .", "the cat sat on the mat ."], return_tensors="pt", padding=True)
    batch = {**enc, "labels": torch.full_like(enc["input_ids"], IGNORE_INDEX)}
    with torch.no_grad():
        inputs = module.model_inputs(batch)
        assert "inputs_embeds" in inputs
        trained = module.backbone(**inputs).logits
        plain = exported(**enc).logits
        torch.testing.assert_close(plain, trained, atol=1e-5, rtol=1e-5)
        W = module.backbone.get_input_embeddings().weight
        assert torch.equal(exported.get_output_embeddings().weight, W)
        assert not torch.equal(exported.get_input_embeddings().weight, W)
    assert exported.config.tie_word_embeddings is False


# -- LIBERT ---------------------------------------------------------------------------------------------------------
def pair_files(root: Path) -> Path:
    from tests.conftest import WORDS

    rng = random.Random(0)
    rows = [{"id": f"p{i}", "text": rng.choice(WORDS), "text_pair": rng.choice(WORDS),
             "label": ("related", "unrelated")[i % 2], "relation": ("synonym", "none")[i % 2]} for i in range(40)]
    write_jsonl(root / "train.jsonl", rows[:32])
    write_jsonl(root / "validation.jsonl", rows[32:])
    return root


def libert_args(tiny_corpus: Path, pairs: Path, combine: str, steps: int) -> list[str]:
    return ["fit", "--config", str(ROOT / "configs" / "knowledge" / "libert_mlm_lexrel_brown.yaml"),
            "--model.init_args.backbone_config", json.dumps(TINY_BERT),
            "--data.init_args.tokenizer", json.dumps({"train": "wordpiece", "vocab_size": 200, "min_frequency": 1}),
            "--data.init_args.corpus", json.dumps({"source": str(tiny_corpus), "max_length": 32}),
            "--data.init_args.pairs", json.dumps({"source": str(pairs), "text_pair_field": "text_pair",
                                                   "max_length": 16}),
            "--data.init_args.combine", combine, "--data.init_args.batch_size", "4",
            "--trainer.precision", "32-true", "--trainer.max_steps", str(steps), "--trainer.val_check_interval", "3",
            "--trainer.limit_val_batches", "2", "--trainer.log_every_n_steps", "1",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


def test_libert_pair_format_golden(tiny_corpus, tmp_path):
    from ptm_app.data.contract import connect
    from ptm_app.knowledge.libert_data import MLMPairsDataModule
    from ptm_app.data.tokenizer import TokenizerSpec
    from ptm_app.knowledge.libert import LexicalRelationMLMModule

    pairs = tmp_path / "pairs"
    write_jsonl(pairs / "train.jsonl", [{"id": "a", "text": "cat", "text_pair": "animal", "label": "related"},
                                        {"id": "b", "text": "sat", "text_pair": "songs", "label": "unrelated"}])
    write_jsonl(pairs / "validation.jsonl", [{"id": "c", "text": "cat", "text_pair": "mat", "label": "unrelated"}])
    dm = MLMPairsDataModule(TokenizerSpec(train="wordpiece", vocab_size=200, min_frequency=1),
                            corpus={"source": str(tiny_corpus), "max_length": 32},
                            pairs={"source": str(pairs), "text_pair_field": "text_pair"}, batch_size=2)
    model = LexicalRelationMLMModule(backbone_config=TINY_BERT)
    connect(model, dm)
    dm.prepare_data()
    dm.setup("fit")
    tok = dm.tokenizer
    collate = model.task_collator("sequence", tok)
    batch = collate([dm.pairs.datasets["train"][k] for k in range(2)])
    rows = [tok.convert_ids_to_tokens(r) for r in batch["input_ids"].tolist()]
    assert rows[0] == ["[CLS]", "cat", "[SEP]", "[UNK]", "[SEP]"]  # 'animal' is not in the tiny corpus
    assert " ".join(rows[1]) == "[CLS] sat [SEP] songs [SEP]"
    assert batch["token_type_ids"][1].tolist() == [0, 0, 0, 1, 1]  # segment B is the second word
    assert batch["labels"].tolist() == [dm.pairs.label_set().index("related"), dm.pairs.label_set().index("unrelated")]
    assert dm.pairs.label_set() == ["related", "unrelated"]


def test_libert_negatives_are_the_nearest_words_of_the_batch():
    """Lauscher et al. 2020 §3 on a hand-built batch of three positives (cat, feline) (car, auto) (happy, glad),
    2-d vectors cat (1, 0), car (0, 1), happy (.7, .7), feline (1, .1), auto (.2, 1), glad (.6, .8).  Cosines by
    hand: to feline, happy .77 > glad .68 > auto .29 > car .10; to cat, happy .71 > glad .60; to auto, glad .90 >
    happy .83; to car, glad .80 > happy .71; to glad, auto .90 > car .80; to happy, auto .83 > feline .77."""
    from ptm_app.knowledge.libert import batch_nearest_negatives

    cat, feline, car, auto, happy, glad = (1,), (2,), (3,), (4,), (5,), (6, 7)
    vectors = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.7, 0.7], [1.0, 0.1], [0.2, 1.0], [0.6, 0.8]])
    negatives = batch_nearest_negatives([cat, car, happy], [feline, auto, glad], vectors)
    assert negatives == [(happy, feline), (cat, happy), (glad, auto), (car, glad), (auto, glad), (happy, auto)]
    assert batch_nearest_negatives([cat], [feline], vectors[[0, 3]]) == []  # no other word: no negative


def test_libert_training_pairs_are_the_positives_and_their_batch_negatives():
    """The module keeps a batch's positive pairs, drops its prepared negatives and adds two nearest-in-batch
    negatives per positive, as [CLS] w1 [SEP] w2 [SEP] with segment ids; the cosine is of the input embeddings."""
    from ptm_app.data.contract import DataFacts
    from ptm_app.knowledge.libert import LexicalRelationMLMModule

    module = LexicalRelationMLMModule(backbone_config={**TINY_BERT, "vocab_size": 30})
    module.configure_model()
    module.data_facts = DataFacts(tokenizer=lambda: None, labels=lambda: ["related", "unrelated"])
    embed = module.backbone.get_input_embeddings().weight
    with torch.no_grad():  # words 10, 11 | 12, 13 | 14, 15 | 16 (the prepared negative) as in the test above
        embed[10:17] = 0.0
        for word, vector in zip(range(10, 17), ([1, 0], [1, .1], [0, 1], [.2, 1], [.7, .7], [.6, .8], [1, 0])):
            embed[word, :2] = torch.tensor(vector)
    CLS, SEP = 2, 3
    rows = [[CLS, 10, SEP, 11, SEP], [CLS, 12, SEP, 13, SEP], [CLS, 16, SEP, 10, SEP], [CLS, 14, SEP, 15, SEP]]
    batch = {"input_ids": torch.tensor(rows), "attention_mask": torch.ones(4, 5, dtype=torch.long),
             "token_type_ids": torch.tensor([[0, 0, 0, 1, 1]] * 4), "labels": torch.tensor([0, 0, 1, 0])}
    out = module.with_batch_negatives(batch)
    pairs = [(r[1], r[3]) for r in out["input_ids"].tolist()]
    assert pairs == [(10, 11), (12, 13), (14, 15), (14, 11), (10, 14), (15, 13), (12, 15), (13, 15), (14, 13)]
    assert out["labels"].tolist() == [0, 0, 0] + [1] * 6
    assert out["token_type_ids"][3].tolist() == [0, 0, 0, 1, 1]
    assert [r[0] for r in out["input_ids"].tolist()] == [CLS] * 9


@pytest.mark.parametrize("combine", ["alternate", "sum"])
def test_libert_streams_alternate_or_sum_and_resume_exactly(combine, tiny_corpus, tmp_path):
    import csv

    pairs = pair_files(tmp_path / "pairs")
    runs = tmp_path / "runs"
    assert_resumes_exactly(libert_args(tiny_corpus, pairs, combine, 6), runs, stop=3, steps=6)
    rows = list(csv.DictReader(open(runs / "full" / "logs" / "metrics.csv")))
    steps = {int(r["step"]): r for r in rows if r.get("train/loss")}
    value = lambda step, key: float(steps[step][f"train/{key}"])  # noqa: E731
    if combine == "alternate":  # mlm, pairs, mlm, pairs ...: the step's loss is that stream's
        assert [value(s, "loss") == value(s, "mlm") for s in range(6)] == [True, False] * 3
        assert all(value(s, "loss") == value(s, "lexrel") for s in (1, 3, 5))
    else:  # both in every step, the loss their sum
        for s in range(6):
            assert value(s, "loss") == pytest.approx(value(s, "mlm") + value(s, "lexrel"), rel=1e-5)
    assert any(r.get("val/lexrel_acc") for r in rows) and any(r.get("val/loss") for r in rows)
    if combine == "alternate":
        from transformers import AutoModelForMaskedLM

        out = tmp_path / "export"
        assert run_main(["export", "--ckpt_path", str(runs / "full"), "--output_dir", str(out)], runs) == 0
        assert AutoModelForMaskedLM.from_pretrained(out).config.hidden_size == TINY_BERT["hidden_size"]


def test_knowledge_recipe_without_brown_spans_prepared_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PTM_DATA_DIR", str(tmp_path / "empty_data"))
    line = bad_line(["fit", "--config", str(ROOT / "configs" / "knowledge" / "ernie_entity_mlm_brown.yaml"),
                     "--trainer.max_steps", "1"], capsys)
    assert "'brown_spans' is not prepared" in line and "python main.py data prepare brown_spans" in line


def test_bad_knowledge_settings_are_one_line(tiny_corpus, tmp_path, capsys):
    line = bad_line(["fit", "--config", str(ROOT / "configs" / "knowledge" / "ernie_entity_mlm_brown.yaml"),
                     "--model.init_args.targets", json.dumps([{"class_path": "MaskedLM", "init_args": {
                         "masking": "knowledge", "knowledge_stages": [0.7, 0.2]}}]), "--trainer.max_steps", "1"], capsys)
    assert "knowledge_stages must be two step fractions" in line
    line = bad_line(["fit", "--config", str(ROOT / "configs" / "knowledge" / "libert_mlm_lexrel_brown.yaml"),
                     "--data.init_args.pairs", json.dumps({"source": "wordnet_lexrel", "text_pair_fieldd": "x"}),
                     "--trainer.max_steps", "1"], capsys)
    assert "unknown option 'text_pair_fieldd' for TaskDataModule" in line
    line = bad_line(["fit", "--config", str(ROOT / "configs" / "knowledge" / "libert_mlm_lexrel_brown.yaml"),
                     "--data.init_args.pairs", json.dumps({"source": "wordnet_lexrel"}),
                     "--trainer.max_steps", "1"], capsys)
    assert "pairs needs text_pair_field" in line


def test_brown_spans_rules_longest_phrase_first_and_proper_noun_runs():
    from ptm_app.data.sources.brown_spans import entity_runs, entity_tag, phrase_matches, word_offsets

    phrases = {("new", "york"): "New York", ("new", "york", "city"): "New York City", ("ice", "cream"): "ice cream",
               ("cream", "cheese"): "cream cheese"}
    words = "In New York City ice cream cheese sells".split()
    assert phrase_matches(words, phrases, 3) == [(1, 4), (4, 6)]  # the longest at a position; no overlap
    assert word_offsets(["New", "York", "."]) == [(0, 3), (4, 8), (9, 10)]
    assert [entity_tag(t) for t in ("np", "np-tl", "np$", "nps-hl", "fw-np", "nn-tl", "np+bez")] == [
        True, True, True, True, False, False, True]
    assert entity_runs(["at", "np-tl", "np-tl", "nn", "np$", "."]) == [(1, 3), (4, 5)]


def test_span_blocks_pack_whole_sentences_of_one_document():
    import numpy as np

    from ptm_app.data.knowledge_spans import SpanCorpus

    lengths = [3, 4, 9, 2, 2]  # sentences; documents: [0, 1, 2] and [3, 4]
    n = sum(lengths)
    corpus = SpanCorpus(np.arange(n), np.full(n, -1), np.full(n, -1), np.zeros(n, np.int64),
                        np.concatenate([[0], np.cumsum(lengths)]), np.array([0, 3, 5]))
    # content 8: 3+4 fit, the 9-token sentence is cut 8 + 1, the second document's 2+2 fit
    assert corpus.blocks(8, [0, 1]) == [(0, 7), (7, 15), (15, 16), (16, 20)]


def test_knowledge_objectives_on_other_examples_are_one_line(tmp_path, capsys):
    corpus = span_corpus(tmp_path / "corpus")
    for recipe, word in (("ernie_entity_mlm_brown", "masking: knowledge"), ("sensebert_mlm_supersense_brown", "Supersense")):
        line = bad_line(["fit", "--config", str(ROOT / "configs" / "knowledge" / f"{recipe}.yaml"),
                         "--data.init_args.source", str(corpus), "--data.init_args.examples", "blocks",
                         "--model.init_args.backbone_config", json.dumps(TINY_BERT), "--data.init_args.max_length",
                         "32", "--trainer.max_steps", "1", "--trainer.precision", "32-true"], capsys)
        assert word in line and "remove data.init_args.examples" in line


def test_bbc_spans_keep_bbc_articles_splits_and_find_phrases():
    root = needs("bbc_spans")
    bbc = needs("bbc")
    for split in ("train", "validation", "test"):
        articles = {json.loads(line)["id"] for line in (bbc / f"{split}.jsonl").open()}
        rows = [json.loads(line) for line in (root / f"{split}.jsonl").open()]
        assert {r["doc"] for r in rows} == articles  # the paragraphs of bbc's split, article by article
    found = Counter(r["text"][a:b].lower() for r in rows for a, b in r["phrases"])
    assert found["prime minister"] > 0 and all(r["entities"] == [] for r in rows)


def test_a_sensebert_checkpoint_without_the_vocabulary_table_is_one_line():
    from ptm_app.objectives.mlm import MaskedLMModule

    module = MaskedLMModule(backbone_config={**TINY_BERT, "vocab_size": 50},
                            targets=[MaskedLM(), Supersense(sense_input=True)])
    with pytest.raises(PtmError, match="predates the vocabulary table M"):
        module.on_load_checkpoint({"state_dict": {"backbone.x": torch.zeros(1)}})
