"""Contrastive pre-training with in-batch negatives: SimCSE and InfoWord.

SimCSE (Gao et al. 2021 §3, unsupervised): every sequence is encoded twice with dropout on; the two
views are a positive pair and the other sequences of the batch are negatives.  Loss = InfoNCE over
cosine similarities / τ (τ = 0.05).

InfoWord (Kong et al. 2020 §3; Qiu et al. 2020 Table 1 "DIM" and fn. 2): the context x̂_{i:j} is
the sequence with one n-gram masked (one [MASK] per token, n ~ N(5, 1) clipped to [1, 10]); it is
scored against its own n-gram x_{i:j}, encoded alone as ``[CLS] n-gram [SEP]``, and the other
sequences' n-grams.  Score = dot product of first-token states; loss = InfoNCE with logsumexp (the
survey prints it without exp, trap T4) plus MLM on the context ("InfoWord = DIM + MLM").

The n-grams and the dropout masks are drawn from rngs seeded by the batch keys, so a resumed run
repeats them exactly.  In-batch negatives are those of one device (no all-gather across ranks).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Literal, Optional

import torch
from torch import nn
from torchmetrics import MeanMetric

from ptm_app.data.collators import MLMCollator, PadCollator, pad
from ptm_app.data.corruption import draw_generator, draw_rng, mlm_mask
from ptm_app.data.corruption.contrastive import info_nce, mask_ngram, ngram_span
from ptm_app.errors import PtmError
from ptm_app.training.module import PtmModule, weighted_mean_update
from ptm_app.training.optim import OptimConfig

Objective = Literal["simcse", "infoword"]
OBJECTIVE_MODEL_CLASS: dict[str, str] = {"simcse": "base", "infoword": "masked_lm"}
LOSS_PARTS: dict[str, tuple[str, ...]] = {"simcse": ("nce",), "infoword": ("dim", "mlm")}


# -- data side --------------------------------------------------------------------------------
@dataclass
class DropoutPairCollator(PadCollator):
    """SimCSE inputs (Gao et al. 2021 §3): padded sequences and a ``dropout_seed`` drawn from the keys."""

    seed: int = 0

    def __call__(self, examples: list[dict]) -> dict:
        batch = self.pad_batch(examples)
        batch["dropout_seed"] = draw_rng(self.seed, batch["keys"]).getrandbits(63)
        return batch


@dataclass
class NgramContextCollator(MLMCollator):
    """InfoWord inputs (Kong et al. 2020 §3): one n-gram per sequence, masked in the context.

    Emits ``input_ids`` (the context: the n-gram as [MASK]s, and BERT 80/10/10 masking at
    ``mlm_probability`` elsewhere), ``labels`` (MLM targets: the n-gram and the other selected
    tokens), ``ngram_mask`` (the n-gram's positions), ``ngram_ids`` / ``ngram_attention_mask``
    (``[CLS] n-gram [SEP]`` per row) and ``dropout_seed``.  Special tokens are never in an n-gram.
    """

    cls_token_id: int = 0
    sep_token_id: int = 0
    ngram_mean: float = 5.0
    ngram_std: float = 1.0
    max_ngram: int = 10

    def __call__(self, examples: list[dict]) -> dict:
        batch = self.pad_batch(examples)
        ids, keys = batch["input_ids"], batch["keys"]
        content = batch["attention_mask"].bool() & ~torch.isin(ids, self._special)
        rng = draw_rng(self.seed, keys)
        context, in_ngram, ngrams = ids.clone(), torch.zeros_like(content), []
        for row in range(len(ids)):
            positions = content[row].nonzero().squeeze(1)
            tokens = ids[row, positions].tolist()
            start, end = ngram_span(len(tokens), rng, mean=self.ngram_mean, std=self.ngram_std, high=self.max_ngram)
            context[row, positions] = torch.tensor(mask_ngram(tokens, start, end, mask_token_id=self.mask_token_id))
            in_ngram[row, positions[start:end]] = True
            ngrams.append(torch.tensor([self.cls_token_id, *tokens[start:end], self.sep_token_id]))
        corrupted, labels = mlm_mask(
            context, content & ~in_ngram, mask_token_id=self.mask_token_id, vocab_size=self.vocab_size,
            generator=draw_generator(self.seed, keys), mlm_probability=self.mlm_probability,
            mask_ratio=self.mask_ratio, random_ratio=self.random_ratio, random_ids=self._random_ids,
        )
        labels[in_ngram] = ids[in_ngram]
        batch.update(input_ids=corrupted, labels=labels, ngram_mask=in_ngram, ngram_ids=pad(ngrams, self.pad_token_id),
                     ngram_attention_mask=pad([torch.ones_like(n) for n in ngrams], 0),
                     dropout_seed=rng.getrandbits(63))
        return batch


@contextlib.contextmanager
def seeded_rng(seed: int, device: torch.device) -> Iterator[None]:
    """Run the block with torch's RNG seeded by ``seed``, restoring the global state afterwards."""
    accelerator = device.type != "cpu"
    with torch.random.fork_rng(devices=[device] if accelerator else [],
                               device_type=device.type if accelerator else None):
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def dropout_on(module: nn.Module) -> Iterator[None]:
    """Train mode (dropout on) inside the block, also during validation, then the previous mode."""
    was_training = module.training
    module.train(True)
    try:
        yield
    finally:
        module.train(was_training)


# -- model side -------------------------------------------------------------------------------
@dataclass
class ContrastiveOutput:
    """Row i of ``anchors`` (SimCSE: first view; InfoWord: masked context) has ``candidates[i]`` as its
    positive; ``scores[i, j]`` scores anchor i against candidate j (float32)."""

    anchors: torch.Tensor
    candidates: torch.Tensor
    scores: torch.Tensor
    mlm: Optional[torch.Tensor] = None


class ContrastiveModule(PtmModule):
    """SimCSE or InfoWord pre-training of an encoder (see the module docstring).

    Args:
        backbone / backbone_config / optim / gradient_checkpointing: see ``PtmModule``.
        objective: ``simcse`` (model class ``base``) or ``infoword`` (model class ``masked_lm``, for its MLM term).
        pooling: the representation: ``cls`` (last-layer first-token state; SimCSE §3, Kong et al. §3) or
            ``mean`` (over non-padding tokens).
        temperature: τ of SimCSE's cosine scores; InfoWord scores are plain dot products.
        ngram_mean / ngram_std / max_ngram: InfoWord n-gram length, round(N(mean, std)) clipped to [1, max_ngram].
        mlm_probability / mask_ratio / random_ratio: InfoWord's BERT masking of the context outside the
            n-gram (``mlm_probability: 0``: MLM on the n-gram only).
        loss_weights: weights of the parts in the summed loss: ``nce`` (SimCSE), ``dim`` and ``mlm`` (InfoWord).

    Logs ``train/loss`` and the parts, and per validation ``val/loss`` (the weighted sum), the parts,
    ``val/acc`` (rows whose positive scores highest) and ``val/alignment`` (mean positive cosine).
    SimCSE's views keep dropout on in validation (seeded by the keys, so still deterministic).
    """

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(), gradient_checkpointing: bool = False,
                 objective: Objective = "simcse", pooling: Literal["cls", "mean"] = "cls", temperature: float = 0.05,
                 ngram_mean: float = 5.0, ngram_std: float = 1.0, max_ngram: int = 10,
                 mlm_probability: float = 0.15, mask_ratio: float = 0.8, random_ratio: float = 0.1,
                 loss_weights: Optional[dict[str, float]] = None):
        parts = LOSS_PARTS[objective]
        unknown = sorted(set(loss_weights or {}) - set(parts))
        if unknown:
            raise PtmError(f"loss_weights: {unknown} are not parts of objective {objective} ({', '.join(parts)})")
        if temperature <= 0:
            raise PtmError("temperature must be > 0")
        # kept as attributes, not only hparams (see MaskedLMModule)
        self.objective, self.pooling, self.temperature = objective, pooling, temperature
        self.model_class = OBJECTIVE_MODEL_CLASS[objective]
        self.ngram_cfg = dict(ngram_mean=ngram_mean, ngram_std=ngram_std, max_ngram=max_ngram,
                              mlm_probability=mlm_probability, mask_ratio=mask_ratio, random_ratio=random_ratio)
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)
        self.weights = {**dict.fromkeys(parts, 1.0), **(loss_weights or {})}
        self.val_metrics = nn.ModuleDict({name: MeanMetric() for name in ("loss", *parts, "acc", "alignment")})

    def configure_model(self) -> None:
        super().configure_model()
        pooler = getattr(self.backbone, "pooler", None)  # AutoModel's BERT pooler: not part of either loss
        if pooler is not None:
            pooler.requires_grad_(False)  # DDP needs a gradient for every trainable parameter

    def make_collator(self, tokenizer, seed: int = 0) -> PadCollator:
        if self.objective == "simcse":
            return DropoutPairCollator(tokenizer.pad_token_id, seed=seed)
        if None in (tokenizer.mask_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id):
            raise PtmError("InfoWord needs a BERT-style tokenizer ([CLS], [SEP], [MASK]); use train: wordpiece")
        vocab = min(len(tokenizer), self.backbone.config.vocab_size) if self.backbone is not None else len(tokenizer)
        return NgramContextCollator(
            pad_token_id=tokenizer.pad_token_id, mask_token_id=tokenizer.mask_token_id,
            special_ids=tuple(i for i in tokenizer.all_special_ids if i < vocab), vocab_size=vocab, seed=seed,
            cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id, **self.ngram_cfg,
        )

    # -- representations and scores ---------------------------------------------------------------
    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.pooling == "cls":
            return hidden[:, 0]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)

    def encode(self, inputs: dict) -> torch.Tensor:
        """The pooled last-layer representation f_enc(x) of ``input_ids`` / ``attention_mask``."""
        hidden = self.backbone.base_model(**inputs).last_hidden_state
        return self.pool(hidden, inputs["attention_mask"])

    def scores(self, anchors: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """SimCSE: cos / τ; InfoWord: dot products.  In float32, outside autocast."""
        with torch.autocast(self.device.type, enabled=False):
            a, c = anchors.float(), candidates.float()
            if self.objective == "simcse":
                return nn.functional.normalize(a, dim=-1) @ nn.functional.normalize(c, dim=-1).T / self.temperature
            return a @ c.T

    def _forward(self, batch: dict) -> ContrastiveOutput:
        with seeded_rng(batch["dropout_seed"], self.device):
            if self.objective == "simcse":  # one pass over the doubled batch: two dropout masks per sequence
                inputs = {k: torch.cat([v, v]) for k, v in self.model_inputs(batch).items()}
                with dropout_on(self.backbone):  # in validation too, or the views are identical (acc = 1)
                    anchors, candidates = self.encode(inputs).chunk(2)
                mlm = None
            else:
                out = self.backbone(**self.model_inputs(batch), labels=batch["labels"], output_hidden_states=True)
                anchors = self.pool(out.hidden_states[-1], batch["attention_mask"])
                candidates = self.encode({"input_ids": batch["ngram_ids"],
                                          "attention_mask": batch["ngram_attention_mask"]})
                mlm = out.loss
        return ContrastiveOutput(anchors, candidates, self.scores(anchors, candidates), mlm)

    # -- losses -----------------------------------------------------------------------------------
    def _losses(self, out: ContrastiveOutput) -> dict[str, torch.Tensor]:
        losses = {LOSS_PARTS[self.objective][0]: info_nce(out.scores)}
        if out.mlm is not None:
            losses["mlm"] = out.mlm
        with torch.no_grad():
            target = torch.arange(len(out.scores), device=out.scores.device)
            losses["acc"] = (out.scores.argmax(1) == target).float().mean()
            losses["alignment"] = nn.functional.cosine_similarity(out.anchors.float(), out.candidates.float()).mean()
        return losses

    def _total(self, losses: dict[str, torch.Tensor]) -> torch.Tensor:
        return sum(self.weights[k] * v for k, v in losses.items() if k in self.weights)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        losses = self._losses(self._forward(batch))
        return self.log_train_losses(self._total(losses), losses, len(batch["input_ids"]))

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        losses = self._losses(self._forward(batch))
        for name, value in {"loss": self._total(losses), **losses}.items():
            weighted_mean_update(self.val_metrics[name], value, len(batch["input_ids"]))

    def on_validation_epoch_end(self) -> None:
        for name, metric in self.val_metrics.items():
            self.log(f"val/{name}", metric.compute(), prog_bar=name == "loss")
            metric.reset()
