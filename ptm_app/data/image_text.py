"""Image–text pairs for multimodal pre-training (docs/multimodal.md): the prepared ``emoji`` set (or any folder
of the same layout: ``images.safetensors`` with a uint8 ``pixels`` tensor ``(N, H, W, 3)`` and split jsonl files
whose records name their ``image`` row, ``caption`` and ``concept``).

Training pictures get the standard augmentation of image pre-training, the random resized crop (Szegedy et al.
2015 "Going deeper with convolutions" §6; CLIP, Radford et al. 2021 §2.5, uses it as its only augmentation):
a box of ``crop_scale`` × the area and an aspect ratio in ``crop_ratio`` (log-uniform), resized back to
``image_size``.  No horizontal flip by default: emoji carry text and direction (keycaps, arrows, flags), which a
mirror changes (``flip: true`` turns it on).  The crop of an example is drawn from a generator seeded by the run's
seed and the example's ``(epoch, index)`` key, so a resumed run repeats every crop exactly; evaluation pictures
are never augmented.  Pixels are scaled to [-1, 1] (mean 0.5, std 0.5 per channel, as ``ViTImageProcessor``).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import Dataset

from ptm_app.data.collators import pad
from ptm_app.data.contract import DataFacts, ModelHooks
from ptm_app.data.corruption import draw_generator
from ptm_app.data.datamodules import check_batch_sizes
from ptm_app.data.loader import ResumableLoader, eval_loader
from ptm_app.data.tokenizer import TokenizerSpec, load_tokenizer
from ptm_app.errors import PtmError

IMAGES = "images.safetensors"
SPLITS = ("train", "validation", "test")
MEAN, STD = 0.5, 0.5


def normalise(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 ``(..., H, W, 3)`` -> float ``(..., 3, H, W)`` in [-1, 1] (mean 0.5, std 0.5)."""
    x = pixels.to(torch.float32).div(255).movedim(-1, -3)
    return (x - MEAN) / STD


def random_resized_crop(image: torch.Tensor, size: int, generator: torch.Generator,
                        scale: tuple[float, float], ratio: tuple[float, float], flip: bool = False) -> torch.Tensor:
    """Inception's crop (Szegedy et al. 2015 §6; torchvision's ``RandomResizedCrop``) of a ``(3, H, W)`` float image:
    area fraction ~ U(scale), aspect ratio log-uniform in ``ratio``; up to 10 tries for a box that fits, else the
    whole image; resized (bilinear, antialiased) to ``size`` × ``size``.  ``flip``: mirrored with probability 1/2."""
    _, height, width = image.shape
    area = height * width
    box = (0, 0, height, width)
    u = torch.rand(40, generator=generator).tolist()  # a fixed number of draws: the stream does not depend on tries
    for t in range(10):
        target = area * (scale[0] + (scale[1] - scale[0]) * u[4 * t])
        log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
        aspect = math.exp(log_lo + (log_hi - log_lo) * u[4 * t + 1])
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(u[4 * t + 2] * (height - h + 1))
            left = int(u[4 * t + 3] * (width - w + 1))
            box = (top, left, h, w)
            break
    top, left, h, w = box
    crop = image[:, top:top + h, left:left + w]
    out = torch.nn.functional.interpolate(crop[None], size=(size, size), mode="bilinear", align_corners=False,
                                          antialias=True)[0]
    if flip and bool(torch.rand(1, generator=generator) < 0.5):
        out = out.flip(-1)
    return out


@dataclass(frozen=True)
class Augment:
    """The training augmentation (see the module docstring)."""

    size: int
    scale: tuple[float, float] = (0.5, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = False
    seed: int = 0

    def __call__(self, image: torch.Tensor, key) -> torch.Tensor:
        return random_resized_crop(image, self.size, draw_generator(self.seed, [key]), self.scale, self.ratio,
                                   self.flip)


def resize(image: torch.Tensor, size: int) -> torch.Tensor:
    """A ``(3, H, W)`` image at ``size`` × ``size`` (unchanged when it is that size)."""
    if image.shape[-1] == size and image.shape[-2] == size:
        return image
    return torch.nn.functional.interpolate(image[None], size=(size, size), mode="bilinear", align_corners=False,
                                           antialias=True)[0]


class ImageTextDataset(Dataset):
    """One picture and its caption's token ids per item (keys ``(epoch, index)`` or plain indices)."""

    def __init__(self, pixels: torch.Tensor, rows: list[int], captions: list[list[int]], concepts: list[int],
                 size: int, augment: Optional[Augment] = None):
        self.pixels, self.rows, self.captions, self.concepts = pixels, rows, captions, concepts
        self.size, self.augment = size, augment

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key) -> dict:
        i = key[1] if isinstance(key, tuple) else int(key)
        image = normalise(self.pixels[self.rows[i]])
        image = self.augment(image, key) if self.augment is not None else resize(image, self.size)
        return {"pixel_values": image, "input_ids": torch.as_tensor(self.captions[i], dtype=torch.long),
                "concept": self.concepts[i], "key": key}


