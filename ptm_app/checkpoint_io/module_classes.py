"""The module classes a checkpoint or an export may name: ptm_app's own, looked up here and never imported by a
name read from a file (docs/design.md principles 10 and 11).

The registry is the ``__all__`` of the packages that hold one LightningModule per kind: pre-training objectives,
adaptation styles (one per task kind), compression and knowledge modules.  Each class is found under the names
checkpoints give it: its defining module's path (``ptm_app.module``), its package's path (Lightning's
``_class_path`` as a config wrote it) and its bare name.  A class outside the registry is imported only with
``--trust_checkpoint`` (python: ``trust=True``).  A class that moved is also found under the names it had before
(``RENAMED_MODULE_CLASSES``).

``config_classes`` is the registry of the names a config may give a class by (``class_path: TaskDataModule``): the
module classes above and the other classes the packages export (pre-training targets: ``class_path: Supersense``),
the data modules of ``DATA_MODULES`` and the callbacks of ``CALLBACK_MODULES``.  The CLI builds
it explicitly (``training.cli.PtmCLI``) before parsing; nothing imports a module only for its side effects.
"""
from __future__ import annotations

import functools
import importlib
from typing import Any, Optional

from ptm_app.errors import TRUST_HINT, CheckpointUnsafe, PtmError

PACKAGES = ("ptm_app.objectives", "ptm_app.adaptation", "ptm_app.compression", "ptm_app.knowledge")
DATA_MODULES = ("ptm_app.data.datamodules", "ptm_app.data.choice_data", "ptm_app.data.generation_data",
                "ptm_app.data.multilingual", "ptm_app.data.multitask", "ptm_app.data.parallel", "ptm_app.data.prompt_data",
                "ptm_app.data.qa_data", "ptm_app.data.tagging_data", "ptm_app.data.multilabel_data",
                "ptm_app.knowledge.data", "ptm_app.knowledge.libert_data", "ptm_app.data.image_text",
                "ptm_app.data.language_corpora")
CALLBACK_MODULES = ("ptm_app.training.compile", "ptm_app.training.unfreezing")
# module classes moved since (old name -> today's), as checkpoints (``ptm_app.module``, ``_class_path``) and exports
# name them: the sequence classifiers with one compression policy preset lived in ``compression/`` (issue 27: the
# package below ``adaptation`` imported it) and now live in ``adaptation.compressed``.  Read through ``current_name``.
_COMPRESSED = "ptm_app.adaptation.compressed"
# LIBERT's module lived in ``objectives/`` and now lives with the other knowledge-enhanced models (issue 27 item 3)
MOVED_KNOWLEDGE_CLASSES = {
    "ptm_app.objectives.libert.LexicalRelationMLMModule": "ptm_app.knowledge.libert.LexicalRelationMLMModule",
    "ptm_app.objectives.LexicalRelationMLMModule": "ptm_app.knowledge.libert.LexicalRelationMLMModule",
}
RENAMED_MODULE_CLASSES = {
    "ptm_app.compression.distillation.DistillationModule": f"{_COMPRESSED}.DistillationModule",
    "ptm_app.compression.DistillationModule": f"{_COMPRESSED}.DistillationModule",
    "ptm_app.compression.theseus.TheseusModule": f"{_COMPRESSED}.TheseusModule",
    "ptm_app.compression.TheseusModule": f"{_COMPRESSED}.TheseusModule",
    "ptm_app.compression.early_exit.EarlyExitModule": f"{_COMPRESSED}.EarlyExitModule",
    "ptm_app.compression.EarlyExitModule": f"{_COMPRESSED}.EarlyExitModule",
    "ptm_app.compression.pruning.PruningModule": f"{_COMPRESSED}.PruningModule",
    "ptm_app.compression.PruningModule": f"{_COMPRESSED}.PruningModule",
    "ptm_app.compression.quantization.QuantAwareModule": f"{_COMPRESSED}.QuantAwareModule",
    "ptm_app.compression.QuantAwareModule": f"{_COMPRESSED}.QuantAwareModule",
    **MOVED_KNOWLEDGE_CLASSES,
}


@functools.cache
def package_classes(package: str) -> dict[str, type]:
    """Every name a module class of ``package`` (one of ``PACKAGES``) goes by -> the class."""
    from lightning.pytorch import LightningModule

    table: dict[str, type] = {}
    exported = importlib.import_module(package)
    for name in exported.__all__:
        cls = getattr(exported, name)
        if isinstance(cls, type) and issubclass(cls, LightningModule):  # the package's PtmModule subclasses
            for key in (f"{cls.__module__}.{cls.__qualname__}", f"{package}.{name}", name):
                table[key] = cls
    return table


def module_classes() -> dict[str, type]:
    """The whole registry: every name a ptm_app module class goes by -> the class."""
    return {k: v for package in PACKAGES for k, v in package_classes(package).items()}


def current_name(name: Any) -> Any:
    """``name`` as the registry knows it today: a moved class's old name (``RENAMED_MODULE_CLASSES``) mapped."""
    return RENAMED_MODULE_CLASSES.get(name, name) if isinstance(name, str) else name


