"""Task kinds: everything one kind of labelled task needs, in one registry entry (docs/design.md principle 10).

A ``TaskKind`` bundles:
- the model class it trains (``backbones.model_classes.MODEL_CLASSES``: the transformers Auto class, the peft task
  type) and the transformers ``problem_type`` that tells it apart from another kind of the same class;
- the model card's intended use and the Hub pipeline tag;
- its data module and the collator its examples need;
- its head's shape (what it reads, its width, its outputs), its loss and its metrics, as small classes
  (``task_kinds.parts``), and the score rows a teacher teaches (``soft_targets``: knowledge distillation);
- its predictions: the scores ``predict_step`` returns, and the input form (``task_kinds.forms``: what
  ``predict --text/--input`` reads and the serve request body) with the rows ``predict`` prints
  (``task_kinds.rows``).

The single-task modules (``adaptation``), ``MultitaskModule``, ``predict``, ``serve`` and ``export``'s model card
read the entry; nothing else lists kinds.  A new kind is one entry (a ``TaskKind`` listed in ``TASK_KINDS``, with
its own loss, metrics and score classes in a module beside this one, as ``task_kinds.multilabel``) plus its data
module: ``git show --stat`` of the commit that added ``multilabel`` shows exactly that (and its data source, config
and tests).

Kinds: ``sequence`` (classification, single sentences and pairs), ``regression``, ``token`` (tagging), ``qa``
(extractive spans), ``choice`` (multiple choice: SWAG / RACE style, Devlin et al. 2019 §4.4; each (question, choice)
pair is encoded on its own and a single score per pair is soft-maxed over the choices), ``generation`` (a
seq2seq or causal LM's decoding: its loss and metrics are the module's own) and ``multilabel`` (label sets:
``task_kinds.multilabel``, an entry with its parts in a module of its own).
"""
from __future__ import annotations

from typing import Optional

from ptm_app.data.choice_data import MultipleChoiceDataModule
from ptm_app.data.collators import ChoiceCollator, QACollator, TokenLabelCollator
from ptm_app.data.datamodules import TaskDataModule
from ptm_app.data.generation_data import Seq2SeqDataModule
from ptm_app.data.qa_data import QADataModule
from ptm_app.data.tagging_data import TokenTaskDataModule
from ptm_app.errors import PtmError
from ptm_app.task_kinds import multilabel, rows
from ptm_app.task_kinds.forms import CHOICES, QA, TEXT, WORDS
from ptm_app.task_kinds.kind import Prediction, TaskKind
from ptm_app.task_kinds.parts import (ChoiceMetrics, Choices, CrossEntropy, LabelMetrics, MeanSquaredError,
                                       PerExample, PerLabelledToken, Pooled, RegressionMetrics, Softmax,
                                       SpanCrossEntropy, SpanMetrics, Spans, StartAndEnd, TagCrossEntropy,
                                       TaggingMetrics, Tokens, Value, Values)


def _kinds(*entries: TaskKind) -> dict[str, TaskKind]:
    return {kind.name: kind for kind in entries}


TASK_KINDS: dict[str, TaskKind] = _kinds(
    TaskKind("sequence", "sequence_classification",
             "labelling a text (or a text pair) with one of its labels (main.py predict)", "text-classification",
             TaskDataModule, Pooled(), CrossEntropy(), LabelMetrics(), Prediction(TEXT, rows.label_rows),
             scores=Softmax(), soft_targets=PerExample()),
    TaskKind("regression", "sequence_classification",
             "labelling a text (or a text pair) with one of its labels (main.py predict)", "text-classification",
             TaskDataModule, Value(), MeanSquaredError(), RegressionMetrics(), Prediction(TEXT, rows.label_rows),
             scores=Values(), problem_type="regression"),
    TaskKind("token", "token_classification", "labelling each word of a text", "token-classification",
             TokenTaskDataModule, Tokens(), TagCrossEntropy(), TaggingMetrics(), Prediction(WORDS, rows.tag_rows),
             TokenLabelCollator, soft_targets=PerLabelledToken()),
    TaskKind("qa", "question_answering", "extracting the answer span to a question from a context",
             "question-answering", QADataModule, Spans(), SpanCrossEntropy(), SpanMetrics(),
             Prediction(QA, rows.answer_rows), QACollator, soft_targets=StartAndEnd()),
    TaskKind("choice", "multiple_choice", "picking one of several candidate answers", None, MultipleChoiceDataModule,
             Choices(), CrossEntropy(), ChoiceMetrics(), Prediction(CHOICES, rows.choice_rows), ChoiceCollator,
             scores=Softmax(), soft_targets=PerExample(by_label=False)),
    TaskKind("generation", "seq2seq_lm", None, None, Seq2SeqDataModule, None, None, None,
             Prediction(TEXT, rows.generation_rows)),
    multilabel.KIND,
)

# names used before the registry had one name per kind: read from old checkpoints, exports and configs
OLD_NAMES = {"multiple_choice": "choice", "sequence_classification": "sequence", "classification": "sequence",
             "token_classification": "token", "question_answering": "qa"}


def task_kind(name: str, where: str = "task") -> TaskKind:
    """The registry entry for ``name`` (an old name is mapped: ``OLD_NAMES``), or one line naming the kinds."""
    name = OLD_NAMES.get(name, name)
    if name not in TASK_KINDS:
        raise PtmError(f"{where}: kind '{name}' is not one of {', '.join(TASK_KINDS)}")
    return TASK_KINDS[name]


def kind_of_model_class(model_class: str, problem_type: Optional[str] = None) -> Optional[TaskKind]:
    """The kind a plain transformers model of ``model_class`` serves: the kind of that class whose ``problem_type``
    is the config's (None: the class's first kind; a single-output classifier counts as regression)."""
    same = [k for k in TASK_KINDS.values() if k.model_class == model_class and k.head is not None]
    for kind in same:
        if kind.problem_type is not None and kind.problem_type == problem_type:
            return kind
    plain = [k for k in same if k.problem_type is None]
    return plain[0] if plain else None


def kind_of(loaded) -> Optional[TaskKind]:
    """The kind of a loaded model (``inference.loading.LoadedModel``): its module's ``task_kind`` (None for
    modules that predict no rows of their own: multitask, prompting), else a plain export's model class and problem
    type."""
    module = loaded.module
    if module is not None:
        name = module.kind_name() if hasattr(module, "kind_name") else getattr(module, "task_kind", None)
        return task_kind(name) if name is not None and getattr(module, "predicts_rows", True) else None
    from ptm_app.backbones.delta import transformers_model

    config = transformers_model(loaded.model).config
    problem = getattr(config, "problem_type", None)
    if loaded.model_class == "sequence_classification" and problem is None and getattr(config, "num_labels", 2) == 1:
        problem = "regression"
    return kind_of_model_class(loaded.model_class, problem)


def forms() -> dict[str, InputForm]:
    """Every input form a kind's predictions take, by name (serve builds one request model per form)."""
    return {kind.prediction.form.name: kind.prediction.form for kind in TASK_KINDS.values()}
