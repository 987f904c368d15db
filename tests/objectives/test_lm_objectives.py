"""CLM: no future leak and padding ignored; MLM: the loss is the cross-entropy at masked positions."""
import torch

from ptm_app.data.collators import CLMCollator
from ptm_app.objectives import CausalLMModule, MaskedLMModule
from tests.conftest import TINY_BERT, TINY_GPT2


def test_causal_lm_has_no_future_leak():
    module = CausalLMModule(backbone_config={**TINY_GPT2, "vocab_size": 50}).build().eval()
    ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 50  # change every token from position 7 on
    with torch.no_grad():
        a, b = module.backbone(input_ids=ids).logits, module.backbone(input_ids=changed).logits
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-6)
    assert not torch.allclose(a[:, 7:], b[:, 7:], atol=1e-3)


def test_clm_labels_ignore_padding_and_loss_is_next_token_ce():
    module = CausalLMModule(backbone_config={**TINY_GPT2, "vocab_size": 50}).build().eval()
    batch = CLMCollator(pad_token_id=0)([{"input_ids": torch.tensor([5, 6, 7, 8]), "key": 0},
                                         {"input_ids": torch.tensor([9, 10]), "key": 1}])
    assert batch["labels"].tolist() == [[5, 6, 7, 8], [9, 10, -100, -100]]
    with torch.no_grad():
        loss, n = module._loss(batch)
        logits = module.backbone(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    manual = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 50), batch["labels"][:, 1:].reshape(-1),
                                               ignore_index=-100)
    assert n == 4 and torch.allclose(loss, manual, atol=1e-6)


def test_mlm_loss_is_cross_entropy_on_selected_positions_only():
    module = MaskedLMModule(backbone_config={**TINY_BERT, "vocab_size": 40}).build().eval()
    ids = torch.randint(5, 40, (3, 10), generator=torch.Generator().manual_seed(1))
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[1, 5], labels[2, 9] = 11, 12, 13
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    with torch.no_grad():
        loss, n = module._loss(batch)
        logits = module.backbone(input_ids=ids).logits
    manual = torch.stack([torch.nn.functional.cross_entropy(logits[i, p][None], torch.tensor([t]))
                          for i, p, t in ((0, 2, 11), (1, 5, 12), (2, 9, 13))]).mean()
    assert n == 3 and torch.allclose(loss, manual, atol=1e-5)
