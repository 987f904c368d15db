"""The distillation losses and layer maps, against hand computations."""
import math

import pytest
import torch

from ptm_app.compression import losses
from ptm_app.compression.layer_maps import layer_pairs
from ptm_app.errors import PtmError


def test_kd_loss_is_zero_for_equal_logits_and_never_negative():
    torch.manual_seed(0)
    z = torch.randn(4, 5)
    assert losses.soft_target_loss(z, z.clone(), 3.0).item() == pytest.approx(0.0, abs=1e-6)
    for _ in range(20):
        assert losses.soft_target_loss(torch.randn(4, 5) * 3, torch.randn(4, 5) * 3, 2.0).item() >= 0.0


def test_kd_loss_is_t_squared_times_the_kl_of_the_tempered_softmaxes():
    student, teacher = torch.tensor([[1.0, 2.0, 0.5]]), torch.tensor([[2.0, 0.0, 1.0]])
    for t in (1.0, 2.0, 4.0):
        p = torch.softmax(teacher / t, -1)[0].tolist()
        q = torch.softmax(student / t, -1)[0].tolist()
        kl = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
        assert losses.soft_target_loss(student, teacher, t).item() == pytest.approx(t * t * kl, rel=1e-5)
    # the T² factor: at T=4 the loss is 16x the plain KL at the same temperature, not 1x
    p4, q4 = torch.softmax(teacher / 4, -1), torch.softmax(student / 4, -1)
    plain = (p4 * (p4.log() - q4.log())).sum().item()
    assert losses.soft_target_loss(student, teacher, 4.0).item() == pytest.approx(16 * plain, rel=1e-5)


def test_kd_gradient_is_t_times_q_minus_p_over_the_batch():
    """Hinton §2: ∂C/∂z_i = (1/T)(q_i − p_i) for the soft cross-entropy; ×T² gives T(q_i − p_i); mean: / B."""
    student = torch.tensor([[0.3, -1.0, 2.0], [1.0, 1.0, 0.0]], requires_grad=True)
    teacher = torch.tensor([[1.0, 0.0, 0.5], [0.0, 2.0, -1.0]])
    t = 3.0
    losses.soft_target_loss(student, teacher, t).backward()
    q, p = torch.softmax(student.detach() / t, -1), torch.softmax(teacher / t, -1)
    assert torch.allclose(student.grad, t * (q - p) / 2, atol=1e-6)


def test_hidden_mse_and_cosine_skip_padding():
    s, t = torch.zeros(1, 3, 2), torch.zeros(1, 3, 2)
    t[0, 0] = torch.tensor([1.0, 3.0])  # real token: squared error mean (1 + 9) / 2 = 5
    t[0, 2] = 100.0  # padding: ignored
    mask = torch.tensor([[1, 1, 0]])
    assert losses.hidden_mse(s, t, mask).item() == pytest.approx(5.0 / 2)  # mean over the 2 real tokens
    a = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [5.0, 5.0]]])
    b = torch.tensor([[[0.0, 1.0], [2.0, 0.0], [-5.0, -5.0]]])
    assert losses.cosine_loss(a, b, mask).item() == pytest.approx((1.0 + 0.0) / 2)


def test_patient_loss_compares_normalised_states():
    """PKD §3.2: scale does not matter, direction does: ‖(1,0) − (0,1)‖² = 2 for orthogonal states."""
    a, b = torch.tensor([[3.0, 0.0], [1.0, 1.0]]), torch.tensor([[0.0, 5.0], [2.0, 2.0]])
    assert losses.patient_loss(a, b).item() == pytest.approx((2.0 + 0.0) / 2)


