"""The students of other structures: the Kim (2014) CNN classifier (``backbones.cnn``) and the teacher's word
embeddings copied into a from-scratch student (Tang et al. 2019 §3)."""
import csv

import pytest
import torch

from tests.compression.test_distill_runs import distill_config, teacher  # noqa: F401  (the tiny teacher fixture)
from tests.conftest import run_main

pytestmark = pytest.mark.usefixtures("one_thread")


def cnn(vocab: int = 20, labels: int = 2, **config):
    from ptm_app.backbones.cnn import CNNConfig, CNNForSequenceClassification

    settings = {"embedding_dim": 8, "num_filters": 4, "dropout": 0.0, "pad_token_id": 0, **config}
    return CNNForSequenceClassification(CNNConfig(vocab_size=vocab, num_labels=labels, **settings))


def test_cnn_shapes_and_max_over_time_pooling_by_hand():
    torch.manual_seed(0)
    model = cnn(labels=3, kernel_sizes=[2, 3]).eval()
    ids = torch.tensor([[1, 5, 6, 7, 2, 0, 0], [1, 8, 2, 0, 0, 0, 0]])
    mask = (ids > 0).long()
    out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    assert out.logits.shape == (2, 3) and out.hidden_states[0].shape == (2, 7, 8)
    assert model.config.hidden_size == 8  # 2 widths x 4 feature maps
    # by hand for row 0: each width's ReLU feature maps over the windows of its 5 real tokens, max over time
    emb = model.embed_tokens(ids[0, :5])
    pooled = []
    for conv, width in zip(model.convs, (2, 3)):
        windows = [torch.relu(conv.bias + (conv.weight * emb[t:t + width].T).sum((1, 2)))
                   for t in range(5 - width + 1)]
        pooled.append(torch.stack(windows).amax(0))
    manual = model.classifier(torch.cat(pooled))
    assert torch.allclose(out.logits[0], manual, atol=1e-5)
    # padding never reaches the features: the same sentence alone, unpadded, scores the same
    alone = model(input_ids=ids[1:, :3], attention_mask=mask[1:, :3]).logits
    assert torch.allclose(alone, out.logits[1:], atol=1e-6)
    # left padding gives the same scores; a sentence shorter than the widest filter still classifies
    left = model(input_ids=ids[1:].roll(4, 1), attention_mask=mask[1:].roll(4, 1)).logits
    assert torch.allclose(left, out.logits[1:], atol=1e-6)
    assert model(input_ids=torch.tensor([[1, 2]])).logits.shape == (1, 3)


def test_cnn_learns_a_tiny_separable_task():
    """Class 1 iff token 3 occurs anywhere (any position): the CNN reaches 100 % where chance is ~50 %."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 20, (64, 10), generator=g)
    labels = torch.randint(0, 2, (64,), generator=g)
    where = torch.randint(0, 10, (64,), generator=g)
    ids[labels == 1, where[labels == 1]] = 3
    torch.manual_seed(0)
    model = cnn(kernel_sizes=[3, 4, 5])
    optimiser = torch.optim.Adam(model.parameters(), lr=0.05)
    before = (model(input_ids=ids).logits.argmax(-1) == labels).float().mean().item()
    for _ in range(60):
        optimiser.zero_grad()
        model(input_ids=ids, labels=labels).loss.backward()
        optimiser.step()
    after = (model.eval()(input_ids=ids).logits.argmax(-1) == labels).float().mean().item()
    assert before < 0.75 and after == 1.0


def test_cnn_student_starts_from_the_teachers_embeddings_and_exports(tiny_corpus, teacher, tmp_path):  # noqa: F811
    """``teacher_embeddings``: the student's embedding_dim becomes the teacher's width and its word embeddings the
    teacher's at build; it then trains (kd + hard), and its export reloads with the same outputs."""
    from transformers import AutoModelForSequenceClassification

    from ptm_app.adaptation import DistillationModule

    path = distill_config(tmp_path, tiny_corpus, teacher, {
        "backbone_config": {"model_type": "ptm_cnn", "num_filters": 4, "kernel_sizes": [3, 4, 5]},
        "teacher_embeddings": True, "optim": {"lr": 1e-2}, "distill": {"kd": 0.5, "hard": 0.5}}, steps=0)
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", str(path), "--trainer.max_steps", "3"], runs) == 0
    module = DistillationModule.load_from_checkpoint(runs / "distill" / "checkpoints" / "last.ckpt").eval()
    assert module.backbone.config.embedding_dim == 32  # the tiny teacher's width
    rows = list(csv.DictReader(open(runs / "distill" / "logs" / "metrics.csv")))
    assert len([r for r in rows if r.get("train/kd")]) == 3 and len([r for r in rows if r.get("train/hard")]) == 3
    # 3 steps at lr 1e-2 moved the copied embeddings only a little from the teacher's, and far less than a random
    # initialisation of the same shape is from them
    teacher_emb = module.teacher.get_input_embeddings().weight
    moved = (module.backbone.get_input_embeddings().weight - teacher_emb).norm()
    assert moved < 0.5 * (torch.randn_like(teacher_emb) * 0.02 - teacher_emb).norm()
    assert run_main(["export", "--ckpt_path", str(runs / "distill"), "--output_dir", str(tmp_path / "x")], runs) == 0
    exported = AutoModelForSequenceClassification.from_pretrained(tmp_path / "x").eval()
    batch = {"input_ids": torch.tensor([[2, 10, 11, 12, 3]]), "attention_mask": torch.ones(1, 5, dtype=torch.long)}
    with torch.no_grad():
        assert torch.allclose(exported(**batch).logits, module(batch), atol=1e-5)


