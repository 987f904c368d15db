"""Distillation end to end through main.py: a tiny teacher trained here for a few steps, a student made from every
other teacher layer that trains with every loss, resumes exactly, exports and reloads; the bad inputs are one line."""
import csv
import shutil

import pytest
import torch
import yaml

from tests.conftest import TINY_BERT, assert_resumes_exactly, run_main

pytestmark = pytest.mark.usefixtures("one_thread")
TOKENIZER = {"train": "wordpiece", "vocab_size": 100, "min_frequency": 1}
QUIET = {"accelerator": "cpu", "enable_progress_bar": False, "enable_model_summary": False, "log_every_n_steps": 1}


def data(corpus, tokenizer=TOKENIZER) -> dict:
    return {"class_path": "TaskDataModule",
            "init_args": {"source": str(corpus), "batch_size": 8, "max_length": 32, "tokenizer": tokenizer}}


@pytest.fixture(scope="module")
def teacher(tiny_corpus, tmp_path_factory):
    """A 4-layer tiny BERT classifier trained 4 steps on the fixture corpus: its run directory."""
    tmp = tmp_path_factory.mktemp("teacher")
    cfg = {"seed_everything": 3, "trainer": {"max_steps": 4, "val_check_interval": 4, "limit_val_batches": 1, **QUIET},
           "model": {"class_path": "SequenceClassificationModule",
                     "init_args": {"backbone_config": {**TINY_BERT, "num_hidden_layers": 4}, "optim": {"lr": 1e-3}}},
           "data": data(tiny_corpus)}
    path = tmp / "teacher.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert run_main(["fit", "--config", str(path)], tmp / "runs") == 0
    return tmp / "runs" / "teacher"


def distill_config(tmp_path, corpus, teacher, model: dict, tokenizer=TOKENIZER, steps: int = 4):
    cfg = {"seed_everything": 5,
           "trainer": {"max_steps": steps, "val_check_interval": 2, "limit_val_batches": 1,
                       "num_sanity_val_steps": 0, **QUIET},
           "model": {"class_path": "DistillationModule", "init_args": {"teacher": str(teacher), **model}},
           "data": data(corpus, tokenizer)}
    path = tmp_path / "distill.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


EVERY_LOSS = {"temperature": 2.0, "kd": 0.5, "hard": 0.5, "hidden": 1.0, "attention": 1.0, "embedding": 1.0,
              "cosine": 1.0, "minilm": 1.0, "layer_map": "uniform"}


def test_student_from_every_other_layer_trains_resumes_exports_and_reloads(tiny_corpus, teacher, tmp_path):
    from transformers import AutoModelForSequenceClassification

    from ptm_app.adaptation import DistillationModule

    path = distill_config(tmp_path, tiny_corpus, teacher,
                          {"student_layers": "every_other", "distill": EVERY_LOSS, "optim": {"lr": 1e-3}})
    runs = tmp_path / "runs"
    assert_resumes_exactly(["fit", "--config", str(path)], runs, stop=2, steps=4)
    rows = list(csv.DictReader(open(runs / "full" / "logs" / "metrics.csv")))
    for name in ("kd", "hard", "hidden", "attention", "embedding", "cosine", "minilm"):
        values = [float(r[f"train/{name}"]) for r in rows if r.get(f"train/{name}")]
        assert len(values) == 4 and all(v >= 0 for v in values), name
    total = next(r for r in rows if r.get("train/kd"))
    parts = sum(EVERY_LOSS[n] * float(total[f"train/{n}"]) for n in ("kd", "hard", "hidden", "attention",
                                                                   "embedding", "cosine", "minilm"))
    assert float(total["train/loss"]) == pytest.approx(parts, rel=1e-4)  # the weighted sum, each term logged
    teacher_acc = [r["val/teacher_acc"] for r in rows if r.get("val/teacher_acc")]
    assert len(teacher_acc) == 1 and 0.0 <= float(teacher_acc[0]) <= 1.0  # once, for reference
    assert any(r.get("val/acc") for r in rows)

    ckpt = torch.load(runs / "full" / "checkpoints" / "last.ckpt", weights_only=True)
    assert not any("teacher" in k for k in ckpt["state_dict"])  # the teacher is named, never saved
    assert ckpt["hyper_parameters"]["teacher"] == str(teacher.resolve())
    assert ckpt["hyper_parameters"]["backbone_config"]["num_hidden_layers"] == 2
    assert ckpt["ptm_app"]["teacher_logged"] is True  # a resume from here does not evaluate the teacher again

    module = DistillationModule.load_from_checkpoint(runs / "full" / "checkpoints" / "last.ckpt").eval()
    assert module.teacher.config.num_hidden_layers == 4 and not module.teacher.training and module.teacher_logged
    export = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(runs / "full"), "--output_dir", str(export)], runs) == 0
    assert not (export / "module_weights.safetensors").exists()  # the projection (none here) is training-only
    exported = AutoModelForSequenceClassification.from_pretrained(export).eval()
    ids = torch.tensor([[2, 10, 11, 12, 3]])
    with torch.no_grad():
        assert torch.allclose(exported(input_ids=ids).logits, module.backbone(input_ids=ids).logits, atol=1e-5)


