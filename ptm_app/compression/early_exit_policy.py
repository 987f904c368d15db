"""Early exit as a policy of a classifier or a tagger (``model.init_args.early_exit: {method: ..., ...}``): an
off-ramp after each of the backbone's first L−1 layers (layer L is the module's own head), trained as its paper
says, and inference that stops at the first layer confident enough.

* DeeBERT (Xin et al. 2020 §3): two-stage training (fine-tune the backbone and the final classifier; then, the
  backbone frozen, train the off-ramps on the sum of their losses); exit at the first layer whose prediction's
  entropy is under a threshold S.
* PABEE (Zhou et al. 2020 §3): every classifier trained jointly on the weighted average ``Σ_j j·L_j / Σ_j j``; exit
  once the prediction has stayed unchanged for ``patience`` consecutive layers (their counter: +1 when layer i
  agrees with layer i−1, reset otherwise; stop when it reaches the patience).

Both papers classify sequences: there an off-ramp is a pooler and a classifier on the [CLS] state (``OffRamp``).
For tagging (the ``token`` kind; ptm_app's extension, in neither paper) an off-ramp is a dropout + linear tag layer
on every token (``TokenRamp``, the shape of BERT's own tagging head), and a *sentence* exits as one unit: under the
entropy rule once the *largest* entropy over its scored tokens (each word's first sub-token) is under S, so every
tag it keeps is that confident and S = 0 never exits early; under the patience rule once its whole tag sequence has
stayed unchanged ``patience`` times.  A tagger's accuracy at the exits is token accuracy over the labelled tokens,
each read at its sentence's exit layer.  Other kinds are refused in one line (``EXIT_KINDS``).

Evaluation runs all layers once and applies every criterion to the same per-layer predictions, so each
threshold / patience is reported with its accuracy, average exit layer and layer speed-up ``L / mean exit layer``
(the ratio PABEE reports; the embedding and exit heads are not counted).  Prediction (``exit_forward``) really
stops: it watches each block's output and leaves the model once every example of the batch has exited (at batch
size 1, after exactly its exit layer's blocks).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Literal, Optional

import torch
from torch import nn

from ptm_app.compression.students import layer_list_path
from ptm_app.errors import PtmError
from ptm_app.training.policy import BackbonePolicy

# the kinds an off-ramp can serve, and why the others cannot (each refusal is one line)
EXIT_KINDS = ("sequence", "token")
NO_EXIT = {
    "qa": "a QA answer is a span chosen from start and end scores over the whole window, so a layer has no label "
          "to be confident in or to agree on (DeeBERT and PABEE classify)",
    "regression": "a predicted value has no entropy and no class to agree on",
    "multilabel": "a label set has no single prediction whose entropy or agreement DeeBERT / PABEE define",
}


# -- the exit rules on per-layer predictions ---------------------------------------------------------------------
def entropy(logits: torch.Tensor) -> torch.Tensor:
    """The entropy (nats) of ``softmax(logits)`` over the last dimension."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return -(log_p.exp() * log_p).sum(-1)


