"""Prompt tuning (Lester et al. 2021) and P-tuning (Liu et al. 2021b) for tagging and QA: peft prepends the
virtual tokens and its TOKEN_CLS / QUESTION_ANS models return outputs for them too, so the modules drop the
first ``num_virtual_tokens`` positions.  The logits then line up with the labels and offsets (checked against the
prompt-prepended model run by hand), the loss is the hand-computed one, a tiny model learns QA spans through the
post-processing, and delta-only checkpoints reload with the same outputs."""
import pytest
import torch
from torch.utils.data import DataLoader

from ptm_app.training.trainer import PtmTrainer
from ptm_app.backbones.delta import prepended_tokens
from ptm_app.adaptation.qa import QuestionAnsweringModule
from ptm_app.task_kinds.spans import span_loss
from ptm_app.task_kinds.tagging import tagging_loss
from ptm_app.adaptation.token_classification import TokenClassificationModule
from ptm_app.training.optim import OptimConfig
from tests.adaptation.test_features_token_qa import batch, qa_data, tiny_dir, tiny_trainer  # noqa: F401 (fixtures)
from tests.conftest import TINY_BERT

TINY = {**TINY_BERT, "vocab_size": 100}
TAGS = ["N", "V", "X"]
V = 5


def tuned(cls, method: str, **kwargs):
    torch.manual_seed(0)
    extra = {"labels": TAGS} if cls is TokenClassificationModule else {}
    return cls(**{"backbone_config": TINY, "delta": {"method": method, "num_virtual_tokens": V}, **extra, **kwargs}).build()


def by_hand(module, b: dict):
    """The transformers model's outputs on [prompt; input] with peft bypassed: [B, V + L, ...]."""
    peft = module.backbone
    hf = peft.base_model  # BertFor{TokenClassification,QuestionAnswering}, the head being peft's trained copy
    n = len(b["input_ids"])
    embeds = torch.cat([peft.get_prompt(batch_size=n), hf.bert.embeddings.word_embeddings(b["input_ids"])], 1)
    mask = torch.cat([torch.ones(n, V, dtype=torch.long), b["attention_mask"]], 1)
    types = torch.cat([torch.zeros(n, V, dtype=torch.long), b["token_type_ids"]], 1)
    return hf(inputs_embeds=embeds, attention_mask=mask, token_type_ids=types)


@pytest.mark.parametrize("method", ["prompt", "ptuning"])
def test_tagger_logits_drop_the_virtual_tokens_and_the_loss_is_the_hand_computed_one(method):
    module = tuned(TokenClassificationModule, method).eval()
    assert prepended_tokens(module.backbone) == V
    b = batch()
    with torch.no_grad():
        logits, full = module(b), by_hand(module, b).logits
    assert full.shape == (3, V + 9, 3) and logits.shape == (*b["labels"].shape, 3)  # [B, L, C] like the labels
    assert torch.allclose(logits, full[:, V:], atol=1e-6)  # row i = input token i, not virtual token i
    labelled, gold = b["labels"] != -100, b["labels"].clamp(min=0).unsqueeze(-1)

    def nll(rows: torch.Tensor) -> float:
        return -torch.log_softmax(rows, -1).gather(-1, gold).squeeze(-1)[labelled].mean().item()

    loss = tagging_loss(logits, b["labels"]).item()  # the task type's loss the module trains with
    assert loss == pytest.approx(nll(full[:, V:]), rel=1e-5)
    assert loss != pytest.approx(nll(full[:, :9]), rel=1e-3)  # the first L rows (5 virtual tokens) differ


@pytest.mark.parametrize("method", ["prompt", "ptuning"])
def test_qa_logits_drop_the_virtual_tokens(method):
    module = tuned(QuestionAnsweringModule, method).eval()
    b = batch()
    with torch.no_grad():
        (start, end), full = module(b), by_hand(module, b)
    assert start.shape == end.shape == b["input_ids"].shape and full.start_logits.shape == (3, V + 9)
    assert torch.allclose(start, full.start_logits[:, V:], atol=1e-6)
    assert torch.allclose(end, full.end_logits[:, V:], atol=1e-6)
    ce = torch.nn.functional.cross_entropy
    manual = (ce(full.start_logits[:, V:], b["start_positions"]) + ce(full.end_logits[:, V:], b["end_positions"])) / 2
    assert span_loss(start, end, b).item() == pytest.approx(manual.item(), rel=1e-5)


def test_prefix_tuning_adds_no_positions():
    module = tuned(TokenClassificationModule, "prefix").eval()
    assert prepended_tokens(module.backbone) == 0 and module(batch()).shape == (3, 9, 3)


def test_prompt_tuned_qa_learns_spans_through_the_post_processing(qa_data, tmp_path):
    torch.manual_seed(0)
    module = QuestionAnsweringModule(backbone_config={**TINY_BERT, "vocab_size": 30522, "hidden_dropout_prob": 0.0},
                                     delta={"method": "prompt", "num_virtual_tokens": V},
                                     optim=OptimConfig(lr=2e-2, warmup=0, weight_decay=0.0)).build()
    trainer = tiny_trainer(tmp_path, 80)
    trainer.fit(module, datamodule=qa_data)
    assert trainer.callback_metrics["val/em"] == 1.0  # every "purple elephants" found at its own position


@pytest.mark.parametrize("cls, method", [(TokenClassificationModule, "prompt"), (QuestionAnsweringModule, "ptuning")])
def test_delta_only_checkpoints_reload_with_the_same_outputs(cls, method, tiny_dir, tmp_path):
    module = tuned(cls, method, backbone=str(tiny_dir), backbone_config=None)
    trainer = PtmTrainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, DataLoader([batch(0), batch(1)], batch_size=None))
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    saved = torch.load(tmp_path / "run.ckpt", weights_only=True)["state_dict"]
    kept = {k for k in saved if k.startswith("backbone.")}
    assert kept and all("prompt_encoder" in k or "modules_to_save" in k for k in kept), sorted(kept)
    module.eval()
    reloaded = cls.load_from_checkpoint(tmp_path / "run.ckpt").eval()
    with torch.no_grad():
        ours, theirs = module(batch(2)), reloaded(batch(2))
    for a, b in zip(*(x if isinstance(x, tuple) else (x,) for x in (ours, theirs))):
        assert a.shape[1] == 9 and torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("cls", [TokenClassificationModule, QuestionAnsweringModule])
def test_virtual_tokens_count_against_the_position_limit(cls):
    """TINY_BERT has 64 positions: 59 input tokens + 5 virtual ones fit, 60 + 5 are refused in one line."""
    from ptm_app.data.contract import DataFacts
    from ptm_app.errors import PtmError

    module = tuned(cls, "prompt")
    module.check_lengths(DataFacts(tokenizer=lambda: None, max_length=59))
    with pytest.raises(PtmError) as err:
        module.check_lengths(DataFacts(tokenizer=lambda: None, max_length=60))
    assert str(err.value) == ("data.max_length=60 + 5 virtual tokens is longer than the backbone allows (64 positions); "
                              "set data.init_args.max_length <= 59")
    tuned(cls, "lora").check_lengths(DataFacts(tokenizer=lambda: None, max_length=64))  # LoRA adds no positions