def test_narrow_from_scratch_student_gets_a_learned_projection(tiny_corpus, teacher, tmp_path):
    """A student of another width (from a config) learns the teacher's hidden states through TinyBERT's W_h, which
    the checkpoint keeps (for resume) and the export leaves out."""
    student = {**TINY_BERT, "hidden_size": 16, "intermediate_size": 32}
    exported = tmp_path / "teacher_export"  # the teacher as an exported save_pretrained directory
    assert run_main(["export", "--ckpt_path", str(teacher), "--output_dir", str(exported)], tmp_path / "runs") == 0
    path = distill_config(tmp_path, tiny_corpus, exported, {
        "backbone_config": student, "optim": {"lr": 1e-3},
        "distill": {"kd": 1.0, "hard": 0.0, "hidden": 1.0, "patient": 1.0, "embedding": 1.0,
                    "layer_map": [[1, 2], [2, 4]]}},
        steps=2)
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", str(path)], runs) == 0
    ckpt = torch.load(runs / "distill" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["state_dict"]["distill_projection.weight"].shape == (32, 16)
    rows = list(csv.DictReader(open(runs / "distill" / "logs" / "metrics.csv")))
    assert all(len([r for r in rows if r.get(f"train/{n}")]) == 2 for n in ("hidden", "patient", "embedding"))
    assert run_main(["export", "--ckpt_path", str(runs / "distill"), "--output_dir", str(tmp_path / "x")], runs) == 0
    assert not (tmp_path / "x" / "module_weights.safetensors").exists()


def test_bilstm_student_learns_the_teachers_logits_and_exports(tiny_corpus, teacher, tmp_path):
    """Tang et al. 2019: a BiLSTM classifier (``backbones.bilstm``) with the teacher's tokenizer, logit MSE + CE
    (+ a cosine loss on its ``[h→; h←]`` states, 16 wide, projected to the teacher's 32)."""
    from transformers import AutoModelForSequenceClassification

    from ptm_app.adaptation import DistillationModule

    bilstm = {"model_type": "ptm_bilstm_lm", "embedding_dim": 8, "hidden_size": 16, "num_layers": 1,
              "tie_embeddings": False}
    path = distill_config(tmp_path, tiny_corpus, teacher, {
        "backbone_config": bilstm, "optim": {"lr": 1e-2},
        "distill": {"kd": 0.0, "hard": 0.5, "logit_mse": 0.5, "cosine": 0.1}}, steps=6)
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", str(path)], runs) == 0
    rows = list(csv.DictReader(open(runs / "distill" / "logs" / "metrics.csv")))
    mse = [float(r["train/logit_mse"]) for r in rows if r.get("train/logit_mse")]
    assert len(mse) == 6 and not any(r.get("train/kd") for r in rows)
    assert len([r for r in rows if r.get("train/cosine")]) == 6
    ckpt = torch.load(runs / "distill" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["state_dict"]["distill_projection.weight"].shape == (32, 16)
    module = DistillationModule.load_from_checkpoint(runs / "distill" / "checkpoints" / "last.ckpt").eval()
    batch = {"input_ids": torch.tensor([[2, 10, 11, 12, 3], [2, 13, 14, 3, 0]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])}
    with torch.no_grad():
        teacher_logits = module.teacher(**batch).logits
        student_logits = module(batch)
    manual = ((student_logits - teacher_logits) ** 2).sum(-1).mean()
    from ptm_app.compression.losses import logit_mse

    assert logit_mse(student_logits, teacher_logits).item() == pytest.approx(manual.item())
    assert run_main(["export", "--ckpt_path", str(runs / "distill"), "--output_dir", str(tmp_path / "x")], runs) == 0
    exported = AutoModelForSequenceClassification.from_pretrained(tmp_path / "x").eval()
    with torch.no_grad():
        assert torch.allclose(exported(**batch).logits, student_logits, atol=1e-5)


def test_logit_distillation_across_tokenizers_retokenizes_for_the_teacher(tiny_corpus, teacher, tmp_path):
    """Soft targets over a shared label set need no shared vocabulary: the teacher reads the text again."""
    other = {**TOKENIZER, "vocab_size": 80}
    path = distill_config(tmp_path, tiny_corpus, teacher, {"backbone_config": TINY_BERT,
                                                           "distill": {"kd": 1.0, "hard": 0.0}}, other, steps=2)
    assert run_main(["fit", "--config", str(path)], tmp_path / "runs") == 0
    rows = list(csv.DictReader(open(tmp_path / "runs" / "distill" / "logs" / "metrics.csv")))
    assert [float(r["train/kd"]) > 0 for r in rows if r.get("train/kd")] == [True, True]
    from transformers import AutoTokenizer

    from ptm_app.compression.teacher import TeacherInputs
    from ptm_app.data.collators import PadCollator

    student_tok = AutoTokenizer.from_pretrained(tmp_path / "runs" / "distill" / "tokenizer")
    teacher_tok = AutoTokenizer.from_pretrained(teacher / "tokenizer")
    assert student_tok.get_vocab() != teacher_tok.get_vocab()
    text, pair = "the cat sat on a mat", "markets rose as shares fell"
    enc = student_tok(text, pair)
    collate = TeacherInputs(PadCollator(student_tok.pad_token_id), student_tok, teacher_tok, 32)
    batch = collate([{"input_ids": torch.tensor(enc["input_ids"]), "key": 0, "label": 0,
                      "token_type_ids": torch.tensor(enc["token_type_ids"])}])
    assert batch["teacher_input_ids"][0].tolist() == teacher_tok(text, pair)["input_ids"]
    assert batch["teacher_token_type_ids"][0].tolist() == teacher_tok(text, pair)["token_type_ids"]


@pytest.mark.parametrize("model, message", [
    ({"backbone_config": TINY_BERT, "distill": {"hidden": 1.0}},
     "use different tokenizers (vocabularies of"),
    ({"student_layers": [1, 3]}, "use different tokenizers"),
])
def test_token_losses_across_tokenizers_are_one_line(tiny_corpus, teacher, tmp_path, capsys, model, message):
    other = {**TOKENIZER, "vocab_size": 80}
    path = distill_config(tmp_path, tiny_corpus, teacher, model, other, steps=1)
    assert run_main(["fit", "--config", str(path)], tmp_path / "runs") != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "data.init_args.tokenizer.pretrained" in err[0], err


@pytest.mark.parametrize("model, message", [
    ({"student_layers": "every_other", "distill": {"hidden": 1.0, "layer_map": [[1, 9]]}},
     "teacher layer 9, but the teacher has layers 1..4"),
    ({"student_layers": [1, 5]}, "student_layers names teacher layer 5, but the teacher has layers 1..4"),
    ({"student_layers": "every_other", "teacher": "checkpoints/minilm_full_bbc"},  # names the config that makes it
     "teacher 'checkpoints/minilm_full_bbc' not found (nor under the runs directory"),
    ({"backbone_config": {"model_type": "ptm_bilstm_lm", "embedding_dim": 8, "hidden_size": 8},
      "distill": {"attention": 1.0}}, "BiLSTMForSequenceClassification has none: set distill.attention: 0"),
    ({"backbone_config": {"model_type": "ptm_bilstm_lm", "embedding_dim": 8, "hidden_size": 8},
      "distill": {"minilm": 1.0}}, "BiLSTMForSequenceClassification has none: set distill.minilm: 0"),
    ({"backbone_config": {**TINY_BERT, "num_attention_heads": 4}, "distill": {"minilm": 1.0}},
     "distill.minilm compares heads one to one, but the student has 4 and the teacher 2"),
    ({"backbone_config": TINY_BERT, "teacher": "minilm"},  # a prepared bare encoder: its head would be random
     "teacher 'minilm' has no trained classification head"),
])
def test_bad_teachers_and_missing_layers_are_one_line(tiny_corpus, teacher, tmp_path, capsys, model, message):
    path = distill_config(tmp_path, tiny_corpus, teacher, model, steps=1)  # model's own teacher wins
    assert run_main(["fit", "--config", str(path)], tmp_path / "runs") != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    if "minilm_full_bbc" in message:
        assert "python main.py fit --config configs/adapt/minilm_full_bbc.yaml" in err[0]


def test_student_from_every_other_layer_has_the_teachers_weights(teacher):
    from ptm_app.compression.students import chosen_layers, student_from_teacher
    from ptm_app.compression.teacher import load_teacher

    model, _ = load_teacher(str(teacher))
    layers = chosen_layers("every_other", 4)
    assert layers == [2, 4] and chosen_layers("every_other", 5) == [1, 3, 5]
    student = student_from_teacher(model, layers)
    assert student.config.num_hidden_layers == 2
    t, s = model.state_dict(), student.state_dict()
    for j, layer in enumerate(layers):
        block = {k for k in s if k.startswith(f"bert.encoder.layer.{j}.")}
        assert block
        for key in block:
            assert torch.equal(s[key], t[key.replace(f"layer.{j}.", f"layer.{layer - 1}.")]), key
    for key in ("bert.embeddings.word_embeddings.weight", "bert.pooler.dense.weight", "classifier.weight"):
        assert torch.equal(s[key], t[key])
    listed = student_from_teacher(model, chosen_layers([3, 1, 4], 4)).state_dict()  # a layer list, in its order
    key = "bert.encoder.layer.{}.attention.self.query.weight"
    same = [torch.equal(listed[key.format(j)], t[key.format(layer - 1)]) for j, layer in enumerate([3, 1, 4])]
    assert same == [True, True, True]


def test_teacher_logits_follow_the_students_label_order(teacher):
    """A teacher trained on ["neg", "pos"] teaches a student whose labels are ["pos", "neg"]: its logits are
    reordered; a teacher of another label set is refused in one line."""
    from ptm_app.adaptation import DistillationModule
    from ptm_app.errors import PtmError

    config = {**TINY_BERT, "vocab_size": 100}
    module = DistillationModule(teacher=str(teacher), backbone_config=config, labels=["pos", "neg"]).build()
    assert [module.teacher.config.id2label[i] for i in range(2)] == ["neg", "pos"]
    batch = {"input_ids": torch.tensor([[2, 10, 11, 3]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    _, reordered = module.teacher_forward(batch, hidden=False)
    with torch.no_grad():
        plain = module.teacher(**batch).logits
    assert torch.equal(reordered, plain[:, [1, 0]]) and not torch.equal(reordered, plain)
    with pytest.raises(PtmError, match=r"predicts labels \['neg', 'pos'\] but the data's labels are \['a', 'b'\]"):
        DistillationModule(teacher=str(teacher), backbone_config=config, labels=["a", "b"]).build()


def test_prepared_encoder_teaches_hidden_states_to_a_student_of_its_layers(tiny_corpus, tmp_path):
    """A prepared bare encoder (MiniLM) can teach what it has, its hidden states and attention scores (TinyBERT's
    task-agnostic stage), to a student made from its layers 2, 4, 6; the student's encoder starts as its copy."""
    path = distill_config(tmp_path, tiny_corpus, "minilm", {
        "student_layers": "every_other", "optim": {"lr": 1e-4},
        "distill": {"kd": 0.0, "hard": 1.0, "hidden": 1.0, "attention": 1.0, "layer_map": "uniform"}},
        tokenizer={"pretrained": "minilm"}, steps=2)
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", str(path)], runs) == 0
    rows = list(csv.DictReader(open(runs / "distill" / "logs" / "metrics.csv")))
    hidden = [float(r["train/hidden"]) for r in rows if r.get("train/hidden")]
    assert len(hidden) == 2 and all(v > 0 for v in hidden)  # dropout in the student: not a perfect copy
    assert not any(r.get("val/teacher_acc") for r in rows)  # its head is random: no reference metrics


def test_adapter_tuned_teacher_teaches_with_its_adapters(tiny_corpus, tmp_path):
    """A Houlsby-adapter run (a delta export cannot merge) is rebuilt with its adapters as the teacher."""
    from ptm_app.compression.teacher import load_teacher

    cfg = {"seed_everything": 3, "trainer": {"max_steps": 2, "limit_val_batches": 1, **QUIET},
           "model": {"class_path": "SequenceClassificationModule",
                     "init_args": {"backbone_config": TINY_BERT, "delta": {"method": "houlsby"}}},
           "data": data(tiny_corpus)}
    path = tmp_path / "adapters.yaml"
    path.write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", str(path)], runs) == 0
    model, tokenizer = load_teacher(str(runs / "adapters"))
    state = torch.load(runs / "adapters" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    adapter_keys = [k for k in state if "adapter" in k]
    assert adapter_keys and tokenizer is not None and not model.training
    weights = dict(model.named_parameters())
    key = adapter_keys[0].removeprefix("backbone.")
    assert torch.equal(weights[key], state[adapter_keys[0]])  # the trained adapter, in the teacher
    path = distill_config(tmp_path, tiny_corpus, runs / "adapters", {"backbone_config": TINY_BERT}, steps=1)
    assert run_main(["fit", "--config", str(path)], runs) == 0


def cached_shares(run) -> list[float]:
    return [float(r["train/teacher_cached"]) for r in csv.DictReader(open(run / "logs" / "metrics.csv"))
            if r.get("train/teacher_cached")]


def test_cached_teacher_logits_skip_the_teacher_after_the_first_epoch(tiny_corpus, teacher, tmp_path, monkeypatch):
    """60 training examples in batches of 8: steps 0-7 are epoch 1 (the teacher runs), steps 8-11 reuse its cached
    logits; the losses equal a run without the cache, and a run resumed in epoch 2 reads the cache from disk
    (exactly the uninterrupted run's losses).  The cache is a file keyed by the teacher: another student of it
    reads every logit from the first step, and the same teacher path with changed weights starts a new one."""
    from safetensors.torch import load_file

    monkeypatch.setenv("PTM_CACHE_DIR", str(tmp_path / "cache"))
    model = {"backbone_config": TINY_BERT, "distill": {"kd": 0.5, "hard": 0.5}, "optim": {"lr": 1e-3}}
    runs = tmp_path / "runs"
    cached = distill_config(tmp_path, tiny_corpus, teacher, {**model, "cache_teacher_logits": True}, steps=12)
    assert_resumes_exactly(["fit", "--config", str(cached)], runs, stop=10, steps=12)
    assert cached_shares(runs / "full") == [0.0] * 8 + [1.0] * 4
    plain = tmp_path / "plain"
    plain.mkdir()
    path = distill_config(plain, tiny_corpus, teacher, model, steps=12)
    assert run_main(["fit", "--config", str(path), "--run_name", "plain"], runs) == 0
    fresh = {int(r["step"]): float(r["train/kd"]) for r in csv.DictReader(open(runs / "plain" / "logs" / "metrics.csv"))
             if r.get("train/kd")}
    rows = [r for r in csv.DictReader(open(runs / "full" / "logs" / "metrics.csv")) if r.get("train/teacher_cached")]
    reused = {int(r["step"]): float(r["train/kd"]) for r in rows}
    assert sorted(fresh) == sorted(reused) == list(range(12))
    for step in range(12):
        assert reused[step] == pytest.approx(fresh[step], rel=1e-4, abs=1e-6), step
    ckpt = torch.load(runs / "full" / "checkpoints" / "last.ckpt", weights_only=True)
    assert "teacher_logits" not in ckpt["ptm_app"] and not any("teacher" in k for k in ckpt["state_dict"])
    files = list((tmp_path / "cache" / "teacher_logits").glob("*.safetensors"))
    assert len(files) == 1 and load_file(str(files[0]))["logits"].shape == (60, 2)



def test_teacher_logit_cache_serves_other_students_and_follows_the_teachers_weights(tiny_corpus, teacher, tmp_path,
                                                                                    monkeypatch):
    """The cache is a file per teacher: another student of it reads every logit from its first step; the same
    teacher path with changed weights starts a new file (the teacher runs again)."""
    monkeypatch.setenv("PTM_CACHE_DIR", str(tmp_path / "cache"))
    copy = tmp_path / "t" / "teacher"
    shutil.copytree(teacher, copy)
    model = {"backbone_config": TINY_BERT, "distill": {"kd": 0.5, "hard": 0.5}, "cache_teacher_logits": True}
    runs = tmp_path / "runs"
    one_layer = {**model, "backbone_config": {**TINY_BERT, "num_hidden_layers": 1}}
    for run, student, share in (("first", model, 0.0), ("other", one_layer, 1.0), ("changed", model, 0.0)):
        if run == "changed":  # the classifier of the teacher's last checkpoint moved
            last = copy / "checkpoints" / "last.ckpt"
            state = torch.load(last, weights_only=True)
            key = next(k for k in state["state_dict"] if k.endswith("classifier.weight"))
            state["state_dict"][key] = state["state_dict"][key] + 1.0
            torch.save(state, last)
        path = distill_config(tmp_path, tiny_corpus, copy, student, steps=2)
        assert run_main(["fit", "--config", str(path), "--run_name", run], runs) == 0
        assert cached_shares(runs / run) == [share] * 2, run
    assert len(list((tmp_path / "cache" / "teacher_logits").glob("*.safetensors"))) == 2


def test_caching_logits_with_a_hidden_state_loss_is_one_line(tiny_corpus, teacher, tmp_path, capsys):
    path = distill_config(tmp_path, tiny_corpus, teacher, {"student_layers": "every_other", "cache_teacher_logits": True,
                                                          "distill": {"kd": 1.0, "cosine": 1.0}}, steps=1)
    assert run_main(["fit", "--config", str(path)], tmp_path / "runs") != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cosine need(s) its hidden states every step" in err[0], err