def first_under(scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """Per unit (row of ``scores`` [N, L]), the first layer (1..L) whose score is under ``threshold``; L if none."""
    confident = scores < threshold
    confident[:, -1] = True
    return confident.float().argmax(-1) + 1


def patience_exits(same: torch.Tensor, patience: int) -> torch.Tensor:
    """PABEE's counter over ``same`` [N, L] (``same[:, i]``: layer i+1 predicts what layer i did; column 0 unused):
    per unit, the first layer at which the prediction has been unchanged ``patience`` times in a row; L if never."""
    n, layers = same.shape
    exits = torch.full((n,), layers, dtype=torch.long)
    counter = torch.zeros(n, dtype=torch.long)
    done = torch.zeros(n, dtype=torch.bool)
    for i in range(1, layers):
        counter = torch.where(same[:, i], counter + 1, torch.zeros_like(counter))
        stop = ~done & (counter >= patience)
        exits[stop] = i + 1
        done |= stop
    return exits


def entropy_exit_layers(layer_logits: torch.Tensor, threshold: float) -> torch.Tensor:
    """DeeBERT: per example of ``layer_logits`` [N, L, C], the first layer (1..L) whose entropy is under
    ``threshold``; L when none is."""
    return first_under(entropy(layer_logits), threshold)


def patience_exit_layers(layer_logits: torch.Tensor, patience: int) -> torch.Tensor:
    """PABEE: per example, the first layer i (1..L) at which the prediction has been unchanged ``patience`` times in
    a row (layers i−patience … i agree); L when that never happens."""
    predictions = layer_logits.argmax(-1)  # [N, L]
    same = torch.zeros_like(predictions, dtype=torch.bool)
    same[:, 1:] = predictions[:, 1:] == predictions[:, :-1]
    return patience_exits(same, patience)


def exit_predictions(layer_logits: torch.Tensor, exits: torch.Tensor) -> torch.Tensor:
    """Each example's logits at its exit layer (1..L): [N, C] (or [N, T, C] per token)."""
    return layer_logits[torch.arange(len(exits)), exits - 1]


def pabee_loss(layer_losses: list[torch.Tensor]) -> torch.Tensor:
    """PABEE's weighted average ``Σ_j j·L_j / Σ_j j`` (j = 1..L): deeper classifiers weigh more."""
    weights = range(1, len(layer_losses) + 1)
    return sum(j * loss for j, loss in zip(weights, layer_losses)) / sum(weights)


def unit_facts(layer_logits: torch.Tensor, labels: torch.Tensor, scored: Optional[torch.Tensor] = None) -> dict:
    """What the exit table needs per unit (an example, or a tagged sentence) and layer, from ``layer_logits``
    [N, L, C] with ``labels`` [N] or [N, L, T, C] with ``labels`` [N, T] (-100: unlabelled) and ``scored`` [N, T]
    (the tokens the rules read; default the labelled ones): ``score`` [N, L] (the entropy, the largest over the
    scored tokens), ``same`` [N, L] (the prediction equals the layer below's), ``correct`` [N, L] and ``count`` [N]
    (labelled predictions right, and made)."""
    predictions = layer_logits.argmax(-1)
    same = torch.zeros(predictions.shape[:2], dtype=torch.bool)
    if layer_logits.dim() == 3:
        same[:, 1:] = predictions[:, 1:] == predictions[:, :-1]
        correct = (predictions == labels[:, None]).float()
        return {"score": entropy(layer_logits), "same": same, "correct": correct, "count": torch.ones(len(labels))}
    labelled = labels != -100
    scored = labelled if scored is None else scored
    score = (entropy(layer_logits) * scored[:, None]).amax(-1)  # entropies are >= 0: unscored tokens add nothing
    agree = (predictions[:, 1:] == predictions[:, :-1]) | ~scored[:, None]
    same[:, 1:] = agree.all(-1)
    correct = ((predictions == labels[:, None]) & labelled[:, None]).sum(-1).float()
    return {"score": score, "same": same, "correct": correct, "count": labelled.sum(-1).float()}


def exit_table(facts: dict, thresholds, patiences) -> list[dict]:
    """One row per criterion: accuracy at the exits, mean exit layer, layer speed-up."""
    layers = facts["score"].shape[1]
    criteria = [("entropy", s, first_under(facts["score"], s)) for s in thresholds]
    criteria += [("patience", t, patience_exits(facts["same"], t)) for t in patiences]
    rows = []
    for kind, value, exits in criteria:
        right = facts["correct"][torch.arange(len(exits)), exits - 1].sum()
        mean_exit = exits.float().mean().item()
        rows.append({"criterion": kind, "value": value, "acc": (right / facts["count"].sum()).item(),
                     "exit_layer": mean_exit, "speedup": layers / mean_exit})
    return rows


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


# -- the off-ramps -------------------------------------------------------------------------------------------------
class OffRamp(nn.Module):
    """DeeBERT's off-ramp: its own pooler (tanh dense on the [CLS] state) and a dropout + linear classifier."""

    def __init__(self, hidden: int, labels: int, dropout: float):
        super().__init__()
        self.pooler = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, labels)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(torch.tanh(self.pooler(hidden_states[:, 0]))))


