"""Replaced token detection (ELECTRA, Clark et al. 2020 §2; Qiu et al. 2020 §3.1.5).

A small generator G (MLM) fills the masked positions with samples; the discriminator D labels
every token as original (0) or replaced (1).  A sampled token equal to the original counts as
original.  Labels follow transformers' ``ElectraForPreTraining`` (1 = replaced); the surveys'
``y_t = 1(x̂_t = x_t)`` is the complement (trap T5).

Modes: ``joint`` (the paper: ``L_MLM(G) + λ·L_Disc(D)``, λ = 50, G smaller, embeddings shared) and
``two_stage`` (Clark et al. §3.2, Qiu §3.1.5: train G alone for ``generator_steps``, initialise D with G's
weights, then train D with G frozen; needs G and D of the same size).  Export keeps the discriminator.

Two-stage and embeddings: the paper initialises D with *all* of G's weights and then keeps G's weights frozen, so
G and D never share a module in this mode: at the switch D's embeddings are a copy of G's (with the rest of G's
encoder), D trains its copy, and every parameter of G (its embeddings and the LM head tied to them included)
stays as it was.  Sharing them instead would either train G through D's embeddings or freeze D's, neither of
which is the recipe; ``share_embeddings: true`` with ``two_stage`` is refused.  The optimiser holds the same
parameters in both stages (G's simply get no gradient after the switch), so a run resumes exactly on either
side of it.

Replacements are sampled on the device of G's logits from a generator seeded by the run seed
(``seed_everything``) and the batch's sample keys: the same seed gives the same replacements on a resume and on
any machine of the same device type, another seed other replacements.  CUDA's generator is another algorithm
than the CPU's, so a GPU run samples other replacements than a CPU run with the same seed.
"""
from __future__ import annotations

from typing import Literal, Optional

import torch
from torch import nn
from torchmetrics import MeanMetric

from ptm_app.data.collators import MLMCollator
from ptm_app.data import IGNORE_INDEX
from ptm_app.data.corruption import draw_generator
from ptm_app.data.corruption.rtd import rtd_labels, sample_replacements
from ptm_app.errors import PtmError
from ptm_app.objectives.heads import masked_lm_forward
from ptm_app.training.module import PtmModule, weighted_mean_update
from ptm_app.training.optim import OptimConfig

SCALED = ("hidden_size", "num_attention_heads", "intermediate_size")


