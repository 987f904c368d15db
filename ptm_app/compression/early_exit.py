"""Early exit: a classifier (an "off-ramp") after every layer of a BERT-style classifier, and inference that stops
at the first layer confident enough.

* DeeBERT (Xin et al. 2020 §3): two-stage training (fine-tune the backbone and the final classifier; then, the
  backbone frozen, train the off-ramps on the sum of their losses); exit at the first layer whose prediction's
  entropy is under a threshold S.
* PABEE (Zhou et al. 2020 §3): every classifier trained jointly on the weighted average ``Σ_j j·L_j / Σ_j j``; exit
  once the prediction has stayed unchanged for ``patience`` consecutive layers (their counter: +1 when layer i
  agrees with layer i−1, reset otherwise; stop when it reaches the patience).

Evaluation runs all layers once and applies every criterion to the same per-layer predictions, so each
threshold / patience is reported with its accuracy, average exit layer and layer speed-up ``L / mean exit layer``
(the ratio PABEE reports; the embedding and exit heads are not counted).  Prediction (``predict_exit``) really
stops: ``exit_forward`` watches each block's output and leaves the model once every example of the batch has exited
(at batch size 1, after exactly its exit layer's blocks).
"""
from __future__ import annotations

from typing import Literal, Optional

import torch
from torch import nn

from ptm_app.adaptation.classification import SequenceClassificationModule
from ptm_app.compression.students import layer_list_path
from ptm_app.errors import PtmError
from ptm_app.training.optim import OptimConfig


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """The entropy (nats) of ``softmax(logits)`` over the last dimension."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return -(log_p.exp() * log_p).sum(-1)


def entropy_exit_layers(layer_logits: torch.Tensor, threshold: float) -> torch.Tensor:
    """DeeBERT: per example of ``layer_logits`` [N, L, C], the first layer (1..L) whose entropy is under
    ``threshold``; L when none is."""
    confident = entropy(layer_logits) < threshold  # [N, L]
    confident[:, -1] = True
    return confident.float().argmax(-1) + 1


def patience_exit_layers(layer_logits: torch.Tensor, patience: int) -> torch.Tensor:
    """PABEE: per example, the first layer i (1..L) at which the prediction has been unchanged ``patience`` times in
    a row (layers i−patience … i agree); L when that never happens."""
    predictions = layer_logits.argmax(-1)  # [N, L]
    n, layers = predictions.shape
    exits = torch.full((n,), layers, dtype=torch.long)
    counter = torch.zeros(n, dtype=torch.long)
    done = torch.zeros(n, dtype=torch.bool)
    for i in range(1, layers):
        same = predictions[:, i] == predictions[:, i - 1]
        counter = torch.where(same, counter + 1, torch.zeros_like(counter))
        stop = ~done & (counter >= patience)
        exits[stop] = i + 1
        done |= stop
    return exits


def pabee_loss(layer_losses: list[torch.Tensor]) -> torch.Tensor:
    """PABEE's weighted average ``Σ_j j·L_j / Σ_j j`` (j = 1..L): deeper classifiers weigh more."""
    weights = range(1, len(layer_losses) + 1)
    return sum(j * loss for j, loss in zip(weights, layer_losses)) / sum(weights)


def parse_exit_rule(rule: Optional[str], method: str, thresholds, patiences) -> tuple[str, float]:
    """``entropy:S`` / ``patience:t`` as ``(kind, value)``; unset: the method's own rule, first value."""
    if rule is None:
        if method == "deebert" and thresholds:
            return "entropy", float(thresholds[0])
        return ("patience", int(patiences[0])) if patiences else ("entropy", float(thresholds[0]))
    kind, _, value = str(rule).partition(":")
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if kind not in ("entropy", "patience") or number < 0 or (kind == "patience" and number != int(number)):
        raise PtmError(f"predict_exit {rule!r}: write entropy:S (S >= 0, e.g. entropy:0.1) or patience:t "
                       f"(a whole number of layers, e.g. patience:2)")
    return kind, (int(number) if kind == "patience" else number)


class _AllExited(Exception):
    """Raised from a block's forward hook once every example has exited: the rest of the model does not run."""


def exit_predictions(layer_logits: torch.Tensor, exits: torch.Tensor) -> torch.Tensor:
    """Each example's logits at its exit layer (1..L): [N, C]."""
    return layer_logits[torch.arange(len(exits)), exits - 1]


class OffRamp(nn.Module):
    """DeeBERT's off-ramp: its own pooler (tanh dense on the [CLS] state) and a dropout + linear classifier."""

    def __init__(self, hidden: int, labels: int, dropout: float):
        super().__init__()
        self.pooler = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, labels)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(torch.tanh(self.pooler(hidden_states[:, 0]))))


