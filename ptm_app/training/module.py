"""The base LightningModule: a plain transformers model at ``.backbone``, AdamW + warm-up, and
self-contained checkpoints (resolved backbone config + tokenizer files inside the ``.ckpt``)."""
from __future__ import annotations

import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import TrainerFn

from ptm_app.backbones.build import build_backbone, max_positions
from ptm_app.backbones.delta import as_delta_spec
from ptm_app.checkpoint_io.reading import (CKPT_KEY, check_record, checkpoint_path as checkpoint_file, load_file,
                                 moved_class_path, trusted, trusting, upgrade_record, write_tokenizer_files)
from ptm_app.data.contract import DataFacts, ModelHooks
from ptm_app.errors import PtmError
from ptm_app.training.optim import OptimConfig, as_optim_config, build_optimizer


class PtmModule(pl.LightningModule):
    """Shared by every objective and adaptation style.

    Subclasses set ``model_class`` (see ``backbones.model_classes.MODEL_CLASSES``), ``monitor`` (metric, mode) for
    the best checkpoint, implement ``make_collator`` and the steps, and may extend ``config_updates``.

    Args:
        backbone: a prepared name, a ``save_pretrained`` directory, a run's ``.ckpt`` or a hub id.
        backbone_config: a transformers config dict with ``model_type`` (from scratch), or overrides of the
            pretrained one; ``attn_implementation: sdpa | eager | ...`` picks the attention kernel
            (``backbones.build``).
        optim: optimiser and LR schedule (``training.optim.OptimConfig``).
        gradient_checkpointing: recompute each transformer block's activations in the backward pass instead of
            keeping them (``enable_activation_checkpointing``).

    Behaviours on the backbone (delta tuning, frozen features, ``init_from``, L2-SP) are policies
    (``adaptation.policies``) that ``make_policies`` derives from the saved hyper-parameters; they are applied in
    order after the build, and each saves and restores what it owns.
    """

    model_class: str = "base"  # the transformers class the backbone is built as (backbones.model_classes)
    monitor: tuple[str, str] = ("val/loss", "min")

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(), gradient_checkpointing: bool = False):
        super().__init__()
        self.save_hyperparameters()
        self.policies = self.make_policies()  # from the settings alone: a bad one is refused at construction
        for policy in self.policies:  # a policy that needs another transformers class (frozen features: the encoder)
            if policy.model_class is not None:
                self.model_class = policy.model_class
        self.optim = as_optim_config(optim)
        self.backbone = None
        self.tokenizer = None
        self.data_facts: Optional[DataFacts] = None  # from data.contract.connect

    # Construction builds nothing: a subclass sets its state after ``super().__init__``.  The backbone is
    # built by ``configure_model``, which Lightning calls in every fit/validate/test/predict (inside the strategy's
    # init context: FSDP, DeepSpeed stage 3) and in ``load_from_checkpoint``; code that needs the model without a
    # trainer (export, analysis, tests) calls ``build()``.

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, map_location=None, hparams_file=None, strict=None,
                             weights_only: Optional[bool] = None, **kwargs):
        """Lightning's loader, made safe: a checkpoint file is checked first (intact; plain data unless
        ``weights_only=False``, for files you made yourself), unpickled weights-only, and its ptm_app record checked
        (``checkpoint_io.reading.check_record``: tokenizer file names, module class; a class that moved since is named as it is
        today, ``checkpoint_io.reading.moved_class_path``).  ``weights_only`` defaults to the running command's
        ``--trust_checkpoint`` (``checkpoint_io.reading.trusting``): weights-only unless it was given."""
        weights_only = not trusted() if weights_only is None else weights_only
        with trusting(not weights_only):
            if isinstance(checkpoint_path, (str, os.PathLike)):
                checkpoint_path = checkpoint_file(checkpoint_path)
                if checkpoint_path.is_file():  # before Lightning reads its class names (a BytesIO was read checked)
                    ckpt = load_file(checkpoint_path, mmap=True)
                    check_record(ckpt, checkpoint_path, own=cls)
                    hparams = ckpt.get("hyper_parameters") or {}
                    kwargs = {**moved_class_path(hparams), **cls.upgraded_arguments(hparams), **kwargs}
            return super().load_from_checkpoint(checkpoint_path, map_location, hparams_file, strict,
                                                weights_only=weights_only, **kwargs)

    @classmethod
    def upgrade_checkpoint(cls, hparams: dict, state_dict: Optional[dict] = None) -> dict:
        """Map what an earlier version of this class wrote onto today's names: returns the hyper-parameters (renamed
        arguments) and renames ``state_dict`` keys in place.  Nothing was renamed here; a subclass maps its own
        (``on_load_checkpoint`` renames the weights, ``load_from_checkpoint`` and a resumed run the arguments)."""
        return hparams

    @classmethod
    def upgraded_arguments(cls, hparams: dict) -> dict:
        """The arguments ``upgrade_checkpoint`` added or changed (given to the constructor over the stored ones;
        the renamed-away ones are not arguments any more, so Lightning leaves them out)."""
        new = cls.upgrade_checkpoint(dict(hparams))
        return {k: v for k, v in new.items() if k not in hparams or hparams[k] is not v}

    # -- building -----------------------------------------------------------------------------
    def build(self) -> "PtmModule":
        """Build the model now, as a fit's ``configure_model`` does (idempotent; returns the module): for code that
        needs it without a trainer.  Without connected data the settings must name everything (``can_build``)."""
        if self.backbone is None and self.data_facts is None and self.tokenizer is None and not self.can_build():
            raise PtmError(f"{type(self).__name__}: the model cannot be built without its data (a from-scratch "
                           f"vocabulary, or the label set); connect the data first (data.contract.connect) "
                           f"or give backbone / labels")
        self.configure_model()
        return self

    def can_build(self) -> bool:
        """True when the backbone can be built without the data module (pretrained, or a full config)."""
        cfg = self.hparams.backbone_config or {}
        return bool(self.hparams.backbone) or "vocab_size" in cfg or any(p.builds for p in self.policies)

    def config_updates(self) -> dict[str, Any]:
        """Config values taken from the data (vocabulary size, special ids ...) for a from-scratch build."""
        tok = self.tokenizer
        if tok is None or self.hparams.backbone:
            return {}
        updates = {"vocab_size": len(tok), "pad_token_id": tok.pad_token_id}
        for name in ("bos_token_id", "eos_token_id"):
            if getattr(tok, name, None) is not None:
                updates[name] = getattr(tok, name)
        return {k: v for k, v in updates.items() if k not in (self.hparams.backbone_config or {})}

    # -- the data contract (data.contract.connect) ---------------------------------------------------
    def connect_data(self, facts: DataFacts) -> None:
        """Take the data's facts: tokenizer, labels, lengths ... (asked for when the model is built)."""
        self.data_facts = facts

    def hooks(self) -> ModelHooks:
        """What the DataModule takes from this module: its collator factory and example format."""
        return ModelHooks(collator=getattr(self, "make_collator", None),
                          example_format=getattr(self, "example_format", frozenset()),
                          static_copies=getattr(self, "static_copies", None),
                          task_collator=getattr(self, "task_collator", None))

    def configure_model(self) -> None:
        """Build the backbone once, then run every policy (each call: ``init_from`` waits for the fit's call)."""
        fresh = self.backbone is None
        fitting = self._trainer is not None and self._trainer.state.fn == TrainerFn.FITTING
        if fresh:
            facts = self.data_facts
            if facts is not None and self.tokenizer is None:
                self.tokenizer = facts.tokenizer()
            built = next((b for b in (p.build(self, fitting) for p in self.policies if p.builds) if b is not None),
                         None)  # a policy's own backbone (BERT-of-Theseus's successor)
            self.backbone = built if built is not None else self.build_model()
            self.backbone.train(self.training)  # from_pretrained returns eval mode: dropout would stay off
            if self.hparams.get("gradient_checkpointing"):
                enable_activation_checkpointing(self.backbone)
        for policy in self.policies:
            policy.apply(self, fresh, fitting)
        if fresh and self.data_facts is not None:
            self.check_lengths(self.data_facts)

    def make_policies(self) -> list:
        """This module's backbone policies, from ``self.hparams`` alone (a pure function of the settings, called by
        ``__init__``: it must read no other state); none here."""
        return []

    @property
    def backbone_runs_without_grad(self) -> bool:
        """A policy runs the backbone without gradients (frozen features): no backward pass through it."""
        return any(policy.backbone_without_grad for policy in self.policies)

    def train(self, mode: bool = True):
        """``nn.Module.train``, then each policy's ``train_mode`` (a frozen backbone stays in eval mode)."""
        super().train(mode)
        for policy in getattr(self, "policies", ()):
            policy.train_mode(self, mode)
        return self

    @property
    def delta(self):
        """The delta-tuning spec (``backbones.delta.DeltaSpec``) of a module that takes ``delta``, else None."""
        return as_delta_spec(self.hparams.get("delta"))

    def policy(self, kind: type):
        """This module's policy of class ``kind`` (``adaptation.policies``), or None."""
        return next((p for p in self.policies if isinstance(p, kind)), None)

    def add_penalties(self, loss: torch.Tensor, batch_size: int) -> torch.Tensor:
        """The training loss plus each policy's penalty term (logged as ``train/<name>``)."""
        for policy in self.policies:
            term = policy.penalty(self)
            if term is not None:
                self.log(f"train/{term[0]}", term[1], batch_size=max(batch_size, 1))
                loss = loss + term[1]
        return loss

    def build_model(self):
        """The transformers model of ``model_class``; override to assemble one differently (e.g. BERT2BERT)."""
        return build_backbone(self.model_class, self.hparams.backbone, self.hparams.backbone_config,
                              **self.config_updates())

    def setup(self, stage: str) -> None:
        if self.data_facts is not None:
            self.tokenizer = self.data_facts.tokenizer()
            if self.backbone is not None:
                self.check_lengths(self.data_facts)

    def check_lengths(self, facts: DataFacts) -> None:
        """Refuse a data max_length the backbone's position embeddings cannot hold."""
        limit, wanted = max_positions(self.backbone), facts.max_length
        virtual = self.virtual_positions()
        if limit is not None and wanted is not None and wanted + virtual > limit:
            what = f"data.max_length={wanted}" + (f" + {virtual} virtual tokens" if virtual else "")
            raise PtmError(f"{what} is longer than the backbone allows ({limit} positions); "
                           f"set data.init_args.max_length <= {limit - virtual}")

    def virtual_positions(self) -> int:
        """Positions taken before the input by trainable virtual tokens (a policy's soft prompt)."""
        return sum(policy.virtual_positions() for policy in self.policies)

    @property
    def run_seed(self) -> int:
        """The run's seed (``seed_everything``, which Lightning keeps in ``PL_GLOBAL_SEED`` for every process of the
        run, and sets again from the config on a resume); 0 when none was set.  Model-side draws (ELECTRA's
        replacements) are seeded from it and the batch's keys."""
        return int(os.environ.get("PL_GLOBAL_SEED", 0))

    # -- optimisation -------------------------------------------------------------------------
    clips_without_unscaling = True  # configure_gradient_clipping below: the fused AdamW may clip under bf16-mixed

    def configure_optimizers(self):
        return build_optimizer(self, self.optim, self.trainer.estimated_stepping_batches)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Lightning's clipping, except under ``bf16-mixed`` with the fused AdamW: Lightning's mixed-precision plugin
        refuses to clip for any optimizer that unscales gradients inside its step (the fused ones), a rule for fp16's
        loss scaling.  bf16 has no loss scale (no ``GradScaler``), so the gradients are clipped as in full precision
        (``Precision.clip_gradients``: ``clip_grad_norm_`` / ``clip_grad_value_`` over the optimizer's parameters)."""
        from lightning.fabric.plugins.precision.amp import _optimizer_handles_unscaling
        from lightning.pytorch.plugins.precision import MixedPrecision, Precision

        plugin = self.trainer.precision_plugin
        if (type(plugin) is MixedPrecision and plugin.scaler is None and _optimizer_handles_unscaling(optimizer)
                and gradient_clip_val):
            from lightning.pytorch.utilities import GradClipAlgorithmType

            algorithm = GradClipAlgorithmType(gradient_clip_algorithm or GradClipAlgorithmType.NORM)
            Precision.clip_gradients(plugin, optimizer, gradient_clip_val, algorithm)
            return
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                            gradient_clip_algorithm=gradient_clip_algorithm)

    @property
    def loss_on_progress_bar(self) -> bool:
        """Log ``train/loss`` to the progress bar every step: not on a GPU.  Lightning turns every progress-bar value
        into a Python number after each batch (``.item()``), which on a GPU waits for all the kernels queued so far:
        one host sync a step, and the GPU idles while the next step is launched.  There ``ThroughputMonitor`` puts
        the loss on the bar at its logging steps instead (``log_every_n_steps``), where it syncs once anyway."""
        return self.device.type != "cuda"

    def style(self) -> str:
        """What kind of run this is, for results tables (``summary.json``'s ``style``): a policy's, or the module's."""
        return next((s for s in (p.style() for p in self.policies) if s), None) or self.default_style()

    def default_style(self) -> str:
        return type(self).__name__.removesuffix("Module")

    def log_train_losses(self, loss: torch.Tensor, parts: dict[str, torch.Tensor], batch_size: int) -> torch.Tensor:
        """Log the total training loss (on the progress bar: ``loss_on_progress_bar``) and each of ``parts`` as
        ``train/<name>``."""
        self.log("train/loss", loss, prog_bar=self.loss_on_progress_bar, batch_size=max(batch_size, 1))
        for name, value in parts.items():
            self.log(f"train/{name}", value, batch_size=max(batch_size, 1))
        return loss

    def model_inputs(self, batch: dict) -> dict:
        keep = ("input_ids", "attention_mask", "token_type_ids", "inputs_embeds")  # embeddings: FreeLB's perturbed
        inputs = {k: batch[k] for k in keep if k in batch}
        if "document_ids" in batch:  # packed documents: block-diagonal attention, position ids per document
            from ptm_app.backbones.attention import packed_document_inputs

            inputs.update(packed_document_inputs(self.backbone, batch["attention_mask"], batch["document_ids"]))
        return inputs

    # -- self-contained checkpoints -------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        hparams = dict(checkpoint.get("hyper_parameters", {}))
        hparams["optim"] = asdict(self.optim)
        hparams["backbone"] = None  # rebuild from the resolved config: no files needed at load time
        hparams["backbone_config"] = self.backbone.config.to_dict()
        attention = (self.hparams.backbone_config or {}).get("attn_implementation")
        if attention:  # transformers leaves it out of to_dict(); a reload must build the same kernel
            hparams["backbone_config"]["attn_implementation"] = attention
        checkpoint["hyper_parameters"] = hparams
        checkpoint[CKPT_KEY] = {
            "model_class": self.model_class,
            "module": f"{own_class(self).__module__}.{own_class(self).__qualname__}",
            "backbone_source": self.hparams.backbone,
            "tokenizer": tokenizer_files(self.tokenizer) if self.tokenizer is not None else {},
        }
        for policy in self.policies:
            policy.save(self, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        check_record(checkpoint, "the checkpoint", own=own_class(self))  # its tokenizer is used or not
        upgrade_record(checkpoint.get(CKPT_KEY) or {})  # keys renamed since it was written (a policy reads it)
        files = checkpoint.get(CKPT_KEY, {}).get("tokenizer")
        if files and self.tokenizer is None:
            self.tokenizer = tokenizer_from_files(files)
        for policy in self.policies:
            policy.load(self, checkpoint)


def enable_activation_checkpointing(model) -> None:
    """Gradient (activation) checkpointing (Chen et al. 2016, "Training deep nets with sublinear memory cost"):
    each transformer block keeps only its inputs and recomputes its activations in the backward pass, so
    activation memory grows with the number of blocks, not with their internals, for about one more forward pass.
    transformers runs ``torch.utils.checkpoint`` non-reentrant, which needs no input that requires grad: frozen
    embeddings (LoRA, adapters, ``init_from.freeze``) work as they are."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise PtmError(f"gradient_checkpointing: {type(model).__name__} does not support it; "
                       f"set model.init_args.gradient_checkpointing: false")
    enable = getattr(model, "activation_checkpointing_enable", None)  # 5.23 deprecates gradient_checkpointing_enable
    (enable or model.gradient_checkpointing_enable)()


def own_class(module: torch.nn.Module) -> type:
    """The module's own class: FSDP2's ``fully_shard`` swaps in a generated ``FSDP<Name>`` subclass."""
    return next(cls for cls in type(module).__mro__ if not cls.__module__.startswith("torch."))


def tokenizer_files(tokenizer) -> dict[str, str]:
    """The tokenizer's ``save_pretrained`` files as text (kept inside checkpoints)."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        return {p.name: p.read_text(encoding="utf-8") for p in Path(tmp).iterdir() if p.is_file()}


def tokenizer_from_files(files: dict[str, str], source: Any = "the checkpoint"):
    """The tokenizer of a checkpoint's files (``checkpoint_io.reading.write_tokenizer_files``: allowed names only, into a
    temporary directory; no code of its own)."""
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        write_tokenizer_files(files, tmp, source)
        try:
            return AutoTokenizer.from_pretrained(tmp, trust_remote_code=False)
        except (OSError, ValueError) as exc:
            reason = " ".join(str(exc).split())[:200]
            raise PtmError(f"{source}: its tokenizer files do not load ({reason}); use another checkpoint") from None


def weighted_mean_update(metric, value: torch.Tensor, weight: int | torch.Tensor) -> None:
    metric.update(value.detach().float(), weight=torch.as_tensor(weight, dtype=torch.float32))
