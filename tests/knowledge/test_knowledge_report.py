"""The knowledge table (``knowledge-report``, ``make knowledge``): every cell comes from a run's summary.json or the
probe's results, with its source recorded; cells that do not apply stay empty; the plan's bad input is one line;
end to end at tiny size (two pre-trainings, their export, probe and a fine-tuning each)."""
import json
from pathlib import Path

import pytest
import yaml

from ptm_app.main import main
from tests.conftest import TINY_BERT, run_main

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "configs" / "sweeps" / "knowledge_brown.yaml"


def write_summary(run: Path, metrics: dict) -> None:
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"module": "X", "metrics": metrics}))


def test_table_cells_come_from_the_runs_and_name_their_source(runs_dir, monkeypatch):
    """Hand-written summaries for the shipped plan's runs (without its seeds: one run per chain): KEPLER's test link
    prediction fills its link columns, the probe file its P@1, the task runs their test metrics; MLM has no link
    metrics (empty), K-Adapter no POS."""
    from ptm_app.experiments.knowledge_report import collect, load_knowledge_plan, write_knowledge_report

    monkeypatch.chdir(ROOT)
    plan = {k: v for k, v in load_knowledge_plan(PLAN).items() if k not in ("seeds", "baseline")}
    write_summary(runs_dir / "knowledge_brown-mlm-pretrain", {"test/loss": 5.1})
    write_summary(runs_dir / "knowledge_brown-kepler-pretrain", {"test/test/mrr": 0.0312, "test/test/hits@10": 0.071,
                                                                 "test/inductive/test/mrr": 0.01})
    write_summary(runs_dir / "knowledge_brown-mlm-wordnet_supersense", {"test/acc": 0.4242, "val/acc": 0.5})
    write_summary(runs_dir / "knowledge_brown-kepler-brown_pos", {"test/acc": 0.9111})
    write_summary(runs_dir / "knowledge_brown-minilm_k_adapter-wordnet_pairs", {"test/mcc": 0.41, "test/f1": 0.77,
                                                                                "test/acc": 0.8})
    write_summary(runs_dir / "knowledge_brown-minilm_k_adapter-brown_pos", {"test/acc": 0.99})  # not its task
    (runs_dir / "knowledge_brown").mkdir()
    settings = {"relation": "hypernym", "facts": 500, "seed": 0, "held_out": True}  # the plan's
    (runs_dir / "knowledge_brown" / "probe.json").write_text(json.dumps(
        {"mlm": {"p_at_1": 0.125, "mrr": 0.2, "facts_scored": 400, "export": "e", **settings},
         "kepler": {"p_at_1": 0.25, "mrr": 0.3, "facts_scored": 400, "export": "f", **settings},
         "ernie": {"p_at_1": 0.5, "mrr": 0.6, "facts_scored": 400, "export": "g", **settings,
                   "held_out": False}}))  # other facts
    rows, columns, sources = collect(plan)
    assert columns == ["model", "link MRR", "link Hits@10", "link MRR, unseen entities", "hypernym P@1",
                       "hypernym MRR", "wordnet_supersense acc", "wordnet_pairs MCC", "Brown POS acc"]
    assert [r["model"] for r in rows] == ["BERT-small MLM", "BERT-small ERNIE masking", "BERT-small SenseBERT",
                                          "BERT-small LIBERT", "BERT-small KEPLER", "MiniLM fine-tuned",
                                          "MiniLM frozen, head on [h]", "MiniLM + K-Adapter (frozen)"]
    by = {r["model"]: r for r in rows}
    assert by["BERT-small MLM"] == {"model": "BERT-small MLM", "hypernym P@1": 0.125, "hypernym MRR": 0.2,
                                    "wordnet_supersense acc": 0.4242}
    assert by["BERT-small KEPLER"] == {"model": "BERT-small KEPLER", "link MRR": 0.0312, "link Hits@10": 0.071,
                                       "link MRR, unseen entities": 0.01, "hypernym P@1": 0.25, "hypernym MRR": 0.3,
                                       "Brown POS acc": 0.9111}
    assert by["MiniLM + K-Adapter (frozen)"] == {"model": "MiniLM + K-Adapter (frozen)", "wordnet_pairs MCC": 0.41}
    assert by["BERT-small ERNIE masking"] == {"model": "BERT-small ERNIE masking"}  # nor a probe of other facts
    assert sources["BERT-small KEPLER"]["link MRR"] == {"run": str(runs_dir / "knowledge_brown-kepler-pretrain"),
                                                        "metric": "test/test/mrr"}
    assert sources["BERT-small MLM"]["wordnet_supersense acc"]["metric"] == "test/acc"
    md = write_knowledge_report(plan)
    lines = md.read_text().splitlines()
    assert "| BERT-small KEPLER | 0.0312 | 0.0710 | 0.0100 | 0.2500 | 0.3000 |  |  | 0.9111 |" in lines
    assert sources["BERT-small MLM"]["hypernym MRR"] == {"probe": str(runs_dir / "knowledge_brown" / "probe.json"),
                                                         "export": "e", "metric": "mrr", "facts": 400}
    assert json.loads(md.with_suffix(".json").read_text())[0]["hypernym P@1"] == 0.125
    assert json.loads((md.parent / "knowledge_runs.json").read_text()) == json.loads(json.dumps(sources))
    assert (md.parent / "knowledge.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_figure_draws_each_number_of_the_table_once():
    """One panel per metric column; its bars are the models that have that number, with the table's values."""
    from ptm_app.experiments.knowledge_report import draw

    columns = ["model", "link MRR", "hypernym P@1"]
    rows = [{"model": "a", "hypernym P@1": 0.1}, {"model": "b", "link MRR": 0.03, "hypernym P@1": 0.2},
            {"model": "c"}]
    fig = draw(rows, columns)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["link MRR", "hypernym P@1"]
    bars = [[(t.get_text(), p.get_width()) for t, p in zip(ax.get_yticklabels(), ax.patches)] for ax in panels]
    assert bars == [[("b", 0.03)], [("a", 0.1), ("b", 0.2)]]
    rows[0]["link MRR"] = float("nan")  # a NaN metric of a diverged run: no bar, no error
    fig = draw(rows, columns)
    assert [len(ax.patches) for ax in fig.axes if ax.get_visible()] == [1, 2]


def test_the_shipped_plan_runs_configs_that_run_as_shipped(monkeypatch):
    """Each cell of the shipped plan is a config that tests/cli/test_configs.py runs as shipped, in the plan's order
    (pre-training or adapters before the runs that start from them); the full plan is hours of CPU (make knowledge),
    its machinery runs end to end at tiny size below."""
    from ptm_app.experiments.knowledge_report import cells, load_knowledge_plan
    from tests.cli.test_configs import ALL

    monkeypatch.chdir(ROOT)
    plan = load_knowledge_plan(PLAN)
    shipped = {str(p.relative_to(ROOT)) for p in ALL}
    runs = [(cell["name"], cell["config"]) for model in plan["models"] for cell, _ in cells(plan, model)]
    assert {config for _, config in runs} <= shipped
    names = [name for name, _ in runs]
    assert len(names) == 5 * 4 + 3 + 2 + 4 and names[:4] == ["mlm/pretrain", "mlm/wordnet_supersense",
                                                         "mlm/wordnet_pairs", "mlm/brown_pos"]
    assert names[-4:] == ["minilm_k_adapter/adapter_factual", "minilm_k_adapter/adapter_linguistic",
                          "minilm_k_adapter/wordnet_supersense", "minilm_k_adapter/wordnet_pairs"]
    assert all("trainer.max_steps" in plan[k] for k in ("pretrain_set", "task_set"))  # equal steps per kind


@pytest.mark.parametrize("change, message", [
    ({"colour": 1}, "unknown keys: ['colour']"),
    ({"models": ["mlm"]}, "'models' is a list of settings"),
    ({"tasks": {"pos": {"config": "configs/adapt/minilm_full_brown_pos.yaml"}}}, "task pos needs exactly 'config', 'metric'"),
    ({"models": [{"id": "a b", "pretrain": "configs/knowledge/bert_wwm_mlm_brown.yaml"}]}, "model a b needs a unique 'id'"),
    ({"models": [{"id": "x", "pretrain": "configs/knowledge/nope.yaml"}]}, "config configs/knowledge/nope.yaml not found"),
    ({"models": [{"id": "x", "tasks": {"ner": "configs/adapt/minilm_full_brown_pos.yaml"}}]},
     "tasks ['ner'] are not in the plan's tasks"),
    ({"probe": {"relation": "hypernym", "heldout": True}}, "'probe' takes facts, held_out, relation, seed; unknown: "
                                                           "['heldout']"),
    ({"probe": {"held_out": "false"}}, "probe.held_out must be true or false (got 'false')"),
    ({"probe": {"facts": 1.5}}, "probe.facts must be int (got 1.5)"),
    ({"task_set": {"--trainer.max_steps": 3}}, "'task_set' maps config keys (without --) to values"),
    ({"task_set": 250}, "'task_set' maps config keys (without --) to values, e.g. task_set: {"),
    ({"pretrain_set": ["--trainer.max_steps"]}, "'--trainer.max_steps' is not '--key value'; write the overrides as "
                                                "a mapping, e.g. pretrain_set: {"),
    ({"pretrain_args": ["--trainer.max_steps", "9"]}, "give pretrain_set (a mapping of overrides), not also "
                                                      "pretrain_args"),
])
def test_a_bad_plan_is_one_line(change, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    plan = {**{k: v for k, v in yaml.safe_load(PLAN.read_text()).items() if k != "baseline"}, **change}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    assert main(["knowledge-report", str(path), "--collect_only"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_readme_without_the_plans_markers_is_one_line_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    readme = tmp_path / "README.md"
    readme.write_text("# no markers here\n")
    assert main(["knowledge-report", str(PLAN), "--readme", str(readme)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no '<!-- knowledge_brown:start -->'" in err[0], err
    assert readme.read_text() == "# no markers here\n"


def test_held_out_probe_facts_leave_out_libert_and_kepler_training_pairs(tmp_path):
    """A hand-built lexrel and graph: the related lexrel pairs (either order) and every lemma pair of a hypernym or
    hyponym triple are seen; an unrelated pair, another relation and the other facts are not."""
    from ptm_app.analysis.knowledge_facts import Fact
    from ptm_app.knowledge.seen_pairs import graph_pairs, held_out, lexrel_pairs
    from tests.conftest import write_jsonl

    write_jsonl(tmp_path / "lexrel" / "train.jsonl", [
        {"text": "Dog", "text_pair": "canine", "relation": "hypernym"},
        {"text": "big", "text_pair": "large", "relation": "synonym"},
        {"text": "cat", "text_pair": "tree", "relation": "none"}])
    write_jsonl(tmp_path / "kg" / "entities.jsonl", [
        {"id": "a", "names": ["oak", "oak tree"]}, {"id": "b", "names": ["tree"]}, {"id": "c", "names": ["wheel"]},
        {"id": "d", "names": ["car", "auto"]}])
    write_jsonl(tmp_path / "kg" / "train.jsonl", [
        {"head": "b", "relation": "hyponym", "tail": "a"}, {"head": "c", "relation": "part_holonym", "tail": "d"}])
    seen = lexrel_pairs(tmp_path / "lexrel")
    assert seen == {frozenset(("dog", "canine")), frozenset(("big", "large"))}
    hypernymy = graph_pairs(tmp_path / "kg", "hypernym")
    assert hypernymy == {frozenset(("oak", "tree")), frozenset(("oak tree", "tree"))}
    assert graph_pairs(tmp_path / "kg", "part_of") == {frozenset(("wheel", "car")), frozenset(("wheel", "auto"))}
    assert graph_pairs(tmp_path / "kg", "supersense") == set()
    facts = [Fact("hypernym", "A [X] is a kind of [MASK].", s, o)
             for s, o in [("canine", "dog"), ("oak", "tree"), ("cat", "tree"), ("wheel", "car"), ("ash", "tree")]]
    assert [f.subject for f in held_out(facts, seen | hypernymy)] == ["cat", "wheel", "ash"]


def test_held_out_hypernymy_on_the_prepared_wordnet():
    """On the real data: the shipped plan's probe pool has no LIBERT or KEPLER training pair, and keeps thousands."""
    from ptm_app.analysis.knowledge_facts import read_facts, relation_file
    from ptm_app.knowledge.seen_pairs import held_out, knowledge_training_pairs
    from tests.knowledge.test_knowledge_objectives import needs

    needs("wordnet_lexrel"), needs("wordnet_kg")
    assert yaml.safe_load(PLAN.read_text())["probe"]["held_out"] is True
    facts = read_facts(relation_file("hypernym"))
    seen = knowledge_training_pairs("hypernym")
    pool = held_out(facts, seen)
    assert 2000 < len(pool) < 0.6 * len(facts)
    assert not any(frozenset((f.subject, f.object)) in seen for f in pool)


def test_knowledge_report_end_to_end_at_tiny_size(tmp_path, runs_dir, monkeypatch, capsys):
    """Two tiny BERTs pre-trained 4 steps (plain MLM and SenseBERT) on a span corpus, exported, probed on hypernymy
    and fine-tuned 3 steps on wordnet_supersense from their exports; the table's rows are the plan's models and its
    numbers are the runs' test metrics and the probe's P@1.  Run again, nothing reruns (the cells are done)."""
    from tests.knowledge.test_knowledge_objectives import needs, span_corpus

    needs("wordnet_supersense")
    monkeypatch.chdir(ROOT)
    corpus = span_corpus(tmp_path / "corpus", n=48)
    (corpus / "test.jsonl").write_text((corpus / "validation.jsonl").read_text())  # pre-training runs are tested
    tiny_pretrain = {"model.init_args.backbone_config": TINY_BERT, "data.init_args.source": str(corpus),
                     "data.init_args.max_length": 32, "data.init_args.batch_size": 4,
                     "data.init_args.tokenizer": {"train": "wordpiece", "vocab_size": 300, "min_frequency": 1,
                                                  "lowercase": True},
                     "trainer.precision": "32-true", "trainer.max_steps": 4, "trainer.val_check_interval": 4,
                     "trainer.limit_val_batches": 1, "trainer.limit_test_batches": 1,
                     "trainer.enable_progress_bar": False}
    plan = {"name": "kb_tiny", "pretrain_set": tiny_pretrain,
            "task_set": {"trainer.precision": "32-true", "trainer.max_steps": 3, "trainer.val_check_interval": 3,
                         "trainer.limit_val_batches": 1, "trainer.limit_test_batches": 2,
                         "data.init_args.limit_train": 24, "data.init_args.batch_size": 8,
                         "trainer.enable_progress_bar": False},
            "probe": {"relation": "hypernym", "facts": 40, "seed": 0},
            "tasks": {"wordnet_supersense": {"config": "configs/adapt/minilm_full_wordnet_supersense.yaml",
                                             "metric": "acc", "column": "supersense acc"}},
            "models": [{"id": "mlm", "label": "MLM", "pretrain": "configs/knowledge/bert_wwm_mlm_brown.yaml"},
                       {"id": "sensebert", "label": "SenseBERT", "pretrain": "configs/knowledge/sensebert_mlm_supersense_brown.yaml"}]}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    ledger = tmp_path / "ledger"
    assert run_main(["knowledge-report", str(path), "--ledger", str(ledger)], runs_dir) == 0
    out = runs_dir / "kb_tiny"
    rows = json.loads((out / "knowledge.json").read_text())
    assert [r["model"] for r in rows] == ["MLM", "SenseBERT"]
    assert set(rows[0]) == {"model", "link MRR", "link Hits@10", "link MRR, unseen entities", "hypernym P@1",
                            "hypernym MRR", "supersense acc"}
    probes = json.loads((out / "probe.json").read_text())
    for row, key in zip(rows, ("mlm", "sensebert")):
        metrics = json.loads((runs_dir / f"kb_tiny-{key}-wordnet_supersense" / "summary.json").read_text())["metrics"]
        assert row["supersense acc"] == metrics["test/acc"]
        assert row["hypernym P@1"] == probes[key]["p_at_1"] and 0.0 <= row["hypernym P@1"] <= 1.0
        assert row["hypernym MRR"] == probes[key]["mrr"] and 0.0 < row["hypernym MRR"] <= 1.0
        assert probes[key]["facts"] > 0 and row["link MRR"] is None  # no relation embeddings: no link prediction
        backbone = yaml.safe_load((runs_dir / f"kb_tiny-{key}-wordnet_supersense" / "config.yaml").read_text())
        assert backbone["model"]["init_args"]["backbone"] == str(runs_dir / f"kb_tiny-{key}-pretrain" / "export")
    sense = yaml.safe_load((runs_dir / "kb_tiny-sensebert-pretrain" / "config.yaml").read_text())
    supersense = [t for t in sense["model"]["init_args"]["targets"] if t["class_path"].endswith("Supersense")]
    assert supersense[0]["init_args"]["sense_input"] is True and sense["trainer"]["max_steps"] == 4
    capsys.readouterr()
    readme = tmp_path / "README.md"
    readme.write_text("# Results\n\n<!-- kb_tiny:start -->\nold\n<!-- kb_tiny:end -->\n\nafter\n")
    assert run_main(["knowledge-report", str(path), "--readme", str(readme)], runs_dir) == 0
    printed = capsys.readouterr().out
    assert "exit" not in printed and "| SenseBERT |" in printed  # every cell was done: only the table
    table = (out / "knowledge.md").read_text().rstrip()
    assert readme.read_text() == f"# Results\n\n<!-- kb_tiny:start -->\n{table}\n<!-- kb_tiny:end -->\n\nafter\n"
    # --ledger: the results outlive the run directories.  A chain whose every run is in the ledger is remade from
    # it (nothing runs); one with a fine-tuning not in it runs its pre-training again: the ledger keeps no weights
    import shutil

    assert sorted(p.name for p in ledger.iterdir()) == [f"kb_tiny-{m}-{c}.json" for m in ("mlm", "sensebert")
                                                         for c in ("pretrain", "wordnet_supersense")] + ["probe.json"]
    assert json.loads((ledger / "probe.json").read_text()) == probes
    mlm_row = next(line for line in table.splitlines() if line.startswith("| MLM |"))
    shutil.rmtree(runs_dir)
    (ledger / "kb_tiny-sensebert-wordnet_supersense.json").unlink()
    assert run_main(["knowledge-report", str(path), "--ledger", str(ledger)], runs_dir) == 0
    printed = capsys.readouterr().out
    ran = [line.split("] ")[1].split(":")[0] for line in printed.splitlines() if " exit " in line]
    assert ran == ["sensebert/pretrain", "sensebert/wordnet_supersense"], printed
    assert "2 run(s) done before, restored from" in printed and "mlm/pretrain" in printed
    assert not (runs_dir / "kb_tiny-mlm-pretrain" / "export").exists()  # remade from its ledger entry: no weights
    assert mlm_row in (out / "knowledge.md").read_text()  # the same numbers, from the ledger
    assert (ledger / "kb_tiny-sensebert-wordnet_supersense.json").is_file()  # kept again
    # a remade pre-training whose weights are needed again (a fine-tuning neither done nor in the ledger) runs again
    shutil.rmtree(runs_dir / "kb_tiny-mlm-wordnet_supersense")
    (ledger / "kb_tiny-mlm-wordnet_supersense.json").unlink()
    assert run_main(["knowledge-report", str(path), "--ledger", str(ledger)], runs_dir) == 0
    printed = capsys.readouterr().out
    assert [line.split("] ")[1].split(":")[0] for line in printed.splitlines() if " exit " in line] == [
        "mlm/pretrain", "mlm/wordnet_supersense"], printed
    assert (runs_dir / "kb_tiny-mlm-pretrain" / "export" / "config.json").is_file()


def test_numbers_from_an_earlier_recipe_or_pretraining_are_left_out(runs_dir, monkeypatch):
    """Every run records what made it (cell.json); only the run the plan makes now counts.  A task run made from
    another pre-training than the row's current one, one made by an earlier task_set, and a probe of an earlier
    pre-training are stale and show nothing; once the pre-training itself is stale, its row shows nothing at all."""
    from ptm_app.experiments.chain import current_runs
    from ptm_app.experiments.knowledge_report import collect, links, load_knowledge_plan

    monkeypatch.chdir(ROOT)
    plan = {k: v for k, v in load_knowledge_plan(PLAN).items() if k not in ("seeds", "baseline")}  # one run a chain
    current = current_runs(plan["name"], links(plan, plan["models"]))
    pretrain = runs_dir / "knowledge_brown-mlm-pretrain"
    write_summary(pretrain, {"test/loss": 5.1})
    (pretrain / "cell.json").write_text(json.dumps({"fingerprint": current[pretrain]}))
    old_task_set = {**plan, "task_set": {**plan["task_set"], "trainer.max_steps": 60}}
    before = current_runs(plan["name"], links(old_task_set, plan["models"]))
    for task, made_by in (("wordnet_supersense", current), ("wordnet_pairs", "made from another pre-training"),
                          ("brown_pos", before)):
        run = runs_dir / f"knowledge_brown-mlm-{task}"
        write_summary(run, {"test/acc": 0.5, "test/f1": 0.25})
        fingerprint = made_by[run] if isinstance(made_by, dict) else "0123456789abcdef"
        (run / "cell.json").write_text(json.dumps({"fingerprint": fingerprint}))
    assert before[runs_dir / "knowledge_brown-mlm-brown_pos"] != current[runs_dir / "knowledge_brown-mlm-brown_pos"]
    (runs_dir / "knowledge_brown").mkdir()
    (runs_dir / "knowledge_brown" / "probe.json").write_text(json.dumps(
        {"mlm": {"p_at_1": 0.125, "facts": 500, "export": "e", "pretrain": "old", "relation": "hypernym", "seed": 0,
                 "held_out": True}}))  # the plan's settings, of the old pre-training
    row = collect(plan)[0][0]
    assert row == {"model": "BERT-small MLM", "wordnet_supersense acc": 0.5}
    (pretrain / "cell.json").write_text(json.dumps({"fingerprint": "0123456789abcdef"}))  # its recipe changed
    assert collect(plan)[0][0] == {"model": "BERT-small MLM"}


def test_a_stale_probe_never_hides_nor_replaces_the_current_one(runs_dir, tmp_path, monkeypatch):
    """probe.json moves both ways between the runs directory and the ledger: of two copies of one model's entry,
    the one of the pre-training the plan makes now wins either way (before, the local copy won on restore: a stale
    local probe hid the ledger's current one, and its pre-training was trained again to probe it)."""
    from ptm_app.experiments.chain import ChainLedger, current_runs
    from ptm_app.experiments.knowledge_report import (PROBE_FILE, links, load_knowledge_plan,
                                                      probe_of_current_pretraining, probe_settings)

    monkeypatch.chdir(ROOT)
    plan = {k: v for k, v in load_knowledge_plan(PLAN).items() if k not in ("seeds", "baseline")}
    made_now = current_runs(plan["name"], links(plan, plan["models"]))[runs_dir / "knowledge_brown-mlm-pretrain"]
    settings = probe_settings(plan)
    current = {"p_at_1": 0.25, "pretrain": made_now, **settings}
    stale = {"p_at_1": 0.125, "pretrain": "0123456789abcdef", **settings}
    other_settings = {**current, "facts": settings["facts"] + 1}
    is_current = probe_of_current_pretraining(plan)
    assert is_current("mlm", current)
    assert not any(is_current(key, entry) for key, entry in
                   (("mlm", stale), ("mlm", other_settings), ("no_such_model", current), ("mlm", [1])))
    how = ChainLedger(lambda p: links(p, p["models"]), files=(PROBE_FILE,), current_entry=probe_of_current_pretraining)
    local, ledger = runs_dir / plan["name"] / PROBE_FILE, tmp_path / "ledger"
    local.parent.mkdir(parents=True)
    ledger.mkdir()

    def probes(local_probes: dict, ledger_probes: dict) -> None:
        local.write_text(json.dumps(local_probes))
        (ledger / PROBE_FILE).write_text(json.dumps(ledger_probes))

    probes({"mlm": stale, "sensebert": stale}, {"mlm": current, "sensebert": stale, "libert": stale})
    how.restore(plan, ledger)  # ledger -> runs: the current entry replaces the stale one; two stale: the local kept
    assert json.loads(local.read_text()) == {"mlm": current, "sensebert": stale, "libert": stale}
    probes({"mlm": current}, {"mlm": stale})
    how.restore(plan, ledger)
    assert json.loads(local.read_text()) == {"mlm": current}
    probes({"mlm": stale, "libert": stale}, {"mlm": current})
    how.keep(plan, ledger)  # runs -> ledger: a stale local entry never replaces the ledger's current one
    assert json.loads((ledger / PROBE_FILE).read_text()) == {"mlm": current, "libert": stale}
    probes({"mlm": {**current, "p_at_1": 0.5}}, {"mlm": current})
    how.keep(plan, ledger)  # both current: the run directory's, as before
    assert json.loads((ledger / PROBE_FILE).read_text())["mlm"]["p_at_1"] == 0.5


def seeded_plan(**extra) -> dict:
    from ptm_app.experiments.knowledge_report import load_knowledge_plan

    return {**load_knowledge_plan(PLAN), "seeds": [1, 2, 3], **extra}


def test_seeds_run_each_chain_once_per_seed_with_that_seed_everywhere(monkeypatch):
    """seeds: [1, 2, 3]: every cell of a row's chain (pre-training, tasks; adapters too) is seeded with its seed, is
    named .../seed<N> (run directory <plan>-<model>-<cell>-seed<N>) and starts from that seed's export or adapters;
    without seeds the cells are as before (their fingerprints unchanged)."""
    from ptm_app.experiments.knowledge_report import cells, run_dir

    monkeypatch.chdir(ROOT)
    plan = seeded_plan()
    mlm = plan["models"][0]
    seeded = cells(plan, mlm, 2)
    assert [c["name"] for c, _ in seeded] == ["mlm/pretrain/seed2", "mlm/wordnet_supersense/seed2",
                                              "mlm/wordnet_pairs/seed2", "mlm/brown_pos/seed2"]
    assert all(c["set"]["seed_everything"] == 2 for c, _ in seeded)
    export = str(run_dir(plan, mlm, "pretrain", 2) / "export")
    assert export.endswith("knowledge_brown-mlm-pretrain-seed2/export")
    assert all(c["set"]["model.init_args.backbone"] == export for c, _ in seeded[1:])
    k_adapter = next(m for m in plan["models"] if m.get("adapters"))
    adapter_cells = cells(plan, k_adapter, 3)
    assert adapter_cells[0][0] == {"name": "minilm_k_adapter/adapter_factual/seed3",
                                   "config": k_adapter["adapters"]["factual"], "set": {"seed_everything": 3}}
    assert "knowledge_brown-minilm_k_adapter-adapter_linguistic-seed3" in adapter_cells[-1][0]["set"][
        "model.init_args.adapters"]
    assert cells(plan, mlm)[0][0] == {"name": "mlm/pretrain", "config": mlm["pretrain"], "test_ckpt": "last"}


def test_seeded_cells_are_means_with_intervals_and_paired_against_the_baseline(runs_dir, monkeypatch):
    """Three seeds of two rows, hand-written: a cell is the mean over its seeds with the t interval (std 0.01 of
    0.50/0.51/0.52: half-width 4.303 * 0.01 / sqrt(3) = 0.0248), the paired difference from the baseline is per seed
    (+0.10, +0.11, +0.12: mean +0.11, significant by its t interval; the sign-flip p of 3 pairs is at least 0.25), a cell missing a seed says how many it has, and the table says so."""
    from ptm_app.experiments.knowledge_report import collect, write_knowledge_report

    monkeypatch.chdir(ROOT)
    plan = seeded_plan(baseline="mlm")
    for seed, (mlm, ernie) in zip((1, 2, 3), ((0.50, 0.60), (0.51, 0.62), (0.52, 0.64))):
        write_summary(runs_dir / f"knowledge_brown-mlm-wordnet_supersense-seed{seed}", {"test/acc": mlm})
        write_summary(runs_dir / f"knowledge_brown-ernie-wordnet_supersense-seed{seed}", {"test/acc": ernie})
    write_summary(runs_dir / "knowledge_brown-ernie-brown_pos-seed1", {"test/acc": 0.9})
    rows, columns, sources = collect(plan)
    by = {r["model"]: r for r in rows}
    assert by["BERT-small MLM"]["wordnet_supersense acc"] == pytest.approx(0.51)
    cell = sources["BERT-small MLM"]["wordnet_supersense acc"]
    assert cell["n"] == 3 and cell["std"] == pytest.approx(0.01)
    assert cell["interval"] == pytest.approx([0.51 - 0.02484, 0.51 + 0.02484], abs=1e-4)
    assert cell["seeds"]["seed2"] == {"value": 0.51, "run": str(runs_dir / "knowledge_brown-mlm-wordnet_supersense-seed2"),
                                      "metric": "test/acc"}
    md = write_knowledge_report(plan).read_text()
    assert "| BERT-small MLM |  |  |  |  |  | 0.5100 ± 0.0100 [0.4852, 0.5348] (3 seeds) |" in md
    assert "0.9000 (1 seed: an observation), 1 of 3" in md
    assert "| BERT-small ERNIE masking |  |  |  |  |  | +0.1100 [+0.0852, +0.1348] p=0.25 * |" in md
    assert md.count("| BERT-small SenseBERT |") == 1  # no runs: a row of the seeds table, none of the pairs table
    assert json.loads((runs_dir / "knowledge_brown" / "knowledge.json").read_text())[1]["wordnet_supersense acc"] \
        == pytest.approx(0.62)


@pytest.mark.parametrize("change, message", [
    ({"seeds": [1, "2"]}, "seeds: '2' is not an integer seed"),
    ({"seeds": [1, 1]}, "seeds: seed 1 is given twice"),
    ({"seeds": [1], "baseline": "mlm"}, "baseline 'mlm' must be one of the model ids (mlm, ernie"),
    ({"seeds": [1, 2], "baseline": "bert"}, "baseline 'bert' must be one of the model ids"),
])
def test_bad_seeds_or_baseline_are_one_line(change, message, tmp_path, monkeypatch, capsys):
    test_a_bad_plan_is_one_line(change, message, tmp_path, monkeypatch, capsys)


def test_a_paired_table_without_any_pair_yet_says_so(runs_dir, monkeypatch):
    """Only the baseline has run (one seed): the paired section says no model has a pair yet, not a table of
    empty rows."""
    from ptm_app.experiments.knowledge_report import write_knowledge_report

    monkeypatch.chdir(ROOT)
    write_summary(runs_dir / "knowledge_brown-mlm-wordnet_supersense-seed1", {"test/acc": 0.45})
    md = write_knowledge_report(seeded_plan(baseline="mlm")).read_text()
    pairs = md.split("#### Paired difference")[1]
    assert "None yet: no model has 2 seeds of a column that BERT-small MLM has too." in pairs
    assert "| BERT-small ERNIE masking |" not in pairs


def test_only_one_seeds_chain_runs_that_chain_and_probes_that_pretraining(monkeypatch):
    """``--only mlm/seed2 kepler``: the MLM chain of seed 2 alone (its pre-training first, then its tasks) and every
    seed of KEPLER's chain; the probe is asked for exactly those pre-trainings."""
    from ptm_app.experiments import knowledge_report as kr

    monkeypatch.chdir(ROOT)
    ran, probed = [], []
    monkeypatch.setattr(kr, "run_chain", lambda name, links, command: ran.extend(l.cell["name"] for l in links) or [])
    monkeypatch.setattr(kr, "probe_models", lambda plan, models: probed.extend(
        kr.probe_key(m, seed) for m, seed in models))
    assert kr.run_plan(seeded_plan(), ["mlm/seed2", "kepler"]) == []
    assert ran[:4] == ["mlm/pretrain/seed2", "mlm/wordnet_supersense/seed2", "mlm/wordnet_pairs/seed2",
                       "mlm/brown_pos/seed2"]
    assert ran[4:] == [f"kepler/{cell}/seed{s}" for s in (1, 2, 3)
                       for cell in ("pretrain", "wordnet_supersense", "wordnet_pairs", "brown_pos")]
    assert probed == ["mlm/seed2", "kepler/seed1", "kepler/seed2", "kepler/seed3"]


@pytest.mark.parametrize("only, message", [
    ("mlm/seed4", "--only mlm/seed4: no such model in {plan} (mlm, ernie, sensebert, libert, kepler, minilm, "
                  "minilm_frozen, minilm_k_adapter; one seed's chain: mlm/seed<N>, N one of 1, 2, 3)"),
    ("bert/seed1", "--only bert/seed1: no such model in {plan} (mlm, "),
])
def test_an_unknown_model_or_seed_in_only_is_one_line_before_anything_runs(only, message, monkeypatch, capsys):
    from ptm_app.experiments import knowledge_report as kr

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(kr, "run_chain", lambda *a, **k: pytest.fail("nothing may run"))
    assert main(["knowledge-report", str(PLAN), "--only", only]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message.format(plan=PLAN) in err[0], err


def test_a_seeded_figure_draws_each_mean_with_its_interval():
    """With seeds, a bar is the mean and its whisker the 95 % t interval the table prints (``collect``'s sources);
    a cell of one seed has no whisker."""
    from ptm_app.experiments.knowledge_report import draw

    columns = ["model", "Brown POS acc"]
    rows = [{"model": "a", "Brown POS acc": 0.9}, {"model": "b", "Brown POS acc": 0.8}]
    sources = {"a": {"Brown POS acc": {"interval": [0.85, 0.95]}}, "b": {"Brown POS acc": {"interval": None}}}
    ax = next(ax for ax in draw(rows, columns, sources).axes if ax.get_visible())
    whiskers = [seg for c in ax.collections for seg in c.get_segments()]
    assert len(whiskers) == 1 and sorted(whiskers[0][:, 0].tolist()) == [0.85, 0.95]
    assert [p.get_width() for p in ax.patches] == [0.9, 0.8]
