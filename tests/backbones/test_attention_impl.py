"""backbone_config.attn_implementation: built as asked (from scratch and pretrained), sdpa and eager agree, the choice
survives a checkpoint, and a value the model cannot run is refused in one line."""
from __future__ import annotations

import pytest
import torch

from ptm_app.backbones.build import build_backbone
from ptm_app.errors import PtmError
from tests.conftest import TINY_BERT, TINY_GPT2, run_main, tiny_mlm_config

SCRATCH = {"bert": ("masked_lm", {**TINY_BERT, "vocab_size": 100}),
           "gpt2": ("causal_lm", {**TINY_GPT2, "vocab_size": 100})}


def padded_batch():
    ids = torch.randint(5, 100, (3, 20), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    mask[2, 5:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def logits(model, batch):
    with torch.no_grad():
        out = model.eval()(**batch).logits
    return out.masked_fill(~batch["attention_mask"].bool()[..., None], 0)  # padded positions are not compared


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_scratch_build_takes_the_implementation_and_both_agree(name):
    model_class, config = SCRATCH[name]
    built = {}
    for impl in ("eager", "sdpa"):
        torch.manual_seed(0)
        built[impl] = build_backbone(model_class, None, {**config, "attn_implementation": impl})
        assert built[impl].config._attn_implementation == impl
    built["sdpa"].load_state_dict(built["eager"].state_dict())
    batch = padded_batch()
    torch.testing.assert_close(logits(built["sdpa"], batch), logits(built["eager"], batch), rtol=1e-4, atol=1e-5)
    torch.manual_seed(0)
    assert build_backbone(model_class, None, config).config._attn_implementation == "sdpa"  # transformers' default


def test_pretrained_build_takes_the_implementation_and_both_agree():
    eager = build_backbone("base", "minilm", {"attn_implementation": "eager"})
    sdpa = build_backbone("base", "minilm", {"attn_implementation": "sdpa"})
    assert (eager.config._attn_implementation, sdpa.config._attn_implementation) == ("eager", "sdpa")
    batch = padded_batch()
    with torch.no_grad():
        a, b = (m.eval()(**batch).last_hidden_state for m in (eager, sdpa))
    keep = batch["attention_mask"].bool()
    torch.testing.assert_close(a[keep], b[keep], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("impl,model_class,pretrained,message", [
    ("sdpa2", "masked_lm", None, "backbone_config.attn_implementation='sdpa2' is not supported by BertForMaskedLM; "
                                 "set it to one of eager, sdpa, flex_attention"),
    ("flex_attention", "causal_lm", None, "'flex_attention' is not supported by GPT2LMHeadModel; set it to one of "
                                          "eager, sdpa, flash_attention_2"),
    ("flash_attention_2", "masked_lm", None, "'flash_attention_2' cannot run here (FlashAttention2"),
    ("sdpa2", "base", "minilm", "'sdpa2' is not supported by BertModel"),
    ("flash_attention_2", "base", "minilm", "'flash_attention_2' cannot run here"),
], ids=["unknown", "undeclared", "flash-on-cpu", "pretrained-unknown", "pretrained-flash"])
def test_unusable_implementation_is_one_line(impl, model_class, pretrained, message):
    config = {"attn_implementation": impl} if pretrained else {**SCRATCH["gpt2" if model_class == "causal_lm" else "bert"][1],
                                                               "attn_implementation": impl}
    with pytest.raises(PtmError) as err:
        build_backbone(model_class, pretrained, config)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_chosen_through_main_and_kept_in_the_checkpoint(tiny_corpus, tmp_path, capsys):
    from ptm_app.objectives import MaskedLMModule

    runs = tmp_path / "runs"
    cfg = str(tiny_mlm_config(tiny_corpus, tmp_path, max_steps=1, limit_val_batches=0))
    assert run_main(["fit", "--config", cfg, "--run_name", "eager",
                     "--model.init_args.backbone_config.attn_implementation", "eager"], runs) == 0
    module = MaskedLMModule.load_from_checkpoint(runs / "eager" / "checkpoints" / "last.ckpt")
    assert module.backbone.config._attn_implementation == "eager"  # transformers' to_dict() alone would drop it
    capsys.readouterr()
    assert run_main(["fit", "--config", cfg, "--run_name", "bad",
                     "--model.init_args.backbone_config.attn_implementation", "sdpa2"], runs) == 2
    assert one_error_line(capsys).startswith("error: backbone_config.attn_implementation='sdpa2'")


def test_a_number_typed_on_the_command_line_reaches_the_backbone_as_a_number(tiny_corpus, tmp_path):
    from ptm_app.objectives import MaskedLMModule

    cfg = str(tiny_mlm_config(tiny_corpus, tmp_path, max_steps=1, limit_val_batches=0))
    argv = ["fit", "--config", cfg, "--run_name", "typed", "--model.init_args.backbone_config.hidden_dropout_prob", "0.0"]
    assert run_main(argv, tmp_path / "runs") == 0
    module = MaskedLMModule.load_from_checkpoint(tmp_path / "runs" / "typed" / "checkpoints" / "last.ckpt")
    assert module.backbone.config.hidden_dropout_prob == 0.0 and isinstance(module.backbone.config.hidden_dropout_prob, float)

def one_error_line(capsys) -> str:
    """The one ``error:`` line on stderr, which is also the last thing said (as tests/cli/test_bad_input.py)."""
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and err[-1] == errors[0], err
    return errors[0]


def test_an_unknown_model_type_is_one_short_line(tiny_corpus, tmp_path, capsys):
    """transformers' own message names all ~800 model types on one line; ours suggests the near ones."""
    cfg = str(tiny_mlm_config(tiny_corpus, tmp_path, max_steps=1))
    argv = ["fit", "--config", cfg, "--model.init_args.backbone_config.model_type", "bret"]
    assert run_main(argv, tmp_path / "runs") == 2
    line = one_error_line(capsys)
    assert line.startswith("error: backbone_config: unknown model_type 'bret'; did you mean 'bert'")
    assert len(line) < 250
