"""VisualBERT-style single-stream pre-training (Li et al. 2019 §3): one BERT reads the caption's tokens and the
picture's patches together.

Input layout (Li et al. §3.2; transformers' ``VisualBertForPreTraining``): ``[CLS] caption [SEP]`` with segment
(token type) 0, then one visual token per picture patch with segment 1 (the modality embedding, VisualBERT's ``e_s``).
VisualBERT's visual tokens are detector region features; here each is a ``patch_size`` × ``patch_size`` patch of the
picture, flattened (channels last, values in [-1, 1]) and followed by a one-hot of the patch's index, so the
model's visual projection (a linear map, VisualBERT's ``f_o`` stand-in) adds a learned embedding per position, as
ViT's patch and position embeddings (Dosovitskiy et al. 2021 §3.1).  Text and patches attend to each other in every
layer.

Two objectives (Li et al. §3.3, task-agnostic pre-training):

- masked language modelling conditioned on the picture: BERT's 15 % / 80-10-10 masking of the caption
  (``data.corruption.mlm_mask``; the picture is never masked), on true pairs only (a caption that does not go with
  the picture gives no evidence to fill it in from);
- image–text matching ("sentence-image prediction"): with probability ``itm_probability`` a picture's caption is
  replaced by the caption of a picture of another concept in the batch (the negative), and the pooled [CLS] state
  predicts match (0) or not (1), transformers' ``sentence_image_labels``.

Negatives and masks are drawn from the run's seed and the batch's keys, so they change every batch and epoch and a
resumed run repeats them exactly.  The backbone is a plain transformers ``VisualBertForPreTraining``; export is
``save_pretrained``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from torchmetrics import MeanMetric

from ptm_app.data.collators import pad
from ptm_app.data.corruption import draw_generator, draw_rng, mlm_mask
from ptm_app.errors import PtmError
from ptm_app.objectives.clip import ImageTextModule
from ptm_app.training.optim import OptimConfig

MATCH, MISMATCH = 0, 1  # transformers' sentence_image_labels


def patch_tokens(pixel_values: torch.Tensor, patch_size: int) -> torch.Tensor:
    """``(B, 3, H, W)`` -> ``(B, P, 3·p·p + P)``: each patch flattened (row-major patches, channels last), then a
    one-hot of its index."""
    b, c, h, w = pixel_values.shape
    if h % patch_size or w % patch_size:
        raise PtmError(f"image side {h}x{w} is not a multiple of patch_size={patch_size}")
    x = pixel_values.unfold(2, patch_size, patch_size).unfold(3, patch_size, patch_size)  # B, C, h', w', p, p
    x = x.permute(0, 2, 3, 4, 5, 1).reshape(b, (h // patch_size) * (w // patch_size), patch_size * patch_size * c)
    n = x.size(1)
    where = torch.eye(n, dtype=x.dtype, device=x.device).expand(b, n, n)
    return torch.cat([x, where], dim=-1)


def visual_dim(image_size: int, patch_size: int) -> int:
    """The size of one visual token (``patch_tokens``): the flattened patch plus the one-hot of its index."""
    n = (image_size // patch_size) ** 2
    return 3 * patch_size * patch_size + n


def itm_negatives(concepts: list[int], probability: float, rng) -> list[Optional[int]]:
    """For each row, the row whose caption replaces its own (a negative pair), or None (kept: a true pair).  A row is
    made a negative with ``probability`` when the batch holds a picture of another concept; the caption is drawn
    uniformly among those rows."""
    out: list[Optional[int]] = []
    for i, concept in enumerate(concepts):
        others = [j for j, c in enumerate(concepts) if c != concept]
        draw = rng.random()
        out.append(rng.choice(others) if others and draw < probability else None)
    return out


@dataclass
class SingleStreamCollator:
    """VisualBERT inputs from image-text examples (see the module docstring): ``input_ids`` (masked caption),
    ``attention_mask``, ``token_type_ids`` (0), ``visual_embeds``, ``visual_attention_mask``,
    ``visual_token_type_ids`` (1), ``labels`` (caption targets, -100 elsewhere and for the patches),
    ``sentence_image_labels`` (0 match / 1 negative) and ``keys``."""

    pad_token_id: int
    mask_token_id: int
    vocab_size: int
    special_ids: tuple[int, ...]
    patch_size: int
    seed: int = 0
    itm_probability: float = 0.5
    mlm_probability: float = 0.15

    def __call__(self, examples: list[dict]) -> dict:
        keys = [e["key"] for e in examples]
        rng = draw_rng(self.seed, keys)
        swap = itm_negatives([int(e["concept"]) for e in examples], self.itm_probability, rng)
        captions = [examples[j if j is not None else i]["input_ids"] for i, j in enumerate(swap)]
        ids = pad(captions, self.pad_token_id)
        attention = pad([torch.ones_like(c) for c in captions], 0)
        maskable = attention.bool() & ~torch.isin(ids, torch.tensor(self.special_ids, dtype=ids.dtype))
        true_pair = torch.tensor([j is None for j in swap])
        corrupted, labels = mlm_mask(ids, maskable & true_pair[:, None], mask_token_id=self.mask_token_id,
                                     vocab_size=self.vocab_size, generator=draw_generator(self.seed, keys),
                                     mlm_probability=self.mlm_probability)
        visual = patch_tokens(torch.stack([e["pixel_values"] for e in examples]), self.patch_size)
        n = visual.size(1)
        return {"input_ids": corrupted, "attention_mask": attention, "token_type_ids": torch.zeros_like(ids),
                "visual_embeds": visual, "visual_attention_mask": torch.ones(len(examples), n, dtype=torch.long),
                "visual_token_type_ids": torch.ones(len(examples), n, dtype=torch.long),
                "labels": torch.cat([labels, torch.full((len(examples), n), -100)], dim=1),
                "sentence_image_labels": torch.tensor([MATCH if j is None else MISMATCH for j in swap]),
                "keys": keys}


class SingleStreamModule(ImageTextModule):
    """VisualBERT-style pre-training (see the module docstring; docs/multimodal.md).

    Args:
        backbone_config: a ``visual_bert`` config (``model_type: visual_bert``; its ``visual_embedding_dim`` is set
            from ``image_size`` and ``patch_size``); ``backbone``: a run or export of this module to continue.
        image_size / patch_size: the pictures' side and the patch side (the visual tokens: (side / patch)²).
        itm_probability: the share of pairs whose caption is replaced by another concept's.
        mlm_probability: BERT's masking rate on the caption.
        loss_weights: weights of ``mlm`` and ``itm`` in the summed loss (1 each).
        optim / gradient_checkpointing: see ``PtmModule``.

    Logs ``train/loss`` with ``train/mlm`` and ``train/itm``, and per validation ``val/loss``, the parts and
    ``val/itm_acc``.
    """

    model_class = "visual_bert"

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 image_size: int = 64, patch_size: int = 8, itm_probability: float = 0.5,
                 mlm_probability: float = 0.15, loss_weights: Optional[dict[str, float]] = None,
                 optim: OptimConfig = OptimConfig(), gradient_checkpointing: bool = False):
        unknown = sorted(set(loss_weights or {}) - {"mlm", "itm"})
        if unknown:
            raise PtmError(f"loss_weights: {unknown} are not parts of this objective (mlm, itm)")
        if image_size % patch_size:
            raise PtmError(f"image_size={image_size} is not a multiple of patch_size={patch_size}")
        if not 0 <= itm_probability <= 1:
            raise PtmError("itm_probability must be in [0, 1]")
        self.image_size, self.patch_size = image_size, patch_size
        self.itm_probability, self.mlm_probability = itm_probability, mlm_probability
        self.weights = {"mlm": 1.0, "itm": 1.0, **(loss_weights or {})}
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)
        self.val_metrics = nn.ModuleDict({name: MeanMetric() for name in ("loss", "mlm", "itm", "itm_acc")})

    def config_updates(self) -> dict:
        updates = super().config_updates()
        if not self.hparams.backbone:
            updates.setdefault("visual_embedding_dim", visual_dim(self.image_size, self.patch_size))
        return {k: v for k, v in updates.items() if k not in (self.hparams.backbone_config or {})}

    def configure_model(self) -> None:
        super().configure_model()
        want, got = visual_dim(self.image_size, self.patch_size), self.backbone.config.visual_embedding_dim
        if want != got:
            raise PtmError(f"the backbone takes visual tokens of {got} values, image_size={self.image_size} and "
                           f"patch_size={self.patch_size} give {want}; set them as the backbone was trained")

    def make_collator(self, tokenizer, seed: int = 0) -> SingleStreamCollator:
        if tokenizer.mask_token_id is None:
            raise PtmError("VisualBERT's masked LM needs a BERT-style tokenizer with [MASK]; use train: wordpiece")
        vocab = min(len(tokenizer), self.backbone.config.vocab_size) if self.backbone is not None else len(tokenizer)
        return SingleStreamCollator(tokenizer.pad_token_id, tokenizer.mask_token_id, vocab,
                                    tuple(i for i in tokenizer.all_special_ids if i < vocab), self.patch_size, seed,
                                    self.itm_probability, self.mlm_probability)

    def _losses(self, batch: dict) -> dict[str, torch.Tensor]:
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids", "visual_embeds",
                                        "visual_attention_mask", "visual_token_type_ids")}
        out = self.backbone(**inputs)
        logits, labels = out.prediction_logits.float(), batch["labels"]
        mlm = (nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
               if (labels != -100).any() else logits.sum() * 0)
        itm_logits = out.seq_relationship_logits.float()
        itm = nn.functional.cross_entropy(itm_logits, batch["sentence_image_labels"])
        acc = (itm_logits.argmax(-1) == batch["sentence_image_labels"]).float().mean().detach()
        return {"mlm": mlm, "itm": itm, "itm_acc": acc}

    def _total(self, losses: dict) -> torch.Tensor:
        return sum(self.weights[k] * losses[k] for k in ("mlm", "itm"))

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        losses = self._losses(batch)
        return self.log_train_losses(self._total(losses), losses, len(batch["input_ids"]))

    def evaluated(self, batch: dict) -> dict[str, torch.Tensor]:
        losses = self._losses(batch)
        return {"loss": self._total(losses), **losses}