def test_copied_embeddings_of_another_width_are_one_line(tiny_corpus, teacher, tmp_path, capsys):  # noqa: F811
    path = distill_config(tmp_path, tiny_corpus, teacher, {
        "backbone_config": {"model_type": "ptm_cnn", "embedding_dim": 16}, "teacher_embeddings": True}, steps=1)
    assert run_main(["fit", "--config", str(path)], tmp_path / "runs") != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the teacher's word embeddings are" in err[0] and "teacher_embeddings: false" in err[0]


def albert_params(v: int, e: int, h: int, ffn: int, positions: int, types: int, labels: int, groups: int) -> int:
    """ALBERT's parameter count by hand: factorised embeddings, ``groups`` distinct layers, pooler, classifier."""
    embeddings = (v + positions + types) * e + 2 * e + e * h + h
    layer = 4 * (h * h + h) + 2 * h + (h * ffn + ffn) + (ffn * h + h) + 2 * h
    return embeddings + groups * layer + (h * h + h) + (h * labels + labels)


def test_shared_student_counts_its_weights_once_and_reports_them(tiny_corpus, teacher, tmp_path):  # noqa: F811
    """``shared_student``: an ALBERT with the (4-layer, 32-wide) teacher's shape, E=8 and one shared layer; it
    trains with the hidden-state and cosine losses, summary.json reports the hand-computed parameter count, and a
    second group adds exactly one layer's weights."""
    import json

    from ptm_app.adaptation import DistillationModule

    path = distill_config(tmp_path, tiny_corpus, teacher, {
        "shared_student": {"embedding_size": 8}, "optim": {"lr": 1e-3},
        "distill": {"kd": 0.5, "hard": 0.5, "hidden": 1.0, "cosine": 1.0}}, steps=2)
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", str(path)], runs) == 0
    module = DistillationModule.load_from_checkpoint(runs / "distill" / "checkpoints" / "last.ckpt")
    config = module.backbone.config
    assert (config.model_type, config.num_hidden_layers, config.num_hidden_groups, config.hidden_size) == \
        ("albert", 4, 1, 32)
    v = config.vocab_size
    assert v == module.teacher.config.vocab_size
    expected = albert_params(v, 8, 32, 64, 64, 2, 2, groups=1)
    summary = json.loads((runs / "distill" / "summary.json").read_text())
    assert summary["student_params"] == expected == sum(p.numel() for p in module.backbone.parameters())
    assert summary["teacher_params"] == sum(p.numel() for p in module.teacher.parameters())
    assert summary["compression"] == pytest.approx(summary["teacher_params"] / expected, abs=1e-3)
    assert summary["compression"] > 2.5  # 4 teacher layers of weights vs one shared layer
    rows = list(csv.DictReader(open(runs / "distill" / "logs" / "metrics.csv")))
    assert len([r for r in rows if r.get("train/hidden")]) == 2
    from ptm_app.compression.students import SharedStudent, shared_student

    two = shared_student(module.teacher, SharedStudent(embedding_size=8, num_hidden_groups=2), num_labels=2)
    assert sum(p.numel() for p in two.parameters()) == albert_params(v, 8, 32, 64, 64, 2, 2, groups=2)