class ReplacedTokenDetectionModule(PtmModule):
    """ELECTRA pre-training.  ``.backbone`` is the discriminator, ``.generator`` the MLM generator.

    Args:
        backbone / backbone_config: the discriminator (``model_type: electra``), pretrained or from scratch.
        generator_size: the generator's width as a fraction of the discriminator's (hidden size, heads,
            FFN); ``generator_config`` overrides it with explicit values.
        mode: ``joint`` or ``two_stage``; ``generator_steps`` = n1 of the two-stage recipe.
        discriminator_weight: λ in ``L_MLM + λ L_Disc`` (joint mode).
        share_embeddings: G and D share token/position embeddings (joint mode; the paper's choice, the default).
            ``two_stage`` never shares them (D starts from a copy of G's, see above).
        mlm_probability / mask_ratio / random_ratio: masking of the generator's input.
        sparse_prediction: the generator computes vocabulary logits only at the masked positions, the only
            ones it samples from (default; same loss, see ``heads.masked_lm_forward``); ``false``: everywhere.
    """

    model_class = "rtd"
    monitor = ("val/disc_loss", "min")

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(lr=5e-4), gradient_checkpointing: bool = False,
                 generator_size: float = 0.25, generator_config: Optional[dict] = None,
                 mode: Literal["joint", "two_stage"] = "joint", generator_steps: int = 0,
                 discriminator_weight: float = 50.0, share_embeddings: Optional[bool] = None,
                 mlm_probability: float = 0.15, mask_ratio: float = 0.8, random_ratio: float = 0.1,
                 sampling_temperature: float = 1.0, sparse_prediction: bool = True):
        if mode == "two_stage" and generator_size != 1.0 and not generator_config:
            raise PtmError("mode: two_stage initialises D from G, so they need the same size: set generator_size: 1.0")
        if mode == "two_stage" and generator_steps <= 0:
            raise PtmError("mode: two_stage needs generator_steps > 0 (the steps that train G alone)")
        if mode == "two_stage" and share_embeddings:
            raise PtmError("mode: two_stage initialises D with a copy of all of G's weights and then freezes G "
                           "(Clark et al. 2020 §3.2), so they cannot share embeddings: remove share_embeddings")
        self.generator = None
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)
        self.register_buffer("stage", torch.tensor(1 if mode == "joint" else 0), persistent=True)
        self.val_gen, self.val_disc, self.val_acc = MeanMetric(), MeanMetric(), MeanMetric()

    # -- models -------------------------------------------------------------------------------
    def configure_model(self) -> None:
        super().configure_model()
        if self.generator is not None:
            return
        import transformers

        cfg = self.backbone.config.to_dict()
        cfg.pop("model_type", None)
        for name in SCALED:
            cfg[name] = max(1, int(round(cfg[name] * self.hparams.generator_size)))
        cfg.update(self.hparams.generator_config or {})
        cfg["embedding_size"] = self.backbone.config.embedding_size  # so the embeddings can be shared
        self.generator = transformers.ElectraForMaskedLM(transformers.ElectraConfig(**cfg))
        self.generator.train(self.training)
        if self.hparams.mode == "joint" and self.hparams.share_embeddings is not False:
            self.generator.electra.embeddings = self.backbone.electra.embeddings
            self.generator.generator_lm_head.weight = self.backbone.electra.embeddings.word_embeddings.weight

    def make_collator(self, tokenizer, seed: int = 0) -> MLMCollator:
        if tokenizer.mask_token_id is None:
            raise PtmError("ELECTRA needs a tokenizer with a [MASK] token; use a BERT-style (wordpiece) tokenizer")
        vocab = min(len(tokenizer), self.backbone.config.vocab_size)
        hp = self.hparams
        return MLMCollator(pad_token_id=tokenizer.pad_token_id, mask_token_id=tokenizer.mask_token_id,
                           special_ids=tuple(i for i in tokenizer.all_special_ids if i < vocab), vocab_size=vocab,
                           seed=seed, mlm_probability=hp.mlm_probability, mask_ratio=hp.mask_ratio,
                           random_ratio=hp.random_ratio)

    # -- two-stage schedule ---------------------------------------------------------------------
    def on_train_batch_start(self, batch, batch_idx) -> None:
        """The switch at ``generator_steps``; after a resume past it, G frozen again.  Freezing happens here, after
        the optimiser is built, so a resumed run's optimiser holds what the uninterrupted run's does."""
        if self.hparams.mode == "two_stage" and int(self.stage) == 0 and self.global_step >= self.hparams.generator_steps:
            self.start_discriminator_stage()
        elif int(self.stage) == 2:
            self.freeze_generator()

    def start_discriminator_stage(self) -> None:
        """Initialise D with G's weights, embeddings included (equal sizes; D's own copy), then freeze G
        (Clark et al. 2020 §3.2; Qiu §3.1.5)."""
        self.backbone.electra.load_state_dict(self.generator.electra.state_dict())
        self.freeze_generator()
        self.stage.fill_(2)

    def freeze_generator(self) -> None:
        """Every parameter of G stops training (it gets no gradient; the discriminator loss never reaches it)."""
        for p in self.generator.parameters():
            p.requires_grad_(False)

    # -- losses -------------------------------------------------------------------------------
    def _losses(self, batch: dict) -> dict[str, torch.Tensor]:
        inputs = self.model_inputs(batch)
        labels = batch["labels"]
        selected = labels != IGNORE_INDEX
        original = torch.where(selected, labels, batch["input_ids"])
        stage = int(self.stage)
        train_g = stage in (0, 1)
        with torch.set_grad_enabled(train_g and torch.is_grad_enabled()):
            gen = masked_lm_forward(self.generator, inputs, labels, sparse=self.hparams.sparse_prediction)
        losses = {"gen_loss": gen.loss}
        if stage == 0:  # two-stage, first phase: the generator alone
            return losses
        rng = (draw_generator(self.run_seed, ["rtd", *batch["keys"]], device=gen.logits.device)
               if "keys" in batch else None)  # reproducible per batch, on the logits' device
        sampled = sample_replacements(gen.logits, None, rng, self.hparams.sampling_temperature)
        corrupted = batch["input_ids"].clone()
        corrupted[selected] = sampled.to(corrupted.dtype)
        disc_labels = rtd_labels(original, corrupted, batch["attention_mask"])
        d_logits = self.backbone(**{**inputs, "input_ids": corrupted}).logits.float()
        active = disc_labels != IGNORE_INDEX
        losses["disc_loss"] = nn.functional.binary_cross_entropy_with_logits(d_logits[active], disc_labels[active].float())
        losses["disc_acc"] = ((d_logits[active] > 0).long() == disc_labels[active]).float().mean()
        losses["replaced"] = disc_labels[active].float().mean()
        return losses

    def _total(self, losses: dict) -> torch.Tensor:
        stage = int(self.stage)
        if stage == 0:
            return losses["gen_loss"]
        if stage == 2:
            return losses["disc_loss"]
        return losses["gen_loss"] + self.hparams.discriminator_weight * losses["disc_loss"]

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        losses = self._losses(batch)
        return self.log_train_losses(self._total(losses), losses, len(batch["input_ids"]))

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        losses = self._losses(batch)
        n = len(batch["input_ids"])
        weighted_mean_update(self.val_gen, losses["gen_loss"], n)
        if "disc_loss" in losses:
            weighted_mean_update(self.val_disc, losses["disc_loss"], n)
            weighted_mean_update(self.val_acc, losses["disc_acc"], n)

    def on_validation_epoch_end(self) -> None:
        self.log("val/gen_loss", self.val_gen.compute())
        if self.val_disc.update_called:
            self.log("val/disc_loss", self.val_disc.compute(), prog_bar=True)
            self.log("val/disc_acc", self.val_acc.compute())
        else:  # first stage of two_stage: nothing to monitor yet but G
            self.log("val/disc_loss", torch.tensor(float("inf")), prog_bar=True)
        for metric in (self.val_gen, self.val_disc, self.val_acc):
            metric.reset()
