"""Where data and model meet: one explicit exchange instead of each reaching the other through the trainer
(litgpt's ``connect``).

``connect(model, datamodule)`` (called by ``training.trainer.PtmTrainer``'s fit/validate/test/predict, or by you before a plain
``Trainer`` run) hands

- the module the data's facts (``DataFacts``): its tokenizer (a pretrained one, or trained on the corpus once in
  ``prepare_data``), label set, task, lengths, languages, multitask task specs and the examples behind
  predictions; the facts that need prepared data are callables, answered when the module asks (in
  ``configure_model`` / ``setup``, after ``prepare_data``), so a multi-rank run builds nothing twice;
- the DataModule the module's needs (``ModelHooks``): its collator factory (the objective's corruption drawn
  per batch), the examples its targets need (NSP or SOP pairs, knowledge spans ...) and its per-task collators.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional


def _no_labels() -> None:
    return None


def _no_records(split: str) -> dict:
    raise KeyError(f"this data module keeps no example records (asked for {split!r})")


@dataclass(frozen=True)
class DataFacts:
    """What a module may know of its data (``LightningDataModule.facts()``)."""

    tokenizer: Callable[[], Any]
    max_length: Optional[int] = None
    max_source_length: Optional[int] = None  # seq2seq pairs
    max_target_length: Optional[int] = None
    task: Optional[str] = None  # TaskDataModule: classification | regression
    kind: Optional[str] = None  # labelled data: its task kind (task_kinds.registry)
    languages: Optional[list[str]] = None  # TLM: the two languages of the parallel text
    unanswerable: bool = False  # QA: questions may have no answer (SQuAD 2.0)
    labels: Callable[[], Optional[list[str]]] = _no_labels  # the label set, from the training split
    label_priors: Callable[[], Optional[list[float]]] = lambda: None  # multi-label: each label's training share
    records: Callable[[str], dict] = _no_records  # a split's examples (ids, texts, targets ...) for predictions
    task_specs: Callable[[], dict[str, dict]] = dict  # multitask: per task its kind and labels
    task_records: Callable[[str, str], dict] = lambda task, split: _no_records(f"{task}/{split}")
    train_examples: Callable[[], Any] = lambda: None  # the encoded training split (in-context demonstrations)


@dataclass(frozen=True)
class ModelHooks:
    """What a DataModule may know of its module (``PtmModule.hooks()``)."""

    collator: Optional[Callable[..., Callable]] = None  # (tokenizer, seed=) -> collate_fn
    example_format: frozenset = frozenset()  # pre-training examples the targets need (data.examples): nsp, sop ...
    static_copies: Optional[int] = None  # static masking: each NSP/SOP pair is one of k fixed draws (None: per epoch)
    task_collator: Optional[Callable[[str, Any], Callable]] = None  # multitask: (task kind, tokenizer) -> collate_fn


def connect(model, datamodule) -> None:
    """Give ``model`` the data's facts and ``datamodule`` the model's hooks (either side may be a plain Lightning
    class that takes no part)."""
    if model is None or datamodule is None:
        return
    if hasattr(model, "connect_data") and hasattr(datamodule, "facts"):
        model.connect_data(datamodule.facts())
    if hasattr(datamodule, "connect_model") and hasattr(model, "hooks"):
        datamodule.connect_model(model.hooks())
