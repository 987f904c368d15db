"""CLIP-style dual encoder (Radford et al. 2021 §2.3): the symmetric InfoNCE, the learned and clipped temperature,
the seeded augmentation, exact resume and the transformers export."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml

from ptm_app.data.image_text import Augment, ImageTextDataModule, random_resized_crop
from ptm_app.data.tokenizer import TokenizerSpec
from ptm_app.objectives.clip import CLIP_INIT, DualEncoderModule, clip_loss
from tests.conftest import TINY_BERT, TINY_VIT, assert_resumes_exactly, image_text_set, run_main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_loss_is_the_hand_computed_symmetric_cross_entropy():
    images = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])
    texts = torch.tensor([[2.0, 0.0], [1.0, 1.0], [0.0, -1.0]])
    scale = 10.0
    loss, logits, target = clip_loss(images, texts, torch.tensor(math.log(scale)))

    def unit(v):
        n = math.sqrt(sum(x * x for x in v))
        return [x / n for x in v]

    img, txt = [unit(v) for v in images.tolist()], [unit(v) for v in texts.tolist()]
    sim = [[scale * sum(a * b for a, b in zip(i, t)) for t in txt] for i in img]  # sim[i][j]: image i, caption j
    rows = [-(sim[i][i] - math.log(sum(math.exp(s) for s in sim[i]))) for i in range(3)]  # image -> captions
    cols = [-(sim[j][j] - math.log(sum(math.exp(sim[i][j]) for i in range(3)))) for j in range(3)]  # caption -> images
    assert loss.item() == pytest.approx((sum(rows) / 3 + sum(cols) / 3) / 2, rel=1e-6)
    assert logits[0, 1].item() == pytest.approx(sim[0][1], rel=1e-6) and target.tolist() == [0, 1, 2]


def test_the_logit_scale_is_clipped_at_100_and_gets_a_gradient():
    images, texts = torch.randn(4, 8), torch.randn(4, 8)
    high = torch.tensor(math.log(500.0), requires_grad=True)
    _, logits, _ = clip_loss(images, texts, high)
    cos = torch.nn.functional.normalize(images, dim=-1) @ torch.nn.functional.normalize(texts, dim=-1).T
    torch.testing.assert_close(logits, 100 * cos)  # exp(t) = 500 is clipped to 100
    t = torch.tensor(CLIP_INIT, requires_grad=True)
    loss, logits, _ = clip_loss(images, texts, t)
    torch.testing.assert_close(logits, cos / 0.07, rtol=1e-4, atol=1e-4)  # initialised to τ = 0.07
    loss.backward()
    assert t.grad is not None and t.grad.item() != 0


def test_random_resized_crop_is_seeded_by_the_key_and_evaluation_is_not_augmented(tmp_path):
    image = torch.rand(3, 16, 16)
    aug = Augment(16, (0.3, 0.6), seed=3)
    assert torch.equal(aug(image, (0, 5)), aug(image, (0, 5)))
    assert not torch.equal(aug(image, (0, 5)), aug(image, (1, 5)))  # a new crop every epoch
    assert not torch.equal(aug(image, (0, 5)), Augment(16, (0.3, 0.6), seed=4)(image, (0, 5)))
    whole = random_resized_crop(image, 16, torch.Generator().manual_seed(0), (1.0, 1.0), (1.0, 1.0))
    torch.testing.assert_close(whole, image)  # scale 1, ratio 1: the picture itself
    dm = ImageTextDataModule(TokenizerSpec(train="wordpiece", vocab_size=60, min_frequency=1),
                             source=str(image_text_set(tmp_path / "set")), image_size=16, batch_size=4)
    dm.setup()
    train, val = dm.datasets["train"], dm.datasets["validation"]
    assert not torch.equal(train[(0, 0)]["pixel_values"], train[(1, 0)]["pixel_values"])
    assert torch.equal(val[(0, 0)]["pixel_values"], val[(1, 0)]["pixel_values"])  # never augmented
    pixel = val[0]["pixel_values"][:, 0, 0]
    torch.testing.assert_close(pixel, torch.ones(3))  # white -> 1 after (x - 0.5) / 0.5


def _config(tmp_path: Path, steps: int = 8) -> Path:
    cfg = {"seed_everything": 3,
           "trainer": {"max_steps": steps, "accelerator": "cpu", "devices": 1, "val_check_interval": 4,
                       "log_every_n_steps": 1, "enable_progress_bar": False, "enable_model_summary": False},
           "model": {"class_path": "DualEncoderModule",
                     "init_args": {"backbone_config": TINY_BERT, "vision_config": TINY_VIT, "projection_dim": 16,
                                   "optim": {"lr": 5e-3, "warmup": 0}}},
           "data": {"class_path": "ImageTextDataModule",
                    "init_args": {"source": str(image_text_set(tmp_path / "set")), "image_size": 16,
                                  "tokenizer": {"train": "wordpiece", "vocab_size": 60, "min_frequency": 1},
                                  "batch_size": 5, "crop_scale": [0.5, 1.0]}}}
    path = tmp_path / "clip.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_resumes_exactly_with_the_learned_temperature_and_exports_a_dual_encoder(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, VisionTextDualEncoderModel

    from ptm_app.checkpoint_io.reading import read_checkpoint

    runs = tmp_path / "runs"
    assert_resumes_exactly(["fit", "--config", str(_config(tmp_path))], runs, stop=3, steps=8)  # 12 pairs: 3 a epoch
    full, part = (read_checkpoint(runs / name / "checkpoints" / "last.ckpt")["state_dict"] for name in ("full", "part"))
    learned = full["backbone.logit_scale"].item()
    assert learned != pytest.approx(CLIP_INIT, abs=1e-4)  # the temperature trains
    assert part["backbone.logit_scale"].item() == pytest.approx(learned, abs=1e-6)  # and resumes with the run
    out = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(runs / "full"), "--output_dir", str(out)], runs) == 0
    model = VisionTextDualEncoderModel.from_pretrained(out).eval()
    assert model.logit_scale.item() == pytest.approx(learned, abs=1e-6)
    assert load_file(str(out / "model.safetensors"))  # plain safetensors weights
    tok = AutoTokenizer.from_pretrained(out)
    module = DualEncoderModule.load_from_checkpoint(runs / "full" / "checkpoints" / "last.ckpt").eval()
    pixels = torch.rand(2, 3, 16, 16) * 2 - 1
    text = tok(["a red square", "a blue square"], return_tensors="pt", padding=True)
    with torch.no_grad():
        theirs = model(input_ids=text["input_ids"], attention_mask=text["attention_mask"], pixel_values=pixels)
        mine = module.backbone(input_ids=text["input_ids"], attention_mask=text["attention_mask"], pixel_values=pixels)
    torch.testing.assert_close(theirs.logits_per_image, mine.logits_per_image)
    assert full["backbone.logit_scale"].shape == (1,) and model.logit_scale.dim() == 0  # [1] for FSDP2; scalar out

    # A checkpoint written before the temperature became [1] (a 0-dim parameter) still loads, resumes and exports.
    old = runs / "old" / "checkpoints" / "last.ckpt"
    old.parent.mkdir(parents=True)
    raw = torch.load(runs / "part" / "checkpoints" / "last.ckpt", weights_only=False)
    raw["state_dict"]["backbone.logit_scale"] = raw["state_dict"]["backbone.logit_scale"].reshape(())
    torch.save(raw, old)
    reloaded = DualEncoderModule.load_from_checkpoint(old)
    assert reloaded.backbone.logit_scale.item() == pytest.approx(part["backbone.logit_scale"].item())
    assert run_main(["export", "--ckpt_path", str(old), "--output_dir", str(tmp_path / "old_export")], runs) == 0
    assert VisionTextDualEncoderModel.from_pretrained(tmp_path / "old_export").logit_scale.dim() == 0


def _rank_loss(rank: int, world: int, port: int, images, texts, out) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        half = len(images) // world
        mine_i = images[rank * half:(rank + 1) * half].clone().requires_grad_(True)
        loss, logits, target = clip_loss(mine_i, texts[rank * half:(rank + 1) * half], torch.tensor(math.log(10.0)))
        loss.backward()
        out[rank] = (loss.item(), tuple(logits.shape), target.tolist(), mine_i.grad.abs().sum().item())
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_negatives_are_gathered_across_ranks():
    """Two gloo ranks of 3 rows each: every row is scored against all 6 captions (its own at its global index), and
    the mean of the two ranks' losses is the loss of the whole batch on one process."""
    import socket

    import torch.multiprocessing as mp

    torch.manual_seed(0)
    images, texts = torch.randn(6, 4), torch.randn(6, 4)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_rank_loss, args=(2, port, images, texts, out), nprocs=2, join=True)
    whole, _, _ = clip_loss(images, texts, torch.tensor(math.log(10.0)))
    assert (out[0][0] + out[1][0]) / 2 == pytest.approx(whole.item(), rel=1e-5)
    assert out[0][1] == out[1][1] == (3, 6) and out[0][2] == [0, 1, 2] and out[1][2] == [3, 4, 5]
    assert out[0][3] > 0 and out[1][3] > 0
