"""The prepared SmolLM2-135M-Instruct (``make data``) as a real causal LM: in-context learning (GPT-3, Brown et al.
2020 §2) with ``InContextEvalModule``, the shipped ICL configs, and decoder-with-prompt headline generation."""
import json
from pathlib import Path

import pytest

from ptm_app.training.trainer import PtmTrainer
from ptm_app.adaptation.prompting import InContextEvalModule
from ptm_app.data.prompt_data import PromptDataModule
from ptm_app.data.sources import prepared_dir
from ptm_app.data.tokenizer import TokenizerSpec
from tests.conftest import run_main, write_jsonl

ADAPT = Path(__file__).resolve().parents[2] / "configs" / "adapt"
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
POOL = {"positive": ["I love this phone, it works perfectly.", "What a wonderful day, everything went great!",
                     "The food was delicious and the staff were lovely.", "Best concert ever, I am so happy."],
        "negative": ["This is the worst service I have ever had.", "I hate waiting, my flight was cancelled again.",
                     "The movie was boring and awful.", "Terrible product, it broke after one day."]}
QUERIES = {"positive": ["Absolutely fantastic, I am thrilled with it!", "Thank you so much, this made me really happy.",
                        "Great job, the team did amazing work."],
           "negative": ["Awful experience, I am very angry.", "It is broken and useless, a total waste of money.",
                        "Horrible weather ruined our miserable trip."]}


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())["metrics"]


def test_smollm2_in_context_labels_obvious_sentiment(tmp_path):
    prepared_dir("smollm2")  # fails with the fix if `make data` was not run
    rows = lambda texts: [{"id": f"{label}-{i}", "text": t, "label": label}  # noqa: E731
                          for label, ts in texts.items() for i, t in enumerate(ts)]
    write_jsonl(tmp_path / "train.jsonl", rows(POOL))
    write_jsonl(tmp_path / "validation.jsonl", rows(QUERIES))
    write_jsonl(tmp_path / "test.jsonl", rows(QUERIES))
    metrics = {}
    for k in (0, 2):
        dm = PromptDataModule(TokenizerSpec(pretrained="smollm2"), source=str(tmp_path), max_length=32,
                              eval_batch_size=6)
        module = InContextEvalModule(backbone="smollm2", template="Review: {text}\nSentiment: {label}\n\n",
                                     k_shot=k, seed=3)
        trainer = PtmTrainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False)
        metrics[k] = trainer.test(module, datamodule=dm, verbose=False)[0]
    assert metrics[0]["test/shots"] == 0 and metrics[2]["test/shots"] == 2
    assert metrics[0]["test/acc"] >= 5 / 6 and metrics[2]["test/acc"] >= 5 / 6, metrics  # a random LM: about 1/2
    # two demonstrations make the real LM surer of the right label (measured: cross-entropy 0.13 -> 0.03)
    assert metrics[2]["test/loss"] < metrics[0]["test/loss"] < 0.4, metrics


@pytest.mark.slow
@pytest.mark.parametrize("config", ["smollm2_icl_tweets", "smollm2_icl_bbc"])
def test_shipped_icl_configs_run_on_a_mixed_sample(config, tmp_path):
    """Two batches of the seeded test order (16 examples of several classes), 4 demonstrations each."""
    assert run_main(["test", "--config", str(ADAPT / f"{config}.yaml"), *QUIET, "--trainer.limit_test_batches", "2"],
                    tmp_path) == 0
    metrics = summary(tmp_path / config)
    assert metrics["test/shots"] == 4 and 0 <= metrics["test/acc"] <= 1 and "test/f1_macro" in metrics


@pytest.mark.slow
def test_headline_generation_starts_from_smollm2_with_lora(tmp_path):
    """Two LoRA steps on 2 articles, then greedy headlines for 2 validation articles; delta-only checkpoints."""
    import torch

    config = ADAPT / "smollm2_lora_bbc_headlines.yaml"
    argv = ["fit", "--config", str(config), *QUIET, "--trainer.max_steps", "2", "--trainer.val_check_interval", "2",
            "--trainer.limit_val_batches", "1", "--data.init_args.batch_size", "2", "--data.init_args.eval_batch_size",
            "2", "--model.init_args.max_new_tokens", "8"]
    assert run_main(argv, tmp_path) == 0
    run = tmp_path / "smollm2_lora_bbc_headlines"
    metrics = summary(run)
    assert 0 <= metrics["val/rougeL"] <= 1 and metrics["val/loss"] > 0
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 2 and (run / "checkpoints" / "last.ckpt").stat().st_size < 30e6  # LoRA only
    assert all("lora_" in k for k in ckpt["state_dict"]), [k for k in ckpt["state_dict"] if "lora_" not in k][:3]