class EarlyExitModule(SequenceClassificationModule):
    """A BERT-style classifier with an off-ramp after each of its first L−1 layers (layer L is its own head).

    Logs the final layer's ``val/acc`` … as usual and, for every entropy threshold S and patience t,
    ``val/entropy_S/acc``, ``val/entropy_S/exit_layer``, ``val/entropy_S/speedup`` and ``val/patience_t/...``
    (and ``test/...``); ``summary.json`` gets the table as ``early_exit``.

    Args:
        method: ``deebert`` (two stages: ``final_steps`` optimiser steps of ordinary fine-tuning, then only the
            off-ramps train, the backbone and final head frozen) or ``pabee`` (every classifier jointly, weighted).
        final_steps: DeeBERT's first stage; 0 when the backbone is already fine-tuned (a run directory).
        entropy_thresholds: the S values to report (DeeBERT's criterion).
        patiences: the t values to report (PABEE's criterion).
        predict_exit: the rule ``predict`` exits by, ``entropy:S`` or ``patience:t`` (default: the method's own with
            its first threshold / patience); ``predictions.jsonl`` gets each example's ``exit_layer``.
    """

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 labels: Optional[list[str]] = None, optim: OptimConfig = OptimConfig(lr=3e-5),
                 method: Literal["deebert", "pabee"] = "pabee", final_steps: int = 0,
                 entropy_thresholds: list[float] = (0.1, 0.3, 0.6), patiences: list[int] = (1, 2, 3),
                 positive_label: Optional[str] = None, predict_exit: Optional[str] = None):
        if method not in ("deebert", "pabee"):
            raise PtmError(f"early exit method {method!r}: use deebert or pabee")
        if final_steps and method != "deebert":
            raise PtmError("final_steps is DeeBERT's first training stage; set method: deebert or final_steps: 0")
        if not entropy_thresholds and not patiences:
            raise PtmError("early exit: give entropy_thresholds or patiences to report")
        if any(t < 1 for t in patiences):
            raise PtmError(f"patiences {list(patiences)}: a patience is a number of layers, at least 1")
        self.exit_rule = parse_exit_rule(predict_exit, method, entropy_thresholds, patiences)
        self.exits = None
        self.collected: dict[str, list] = {}
        super().__init__(backbone, backbone_config, labels, optim, positive_label=positive_label)

    def default_style(self) -> str:
        return f"early exit ({self.hparams.method})"

    def configure_model(self) -> None:
        super().configure_model()
        if self.exits is None:
            model = self.backbone
            if getattr(model.base_model, "pooler", None) is None or not hasattr(model, "classifier"):
                raise PtmError(f"early exit needs a BERT-style classifier (a pooler and a classifier on it); "
                               f"{type(model).__name__} has none: use a bert/minilm backbone")
            cfg = model.config
            dropout = getattr(cfg, "classifier_dropout", None) or cfg.hidden_dropout_prob
            self.exits = nn.ModuleList(OffRamp(cfg.hidden_size, cfg.num_labels, dropout)
                                       for _ in range(cfg.num_hidden_layers - 1))
            with torch.no_grad():  # each off-ramp's pooler starts as the model's
                for ramp in self.exits:
                    ramp.pooler.load_state_dict(model.base_model.pooler.dense.state_dict())
            if self.hparams.method == "deebert" and not self.hparams.final_steps:
                model.requires_grad_(False)  # only DeeBERT's second stage: the off-ramps alone train

    # -- the per-layer classifiers -----------------------------------------------------------------------------
    def layer_logits(self, batch: dict, backbone_grad: bool = True) -> list[torch.Tensor]:
        """Logits of the classifier after every layer 1..L (layer L: the model's own pooler and head)."""
        model = self.backbone
        with torch.set_grad_enabled(backbone_grad and torch.is_grad_enabled()):
            out = model.base_model(**self.model_inputs(batch), output_hidden_states=True)
            final = model.classifier(model.dropout(out.pooler_output))
        hidden = out.hidden_states
        return [ramp(hidden[i + 1]) for i, ramp in enumerate(self.exits)] + [final]

    def in_final_stage(self) -> bool:
        """DeeBERT's first stage (the ordinary fine-tuning of backbone and final classifier) is running."""
        return self.hparams.method == "deebert" and self.global_step < self.hparams.final_steps

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        n = self.batch_size(batch)
        if self.in_final_stage():
            loss = self.kind.loss(self(batch), batch)
            self.log("train/loss", loss, prog_bar=True, batch_size=n)
            return loss
        deebert = self.hparams.method == "deebert"  # second stage: the backbone and final head frozen
        logits = self.layer_logits(batch, backbone_grad=not deebert)
        layer_losses = [self.kind.loss(x, batch) for x in (logits[:-1] if deebert else logits)]
        loss = sum(layer_losses) if deebert else pabee_loss(layer_losses)
        parts = {f"layer_{i + 1}": value for i, value in enumerate(layer_losses)}
        return self.log_train_losses(loss, parts, n)

    # -- evaluation: every criterion on the same per-layer predictions ------------------------------------------
    def _eval_step(self, stage: str, batch: dict):
        logits = self.layer_logits(batch)
        out = logits[-1]
        self.log(f"{stage}/loss", self.kind.loss(out, batch), batch_size=self.batch_size(batch))
        self.kind.update(self.stage_metrics[stage], out, batch, self.eval_settings())
        self.collected.setdefault(stage, []).append((torch.stack(logits, 1).detach().float().cpu(),
                                                     batch["labels"].detach().cpu()))
        return out

    def exit_table(self, layer_logits: torch.Tensor, labels: torch.Tensor) -> list[dict]:
        """One row per criterion: accuracy at the exit, mean exit layer, layer speed-up."""
        layers = layer_logits.shape[1]
        criteria = [("entropy", s, entropy_exit_layers(layer_logits, s)) for s in self.hparams.entropy_thresholds]
        criteria += [("patience", t, patience_exit_layers(layer_logits, t)) for t in self.hparams.patiences]
        rows = []
        for kind, value, exits in criteria:
            predictions = exit_predictions(layer_logits, exits).argmax(-1)
            mean_exit = exits.float().mean().item()
            rows.append({"criterion": kind, "value": value, "acc": (predictions == labels).float().mean().item(),
                         "exit_layer": mean_exit, "speedup": layers / mean_exit})
        return rows

    def _log_metrics(self, stage: str) -> None:
        super()._log_metrics(stage)
        collected = self.collected.pop(stage, [])
        if not collected:
            return
        layer_logits = torch.cat([x for x, _ in collected])
        labels = torch.cat([y for _, y in collected])
        table = self.exit_table(layer_logits, labels)
        for row in table:
            name = f"{stage}/{row['criterion']}_{row['value']:g}"
            self.log_dict({f"{name}/{k}": float(row[k]) for k in ("acc", "exit_layer", "speedup")})
        object.__setattr__(self, "latest_exit_table", {"stage": stage, "layers": layer_logits.shape[1],
                                                       "examples": len(labels), "rows": table})

    # -- inference that stops ------------------------------------------------------------------------------------
    def exit_forward(self, batch: dict, rule: Optional[tuple[str, float]] = None):
        """``(logits at each example's exit [N, C], exit layers [N], blocks run)``: runs the blocks one by one (hooks
        on the block list) and stops the model as soon as every example has exited under ``rule``."""
        kind, value = rule or self.exit_rule
        model = self.backbone
        blocks = model.get_submodule(layer_list_path(model))
        layers, n = len(blocks), len(batch["input_ids"])
        state = {"run": 0, "exits": torch.full((n,), layers, dtype=torch.long),
                 "done": torch.zeros(n, dtype=torch.bool), "counter": torch.zeros(n, dtype=torch.long),
                 "previous": None, "logits": None}

        def watch(index: int):
            def hook(_module, _inputs, output):
                state["run"] = index + 1
                if index + 1 == layers:
                    return None  # the last layer: the model's own head decides the rest
                logits = self.exits[index](output[0] if isinstance(output, tuple) else output).float()
                if state["logits"] is None:
                    state["logits"] = torch.zeros_like(logits)
                predictions = logits.argmax(-1).cpu()
                if kind == "entropy":
                    stop = entropy(logits).cpu() < value
                else:
                    if state["previous"] is not None:
                        same = predictions == state["previous"]
                        state["counter"] = torch.where(same, state["counter"] + 1, torch.zeros_like(same, dtype=torch.long))
                    state["previous"] = predictions
                    stop = state["counter"] >= value
                stop &= ~state["done"]
                state["exits"][stop] = index + 1
                state["logits"][stop.to(logits.device)] = logits[stop.to(logits.device)]
                state["done"] |= stop
                if bool(state["done"].all()):
                    raise _AllExited
                return None
            return hook

        handles = [block.register_forward_hook(watch(i)) for i, block in enumerate(blocks)]
        try:
            final = model(**self.model_inputs(batch)).logits.float()
            rest = ~state["done"]
            if state["logits"] is None:
                state["logits"] = torch.zeros_like(final)
            state["logits"][rest.to(final.device)] = final[rest.to(final.device)]
        except _AllExited:
            pass
        finally:
            for handle in handles:
                handle.remove()
        return state["logits"], state["exits"], state["run"]

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        """Every label's probability at each example's exit under ``predict_exit``, and its ``exit_layer``."""
        logits, exits, _ = self.exit_forward(batch)
        return {"keys": batch["keys"], "probs": torch.softmax(logits, dim=-1).cpu(),
                "row_extras": [{"exit_layer": int(e)} for e in exits]}

    def summary_facts(self) -> dict:
        table = getattr(self, "latest_exit_table", None)
        return {"early_exit": table} if table else {}
