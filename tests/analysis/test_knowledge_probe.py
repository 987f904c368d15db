"""Knowledge probe (LAMA): a masked LM whose answer is known scores P@1 = 1 (with LAMA's filtered ranking), a
causal LM's rankings equal hand-computed log-likelihoods, WordNet pointers become facts, and bad input is one
line."""
import json

import pytest
import torch

from tests.conftest import TINY_BERT, TINY_GPT2, run_main, write_jsonl

TEMPLATE = "A [X] is a kind of [MASK]."


def _tokenizer():
    from transformers import AutoTokenizer

    from ptm_app.data.sources import prepared_dir

    return AutoTokenizer.from_pretrained(prepared_dir("minilm"))


def _facts(pairs, template=TEMPLATE, relation="kind_of"):
    return [{"relation": relation, "template": template, "subject": s, "object": o} for s, o in pairs]


@pytest.fixture(scope="module")
def rigged_mlm(tmp_path_factory):
    """A tiny BERT MLM whose output bias makes 'animal' win at every mask, 'mammal' second."""
    import transformers

    tok = _tokenizer()
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(transformers.AutoConfig.for_model(
        **{**TINY_BERT, "vocab_size": tok.vocab_size, "max_position_embeddings": 128}))
    with torch.no_grad():
        bias = model.cls.predictions.decoder.bias
        bias[tok.convert_tokens_to_ids("animal")] = 100.0
        bias[tok.convert_tokens_to_ids("mammal")] = 50.0
    where = tmp_path_factory.mktemp("rigged_mlm")
    model.save_pretrained(where)
    tok.save_pretrained(where)
    return where


def test_a_masked_lm_whose_answer_is_known_scores_p_at_1(rigged_mlm, tmp_path, capsys):
    tok = _tokenizer()
    assert len(tok.tokenize("xylophonist")) > 1
    # fox -> mammal ranks first only because the fact fox -> animal (a valid object) is filtered out (LAMA §4)
    facts = write_jsonl(tmp_path / "kind_of.jsonl", _facts([("dog", "animal"), ("cat", "animal"), ("owl", "animal"),
                                                             ("fox", "animal"), ("fox", "mammal"),
                                                             ("bard", "xylophonist")]))
    out = tmp_path / "out"
    assert run_main(["knowledge-probe", "--models", str(rigged_mlm), "--relations", str(facts),
                     "--output_dir", str(out)], tmp_path) == 0
    rows = {(r["relation"], r["ranking"]): r for r in json.loads((out / "knowledge_probe.json").read_text())}
    for key in [("kind_of", "vocabulary"), ("all", "vocabulary")]:
        assert rows[key]["facts"] == 5 and rows[key]["multi_token"] == 1
        assert rows[key]["p_at_1"] == rows[key]["p_at_10"] == rows[key]["mrr"] == 1.0
    predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [p["top"][0] for p in predictions] == ["animal"] * 3 + ["animal", "mammal"]
    assert (out / "knowledge_probe.png").stat().st_size > 1000
    assert capsys.readouterr().out.strip().endswith(f"wrote {out}")


def test_the_filter_is_what_makes_the_second_answer_first(rigged_mlm):
    from ptm_app.analysis.knowledge_facts import Fact
    from ptm_app.analysis.knowledge_probe import load_language_model, score_relation

    lm = load_language_model(str(rigged_mlm))
    fact = Fact("kind_of", TEMPLATE, "fox", "mammal")
    alone, _ = score_relation(lm, [fact], {("kind_of", "fox"): {"mammal"}}, 4)
    filtered, _ = score_relation(lm, [fact], {("kind_of", "fox"): {"mammal", "animal"}}, 4)
    assert alone[0]["rank"] == 2 and filtered[0]["rank"] == 1