@dataclass
class ImageTextCollator:
    """Stacks the pictures, pads the captions: ``pixel_values``, ``input_ids``, ``attention_mask``, ``concept``
    (the concept's index: rows of one concept are true pairs for each other), ``keys``."""

    pad_token_id: int

    def __call__(self, examples: list[dict]) -> dict:
        ids = [e["input_ids"] for e in examples]
        return {"pixel_values": torch.stack([e["pixel_values"] for e in examples]),
                "input_ids": pad(ids, self.pad_token_id), "attention_mask": pad([torch.ones_like(i) for i in ids], 0),
                "concept": torch.tensor([e["concept"] for e in examples]), "keys": [e["key"] for e in examples]}


def read_records(root: Path, split: str) -> list[dict]:
    path = root / f"{split}.jsonl"
    try:
        with open(path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except (OSError, ValueError) as exc:
        raise PtmError(f"{path}: cannot read the {split} split ({exc}); run: python main.py data prepare emoji") \
            from None


def load_pixels(root: Path) -> torch.Tensor:
    """The uint8 ``(N, H, W, 3)`` pictures of a prepared image set (safetensors: data only)."""
    from safetensors.torch import load_file

    path = root / IMAGES
    try:
        return load_file(str(path))["pixels"]
    except (OSError, KeyError, ValueError, RuntimeError) as exc:
        raise PtmError(f"{path}: cannot read the pictures ({' '.join(str(exc).split())[:120]}); "
                       f"run: python main.py data prepare emoji --force") from None


def image_source(source: str) -> Path:
    """A prepared image set's folder: a registered name or a folder holding ``images.safetensors``."""
    given = Path(source).expanduser()
    if (given / IMAGES).is_file():
        return given.resolve()
    from ptm_app.data.sources import prepared_dir

    root = prepared_dir(source)
    if not (root / IMAGES).is_file():
        raise PtmError(f"data source '{source}' has no {IMAGES}: it is not an image-text set; use source: emoji")
    return root


class ImageTextDataModule(pl.LightningDataModule):
    """Pictures with captions (docs/multimodal.md).

    Args:
        tokenizer: the text tower's tokenizer (``pretrained: minilm``), or one trained on the training captions.
        source: a prepared image-text set (``emoji``) or a folder of the same layout.
        styles: the drawing styles trained on (``openmoji``, ``noto``, ``gemojione``; default all): cross-style
            transfer trains on one and evaluates on another.
        eval_styles: the styles of the validation/test pictures (default: ``styles``).
        skin_tones: keep the skin-tone variants (their captions name the tone).
        image_size: the side the pictures are given to the model at (the prepared side, or smaller).
        max_length: captions are cut to this many tokens ([CLS] and [SEP] included).
        crop_scale / crop_ratio / flip: the training augmentation (``random_resized_crop``); ``crop_scale: [1, 1]``
            and ``crop_ratio: [1, 1]`` turn cropping off.
        batch_size / eval_batch_size / num_workers / seed: as for text data.
        limit_train: keep only this many training pairs (a seeded draw), for quick runs.
    """

    def __init__(self, tokenizer: TokenizerSpec, source: str = "emoji", styles: Optional[list[str]] = None,
                 eval_styles: Optional[list[str]] = None, skin_tones: bool = True, image_size: int = 64,
                 max_length: int = 32, crop_scale: tuple[float, float] = (0.5, 1.0),
                 crop_ratio: tuple[float, float] = (3 / 4, 4 / 3), flip: bool = False, batch_size: int = 64,
                 eval_batch_size: Optional[int] = None, num_workers: int = 0, seed: int = 0,
                 limit_train: Optional[int] = None):
        super().__init__()
        check_batch_sizes(batch_size, eval_batch_size)
        if not (0 < crop_scale[0] <= crop_scale[1] <= 1) or not (0 < crop_ratio[0] <= crop_ratio[1]):
            raise PtmError(f"data.init_args.crop_scale={list(crop_scale)} / crop_ratio={list(crop_ratio)}: need "
                           f"0 < low <= high (<= 1 for the scale)")
        if max_length < 3:
            raise PtmError("data.init_args.max_length: a caption needs at least 3 tokens ([CLS] word [SEP])")
        self.tokenizer_spec, self.source = tokenizer, source
        self.styles, self.eval_styles, self.skin_tones = styles, eval_styles or styles, skin_tones
        self.image_size, self.max_length = image_size, max_length
        self.augment = Augment(image_size, tuple(crop_scale), tuple(crop_ratio), flip, seed)
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.num_workers, self.seed, self.limit_train = num_workers, seed, limit_train
        self.tokenizer = None
        self.model_hooks: Optional[ModelHooks] = None
        self.collate_fn = None
        self.datasets: dict[str, ImageTextDataset] = {}
        self.split_records: dict[str, list[dict]] = {}
        self.pixels: Optional[torch.Tensor] = None

    @property
    def root(self) -> Path:
        return image_source(self.source)

    def _kept(self, records: list[dict], styles: Optional[list[str]]) -> list[dict]:
        known = {r["style"] for r in records}
        unknown = sorted(set(styles or ()) - known)
        if unknown:
            raise PtmError(f"data.init_args.styles: {unknown} are not styles of {self.source} "
                           f"({', '.join(sorted(known))})")
        return [r for r in records if (styles is None or r["style"] in styles)
                and (self.skin_tones or not r.get("skin_tone"))]

    def load_tokenizer(self):
        if self.tokenizer is None:
            root = self.root
            self.tokenizer = load_tokenizer(self.tokenizer_spec, lambda: (r["caption"] for r in read_records(
                root, "train")), f"{root}/train.jsonl:caption")
        return self.tokenizer

    def facts(self) -> DataFacts:
        return DataFacts(tokenizer=self.load_tokenizer, max_length=self.max_length, records=self.records)

    def connect_model(self, hooks: ModelHooks) -> None:
        self.model_hooks = hooks

    def prepare_data(self) -> None:
        self.load_tokenizer()  # trained once (cached) on rank 0

    def encode(self, captions: list[str]) -> list[list[int]]:
        return self.load_tokenizer()(captions, truncation=True, max_length=self.max_length)["input_ids"]

    def setup(self, stage: Optional[str] = None) -> None:
        if self.datasets:
            return
        root = self.root
        self.pixels = load_pixels(root)
        if self.image_size > self.pixels.shape[1]:
            raise PtmError(f"data.init_args.image_size={self.image_size} is larger than the prepared pictures "
                           f"({self.pixels.shape[1]}); set it to {self.pixels.shape[1]} or less")
        for split in SPLITS:
            records = self._kept(read_records(root, split), self.styles if split == "train" else self.eval_styles)
            if split == "train" and self.limit_train:
                order = np.random.default_rng(self.seed).permutation(len(records))[: self.limit_train]
                records = [records[i] for i in sorted(order)]
            concepts = {c: i for i, c in enumerate(sorted({r["concept"] for r in records}))}
            self.split_records[split] = records
            self.datasets[split] = ImageTextDataset(
                self.pixels, [r["image"] for r in records], self.encode([r["caption"] for r in records]),
                [concepts[r["concept"]] for r in records], self.image_size,
                self.augment if split == "train" else None)

    def records(self, split: str) -> dict:
        self.setup()
        return {"records": self.split_records[split]}

    def _collate(self):
        if self.collate_fn is None:
            hooks = self.model_hooks
            factory = hooks.collator if hooks is not None and hooks.collator is not None else None
            tok = self.load_tokenizer()
            self.collate_fn = factory(tok, seed=self.seed) if factory else ImageTextCollator(tok.pad_token_id)
        return self.collate_fn

    def _rank(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def train_dataloader(self):
        rank, world = self._rank()
        return ResumableLoader(self.datasets["train"], batch_size=self.batch_size, shuffle=True, seed=self.seed,
                               rank=rank, world_size=world, collate_fn=self._collate(), num_workers=self.num_workers,
                               persistent_workers=self.num_workers > 0)

    def _eval(self, split: str):
        return eval_loader(self.datasets[split], batch_size=self.eval_batch_size, seed=self.seed,
                           collate_fn=self._collate(), num_workers=self.num_workers)

    def val_dataloader(self):
        return self._eval("validation")

    def test_dataloader(self):
        return self._eval("test")
