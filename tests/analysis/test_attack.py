"""The TextFooler-style attack (Jin et al. 2020 §3) and the FreeLB defence (Zhu et al. 2020, Alg. 1): word importance
by deletion (eq. 2), synonyms of the word's main part of speech, the similarity constraint, the substitution rule,
the queries counted; FreeLB's ascent steps and its loss; a tiny classifier attacked end to end, every adversarial
text re-checked to flip it, and a FreeLB fit through ``main.py``."""
import json

import pytest
import torch
import yaml

from ptm_app.analysis.attack import Victim, attack_one, importance, pos_synonyms
from ptm_app.data.sources.wordnet import Synset
from ptm_app.training.adversarial import FreeLB, freelb_loss
from tests.conftest import run_main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_importance_is_textfoolers_eq2():
    p0 = torch.tensor([0.8, 0.2])
    deleted = torch.tensor([[0.6, 0.4],    # label kept: 0.8 - 0.6
                            [0.3, 0.7]])   # label flips to 1: 0.8 - 0.3 + (0.7 - 0.2)
    assert importance(p0, deleted, gold=0).tolist() == pytest.approx([0.2, 1.0])


def test_synonyms_come_from_the_words_main_part_of_speech():
    synsets = [Synset("1-a", "adj", 1, ("good", "beneficial"), "", ()),
               Synset("2-a", "adj", 1, ("good", "estimable"), "", ()),
               Synset("3-n", "noun", 1, ("good", "goodness"), "", ()),
               Synset("4-v", "verb", 1, ("run", "go", "operate"), "", ())]
    synonyms, main = pos_synonyms(synsets)
    assert main["good"] == "adj"  # two adjective synsets, one noun
    assert synonyms["good"] == {"adj": ("beneficial", "estimable"), "noun": ("goodness",)}
    from ptm_app.analysis.attack import candidates
    assert candidates("Good!", synonyms, main, 50) == ["Beneficial!", "Estimable!"]  # never the noun 'goodness'
    assert candidates("the", synonyms, main, 50) == []


class RuleVictim(Victim):
    """P(pos) = 0.9 with 'good' in the text, 0.6 with 'fine', else 0.2."""

    def __init__(self):
        super().__init__(None, 32, 8)

    def probs(self, texts):
        self.queries += len(texts)
        pos = [0.9 if "good" in t.lower() else 0.6 if "fine" in t.lower() else 0.2 for t in texts]
        return torch.tensor([[p, 1 - p] for p in pos])


SYNONYMS = {"good": {"adj": ("fine", "bad")}, "film": {"noun": ("movie",)}, "fine": {"adj": ("good",)}}
MAIN = {"good": "adj", "film": "noun", "fine": "adj"}


def test_the_attack_flips_with_the_most_similar_candidate_and_counts_its_queries():
    victim = RuleVictim()
    similar = lambda original, changed: [0.95 if "fine" in x else 0.9 for x in changed]  # noqa: E731
    out = attack_one(victim, "a good film", 0, SYNONYMS, MAIN, similar, 0.84, 50, 1.0)
    # 1 query for the text, 2 deletions (good, film), then 'good' first (deleting it drops P(pos) most): its two
    # candidates both flip?  'fine' keeps pos (0.6), 'bad' flips (0.2): 'bad' is the only flip
    assert out.status == "success" and out.adversarial == "a bad film" and out.changes == [("good", "bad")]
    assert out.queries == 1 + 2 + 2 and out.perturbed == pytest.approx(1 / 3)


def test_the_similarity_constraint_can_stop_the_attack():
    victim = RuleVictim()
    strict = lambda original, changed: [0.5 for _ in changed]  # noqa: E731
    out = attack_one(victim, "a good film", 0, SYNONYMS, MAIN, strict, 0.84, 50, 1.0)
    assert out.status == "failure" and out.changes == [] and out.queries == 3  # no candidate was ever queried
    wrong = attack_one(RuleVictim(), "a good film", 1, SYNONYMS, MAIN, strict, 0.84, 50, 1.0)
    assert wrong.status == "skipped" and wrong.queries == 1  # misclassified already: not attacked


