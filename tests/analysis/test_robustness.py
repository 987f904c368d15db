"""Robustness: the perturbations are seeded, do what they say and hit their rates; a tiny classifier trained here
is evaluated end to end on perturbed copies of its test set; a rate outside [0, 1] is one line."""
import json
import random

import pytest

from tests.cli.test_report import classifier_config
from tests.conftest import WORDS, run_main

TYPOS = ("typo_swap", "typo_drop", "typo_insert", "typo_replace")


def _texts(n=200, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 30))) for _ in range(n)]


@pytest.mark.parametrize("kind", [*TYPOS, "word_dropout", "synonym"])
@pytest.mark.parametrize("rate", [0.05, 0.1, 0.2])
def test_perturbations_are_seeded_and_hit_their_rate(kind, rate):
    from ptm_app.analysis.robustness import perturbed_copy

    synonyms = {w: (("zz" + w,),) for w in WORDS if len(w) >= 3}  # every content word has one synonym
    texts = _texts()
    first, changed = perturbed_copy(texts, kind, rate, seed=3, synonyms=synonyms)
    again, _ = perturbed_copy(texts, kind, rate, seed=3, synonyms=synonyms)
    other, _ = perturbed_copy(texts, kind, rate, seed=4, synonyms=synonyms)
    assert first == again and first != other and first != texts
    if kind == "synonym":  # only words of 3+ letters that are not function words can change
        eligible = sum(1 for t in texts for w in t.split() if len(w) >= 3 and w not in {"the", "and", "of", "on"})
        words = sum(len(t.split()) for t in texts)
        assert changed == pytest.approx(min(rate, eligible / words), abs=0.01)
    else:
        assert changed == pytest.approx(rate, abs=0.01)


@pytest.mark.parametrize("kind", TYPOS)
def test_each_typo_is_one_edit_of_its_kind(kind):
    from ptm_app.analysis.perturbations import typo

    rng = random.Random(0)
    for word in ["markets", "shares", "Bank", "profits"] * 10:
        new = typo(kind, word, rng)
        if kind == "typo_swap":
            assert sorted(new) == sorted(word) and sum(a != b for a, b in zip(new, word)) == 2
        elif kind == "typo_drop":
            assert len(new) == len(word) - 1 and any(new == word[:i] + word[i + 1:] for i in range(len(word)))
        elif kind == "typo_insert":
            assert len(new) == len(word) + 1 and any(word == new[:i] + new[i + 1:] for i in range(len(new)))
        else:
            assert len(new) == len(word) and sum(a.lower() != b.lower() for a, b in zip(new, word)) == 1


def test_word_dropout_keeps_the_other_words_in_order():
    from ptm_app.analysis.perturbations import perturb

    text = "the cat sat on a mat while dogs ran"
    new, n = perturb(text, "word_dropout", 0.5, random.Random(1))
    kept = new.split(" ")
    assert n == 4 and len(kept) == 5 and "  " not in new
    assert [w for w in text.split() if w in kept] == kept  # a subsequence of the original


def test_synonym_swaps_stay_in_a_synset_and_keep_case():
    from ptm_app.analysis.perturbations import perturb, synonym_table
    from ptm_app.data.sources.wordnet import Synset

    synsets = [Synset("1-n", "noun", 5, ("dog", "domestic dog", "Canis familiaris"), "", ()),
               Synset("2-n", "noun", 5, ("dog", "frank", "hotdog"), "", ()),
               Synset("3-v", "verb", 30, ("run", "go"), "", ())]
    table = synonym_table(synsets)
    assert table == {"frank": (("dog", "hotdog"),), "hotdog": (("dog", "frank"),), "dog": (("frank", "hotdog"),),
                     "run": (("go",),)}  # 'go' (2 letters) is never replaced
    new, n = perturb("Dog, run!", "synonym", 1.0, random.Random(0), table)
    assert n == 2 and new in {"Frank, go!", "Hotdog, go!"}


def test_a_rate_outside_zero_one_is_one_line(tmp_path, capsys):
    assert run_main(["robustness", "--runs", "nowhere", "--rates", "0.1", "1.5"], tmp_path) == 2
    err = capsys.readouterr().err
    assert "rates: 1.5 is outside [0, 1]" in err and err.count("\n") == 1


def test_a_tiny_classifier_end_to_end(tiny_corpus, tmp_path, capsys):
    runs = tmp_path / "runs"
    config = classifier_config(tiny_corpus, tmp_path, steps=4, val_every=2, val_batches=2)
    assert run_main(["fit", "--config", str(config), "--run_name", "cls"], runs) == 0
    assert run_main(["test", "--config", str(config), "--run_name", "cls", "--ckpt_path", "best"], runs) == 0
    test_acc = json.loads((runs / "cls" / "summary.json").read_text())["metrics"]["test/acc"]
    capsys.readouterr()
    out = tmp_path / "robust"
    assert run_main(["robustness", "--runs", str(runs / "cls"), "--examples", "null", "--perturbations",
                     "typo_swap", "word_dropout", "--rates", "0.0", "0.5", "--output_dir", str(out)], runs) == 0
    rows = json.loads((out / "robustness.json").read_text())
    assert [(r["perturbation"], r["rate"]) for r in rows] == [("clean", 0.0), ("typo_swap", 0.0), ("typo_swap", 0.5),
                                                             ("word_dropout", 0.0), ("word_dropout", 0.5)]
    clean = rows[0]
    assert clean["examples"] == 10 and clean["accuracy"] == pytest.approx(test_acc, abs=1e-6)  # as `test` scores it
    for r in rows[1:]:
        assert r["accuracy_drop"] == pytest.approx(clean["accuracy"] - r["accuracy"])
        if r["rate"] == 0.0:
            assert r["words_changed"] == 0.0 and r["accuracy"] == clean["accuracy"] and r["f1_macro"] == clean["f1_macro"]
        else:
            assert r["words_changed"] == pytest.approx(0.5, abs=0.05)
    assert (out / "robustness.png").stat().st_size > 1000
    assert capsys.readouterr().out.strip().endswith(f"wrote {out}")