@pytest.mark.parametrize("model, message", [
    ({"shared_student": {"embedding_size": 8}, "student_layers": [1, 2]},
     "student_layers and shared_student each choose the student; give only one"),
    ({"shared_student": {"num_hidden_groups": 5}}, "num_hidden_groups must be 1..4"),
    ({"student_layers": [1, 2], "teacher_embeddings": True}, "set teacher_embeddings: false"),
])
def test_bad_student_choices_are_one_line(tiny_corpus, teacher, tmp_path, capsys, model, message):  # noqa: F811
    path = distill_config(tmp_path, tiny_corpus, teacher, model, steps=1)
    assert run_main(["fit", "--config", str(path)], tmp_path / "runs") != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_shared_student_from_the_teacher_computes_the_teachers_blocks_and_factorises_its_embeddings():
    """``init_shared_from_teacher``: with a group per layer, fed the teacher's embedding output, the ALBERT student
    computes the teacher's hidden states and logits (each layer, the pooler and the classifier copied); at E = H
    its factorised word table read back through the E->H map is W and its embedding output the teacher's exactly;
    below H the read-back is the centred W on E orthogonal directions (scaled by sqrt(H/E) for the E-wide
    LayerNorm); one shared group takes the middle block; a classifier over the same labels in another order is
    reordered."""
    from transformers import BertConfig, BertForSequenceClassification

    from ptm_app.compression.students import SharedStudent, group_teacher_layers, reflection_onto_ones, shared_student

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=4, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()
    ids = torch.randint(1, 50, (2, 9))
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    words = model.bert.embeddings.word_embeddings.weight.detach()

    def read_back(student):
        albert = student.albert
        return albert.embeddings.word_embeddings.weight @ albert.encoder.embedding_hidden_mapping_in.weight.T

    full = shared_student(model, SharedStudent(embedding_size=16, num_hidden_groups=4),
                          num_labels=3, id2label=model.config.id2label).eval()
    assert torch.allclose(read_back(full), words, atol=1e-4)  # E = H: the factorisation is exact
    embedded = {}
    hook = full.albert.encoder.embedding_hidden_mapping_in.register_forward_hook(
        lambda module, args, result: embedded.setdefault("out", result))
    with torch.no_grad():
        full(input_ids=ids)
    hook.remove()
    error = (embedded["out"] - out.hidden_states[0]).norm() / out.hidden_states[0].norm()
    assert float(error) < 1e-5, float(error)  # E = H: the teacher's LayerNorm output exactly
    hook = full.albert.encoder.embedding_hidden_mapping_in.register_forward_hook(
        lambda module, args, result: out.hidden_states[0])
    with torch.no_grad():
        got = full(input_ids=ids, output_hidden_states=True)
    hook.remove()
    for layer in range(1, 5):
        assert torch.allclose(got.hidden_states[layer], out.hidden_states[layer], atol=1e-5), layer
    assert torch.allclose(got.logits, out.logits, atol=1e-5)
    small = shared_student(model, SharedStudent(embedding_size=4), num_labels=3)
    mapping = small.albert.encoder.embedding_hidden_mapping_in.weight.detach() / 2.0  # sqrt(H/E) = 2, weight 1
    projector = mapping @ mapping.T  # B Bᵀ: orthogonal projection on 4 directions orthogonal to the ones vector
    assert torch.allclose(projector @ projector, projector, atol=1e-5) and round(float(projector.trace())) == 4
    assert float((projector @ torch.ones(16)).norm()) < 1e-5
    centred = words - words.mean(1, keepdim=True)
    assert torch.allclose(read_back(small).detach(), 2.0 * centred @ projector, atol=1e-4)
    wide = shared_student(model, SharedStudent(embedding_size=24), num_labels=3)  # E > H: all H directions
    assert torch.allclose(read_back(wide), words * (16 / 24) ** 0.5, atol=1e-4)
    reflection = reflection_onto_ones(5)
    assert torch.allclose(reflection @ reflection, torch.eye(5), atol=1e-6)
    assert torch.allclose(reflection[:, -1], torch.full((5,), 5 ** -0.5), atol=1e-6)
    assert group_teacher_layers(4, 1, 4) == [1] and group_teacher_layers(6, 2, 6) == [1, 4]
    assert group_teacher_layers(6, 4, 6) == [0, 2, 3, 5]  # ALBERT's grouping: layer i runs group int(i / (L/G))
    block = model.bert.encoder.layer[1].attention.self.query.weight
    assert torch.equal(small.albert.encoder.albert_layer_groups[0].albert_layers[0].attention.query.weight, block)
    scratch = shared_student(model, SharedStudent(embedding_size=4, from_teacher=False), num_labels=3)
    assert not torch.equal(scratch.albert.encoder.albert_layer_groups[0].albert_layers[0].attention.query.weight,
                           block)
    names = [model.config.id2label[i] for i in range(3)]
    reordered = shared_student(model, SharedStudent(embedding_size=4), num_labels=3,
                               id2label=dict(enumerate(reversed(names))))
    assert torch.equal(reordered.classifier.weight, model.classifier.weight.flip(0))