class CountVictim(RuleVictim):
    """P(pos) = 0.3 + 0.3 per 'good'."""

    def probs(self, texts):
        self.queries += len(texts)
        pos = [min(0.9, 0.3 + 0.3 * t.lower().split().count("good")) for t in texts]
        return torch.tensor([[p, 1 - p] for p in pos])


def test_without_a_flip_only_a_candidate_that_lowers_the_gold_probability_is_kept():
    synonyms, main = {"good": {"adj": ("fine",)}}, {"good": "adj"}
    same = lambda original, changed: [1.0] * len(changed)  # noqa: E731
    out = attack_one(CountVictim(), "good good", 0, synonyms, main, same, 0.84, 50, 1.0)
    # the first 'good' -> 'fine' lowers P(pos) 0.9 -> 0.6 (kept, no flip); the second flips it (0.3)
    assert out.status == "success" and out.adversarial == "fine fine" and len(out.changes) == 2
    assert out.queries == 1 + 2 + 1 + 1
    stuck = attack_one(RuleVictim(), "good good", 0, synonyms, main, same, 0.84, 50, 1.0)
    # with RuleVictim one 'good' left keeps P(pos) at 0.9: no change lowers it, none is kept
    assert stuck.status == "failure" and stuck.adversarial == "good good" and stuck.changes == []
    budget = attack_one(CountVictim(), "good good", 0, synonyms, main, same, 0.84, 50, 0.5)
    assert budget.status == "failure" and len(budget.changes) == 1  # max_perturbed: one word of two


# -- FreeLB -----------------------------------------------------------------------------------------------
def _toy():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 2)
    batch = {"input_ids": torch.tensor([[1, 2, 3], [4, 5, 0]]), "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
             "labels": torch.tensor([0, 1])}

    def loss_of(inputs):
        x = inputs["inputs_embeds"] if "inputs_embeds" in inputs else emb(inputs["input_ids"])
        pooled = (x * inputs["attention_mask"][..., None]).sum(1) / inputs["attention_mask"].sum(1, keepdim=True)
        return torch.nn.functional.cross_entropy(head(pooled), batch["labels"])
    return emb, head, batch, loss_of


def test_one_freelb_step_from_zero_is_the_plain_loss():
    emb, head, batch, loss_of = _toy()
    plain = loss_of(batch)
    assert float(freelb_loss(FreeLB(steps=1, init_mag=0.0), emb, batch, loss_of)) == pytest.approx(float(plain))


def test_freelb_ascends_by_step_size_per_example_and_averages_the_losses():
    emb, head, batch, loss_of = _toy()
    cfg = FreeLB(steps=2, step_size=0.5, init_mag=0.0)
    total = freelb_loss(cfg, emb, batch, loss_of)
    word = emb(batch["input_ids"]).detach().requires_grad_(True)
    first = loss_of({**batch, "inputs_embeds": word})
    (g,) = torch.autograd.grad(first / 2, word)
    delta = 0.5 * g / g.flatten(1).norm(dim=1)[:, None, None] * batch["attention_mask"][..., None]
    second = loss_of({**batch, "inputs_embeds": word + delta})
    assert float(total) == pytest.approx(float((first + second) / 2), rel=1e-6)
    assert float(second) > float(first)  # an ascent step: the perturbed loss is higher
    assert delta.flatten(1).norm(dim=1).tolist() == pytest.approx([0.5, 0.5], rel=1e-5)
    from ptm_app.training.adversarial import _project
    big, small = torch.randn(2, 3, 4) * 10, torch.full((2, 3, 4), 0.001)
    assert _project(big, 0.1).flatten(1).norm(dim=1).tolist() == pytest.approx([0.1, 0.1], rel=1e-5)
    assert torch.equal(_project(small, 0.1), small)  # inside the ball: unchanged
    with pytest.raises(Exception, match="steps must be >= 1"):
        FreeLB(steps=0)