def test_masked_scores_equal_the_dense_log_probabilities_at_each_mask(rigged_mlm):
    """The vocabulary is projected at the mask only (``objectives.heads.logits_at``): the same numbers as the
    full forward's logits there, for facts of different lengths in one padded batch."""
    from ptm_app.analysis.knowledge_facts import SLOT, Fact
    from ptm_app.analysis.knowledge_probe import fill, load_language_model, masked_scores

    lm = load_language_model(str(rigged_mlm))
    facts = [Fact("kind_of", TEMPLATE, s, "animal") for s in ("dog", "grey wolf of the north", "owl")]
    tok = lm.tokenizer
    enc = tok([fill(f.template, f.subject).replace(SLOT, tok.mask_token) for f in facts], return_tensors="pt",
              padding=True)
    with torch.no_grad():
        dense = lm.model(**enc).logits
    rows, cols = torch.nonzero(enc["input_ids"] == tok.mask_token_id, as_tuple=True)
    assert len(set(cols.tolist())) > 1  # the masks sit at different positions
    expected = torch.log_softmax(dense[rows, cols].float(), dim=-1)
    assert torch.allclose(masked_scores(lm, facts, batch_size=3), expected, atol=1e-5)


def test_a_masked_lm_without_a_trained_head_is_refused(tiny_bert_dir, tmp_path, capsys):
    facts = write_jsonl(tmp_path / "kind_of.jsonl", _facts([("dog", "animal")]))
    assert run_main(["knowledge-probe", "--models", str(tiny_bert_dir), "--relations", str(facts)], tmp_path) == 2
    err = capsys.readouterr().err
    assert "has no trained MLM head" in err and "cls.predictions" in err and err.count("\n") == 1


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    import transformers

    tok = _tokenizer()
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.AutoConfig.for_model(
        **{**TINY_GPT2, "vocab_size": tok.vocab_size, "n_positions": 64,
           "bos_token_id": tok.sep_token_id, "eos_token_id": tok.sep_token_id}))
    where = tmp_path_factory.mktemp("tiny_gpt2")
    model.save_pretrained(where)
    tok.save_pretrained(where)
    return where


def _hand_log_likelihood(model, ids: list[int], start: int) -> float:
    """sum over positions t >= start of log p(ids[t] | ids[:t]), one unbatched pass."""
    logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    return float(sum(logp[t - 1, ids[t]] for t in range(start, len(ids))))


def test_causal_rankings_equal_hand_computed_log_likelihoods(tiny_gpt2):
    from ptm_app.analysis.knowledge_facts import Fact
    from ptm_app.analysis.knowledge_probe import load_language_model, score_relation

    lm = load_language_model(str(tiny_gpt2))
    assert lm.kind == "causal"
    tok = lm.tokenizer
    objects = ["xylophonist", "lutenist", "harpsichordist", "animal"]
    facts = [Fact("kind_of", TEMPLATE, s, o) for s, o in [("bard", "xylophonist"), ("piper", "lutenist"),
                                                          ("bard", "harpsichordist"), ("dog", "animal")]]
    valid = {("kind_of", "bard"): {"xylophonist", "harpsichordist"}, ("kind_of", "piper"): {"lutenist"},
             ("kind_of", "dog"): {"animal"}}
    rows, skipped = score_relation(lm, facts, valid, batch_size=2)
    assert skipped == 0
    by_fact = {(r["subject"], r["object"]): r for r in rows}
    assert by_fact["dog", "animal"]["ranking"] == "vocabulary"
    # the one-token object: rank of 'animal' among all next tokens after "A dog is a kind of"
    prefix = tok("A dog is a kind of", add_special_tokens=False)["input_ids"]
    logp = torch.log_softmax(lm.model(torch.tensor([prefix])).logits[0, -1].float(), dim=-1)
    gold = tok.convert_tokens_to_ids("animal")
    assert by_fact["dog", "animal"]["rank"] == int((logp > logp[gold]).sum()) + 1
    # multi-token objects: ranked among every object of the facts by total log-likelihood, other valid ones out
    for subject, obj in [("bard", "xylophonist"), ("piper", "lutenist"), ("bard", "harpsichordist")]:
        prefix = tok(f"A {subject} is a kind of", add_special_tokens=False)["input_ids"]
        scores = {}
        for candidate in sorted(objects):
            ids = tok(f"A {subject} is a kind of {candidate}", add_special_tokens=False)["input_ids"]
            scores[candidate] = _hand_log_likelihood(lm.model, ids, len(prefix))
        others = valid["kind_of", subject] - {obj}
        expected = 1 + sum(score > scores[obj] for c, score in scores.items() if c not in others)
        row = by_fact[subject, obj]
        assert row["ranking"] == "candidates" and row["rank"] == expected
        assert row["top"][0] == max((c for c in scores if c not in others), key=scores.get)


