"""Distillation and quantization-aware training as policies of any task module (``compression.teacher_loss``,
``compression.fake_quant``): per-token soft targets over labelled tokens only, QA's start and end distributions over
real tokens (golden numbers by hand, Hinton et al. 2015 §2), a tagger that moves toward its teacher, QA distilled end
to end through main.py, and QAT on a tagger."""
import csv
import math

import pytest
import torch
import yaml

from ptm_app.compression.teacher_loss import kind_logit_mse, kind_soft_target_loss
from ptm_app.task_kinds.registry import task_kind
from tests.conftest import TINY_BERT, assert_resumes_exactly, run_main

pytestmark = pytest.mark.usefixtures("one_thread")
LN3 = math.log(3.0)


def kl(p: list[float], q: list[float]) -> float:
    return sum(a * math.log(a / b) for a, b in zip(p, q))


def tag_batch():
    """Two sentences of 4 positions, 3 tags: [CLS] w1 ##w1 w2 / [CLS] w1 [SEP] [PAD]; labels only on words' first
    sub-tokens.  At T = 2 the teacher's first labelled token is softmax([2 ln 3, 0, 0] / 2) = (0.6, 0.2, 0.2) and the
    student's uniform; the second labelled token agrees; the third is (0.2, 0.6, 0.2) against (0.6, 0.2, 0.2).  Every
    unlabelled position (CLS, the later sub-token, SEP, padding) gets wildly different logits that must not count."""
    far_t, far_s = [9.0, -9.0, 0.0], [-9.0, 9.0, 0.0]
    teacher = torch.tensor([[far_t, [2 * LN3, 0, 0], far_t, [1.0, 2.0, 3.0]],
                            [far_t, [0, 2 * LN3, 0], far_t, far_t]])
    student = torch.tensor([[far_s, [0.0, 0, 0], far_s, [1.0, 2.0, 3.0]],
                            [far_s, [2 * LN3, 0, 0], far_s, far_s]])
    labels = torch.tensor([[-100, 0, -100, 2], [-100, 1, -100, -100]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    return student, teacher, {"labels": labels, "attention_mask": mask}


def test_token_kd_is_t_squared_kl_averaged_over_labelled_tokens_only():
    student, teacher, batch = tag_batch()
    targets = task_kind("token").soft_targets
    loss = kind_soft_target_loss(targets, student, teacher, batch, temperature=2.0)
    by_hand = 4.0 * (kl([0.6, 0.2, 0.2], [1 / 3] * 3) + 0.0 + kl([0.2, 0.6, 0.2], [0.6, 0.2, 0.2])) / 3
    assert by_hand == pytest.approx(0.78372, abs=1e-5)  # the golden number: (0.14834 + 0 + 0.4 ln 3) · 4 / 3
    assert float(loss) == pytest.approx(by_hand, rel=1e-6)
    # the unlabelled positions do not count: changing them changes nothing; one labelled logit moves the loss
    moved = student.clone()
    moved[:, 0], moved[:, 2], moved[1, 3] = 50.0, -50.0, 7.0
    assert float(kind_soft_target_loss(targets, moved, teacher, batch, 2.0)) == pytest.approx(by_hand, rel=1e-6)
    moved[0, 3, 0] += 1.0
    assert float(kind_soft_target_loss(targets, moved, teacher, batch, 2.0)) > by_hand + 1e-3
    # the squared logit error over the same rows: (2 ln 3)² + 0 + 2·(2 ln 3)², averaged over the 3 labelled tokens
    assert float(kind_logit_mse(targets, student, teacher, batch)) == pytest.approx(3 * (2 * LN3) ** 2 / 3, rel=1e-6)


def test_qa_kd_is_the_mean_of_the_start_and_end_kls_over_real_tokens():
    """One window of 3 real tokens and 1 padding position: the start distributions (0.6, 0.2, 0.2) vs uniform, the
    end ones equal; the padding's scores (however far apart) take no probability."""
    teacher = (torch.tensor([[2 * LN3, 0.0, 0.0, 30.0]]), torch.tensor([[0.0, 1.0, 2.0, -30.0]]))
    student = (torch.tensor([[0.0, 0.0, 0.0, -30.0]]), torch.tensor([[0.0, 1.0, 2.0, 30.0]]))
    batch = {"attention_mask": torch.tensor([[1, 1, 1, 0]])}
    loss = kind_soft_target_loss(task_kind("qa").soft_targets, student, teacher, batch, temperature=2.0)
    assert float(loss) == pytest.approx(4.0 * (kl([0.6, 0.2, 0.2], [1 / 3] * 3) + 0.0) / 2, rel=1e-5)


def test_sequence_kd_is_the_plain_soft_target_loss():
    """One row per example: the kind's loss is exactly ``losses.soft_target_loss`` (what DistillationModule used)."""
    from ptm_app.compression.losses import soft_target_loss

    student, teacher = torch.randn(5, 3, generator=torch.Generator().manual_seed(0)), torch.randn(5, 3)
    got = kind_soft_target_loss(task_kind("sequence").soft_targets, student, teacher, {}, 3.0)
    assert torch.equal(got, soft_target_loss(student, teacher, 3.0))
    assert task_kind("regression").soft_targets is None  # a value has no distribution: no distill on regression


LABELS = ["DET", "NOUN", "VERB", "X"]


def sharp_tagger(tmp_path, seed: int):
    """An exported tiny BERT tagger with confident, random per-token predictions (its classifier scaled up)."""
    from ptm_app.adaptation.token_classification import TokenClassificationModule

    torch.manual_seed(seed)
    config = {**TINY_BERT, "vocab_size": 60, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    module = TokenClassificationModule(backbone_config=config, labels=LABELS).build()
    with torch.no_grad():
        module.backbone.classifier.weight.mul_(30.0)
    module.backbone.save_pretrained(tmp_path / "teacher")
    return tmp_path / "teacher", config


def tagged_batch(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 60, (16, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[8:, 7:] = 0  # padding in half the rows
    labels = torch.randint(0, len(LABELS), ids.shape, generator=g)
    labels[:, 0] = -100
    labels[:, 3::4] = -100  # later sub-tokens
    labels[mask == 0] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def test_a_tagger_trained_on_its_teachers_soft_targets_moves_toward_the_teacher(tmp_path):
    """A student tagger (another random init) trained only on the teacher policy's loss (kd = 1, hard = 0) for 40
    steps on one batch agrees with the teacher's tag on held-out labelled tokens far more, and its KL to the teacher
    falls; the policy's loss is the per-token KD of the two models' outputs."""
    from ptm_app.adaptation.token_classification import TokenClassificationModule
    from ptm_app.compression.teacher_loss import TeacherLoss

    teacher_dir, config = sharp_tagger(tmp_path, seed=1)
    torch.manual_seed(2)
    student = TokenClassificationModule(backbone_config=config, labels=LABELS,
                                        distill={"teacher": str(teacher_dir), "kd": 1.0, "hard": 0.0,
                                                 "temperature": 1.0}).build()
    policy = student.policy(TeacherLoss)
    assert policy is not None and student.style() == "distillation"
    train, held_out = tagged_batch(0), tagged_batch(1)
    keep = held_out["labels"] != -100

    def agreement_and_kl() -> tuple[float, float]:
        student.eval()
        with torch.no_grad():
            s, t = student(held_out), policy.teacher_forward(student, held_out, hidden=False)[1]
        kd = kind_soft_target_loss(student.kind.soft_targets, s, t, held_out, 1.0)
        return float((s.argmax(-1) == t.argmax(-1))[keep].float().mean()), float(kd)

    before = agreement_and_kl()
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-2)
    student.train()
    loss, parts = policy.training_loss(student, train)
    with torch.no_grad():
        expected = kind_soft_target_loss(student.kind.soft_targets, student(train),
                                         policy.teacher_forward(student, train, hidden=False)[1], train, 1.0)
    assert set(parts) == {"kd"} and float(loss.detach()) == pytest.approx(float(expected), rel=1e-5)
    for _ in range(40):
        optimizer.zero_grad()
        policy.training_loss(student, train)[0].backward()
        optimizer.step()
    after = agreement_and_kl()
    # agreement on held-out labelled tokens: from chance (1/4; 0.23 measured) to 0.84 measured; KL 0.95 -> 0.22
    assert before[0] < 0.4 and after[0] > 0.75, (before, after)
    assert after[1] < 0.4 * before[1], (before, after)


def test_a_choice_student_learns_the_teachers_distribution_over_the_choices(tmp_path):
    """Multiple choice: the teacher reads the same [B, choices, L] inputs, and kd is Hinton's loss over each
    question's choice scores."""
    from ptm_app.adaptation.choice import MultipleChoiceModule
    from ptm_app.compression.losses import soft_target_loss
    from ptm_app.compression.teacher_loss import TeacherLoss

    config = {**TINY_BERT, "vocab_size": 60}
    torch.manual_seed(1)
    MultipleChoiceModule(backbone_config=config, num_choices=3).build().backbone.save_pretrained(tmp_path / "t")
    torch.manual_seed(2)
    student = MultipleChoiceModule(backbone_config=config, num_choices=3,
                                   distill={"teacher": str(tmp_path / "t"), "kd": 1.0, "hard": 1.0}).build().eval()
    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(5, 60, (6, 7), generator=g), "labels": torch.tensor([0, 2]),
             "attention_mask": torch.ones(6, 7, dtype=torch.long)}
    policy = student.policy(TeacherLoss)
    with torch.no_grad():
        loss, parts = policy.training_loss(student, batch)
        scores, teacher = student(batch), policy.teacher_forward(student, batch, hidden=False)[1]
    assert scores.shape == teacher.shape == (2, 3)
    assert float(parts["kd"]) > 0
    assert float(parts["kd"]) == pytest.approx(float(soft_target_loss(scores, teacher, 2.0)), rel=1e-5)
    assert float(parts["hard"]) == pytest.approx(float(torch.nn.functional.cross_entropy(scores, batch["labels"])),
                                                 rel=1e-5)
    assert float(loss) == pytest.approx(float(parts["kd"] + parts["hard"]), rel=1e-5)


def test_distill_on_a_kind_without_soft_targets_and_without_a_teacher_is_one_line(tmp_path):
    from ptm_app.adaptation.classification import SequenceRegressionModule, SequenceClassificationModule
    from ptm_app.errors import PtmError

    with pytest.raises(PtmError, match="distill.teacher is not set"):
        SequenceClassificationModule(backbone_config=TINY_BERT, labels=["a", "b"], distill={"kd": 1.0})
    with pytest.raises(PtmError, match="adversarial .FreeLB. and distill each replace the training loss"):
        SequenceClassificationModule(backbone_config=TINY_BERT, labels=["a", "b"], distill={"teacher": "x"},
                                     adversarial={"steps": 2})
    assert "distill" not in SequenceRegressionModule.__init__.__code__.co_varnames  # nothing to distil: not offered


# -- QA distilled end to end through main.py --------------------------------------------------------------------------
QUIET = {"accelerator": "cpu", "devices": 1, "log_every_n_steps": 1, "enable_progress_bar": False,
         "enable_model_summary": False, "num_sanity_val_steps": 0}
WORDPIECE = {"train": "wordpiece", "vocab_size": 200, "min_frequency": 1}
QA_DATA = {"max_length": 32, "doc_stride": 8, "max_question_length": 8, "batch_size": 8, "tokenizer": WORDPIECE}


def qa_config(tmp_path, name: str, root, model: dict, steps: int) -> str:
    cfg = {"seed_everything": 5, "trainer": {"max_steps": steps, "val_check_interval": 2, "limit_val_batches": 1,
                                             **QUIET},
           "model": {"class_path": "QuestionAnsweringModule", "init_args": {"optim": {"lr": 1e-2, "warmup": 0},
                                                                            **model}},
           "data": {"class_path": "QADataModule", "init_args": {"source": str(root), **QA_DATA}}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_qa_student_distils_start_and_end_from_a_teacher_resumes_and_exports(tmp_path):
    from ptm_app.adaptation.qa import QuestionAnsweringModule
    from ptm_app.compression.teacher_loss import TeacherLoss
    from tests.task_kinds.test_every_kind import qa_rows, splits

    root = splits(tmp_path / "qa", qa_rows)
    runs = tmp_path / "runs"
    teacher = {"backbone_config": {**TINY_BERT, "num_hidden_layers": 3}}
    assert run_main(["fit", "--config", qa_config(tmp_path, "teacher", root, teacher, 4)], runs) == 0
    narrow = {**TINY_BERT, "num_hidden_layers": 1, "hidden_size": 16, "intermediate_size": 32}  # W_h: 16 -> 32
    student = {"backbone_config": narrow,
               "distill": {"teacher": str(runs / "teacher"), "temperature": 2.0, "kd": 0.5, "hard": 0.5,
                           "hidden": 1.0, "layer_map": "uniform"}}
    path = qa_config(tmp_path, "student", root, student, 4)
    assert_resumes_exactly(["fit", "--config", path], runs, stop=2, steps=4)
    rows = list(csv.DictReader(open(runs / "full" / "logs" / "metrics.csv")))
    trained = [r for r in rows if r.get("train/kd")]
    assert len(trained) == 4 and all(float(r["train/kd"]) > 0 and float(r["train/hidden"]) > 0 for r in trained)
    for r in trained:  # the weighted sum of the logged terms
        total = 0.5 * float(r["train/kd"]) + 0.5 * float(r["train/hard"]) + float(r["train/hidden"])
        assert float(r["train/loss"]) == pytest.approx(total, rel=1e-4)
    reference = [r for r in rows if r.get("val/teacher_f1")]
    assert len(reference) == 1 and 0.0 <= float(reference[0]["val/teacher_em"]) <= 100.0  # once, for reference
    ckpt = torch.load(runs / "full" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["hyper_parameters"]["distill"]["teacher"] == str((runs / "teacher").resolve())
    assert not any("teacher" in k for k in ckpt["state_dict"]) and ckpt["ptm_app"]["teacher_logged"] is True
    assert ckpt["state_dict"]["distill_projection.weight"].shape == (32, 16)  # TinyBERT's W_h, kept for resume
    module = QuestionAnsweringModule.load_from_checkpoint(runs / "full" / "checkpoints" / "last.ckpt")
    assert module.backbone.config.num_hidden_layers == 1
    assert module.policy(TeacherLoss).frozen._model is None  # the student loads (predicts, exports) without it
    assert run_main(["export", "--ckpt_path", str(runs / "full"), "--output_dir", str(tmp_path / "x")], runs) == 0
    assert (tmp_path / "x" / "config.json").exists()


# -- QAT as a policy -----------------------------------------------------------------------------------------------
def test_qat_policy_on_a_tagger_fake_quantizes_every_linear_as_quant_aware_module_did():
    """``qat`` on a TokenClassificationModule: every linear computes on 8-bit weights and inputs (the logits move off
    the fp32 ones by a quantization step, not more), the EMA input ranges are learned in training mode, and the
    QuantAwareModule name gives the same model as SequenceClassificationModule with ``qat``."""
    from ptm_app.adaptation.classification import SequenceClassificationModule
    from ptm_app.adaptation.token_classification import TokenClassificationModule
    from ptm_app.compression.fake_quant import FakeQuant, disable_fake_quant, quantizable_linears
    from ptm_app.adaptation import QuantAwareModule

    tiny = {**TINY_BERT, "vocab_size": 30}
    torch.manual_seed(0)
    module = TokenClassificationModule(backbone_config=tiny, labels=LABELS, qat={"ema": 0.5}).build()
    assert isinstance(module.policy(FakeQuant), FakeQuant) and module.style() == "quantization-aware (Q8BERT)"
    batch = tagged_batch(0)
    batch["input_ids"] = batch["input_ids"] % 30
    module.train()
    module(batch)
    names = list(quantizable_linears(module.backbone))
    assert all(float(module.qat_ranges.get(n)) > 0 for n in names)  # every linear's input range observed
    module.eval()
    with torch.no_grad():
        quantized = module(batch)
        disable_fake_quant(module.backbone)
        plain = module(batch)
    gap = float((quantized - plain).abs().max())
    assert 0 < gap < 0.1 * float(plain.abs().max())

    torch.manual_seed(3)
    old = QuantAwareModule(backbone_config=tiny, labels=["a", "b"]).build().eval()
    torch.manual_seed(3)
    new = SequenceClassificationModule(backbone_config=tiny, labels=["a", "b"], qat={}).build().eval()
    ids = {"input_ids": torch.tensor([[2, 7, 9, 3]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    with torch.no_grad():
        assert torch.equal(old(ids), new(ids))
    assert set(old.state_dict()) == set(new.state_dict())  # qat_ranges.* where older checkpoints have them


# -- pruning as a policy ---------------------------------------------------------------------------------------------
def test_pruning_policy_prunes_a_tagger_layers_heads_and_weights_through_main(tmp_path):
    """``pruning`` on a TokenClassificationModule: a layer dropped, one head of layer 0 removed at step 1 (scored and
    sliced as for classification), magnitude sparsity 0.5 kept through the steps after it; the checkpoint reloads
    the smaller model and the summary reports it."""
    import json

    from ptm_app.adaptation.token_classification import TokenClassificationModule
    from ptm_app.compression.magnitude import prunable_weights, sparsity_of
    from tests.task_kinds.test_every_kind import splits, tagged

    root = splits(tmp_path / "tags", tagged)
    pruning = {"layers": {"drop": "top", "k": 1}, "heads": {"heads": {0: [1]}, "start_step": 1},
               "magnitude": {"sparsity": 0.5, "start_step": 2}}
    cfg = {"seed_everything": 5, "trainer": {"max_steps": 4, "val_check_interval": 4, "limit_val_batches": 1,
                                             **QUIET},
           "model": {"class_path": "TokenClassificationModule",
                     "init_args": {"backbone_config": {**TINY_BERT, "num_hidden_layers": 3}, "pruning": pruning,
                                   "optim": {"lr": 1e-2, "warmup": 0}}},
           "data": {"class_path": "TokenTaskDataModule",
                    "init_args": {"source": str(root), "max_length": 16, "batch_size": 8, "tokenizer": WORDPIECE}}}
    path = tmp_path / "prune_tags.yaml"
    path.write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", str(path)], runs) == 0
    facts = json.loads((runs / "prune_tags" / "summary.json").read_text())["compression"]
    assert facts["num_hidden_layers"] == 2 and facts["dropped_layers"] == [3]
    assert facts["heads_per_layer"] == [1, 2] and facts["sparsity"] == pytest.approx(0.5, abs=0.01)
    module = TokenClassificationModule.load_from_checkpoint(runs / "prune_tags" / "checkpoints" / "last.ckpt")
    assert module.backbone.config.num_hidden_layers == 2
    assert sparsity_of(prunable_weights(module.backbone).values()) == pytest.approx(0.5, abs=0.01)
    assert module.style() == "pruning"