# -- end to end ----------------------------------------------------------------------------------------------
def keyword_rows(n, seed):
    """Random words with 'good' (pos) or 'bad' (neg) among them: a classifier that learns the keyword."""
    import random

    from tests.conftest import WORDS
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 4))]
        words.insert(rng.randrange(len(words) + 1), "good" if i % 2 else "bad")
        rows.append({"id": f"k{seed}-{i}", "text": " ".join(words), "label": "pos" if i % 2 else "neg"})
    return rows


def test_attack_and_a_freelb_fit_end_to_end(tmp_path, capsys, monkeypatch):
    from tests.conftest import TINY_BERT, write_jsonl
    root = tmp_path / "data"
    for split, seed, n in (("train", 1, 64), ("validation", 2, 16), ("test", 3, 12)):
        write_jsonl(root / f"{split}.jsonl", keyword_rows(n, seed))
    cfg = {"seed_everything": 3,
           "trainer": {"max_steps": 32, "accelerator": "cpu", "val_check_interval": 16, "enable_progress_bar": False,
                       "enable_model_summary": False, "log_every_n_steps": 1},
           "model": {"class_path": "SequenceClassificationModule",
                     "init_args": {"backbone_config": TINY_BERT, "optim": {"lr": 6e-3, "warmup": 0}}},
           "data": {"class_path": "TaskDataModule", "init_args": {
               "source": str(root), "batch_size": 8, "max_length": 32,
               "tokenizer": {"train": "wordpiece", "vocab_size": 120, "min_frequency": 1}}}}
    config = tmp_path / "cls.yaml"
    config.write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", str(config), "--run_name", "cls"], runs) == 0
    cfg["model"]["init_args"]["adversarial"] = {"steps": 2, "step_size": 0.1, "init_mag": 0.1}
    freelb = tmp_path / "freelb.yaml"
    freelb.write_text(yaml.safe_dump(cfg))
    assert run_main(["fit", "--config", str(freelb), "--run_name", "freelb"], runs) == 0
    ckpt = torch.load(runs / "freelb" / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    assert ckpt["hyper_parameters"]["adversarial"] == {"steps": 2, "step_size": 0.1, "init_mag": 0.1, "max_norm": 0.0}

    out = tmp_path / "attack"
    page = tmp_path / "docs" / "results" / "page.md"  # the table goes between its markers, the picture to docs/figures
    (tmp_path / "docs" / "figures").mkdir(parents=True)
    page.parent.mkdir()
    page.write_text("intro\n")
    capsys.readouterr()
    assert run_main(["attack", "--runs", str(runs / "cls"), "--output_dir", str(out), "--readme", str(page)], runs) == 2
    assert capsys.readouterr().err.strip().endswith("has no '<!-- attack:start -->' and '<!-- attack:end -->' lines; "
                                                    "add them where the table goes")  # refused before any attack
    assert not out.exists()
    page.write_text("intro\n<!-- attack:start -->\nold\n<!-- attack:end -->\nafter\n")
    assert run_main(["attack", "--runs", str(runs / "cls"), str(runs / "freelb"), "--examples", "null",
                     "--similarity", "0.5", "--output_dir", str(out), "--readme", str(page)], runs) == 0
    assert page.read_text() == ("intro\n<!-- attack:start -->\n" + (out / "attack.md").read_text().rstrip()
                                + "\n<!-- attack:end -->\nafter\n")
    assert (tmp_path / "docs" / "figures" / "attack.png").read_bytes() == (out / "attack.png").read_bytes()
    rows = json.loads((out / "attack.json").read_text())
    assert [r["model"] for r in rows] == ["cls", "freelb"]
    from ptm_app.analysis.robustness import load_classifier, predict
    for row in rows:
        assert row["examples"] == 12 and row["attacked"] == round(row["clean_accuracy"] * 12)
        assert row["attacked_accuracy"] == pytest.approx(row["clean_accuracy"] * (1 - row["success_rate"]))
    flips = [json.loads(line) for line in (out / "examples.jsonl").read_text().splitlines()]
    assert flips and sum(r["success_rate"] > 0 for r in rows) >= 1
    for flip in flips:  # every adversarial text really changes the classifier's label
        model = load_classifier(runs / flip["model"] / "checkpoints" / "best.ckpt")
        labels = list(model.hparams.labels)
        before, after = predict(model, [flip["text"], flip["adversarial"]], None, 32, 2)
        assert labels[before] == flip["label"] and labels[after] != flip["label"]
        assert 0 < len(flip["changes"]) <= 0.3 * len(flip["text"].split()) + 1
    assert (out / "attack.png").stat().st_size > 1000

    # progress.json: an attack cut short goes on where it stopped, to the same table; other settings start afresh
    table = json.loads((out / "attack.json").read_text())
    assert sorted(len(v) for v in json.loads((out / "progress.json").read_text())["runs"].values()) == [12, 12]
    from ptm_app.analysis import attack as attack_module

    class Cut(Exception):
        pass

    real, state = attack_module.attack_one, {"calls": 0, "cut_at": None}

    def counted(*args, **kwargs):
        if state["calls"] == state["cut_at"]:
            raise Cut
        state["calls"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(attack_module, "attack_one", counted)
    argv = ["attack", "--runs", str(runs / "cls"), str(runs / "freelb"), "--examples", "null", "--similarity", "0.5",
            "--output_dir", str(out)]
    capsys.readouterr()
    assert run_main(argv, runs) == 0 and state["calls"] == 0  # all 24 outcomes kept: nothing attacked again
    assert capsys.readouterr().out.count("12 of 12 examples attacked before, reused") == 2
    assert json.loads((out / "attack.json").read_text()) == table
    (out / "progress.json").unlink()
    state["cut_at"] = 17  # cut short in the second classifier's examples
    with pytest.raises(Cut):
        run_main(argv, runs)
    assert sorted(len(v) for v in json.loads((out / "progress.json").read_text())["runs"].values()) == [5, 12]
    state.update(calls=0, cut_at=None)
    assert run_main(argv, runs) == 0 and state["calls"] == 7
    assert json.loads((out / "attack.json").read_text()) == table
    state["calls"] = 0
    assert run_main([*argv, "--max_candidates", "20"], runs) == 0 and state["calls"] == 24

    qa = tmp_path / "not_a_classifier.ckpt"
    torch.save({"state_dict": {}, "ptm_app": {"module": "ptm_app.adaptation.qa.QuestionAnsweringModule"}}, qa)
    capsys.readouterr()
    assert run_main(["attack", "--runs", str(qa), "--output_dir", str(tmp_path / "x")], runs) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a fine-tuned sequence classifier" in err


def test_a_freelb_fit_resumes_exactly(tmp_path):
    """FreeLB draws its random start from torch's generator: a paused run resumed from last.ckpt logs the same
    losses as the run done whole."""
    from tests.conftest import TINY_BERT, assert_resumes_exactly, write_jsonl
    root = tmp_path / "data"
    for split, seed, n in (("train", 1, 32), ("validation", 2, 8)):
        write_jsonl(root / f"{split}.jsonl", keyword_rows(n, seed))
    cfg = {"seed_everything": 3,
           "trainer": {"max_steps": 4, "accelerator": "cpu", "val_check_interval": 2, "enable_progress_bar": False,
                       "enable_model_summary": False, "log_every_n_steps": 1},
           "model": {"class_path": "SequenceClassificationModule",
                     "init_args": {"backbone_config": TINY_BERT, "optim": {"lr": 6e-3, "warmup": 0},
                                   "adversarial": {"steps": 2, "init_mag": 0.5}}},
           "data": {"class_path": "TaskDataModule", "init_args": {
               "source": str(root), "batch_size": 8, "max_length": 32,
               "tokenizer": {"train": "wordpiece", "vocab_size": 120, "min_frequency": 1}}}}
    path = tmp_path / "freelb.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert_resumes_exactly(["fit", "--config", str(path)], tmp_path / "runs", stop=2, steps=4)
