"""CLIP-style contrastive image–text pre-training (Radford et al. 2021 §2.3, Figure 3): a dual encoder.

The image encoder is a Vision Transformer (Dosovitskiy et al. 2021) built from a config and trained from scratch
(no pretrained vision weights exist here); the text encoder is any transformers encoder (MiniLM, a small BERT).
Each tower's pooled output goes through a linear projection (no bias) into a shared space and is L2-normalised;
the logits are the cosine similarities times ``exp(t)``, where ``t`` is a learned log-parameterised temperature
("initialised to the equivalent of 0.07 ... clipped to prevent scaling the logits by more than 100", §2.5).  The
loss is the symmetric cross-entropy over the batch: images against every caption and captions against every image,
averaged (Figure 3's pseudocode).  Under DDP the in-batch negatives are every rank's rows
(``gather_rows``: an all-gather that keeps the gradient), so the batch is the global one.

The model is a plain transformers ``VisionTextDualEncoderModel`` (``.backbone``): its ``logit_scale`` is the
learned temperature, saved with the weights, restored on resume and exported with the model.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import nn
from torchmetrics import MeanMetric

from ptm_app.data.image_text import ImageTextCollator
from ptm_app.errors import PtmError
from ptm_app.training.module import PtmModule, weighted_mean_update
from ptm_app.training.optim import OptimConfig

DUAL = "vision-text-dual-encoder"
CLIP_INIT = math.log(1 / 0.07)  # CLIP §2.5: τ initialised to 0.07


def gather_rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Every rank's rows of ``x`` concatenated in rank order (the gradient flows back to each rank's own rows:
    ``torch.distributed.nn.functional.all_gather``), and where this rank's rows start; ``(x, 0)`` alone."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x, 0
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(x.contiguous())), dist.get_rank() * len(x)


def clip_loss(image_embeds: torch.Tensor, text_embeds: torch.Tensor, logit_scale: torch.Tensor,
              max_scale: float = 100.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Symmetric InfoNCE (CLIP Figure 3): ``(CE(image→text) + CE(text→image)) / 2`` over cosine logits times
    ``min(exp(logit_scale), max_scale)``, the positives on the diagonal; with DDP the columns are all ranks' rows
    (``gather_rows``).  Returns the loss, this rank's image→text logits ``(batch, global batch)`` and their targets
    (the columns of the true captions).  float32."""
    with torch.autocast(image_embeds.device.type, enabled=False):
        img = nn.functional.normalize(image_embeds.float(), dim=-1)
        txt = nn.functional.normalize(text_embeds.float(), dim=-1)
        all_img, start = gather_rows(img)
        all_txt, _ = gather_rows(txt)
        scale = logit_scale.float().clamp(max=math.log(max_scale)).exp()
        per_image, per_text = scale * img @ all_txt.T, scale * txt @ all_img.T
        target = torch.arange(len(img), device=img.device) + start
        loss = (nn.functional.cross_entropy(per_image, target) + nn.functional.cross_entropy(per_text, target)) / 2
    return loss, per_image, target


def build_dual_encoder(text_model, vision_config: dict, projection_dim: int, logit_scale_init: float):
    """A ``VisionTextDualEncoderModel`` of a fresh ViT (from ``vision_config``) and ``text_model``."""
    import transformers

    cfg = dict(vision_config)
    if cfg.pop("model_type", "vit") != "vit":
        raise PtmError("vision_config: model_type must be vit (a Vision Transformer trained from scratch)")
    try:
        vision = transformers.ViTModel(transformers.ViTConfig(**cfg))
    except (TypeError, ValueError) as exc:
        raise PtmError(f"vision_config: {' '.join(str(exc).split())[:160]}") from None
    config = transformers.VisionTextDualEncoderConfig.from_vision_text_configs(
        vision.config, text_model.config, projection_dim=projection_dim, logit_scale_init_value=logit_scale_init)
    text_state = {k: v.clone() for k, v in text_model.state_dict().items()}
    model = transformers.VisionTextDualEncoderModel(config, vision_model=vision, text_model=text_model)
    model.text_model.load_state_dict(text_state)  # post_init must not re-draw a pretrained text tower
    return model