def test_attention_scores_are_qk_over_sqrt_d_per_head():
    torch.manual_seed(1)
    h = torch.randn(1, 3, 4)
    query, key = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    scores = losses.attention_scores(h, query, key, heads=2)
    q, k = query(h)[0, :, 2:], key(h)[0, :, 2:]  # head 2 uses units 2..3
    assert scores.shape == (1, 2, 3, 3)
    assert torch.allclose(scores[0, 1], q @ k.T / math.sqrt(2), atol=1e-6)
    other = scores.clone()
    other[0, 0, 0, 0] += 2.0  # one head, one real pair: (2²) / (4 real pairs) / 2 heads
    mask = torch.tensor([[1, 1, 0]])
    other[0, 1, 2, :] += 50.0  # a padded query row: ignored
    assert losses.attention_score_mse(other, scores, mask).item() == pytest.approx(4.0 / 4 / 2)


def test_layer_maps():
    assert layer_pairs("uniform", 4, 12) == [(1, 3), (2, 6), (3, 9), (4, 12)]  # TinyBERT g(m) = 3m
    assert layer_pairs("skip", 6, 12) == [(1, 2), (2, 4), (3, 6), (4, 8), (5, 10)]  # PKD-Skip
    assert layer_pairs("last", 6, 12) == [(1, 7), (2, 8), (3, 9), (4, 10), (5, 11)]  # PKD-Last
    assert layer_pairs("uniform", 3, 6) == [(1, 2), (2, 4), (3, 6)]
    assert layer_pairs([[1, 5], [2, 1]], 2, 6) == [(1, 5), (2, 1)]
    assert layer_pairs("skip-2", 6, 12) == layer_pairs("skip", 6, 12)
    assert layer_pairs("skip-3", 4, 12) == [(1, 3), (2, 6), (3, 9)]
    assert layer_pairs("last-5", 6, 12) == layer_pairs("last", 6, 12)
    assert layer_pairs("last-2", 6, 12) == [(1, 10), (2, 11)]


@pytest.mark.parametrize("spec, message", [
    ([[1, 7]], "teacher layer 7, but the teacher has layers 1..6"),
    ([[4, 2]], "student layer 4, but the student has layers 1..3"),
    ("every_third", "'every_third' is unknown"),
    ("skip-4", "teacher layer 8, but the teacher has layers 1..6"),  # student layers 1, 2 → teacher 4, 8
    ("last-4", "student layer 4, but the student has layers 1..3"),
    ("uniform-2", "'uniform-2' is unknown"),
    ([[1, "2"]], "is not a [student_layer, teacher_layer] pair"),
])
def test_a_layer_map_naming_a_missing_layer_is_one_line(spec, message):
    with pytest.raises(PtmError) as err:
        layer_pairs(spec, 3, 6)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_minilm_relation_kl_by_hand_zero_for_equal_scores_and_blind_to_padding():
    torch.manual_seed(0)
    teacher, student = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    assert losses.relation_kl(teacher, teacher.clone(), mask).item() == pytest.approx(0.0, abs=1e-6)
    value = losses.relation_kl(student, teacher, mask).item()
    assert value > 0
    # by hand: mean over the 7 real query rows of the per-head-mean KL, padding key 3 of row 1 left out
    total = 0.0
    for b, length in ((0, 4), (1, 3)):
        for q in range(length):
            kl = 0.0
            for h in range(3):
                p = torch.softmax(teacher[b, h, q, :length], -1)
                r = torch.softmax(student[b, h, q, :length], -1)
                kl += (p * (p.log() - r.log())).sum().item() / 3
            total += kl
    assert value == pytest.approx(total / 7, rel=1e-5)
    changed = student.clone()
    changed[1, :, :, 3] = 100.0  # a padding key
    changed[1, :, 3, :] = -7.0  # a padding query
    assert losses.relation_kl(changed, teacher, mask).item() == pytest.approx(value, rel=1e-6)


def test_value_relations_are_scaled_value_dot_products():
    torch.manual_seed(1)
    value = torch.nn.Linear(8, 8)
    x = torch.randn(1, 3, 8)
    v = value(x).view(1, 3, 2, 4).transpose(1, 2)  # 2 heads of 4
    expected = v @ v.transpose(-1, -2) / 2.0
    assert torch.allclose(losses.value_relations(x, value, 2), expected, atol=1e-6)
