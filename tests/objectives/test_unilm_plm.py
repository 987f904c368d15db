"""UniLM mixes its three attention masks across batches; XLNet's collator feeds a leak-free permutation."""
from collections import Counter

import torch

from ptm_app.objectives import PermutationLMModule, UnifiedLMModule
from ptm_app.objectives.unilm import MODES
from tests.conftest import TINY_BERT


class Tok:
    pad_token_id, mask_token_id, cls_token_id, sep_token_id = 0, 4, 2, 3
    all_special_ids = [0, 1, 2, 3, 4]

    def __len__(self):
        return 40


def examples(epoch, n=4, length=12):
    gen = torch.Generator().manual_seed(epoch)
    return [{"input_ids": torch.cat([torch.tensor([2]), torch.randint(5, 40, (length,), generator=gen),
                                     torch.tensor([3])]), "key": (epoch, i)} for i in range(n)]


def test_unilm_draws_each_mode_about_equally_and_builds_its_mask():
    module = UnifiedLMModule(backbone_config={**TINY_BERT, "vocab_size": 40}).build()
    collate = module.make_collator(Tok(), seed=1)
    counts = Counter()
    for epoch in range(300):
        b = collate(examples(epoch))
        mode, mask = MODES[b["mode"]], b["attention_3d"]
        counts[mode] += 1
        L = mask.shape[-1]
        if mode == "bidirectional":
            assert mask.all()
        elif mode == "left_to_right":
            assert torch.equal(mask[0], torch.tril(torch.ones(L, L, dtype=torch.bool)))
        else:
            source = b["token_type_ids"][0] == 0
            s = int(source.sum())
            assert mask[0, :s, :s].all() and not mask[0, :s, s:].any()  # source sees only the source
            assert mask[0, s:, :s].all()  # the target sees the whole source
            assert torch.equal(mask[0, s:, s:], torch.tril(torch.ones(L - s, L - s, dtype=torch.bool)))
    assert all(abs(counts[m] / 300 - 1 / 3) < 0.08 for m in MODES), counts


def test_unilm_left_to_right_batches_do_not_leak_the_future():
    module = UnifiedLMModule(backbone_config={**TINY_BERT, "vocab_size": 40}, mode_weights={"left_to_right": 1.0}).build().eval()
    b = module.make_collator(Tok(), seed=1)(examples(0))
    changed = dict(b, input_ids=b["input_ids"].clone())
    changed["input_ids"][:, 8:] = 5
    with torch.no_grad():
        a = module.backbone(**module.model_inputs(b)).logits
        c = module.backbone(**module.model_inputs(changed)).logits
    assert torch.allclose(a[:, :8], c[:, :8], atol=1e-5) and not torch.allclose(a[:, 8:], c[:, 8:], atol=1e-3)


def test_unilm_seq2seq_mask_keeps_the_target_from_the_source_and_the_future_from_the_target():
    """UniLM §2.2 through the model: changing target tokens leaves every source output unchanged, and changing a
    target token leaves the outputs of the target tokens before it unchanged (it changes its own and later ones)."""
    module = UnifiedLMModule(backbone_config={**TINY_BERT, "vocab_size": 40}, mode_weights={"seq2seq": 1.0}).build()
    module.eval()
    b = module.make_collator(Tok(), seed=1)(examples(0, n=4, length=14))
    source = (b["token_type_ids"] == 0) & b["attention_mask"].bool()
    target = (b["token_type_ids"] == 1) & b["attention_mask"].bool()
    assert source.any(1).all() and target.sum(1).min() >= 3

    def outputs(ids):
        with torch.no_grad():
            return module.backbone(**module.model_inputs(dict(b, input_ids=ids))).logits

    base = outputs(b["input_ids"])
    every_target = b["input_ids"].masked_fill(target, 5)
    changed = outputs(every_target)
    assert torch.allclose(base[source], changed[source], atol=1e-5)
    assert not torch.allclose(base[target], changed[target], atol=1e-3)
    for row in range(len(b["input_ids"])):
        positions = target[row].nonzero().squeeze(1).tolist()
        at = positions[len(positions) // 2]
        one = b["input_ids"].clone()
        one[row, at] = 5 if one[row, at] != 5 else 6
        after = outputs(one)
        earlier = positions[: positions.index(at)]
        assert torch.allclose(base[row, earlier], after[row, earlier], atol=1e-5), row
        assert torch.allclose(base[row, source[row]], after[row, source[row]], atol=1e-5), row
        assert not torch.allclose(base[row, at], after[row, at], atol=1e-3), row


def test_xlnet_collator_targets_never_see_themselves():
    module = PermutationLMModule(backbone_config={"model_type": "xlnet", "d_model": 32, "n_layer": 2, "n_head": 2,
                                                  "d_inner": 64, "vocab_size": 40}).build().eval()
    b = module.make_collator(Tok(), seed=2)(examples(0, n=2, length=30))
    assert torch.equal(b["input_ids"][:, 0], torch.full((2,), 2))  # inputs keep their natural order
    targets = b["target_mapping"].argmax(-1)  # [B, K] positions of the targets
    row, k = 0, 0
    pos = int(targets[row, k])
    changed = b["input_ids"].clone()
    changed[row, pos] = (changed[row, pos] + 1 - 5) % 35 + 5
    with torch.no_grad():
        a = module.backbone(**module.model_inputs(b)).logits
        c = module.backbone(**module.model_inputs(dict(b, input_ids=changed))).logits
    assert torch.allclose(a[row, k], c[row, k], atol=1e-5)


def test_xlnet_gives_every_parameter_a_gradient():
    """DDP (without find_unused_parameters) fails on a parameter that takes no part in the loss: XLNet's relative
    segment encodings (seg_embed, r_s_bias) need token_type_ids, which the module supplies for one segment."""
    module = PermutationLMModule(backbone_config={"model_type": "xlnet", "d_model": 32, "n_layer": 2, "n_head": 2,
                                                  "d_inner": 64, "vocab_size": 40}).build()
    batch = module.make_collator(Tok(), seed=1)(examples(0, n=2, length=20))
    inputs = module.model_inputs(batch)
    assert torch.equal(inputs["token_type_ids"], torch.zeros_like(batch["input_ids"]))
    module.backbone(**inputs).logits.float().sum().backward()
    missing = [n for n, p in module.backbone.named_parameters() if p.requires_grad and p.grad is None]
    assert missing == []


def test_xlnet_runs_with_its_weights_cast_to_bf16():
    """DeepSpeed's bf16 casts the weights and the batch's float tensors and runs without autocast: the float32
    positional encoding XLNet makes inside must follow."""
    module = PermutationLMModule(backbone_config={"model_type": "xlnet", "d_model": 32, "n_layer": 2, "n_head": 2,
                                                  "d_inner": 64, "vocab_size": 40}).build()
    batch = module.make_collator(Tok(), seed=1)(examples(0, n=2, length=20))
    batch = {k: v.to(torch.bfloat16) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in batch.items()}
    module.backbone.to(torch.bfloat16)
    logits = module.backbone(**module.model_inputs(batch)).logits
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()