class ImageTextModule(PtmModule):
    """Shared by the image–text objectives: the validation and test metrics are the batch-size-weighted means of
    what ``evaluated(batch)`` returns (``val_metrics`` holds one ``MeanMetric`` per name), logged as ``val/<name>``
    and ``test/<name>``."""

    def evaluated(self, batch: dict) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        for name, value in self.evaluated(batch).items():
            weighted_mean_update(self.val_metrics[name], value, len(batch["input_ids"]))

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")

    def _log_epoch(self, stage: str) -> None:
        for name, metric in self.val_metrics.items():
            self.log(f"{stage}/{name}", metric.compute(), prog_bar=name == "loss")
            metric.reset()


class DualEncoderModule(ImageTextModule):
    """CLIP-style dual-encoder pre-training (see the module docstring; docs/multimodal.md).

    Args:
        backbone: the text tower (a prepared name such as ``minilm``, a directory ...); or give
            ``backbone_config`` (a text config with ``model_type``, from scratch).  A checkpoint's resolved config
            is the whole dual encoder's (``model_type: vision-text-dual-encoder``).
        vision_config: the ViT's ``ViTConfig`` arguments (``image_size`` must match the data's).
        projection_dim: the shared embedding size.
        logit_scale_init: the initial log of the logit scale (log(1/0.07), CLIP §2.5).
        max_logit_scale: the clip on the logit scale (100, CLIP §2.5).
        freeze_text: keep the text tower (encoder and pooler) as it is, in eval mode, and train the rest: the ViT,
            both projections and the temperature (a locked pretrained tower, as LiT: Zhai et al. 2022, there on the
            image side).  Its outputs are then a fixed function of the caption and are computed once per caption
            (memoised for the run).  With a tower from scratch its [CLS] output barely depends on the caption at
            initialisation, and a short run stays at the uniform loss log(batch): lock a pretrained one (MiniLM).
        optim / gradient_checkpointing: see ``PtmModule``.

    Logs ``train/loss``, ``train/logit_scale``, and per validation ``val/loss`` and ``val/acc`` (in-batch
    image→text top-1).
    """

    model_class = "base"

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 vision_config: Optional[dict] = None, projection_dim: int = 128,
                 logit_scale_init: float = CLIP_INIT, max_logit_scale: float = 100.0, freeze_text: bool = False,
                 optim: OptimConfig = OptimConfig(), gradient_checkpointing: bool = False):
        if max_logit_scale <= 1:
            raise PtmError("max_logit_scale must be > 1")
        self.vision_config = dict(vision_config or {"model_type": "vit", "image_size": 64, "patch_size": 8,
                                                    "hidden_size": 128, "num_hidden_layers": 4,
                                                    "num_attention_heads": 4, "intermediate_size": 256})
        self.projection_dim, self.logit_scale_init, self.max_logit_scale = (projection_dim, logit_scale_init,
                                                                           max_logit_scale)
        self.freeze_text = freeze_text
        self._text_memo: dict[tuple, torch.Tensor] = {}  # freeze_text: caption ids -> the locked tower's output
        self._pending_captions: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # on_fit_start's, not yet run
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)
        self.val_metrics = nn.ModuleDict({name: MeanMetric() for name in ("loss", "acc")})

    def is_whole(self) -> bool:
        return (self.hparams.backbone_config or {}).get("model_type") == DUAL

    def can_build(self) -> bool:
        return self.is_whole() or super().can_build()

    def config_updates(self) -> dict[str, Any]:
        return {} if self.is_whole() else super().config_updates()

    def build_model(self):
        from ptm_app.backbones.build import build_backbone

        if self.is_whole():  # a checkpoint's resolved dual-encoder config
            model = build_backbone("base", None, self.hparams.backbone_config)
        else:
            text = build_backbone("base", self.hparams.backbone, self.hparams.backbone_config, **self.config_updates())
            model = build_dual_encoder(text, self.vision_config, self.projection_dim, self.logit_scale_init)
        # FSDP2's fully_shard refuses 0-dim parameters: the temperature trains as one element of shape [1] (the
        # model's forward broadcasts it the same); exports and old checkpoints keep transformers' scalar
        # (``backbones.from_checkpoint.rebuild_backbone``, ``on_load_checkpoint``).
        model.logit_scale = torch.nn.Parameter(model.logit_scale.detach().reshape(1))
        return model

    def check_lengths(self, facts) -> None:
        from ptm_app.backbones.build import max_positions

        limit, wanted = max_positions(self.backbone.text_model), facts.max_length
        if limit is not None and wanted is not None and wanted > limit:
            raise PtmError(f"data.max_length={wanted} is longer than the text tower allows ({limit} positions); "
                           f"set data.init_args.max_length <= {limit}")

    def configure_model(self) -> None:
        super().configure_model()
        if self.freeze_text:
            self.backbone.text_model.requires_grad_(False)

    def on_fit_start(self) -> None:
        """With ``freeze_text``: the locked tower's output for every caption of the data, computed once up front (so
        what a caption gets does not depend on the batches it came with: a resumed run gets the same)."""
        if not self.freeze_text or self.data_facts is None or self.tokenizer is None:
            return
        captions = sorted({r["caption"] for split in ("train", "validation") for r in
                           self.data_facts.records(split)["records"]})
        ids = self.tokenizer(captions, truncation=True, max_length=self.data_facts.max_length)["input_ids"]
        rows = [torch.tensor(i) for i in ids]
        from ptm_app.data.collators import pad

        # embedded at the first step's text_embeds, inside the step: under FSDP2 the locked tower's weights are
        # sharded outside the root unit's forward
        self._pending_captions = (pad(rows, self.tokenizer.pad_token_id).to(self.device),
                                  pad([torch.ones_like(r) for r in rows], 0).to(self.device))

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        state = checkpoint.get("state_dict", {})
        if "backbone.logit_scale" in state and state["backbone.logit_scale"].dim() == 0:  # written before [1]
            state["backbone.logit_scale"] = state["backbone.logit_scale"].reshape(1)
        self._text_memo.clear()

    def make_collator(self, tokenizer, seed: int = 0) -> ImageTextCollator:
        return ImageTextCollator(tokenizer.pad_token_id)

    # -- embeddings ----------------------------------------------------------------------------------
    def image_embeds(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Projected (not normalised) image features."""
        return self.backbone.get_image_features(pixel_values=pixel_values).pooler_output

    def text_embeds(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Projected (not normalised) caption features (``get_text_features``; with ``freeze_text`` the locked
        tower's pooled output is memoised per caption, then projected)."""
        if not self.freeze_text:
            return self.backbone.get_text_features(input_ids=input_ids, attention_mask=attention_mask).pooler_output
        pending, self._pending_captions = self._pending_captions, None
        if pending is not None:  # every caption of the data first (on_fit_start)
            self.text_embeds(*pending)
        tower = self.backbone.text_model
        tower.eval()  # locked: no dropout, ever
        keys = [tuple(row[mask.bool()].tolist()) for row, mask in zip(input_ids, attention_mask)]
        todo = sorted({k for k in keys if k not in self._text_memo}, key=lambda k: (len(k), k))
        for length in sorted({len(k) for k in todo}):  # captions of one length together: no padding, in float32
            same = [k for k in todo if len(k) == length]
            for start in range(0, len(same), 256):
                chunk = same[start:start + 256]
                with torch.no_grad(), torch.autocast(input_ids.device.type, enabled=False):
                    ids = torch.tensor(chunk, device=input_ids.device)
                    pooled = tower(input_ids=ids, attention_mask=torch.ones_like(ids)).pooler_output
                self._text_memo.update(zip(chunk, pooled))
        pooled = torch.stack([self._text_memo[k] for k in keys]).to(self.backbone.text_projection.weight.dtype)
        return self.backbone.text_projection(pooled)

    def _losses(self, batch: dict) -> dict[str, torch.Tensor]:
        images = self.image_embeds(batch["pixel_values"])
        texts = self.text_embeds(batch["input_ids"], batch["attention_mask"])
        loss, logits, target = clip_loss(images, texts, self.backbone.logit_scale, self.max_logit_scale)
        return {"loss": loss, "acc": (logits.detach().argmax(1) == target).float().mean()}

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        losses = self._losses(batch)
        scale = self.backbone.logit_scale.detach().clamp(max=math.log(self.max_logit_scale)).exp().squeeze()
        return self.log_train_losses(losses["loss"], {"logit_scale": scale}, len(batch["input_ids"]))

    def evaluated(self, batch: dict) -> dict[str, torch.Tensor]:
        return self._losses(batch)