class TokenRamp(nn.Module):
    """A tagger's off-ramp: dropout + a linear tag layer on every token (BERT's tagging head, Devlin et al. §4.3)."""

    def __init__(self, hidden: int, labels: int, dropout: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, labels)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(hidden_states))


def build_ramps(module) -> nn.ModuleList:
    """The L−1 off-ramps for the module's kind: a pooled one per layer (its pooler starting as the model's) for
    sequences, a per-token one for tags; one line for a backbone without the parts they copy or read."""
    model = module.backbone
    cfg = model.config
    dropout = getattr(cfg, "classifier_dropout", None) or getattr(cfg, "hidden_dropout_prob", 0.1)
    if module.kind.name == "token":
        if not isinstance(getattr(cfg, "hidden_size", None), int) or not isinstance(cfg.num_hidden_layers, int):
            raise PtmError(f"early_exit reads every layer's hidden states; {type(model).__name__} has no "
                           f"hidden_size / num_hidden_layers: use a transformer encoder backbone")
        return nn.ModuleList(TokenRamp(cfg.hidden_size, cfg.num_labels, dropout)
                             for _ in range(cfg.num_hidden_layers - 1))
    if getattr(model.base_model, "pooler", None) is None or not hasattr(model, "classifier"):
        raise PtmError(f"early exit needs a BERT-style classifier (a pooler and a classifier on it); "
                       f"{type(model).__name__} has none: use a bert/minilm backbone")
    ramps = nn.ModuleList(OffRamp(cfg.hidden_size, cfg.num_labels, dropout) for _ in range(cfg.num_hidden_layers - 1))
    with torch.no_grad():  # each off-ramp's pooler starts as the model's
        for ramp in ramps:
            ramp.pooler.load_state_dict(model.base_model.pooler.dense.state_dict())
    return ramps


# -- the setting ---------------------------------------------------------------------------------------------------
@dataclass
class ExitSpec:
    """A task module's ``early_exit`` setting.

    Args:
        method: ``deebert`` (two stages: ``final_steps`` optimiser steps of ordinary fine-tuning, then only the
            off-ramps train, the backbone and final head frozen) or ``pabee`` (every classifier jointly, weighted).
        final_steps: DeeBERT's first stage; 0 when the backbone is already fine-tuned (a run directory).
        entropy_thresholds: the S values to report (DeeBERT's criterion).
        patiences: the t values to report (PABEE's criterion).
        predict_exit: the rule ``predict`` exits by, ``entropy:S`` or ``patience:t`` (default: the method's own with
            its first threshold / patience); each prediction row gets its ``exit_layer``.
    """

    method: Literal["deebert", "pabee"] = "pabee"
    final_steps: int = 0
    entropy_thresholds: list[float] = field(default_factory=lambda: [0.1, 0.3, 0.6])
    patiences: list[int] = field(default_factory=lambda: [1, 2, 3])
    predict_exit: Optional[str] = None

    def __post_init__(self):
        if self.method not in ("deebert", "pabee"):
            raise PtmError(f"early exit method {self.method!r}: use deebert or pabee")
        if self.final_steps and self.method != "deebert":
            raise PtmError("final_steps is DeeBERT's first training stage; set method: deebert or final_steps: 0")
        if not self.entropy_thresholds and not self.patiences:
            raise PtmError("early exit: give entropy_thresholds or patiences to report")
        if any(t < 1 for t in self.patiences):
            raise PtmError(f"patiences {list(self.patiences)}: a patience is a number of layers, at least 1")
        self.entropy_thresholds, self.patiences = list(self.entropy_thresholds), list(self.patiences)
        self.rule()  # a bad predict_exit is refused now

    def rule(self) -> tuple[str, float]:
        return parse_exit_rule(self.predict_exit, self.method, self.entropy_thresholds, self.patiences)