def registered(name: Any) -> Optional[type]:
    """The registry's class for ``name`` (an old name of a moved class included), or None.  Only the package the
    name lies in is imported (ptm_app's own code, chosen among ``PACKAGES``; a bare class name needs them all); a
    name elsewhere imports nothing."""
    if not isinstance(name, str):
        return None
    name = current_name(name)
    if "." not in name:
        return module_classes().get(name)
    package = next((p for p in PACKAGES if name.startswith(f"{p}.")), None)
    return package_classes(package).get(name) if package is not None else None


def _names(cls: Optional[type]) -> set[str]:
    return set() if cls is None else {f"{cls.__module__}.{cls.__qualname__}", cls.__qualname__}


def check_module_name(name: Any, source: Any, trust: bool = False, own: Optional[type] = None) -> None:
    """Refuse, in one line, a stored module class name that is not ptm_app's (nor ``own``, the class the caller
    chose), unless ``trust``; nothing is imported."""
    if trust or (isinstance(name, str) and name in _names(own)) or registered(name) is not None:
        return
    raise CheckpointUnsafe(f"{source}: it names the module class {repr(name)[:120]}, which is not one of ptm_app's "
                           f"(objectives, adaptation, compression, knowledge); refusing to import it (importing runs "
                           f"its code); {TRUST_HINT}")


def module_class(name: Any, source: Any, trust: bool = False) -> type:
    """The class a checkpoint or export names: from the registry, or (``trust`` only) imported by its name."""
    check_module_name(name, source, trust)
    found = registered(name)
    if found is not None:
        return found
    from lightning.pytorch import LightningModule

    module_path, _, attr = str(name).rpartition(".")
    try:
        found = getattr(importlib.import_module(module_path), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise PtmError(f"{source}: its module class {name!r} cannot be imported ({exc}); install the package that "
                       f"defines it") from None
    if not (isinstance(found, type) and issubclass(found, LightningModule)):
        raise PtmError(f"{source}: {name!r} is not a LightningModule class")
    return found


@functools.cache
def exported_classes() -> dict[str, type]:
    """Every class ``PACKAGES`` export (``__all__``) by bare name: the module classes, and the parts configs and
    checkpoints name short, such as the pre-training targets (``objectives.targets.known_targets``: ``MaskedLM``,
    ``Supersense`` ...); looked up here, never imported by a name read from a file."""
    found = (getattr(importlib.import_module(package), name) for package in PACKAGES
             for name in importlib.import_module(package).__all__)
    return {cls.__name__: cls for cls in found if isinstance(cls, type)}


def _defined_in(module: str, base: type) -> dict[str, type]:
    """The public subclasses of ``base`` that ``module`` defines (not the ones it imports)."""
    found = importlib.import_module(module)
    return {name: cls for name, cls in vars(found).items() if isinstance(cls, type) and issubclass(cls, base)
            and cls.__module__ == module and not name.startswith("_")}


@functools.cache
def config_classes() -> dict[str, type]:
    """Every bare class name a config may use -> the class: the module classes (``module_classes``) and the other
    classes the packages export (``exported_classes``: targets), the data modules and the callbacks.  A name given twice is a bug of ours (configs could not name either), refused here."""
    from lightning.pytorch import Callback, LightningDataModule

    groups = [{name: cls for name, cls in module_classes().items() if "." not in name}, exported_classes()]
    groups += [_defined_in(module, LightningDataModule) for module in DATA_MODULES]
    groups += [_defined_in(module, Callback) for module in CALLBACK_MODULES]
    table: dict[str, type] = {}
    for group in groups:
        for name, cls in group.items():
            if table.setdefault(name, cls) is not cls:
                raise RuntimeError(f"two config classes are named {name}: {table[name].__module__} and "
                                   f"{cls.__module__}; rename one")
    return table

def class_paths(settings: Any):
    """Every ``class_path`` value in a config's settings, at any depth."""
    if isinstance(settings, dict):
        for key, value in settings.items():
            if key == "class_path" and isinstance(value, str):
                yield value
            else:
                yield from class_paths(value)
    elif isinstance(settings, list):
        for value in settings:
            yield from class_paths(value)


def check_class_paths(settings: Any, path: str) -> None:
    """A dotted ``ptm_app.`` class path that no longer exists where it names (an old run's ``config.yaml`` after a
    class moved, e.g. ``ptm_app.objectives.libert.LexicalRelationMLMModule``) is one line naming the short name the
    registry knows it by; jsonargparse's own message only says the module has no such attribute."""
    for value in class_paths(settings):
        module, _, name = value.rpartition(".")
        if not module.startswith("ptm_app"):
            continue
        try:
            there = hasattr(importlib.import_module(module), name)
        except ImportError:
            there = False
        if not there:
            if name in config_classes():
                raise PtmError(f"{path}: class_path {value} is not there any more (ptm_app moved it); write its "
                               f"short name, class_path: {name}")