def test_sequence_log_likelihoods_match_one_pass_per_sequence(tiny_gpt2):
    from ptm_app.analysis.knowledge_probe import load_language_model, sequence_log_likelihoods

    lm = load_language_model(str(tiny_gpt2))
    prefix = [101, 1037, 3899]
    conts = [[2000], [2000, 2001, 2002], [3000, 3001]]
    batched = sequence_log_likelihoods(lm, prefix, conts, batch_size=3)
    for got, cont in zip(batched.tolist(), conts):
        assert got == pytest.approx(_hand_log_likelihood(lm.model, prefix + cont, len(prefix)), abs=1e-4)


def test_a_malformed_relation_line_is_one_line_with_file_and_line(rigged_mlm, tmp_path, capsys):
    path = tmp_path / "kind_of.jsonl"
    path.write_text(json.dumps(_facts([("dog", "animal")])[0]) + "\n" + '{"subject": "cat", "object": \n')
    assert run_main(["knowledge-probe", "--models", str(rigged_mlm), "--relations", str(path)], tmp_path) == 2
    err = capsys.readouterr().err
    assert f"{path}:2: malformed JSON" in err and err.count("\n") == 1
    path.write_text(json.dumps({"relation": "kind_of", "template": TEMPLATE, "subject": "dog"}) + "\n")
    assert run_main(["knowledge-probe", "--models", str(rigged_mlm), "--relations", str(path)], tmp_path) == 2
    err = capsys.readouterr().err
    assert f"{path}:1: missing or empty field 'object'" in err and err.count("\n") == 1


def test_a_template_without_a_mask_slot_is_one_line(rigged_mlm, tmp_path, capsys):
    path = write_jsonl(tmp_path / "kind_of.jsonl", _facts([("dog", "animal"), ("cat", "animal")]))
    bad = write_jsonl(tmp_path / "bad.jsonl", _facts([("dog", "animal")], template="A [X] is a kind of animal."))
    assert run_main(["knowledge-probe", "--models", str(rigged_mlm), "--relations", str(bad)], tmp_path) == 2
    err = capsys.readouterr().err
    assert f"{bad}:1: template 'A [X] is a kind of animal.' has 0 [MASK] slots" in err and err.count("\n") == 1
    config = tmp_path / "kp.yaml"
    config.write_text(f"models: ['{rigged_mlm}']\nrelations: ['{path}']\ntemplates: {{kind_of: 'A [X] is nice.'}}\n")
    assert run_main(["knowledge-probe", "--config", str(config)], tmp_path) == 2
    err = capsys.readouterr().err
    assert "templates.kind_of: template 'A [X] is nice.' has 0 [MASK] slots" in err and err.count("\n") == 1


def test_wordnet_pointers_become_facts():
    """wndb(5WN) data lines: synset-level pointers (0000) relate every lemma; a lexical one (0101) one word each."""
    from ptm_app.analysis.knowledge_facts import WORDNET_RELATIONS, parse_pointers, wordnet_facts

    nouns = ("02084071 05 n 02 dog 0 domestic_dog 0 003 @ 02083346 n 0000 #m 02085998 n 0000 @ 99999999 n 0000 "
             "| a member of the genus Canis\n"
             "02083346 05 n 02 canine 0 canid 0 000 | any of various fissiped mammals\n"
             "02085998 05 n 01 pack 0 000 | a group of hunting animals\n")
    adjectives = ("01247240 00 a 02 hot 0 red-hot 0 001 ! 01251128 a 0101 | used of physical heat\n"
                  "01251128 00 a 01 cold 0 001 ! 01247240 a 0101 | having a low temperature\n")
    table = {**parse_pointers(nouns, "noun"), **parse_pointers(adjectives, "adj")}
    assert table["02084071-n"][0] == ("dog", "domestic dog") and table["02084071-n"][1] == 5
    pairs = lambda name: [(f.subject, f.object) for f in wordnet_facts(WORDNET_RELATIONS[name], table)]  # noqa: E731
    assert pairs("hypernym") == [("dog", "canid"), ("dog", "canine"), ("domestic dog", "canid"),
                                 ("domestic dog", "canine")]
    assert pairs("member_of") == [("dog", "pack"), ("domestic dog", "pack")]
    assert pairs("antonym") == [("cold", "hot"), ("hot", "cold")]
    assert ("canine", "animal") in pairs("supersense") and ("pack", "animal") in pairs("supersense")