def as_exit_spec(value) -> Optional[ExitSpec]:
    if value is None or isinstance(value, ExitSpec):
        return value
    return ExitSpec(**(asdict(value) if is_dataclass(value) else value))


class _AllExited(Exception):
    """Raised from a block's forward hook once every example has exited: the rest of the model does not run."""


# -- the policy ----------------------------------------------------------------------------------------------------
class EarlyExit(BackbonePolicy):
    """Off-ramps (``module.exits``, a sub-module: trained, checkpointed, exported with the module's weights) after
    each of the backbone's first L−1 layers; their losses replace the task's (DeeBERT's second stage, PABEE's
    weighted sum); every validation / test logs ``<stage>/entropy_S/{acc,exit_layer,speedup}`` and
    ``<stage>/patience_t/...`` and ``summary.json`` gets the table as ``early_exit``; prediction stops at the exit.

    ``module.exit_rule`` (the ``(kind, value)`` prediction exits by) may be set to another rule (the compression
    report scores several)."""

    def __init__(self, spec: ExitSpec | dict, kind: str):
        self.spec = as_exit_spec(spec)
        if kind not in EXIT_KINDS:
            raise PtmError(f"early_exit: off-ramps classify per sequence or per token (kinds {', '.join(EXIT_KINDS)}); "
                           f"the {kind} kind cannot exit early: {NO_EXIT.get(kind, 'it is not one of them')}; "
                           f"remove model.init_args.early_exit")
        self.collected: dict[str, list[dict]] = {}
        self.latest: Optional[dict] = None
        self.evaluated: Optional[tuple[dict, list[torch.Tensor]]] = None  # (batch, its per-layer outputs)

    def style(self) -> str:
        return f"early exit ({self.spec.method})"

    def apply(self, module, fresh: bool, fitting: bool) -> None:
        if getattr(module, "exits", None) is None:
            module.exits = build_ramps(module)
            module.exit_rule = self.spec.rule()
            if self.spec.method == "deebert" and not self.spec.final_steps:
                module.backbone.requires_grad_(False)  # only DeeBERT's second stage: the off-ramps alone train

    # -- the per-layer outputs ---------------------------------------------------------------------------------
    def layer_logits(self, module, batch: dict, backbone_grad: bool = True) -> list[torch.Tensor]:
        """The kind's outputs after every layer 1..L (layer L: the module's own head)."""
        with torch.set_grad_enabled(backbone_grad and torch.is_grad_enabled()):
            out = module.backbone(**module.backbone_inputs(batch), output_hidden_states=True)
            final = module.outputs(out)
        hidden = out.hidden_states
        return [ramp(hidden[i + 1]) for i, ramp in enumerate(module.exits)] + [final]

    def forward(self, module, batch: dict) -> Optional[torch.Tensor]:
        """In evaluation, the module's outputs from the same backbone pass that gives every layer's (kept for
        ``eval_step``, so an evaluated batch runs the backbone once); in training, None (the module's own)."""
        if module.training:
            return None
        logits = self.layer_logits(module, batch)
        self.evaluated = (batch, logits)
        return logits[-1]

    def in_final_stage(self, module) -> bool:
        """DeeBERT's first stage (the ordinary fine-tuning of backbone and final classifier) is running."""
        return self.spec.method == "deebert" and module.global_step < self.spec.final_steps

    def training_loss(self, module, batch: dict) -> Optional[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
        if self.in_final_stage(module):
            return None  # the task's own loss
        deebert = self.spec.method == "deebert"  # second stage: the backbone and final head frozen
        logits = self.layer_logits(module, batch, backbone_grad=not deebert)
        layer_losses = [module.kind.loss(x, batch) for x in (logits[:-1] if deebert else logits)]
        loss = sum(layer_losses) if deebert else pabee_loss(layer_losses)
        return loss, {f"layer_{i + 1}": value for i, value in enumerate(layer_losses)}

    # -- evaluation: every criterion on the same per-layer predictions ------------------------------------------
    def eval_step(self, module, stage: str, batch: dict, outputs: Any) -> None:
        kept, self.evaluated = self.evaluated, None
        layers = kept[1] if kept is not None and kept[0] is batch else self.layer_logits(module, batch)
        logits = torch.stack(layers, 1).detach().float().cpu()
        labels = batch["labels"].detach().cpu()
        scored = scored_tokens(batch)
        self.collected.setdefault(stage, []).append(
            unit_facts(logits, labels, scored.cpu() if scored is not None else None))

    def epoch_end(self, module, stage: str) -> None:
        collected = self.collected.pop(stage, [])
        if stage == "train" or not collected:
            return
        facts = {k: torch.cat([c[k] for c in collected]) for k in collected[0]}
        table = exit_table(facts, self.spec.entropy_thresholds, self.spec.patiences)
        for row in table:
            name = f"{stage}/{row['criterion']}_{row['value']:g}"
            module.log_dict({f"{name}/{k}": float(row[k]) for k in ("acc", "exit_layer", "speedup")})
        self.latest = {"stage": stage, "layers": facts["score"].shape[1], "examples": len(facts["count"]),
                       "rows": table}

    def summary(self, module) -> dict:
        return {"early_exit": self.latest} if self.latest else {}

    # -- inference that stops ------------------------------------------------------------------------------------
    def exit_forward(self, module, batch: dict, rule: Optional[tuple[str, float]] = None):
        """``(outputs at each example's exit [N, C] or [N, T, C], exit layers [N], blocks run)``: runs the blocks
        one by one (hooks on the block list) and stops the model as soon as every example has exited under
        ``rule``."""
        kind, value = rule or module.exit_rule
        model = module.backbone
        blocks = model.get_submodule(layer_list_path(model))
        layers, n = len(blocks), len(batch["input_ids"])
        scored = scored_tokens(batch)
        state = {"run": 0, "exits": torch.full((n,), layers, dtype=torch.long),
                 "done": torch.zeros(n, dtype=torch.bool), "counter": torch.zeros(n, dtype=torch.long),
                 "previous": None, "logits": None}

        def watch(index: int):
            def hook(_module, _inputs, output):
                state["run"] = index + 1
                if index + 1 == layers:
                    return None  # the last layer: the model's own head decides the rest
                logits = module.exits[index](output[0] if isinstance(output, tuple) else output).float()
                if state["logits"] is None:
                    state["logits"] = torch.zeros_like(logits)
                predictions = logits.argmax(-1).cpu()
                if kind == "entropy":
                    scores = entropy(logits).cpu()
                    stop = (scores * scored.cpu()).amax(-1) < value if scores.dim() == 2 else scores < value
                else:
                    if state["previous"] is not None:
                        same = predictions == state["previous"]
                        if same.dim() == 2:
                            same = (same | ~scored.cpu()).all(-1)
                        state["counter"] = torch.where(same, state["counter"] + 1, torch.zeros_like(state["counter"]))
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
            final = module.outputs(model(**module.backbone_inputs(batch))).float()
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

    def predict_outputs(self, module, batch: dict) -> tuple[torch.Tensor, list[dict]]:
        logits, exits, _ = self.exit_forward(module, batch)
        return logits, [{"exit_layer": int(e)} for e in exits]

    # -- checkpoints -------------------------------------------------------------------------------------------
    def save(self, module, checkpoint: dict) -> None:
        hparams = checkpoint["hyper_parameters"]
        if "early_exit" in hparams:  # plain data (``EarlyExitModule`` keeps its flat settings)
            hparams["early_exit"] = asdict(self.spec)


def scored_tokens(batch: dict) -> Optional[torch.Tensor]:
    """A tagging batch's tokens the exit rules read: each word's first sub-token (``word_index >= 0``, also at
    prediction), else the labelled ones; None for a batch of sequences."""
    if "word_index" in batch:
        return batch["word_index"] >= 0
    labels = batch.get("labels")
    return labels != -100 if labels is not None and labels.dim() == 2 else None
