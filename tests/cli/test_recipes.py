"""Every pre-training recipe in configs/pretrain/ at tiny size, on its real corpus (Brown; XLM: the Bible's
English-Spanish verse pairs) through main.py:
it trains, resumes exactly mid-run, exports a loadable transformers directory, and overfits one batch."""
import csv
import json
from pathlib import Path

import pytest
import torch
import yaml

from ptm_app.training.trainer import PtmTrainer
from tests.conftest import run_main

ROOT = Path(__file__).resolve().parents[2]
TINY = {  # per model_type: the recipe's architecture at toy width (the objective and data stay the recipe's)
    "bert": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=64),
    "roberta": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                    max_position_embeddings=66),
    "albert": dict(embedding_size=16, hidden_size=32, num_hidden_layers=2, num_hidden_groups=1,
                   num_attention_heads=2, intermediate_size=64, max_position_embeddings=64),
    "electra": dict(embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=64),
    "xlnet": dict(d_model=32, n_layer=2, n_head=2, d_inner=64),
    "t5": dict(d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2),
    "bart": dict(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64),
    "gpt2": dict(n_embd=32, n_layer=2, n_head=2, n_positions=64),
    "ptm_bilstm_lm": dict(embedding_dim=32, hidden_size=128, num_layers=2),
    "xlm": dict(emb_dim=32, n_layers=2, n_heads=2, max_position_embeddings=64),
}
# the text recipes from scratch (a backbone_config: ULMFiT's stage 1 continues MiniLM, tests/adaptation/
# test_features_strategies.py runs it); the image-text ones (clip_contrastive_emoji, visualbert_mlm_itm_emoji) train, resume exactly (with CLIP's learned
# temperature) and export in tests/objectives/test_clip.py and test_visualbert.py
# mbert_mlm_quran_bible and xlm_clm_mlm_tlm_quran_bible (about a minute together) are slow here: tests/objectives/test_multilingual_lm.py checks their
# objectives, and their resume and as-shipped runs are slow tests there too
RECIPE_FILES = [p for p in sorted((ROOT / "configs" / "pretrain").glob("*.yaml")) if not p.stem.endswith("_emoji")
                and "backbone_config" in yaml.safe_load(p.read_text())["model"]["init_args"]]
RECIPES = [pytest.param(p, marks=pytest.mark.slow) if p.stem in ("mbert_mlm_quran_bible", "xlm_clm_mlm_tlm_quran_bible")
           else p for p in RECIPE_FILES]


def tiny_args(config: Path, steps: int) -> list[str]:
    cfg = yaml.safe_load(config.read_text())
    backbone = cfg["model"]["init_args"]["backbone_config"]
    tiny = {"model_type": backbone["model_type"], **TINY[backbone["model_type"]]}
    # a corpus is cut to 20 documents; parallel pairs are one verse each and are read whole
    limit = [] if cfg["data"]["class_path"] == "ParallelDataModule" else ["--data.init_args.limit_documents", "20"]
    return ["--config", str(config), "--model.init_args.backbone_config", json.dumps(tiny),
            "--data.init_args.max_length", "32", "--data.init_args.batch_size", "4",
            "--data.init_args.tokenizer.vocab_size", "1000", *limit,
            "--trainer.precision", "32-true", "--trainer.max_steps", str(steps), "--trainer.val_check_interval", "3",
            "--trainer.limit_val_batches", "2", "--trainer.log_every_n_steps", "1", "--trainer.enable_progress_bar",
            "false", "--trainer.enable_model_summary", "false"]


def losses(run: Path) -> dict[int, float]:
    return {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(open(run / "logs" / "metrics.csv"))
            if r.get("train/loss")}


def test_every_representative_model_has_a_recipe():
    names = {p.stem for p in (ROOT / "configs" / "pretrain").glob("*.yaml")}
    assert {"bert_mlm_nsp_brown", "roberta_mlm_brown", "albert_mlm_sop_brown", "spanbert_span_mlm_sbo_brown",
            "electra_rtd_brown", "xlnet_plm_brown", "mass_seq2seq_mlm_brown", "t5_span_corruption_brown",
            "bart_dae_brown", "unilm_unified_mlm_brown", "elmo_bilm_brown", "gpt2_clm_bbc"} <= names


@pytest.mark.parametrize("config", RECIPES, ids=lambda p: getattr(p, "stem", None))
def test_recipe_trains_resumes_exactly_and_exports(config, tmp_path):
    runs = tmp_path / "runs"
    args = tiny_args(config, steps=6)
    assert run_main(["fit", *args, "--run_name", "full"], runs) == 0
    assert run_main(["fit", *args, "--run_name", "part", "--stop_at_step", "3"], runs) == 0
    assert run_main(["fit", *args, "--run_name", "part", "--ckpt_path", "last"], runs) == 0
    full, part = losses(runs / "full"), losses(runs / "part")
    assert sorted(full) == sorted(part) == list(range(6))
    for step in range(3, 6):
        assert part[step] == pytest.approx(full[step], rel=1e-5, abs=1e-6), step

    out = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(runs / "full"), "--output_dir", str(out)], runs) == 0
    from ptm_app.backbones.build import auto_class
    from ptm_app.checkpoint_io.reading import read_checkpoint
    from ptm_app.backbones.from_checkpoint import rebuild_backbone

    ckpt = read_checkpoint(runs / "full")
    exported = auto_class(ckpt["ptm_app"]["model_class"]).from_pretrained(out)
    expected = rebuild_backbone(ckpt).state_dict()
    got = exported.state_dict()
    assert set(got) == set(expected)
    assert all(torch.equal(got[k], expected[k]) for k in expected)


@pytest.mark.parametrize("config", RECIPES, ids=lambda p: getattr(p, "stem", None))
def test_recipe_overfits_one_fixed_batch(config, tmp_path, monkeypatch):
    from lightning.pytorch.callbacks import Callback
    from torch.utils.data import DataLoader

    from ptm_app.training.cli import PtmCLI

    monkeypatch.setenv("PTM_RUNS_DIR", str(tmp_path))
    # an LSTM memorises more slowly than attention; XLM's mix trains each of CLM, MLM and TLM every third step
    steps = 80 if config.stem in ("elmo_bilm_brown", "xlm_clm_mlm_tlm_quran_bible") else 40
    cli = PtmCLI(args=[*tiny_args(config, steps=steps), "--model.init_args.optim.lr", "3e-2" if "elmo" in config.stem else "3e-3",
                       "--model.init_args.optim.warmup", "0", "--model.init_args.optim.schedule", "constant"], run=False)
    module, dm = cli.model, cli.datamodule
    dm.connect_model(module.hooks())  # what a Trainer would ask the module for
    dm.prepare_data()
    dm.setup("fit")
    module.tokenizer = dm.tokenizer
    module.configure_model()
    dm.collate_fn = module.make_collator(dm.tokenizer, seed=dm.seed)
    batch = next(iter(dm.train_dataloader()))

    seen = []

    class Record(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, b, i):
            seen.append(float(outputs["loss"]))

    trainer = PtmTrainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[Record()])
    trainer.fit(module, train_dataloaders=DataLoader([batch] * steps, batch_size=None))
    first, last = seen[0], sum(seen[-5:]) / 5
    print(config.stem, round(last / first, 3))
    assert last < 0.5 * first, (config.stem, seen[:3], seen[-3:])
