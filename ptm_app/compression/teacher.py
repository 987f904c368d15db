"""The teacher: any ptm_app run directory / ``.ckpt``, exported ``save_pretrained`` directory or prepared model,
loaded frozen and in eval mode.  It is never saved with the student: the student's checkpoint names it (its
resolved path) and it is rebuilt from that name on load."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ptm_app.backbones.build import build_backbone, model_dir, quiet_transformers
from ptm_app.errors import PtmError
from ptm_app.paths import runs_root

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def resolve_teacher(ref: str) -> str:
    """A local path for ``ref`` (as given, or a run name under the runs directory), else ``ref`` itself (a prepared
    name); a missing run directory names the config that produces it."""
    path = Path(ref).expanduser()
    candidates = [path] if path.is_absolute() else [path, runs_root() / path, runs_root() / path.name]
    found = next((p for p in candidates if p.exists()), None)
    if found is not None:
        return str(found.resolve())
    from ptm_app.data.sources import SOURCES

    if ref in SOURCES:
        return ref
    producers = sorted(CONFIGS.glob(f"*/{path.name}.yaml"))
    hint = (f"train it first: python main.py fit --config {producers[0].relative_to(CONFIGS.parent)}" if producers
            else "give a run directory, a .ckpt, an exported directory or a prepared model name")
    raise PtmError(f"teacher '{ref}' not found (nor under the runs directory {runs_root()}); {hint}")


def load_teacher(ref: str, model_class: str = "sequence_classification") -> tuple[nn.Module, object]:
    """``(frozen teacher model in eval mode, its tokenizer or None)``.  Loading leaves the global RNG as it was
    (building a model initialises it randomly before the weights load): a run must draw the same dropout masks
    whichever way its teacher was loaded."""
    where = resolve_teacher(ref)
    with torch.random.fork_rng(devices=[]), quiet_transformers():
        from_run = run_teacher(where, model_class)
        model, tokenizer = from_run if from_run is not None else (build_backbone(model_class, where, None), None)
    model.requires_grad_(False)
    model.eval()
    return model, tokenizer if from_run is not None else teacher_tokenizer(model_dir(where))


def run_teacher(where: str, model_class: str):
    """``(model, tokenizer)`` of a run of the same model class, rebuilt from its checkpoint with any delta in place
    (LoRA merged; adapters and soft prompts kept as the tuned model, which export could not merge); else None."""
    from ptm_app.backbones.from_checkpoint import checkpoint_backbone, is_checkpoint
    from ptm_app.checkpoint_io.reading import CKPT_KEY, read_checkpoint
    from ptm_app.training.module import tokenizer_from_files

    if not is_checkpoint(where):
        return None
    ckpt = read_checkpoint(where)
    if ckpt[CKPT_KEY].get("model_class") != model_class:
        return None  # another model class (an MLM run ...): its encoder, through the export cache
    model, unmerged = checkpoint_backbone(ckpt)
    files = ckpt[CKPT_KEY].get("tokenizer")
    return (model if model is not None else unmerged[1]), (tokenizer_from_files(files, where) if files else None)


def teacher_tokenizer(directory: str):
    """The tokenizer saved with the teacher (export directories and checkpoints carry one), or None."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(directory, trust_remote_code=False)
    except (OSError, ValueError, TypeError):
        return None


def same_vocabulary(a, b) -> bool:
    """Both tokenizers map every token to the same id (so one ``input_ids`` tensor means the same text to both)."""
    return a is not None and b is not None and a.get_vocab() == b.get_vocab()


def has_trained_head(model: nn.Module) -> bool:
    """False when the classification head's weights were freshly initialised at load (a bare encoder)."""
    missing = getattr(model, "ptm_missing_keys", ())
    return not any(k.startswith(("classifier", "score", "pre_classifier")) for k in missing)


class TeacherInputs:
    """Collator wrapper for a teacher with another vocabulary (logit distillation only): each example's text, as
    the student's tokenizer decodes it, is encoded again with the teacher's tokenizer into ``teacher_*`` fields.
    Sentence pairs are split at the student's segment ids."""

    def __init__(self, base, student_tokenizer, teacher_tok, max_length: int):
        self.base, self.student, self.teacher, self.max_length = base, student_tokenizer, teacher_tok, max_length

    def texts(self, ids: torch.Tensor, mask: torch.Tensor, segments) -> tuple[list[str], list[str] | None]:
        firsts, seconds = [], []
        for i in range(len(ids)):
            row = ids[i][mask[i].bool()]
            seg = segments[i][mask[i].bool()] if segments is not None else torch.zeros_like(row)
            firsts.append(self.student.decode(row[seg == 0], skip_special_tokens=True))
            seconds.append(self.student.decode(row[seg == 1], skip_special_tokens=True))
        return firsts, (seconds if any(seconds) else None)

    def __call__(self, examples: list[dict]) -> dict:
        batch = self.base(examples)
        first, second = self.texts(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
        enc = self.teacher(first, second, truncation=True, max_length=self.max_length, padding=True,
                           return_tensors="pt")
        batch.update({f"teacher_{k}": v for k, v in enc.items()})
        return batch


class FrozenTeacher:
    """A teacher loaded on first use (``load_teacher``) and kept off the student module's sub-modules: never in its
    ``state_dict``, ``.train()`` or optimiser; moved to the student's device when called."""

    def __init__(self, ref: str, model_class: str):
        self.ref, self.model_class = ref, model_class
        self._model, self._tokenizer = None, None

    def _load(self) -> None:
        if self._model is None:
            self._model, self._tokenizer = load_teacher(self.ref, self.model_class)

    @property
    def model(self) -> nn.Module:
        self._load()
        return self._model

    @property
    def tokenizer(self):
        self._load()
        return self._tokenizer

    def on(self, device: torch.device) -> nn.Module:
        model = self.model
        if next(model.parameters()).device != device:
            model.to(device)
        return model

    def fresh_weights(self) -> list[str]:
        """Weights outside the base model that were freshly initialised at load (an output layer it lacked)."""
        prefix = getattr(self.model, "base_model_prefix", "") + "."
        return [k for k in getattr(self.model, "ptm_missing_keys", ()) if not k.startswith(prefix)]

    def check_vocabulary(self, tokenizer, why: str) -> None:
        """One line when the data's tokenizer is not the teacher's (``why``: what needs one vocabulary)."""
        if not same_vocabulary(tokenizer, self.tokenizer):
            size = len(self.tokenizer) if self.tokenizer is not None else "unknown"
            raise PtmError(f"teacher '{self.ref}' and the student use different tokenizers (vocabularies of {size} "
                           f"and {len(tokenizer)} tokens), and {why} needs one vocabulary; set "
                           f"data.init_args.tokenizer.pretrained to the teacher ({self.ref})")


def size_facts(student: nn.Module, teacher: nn.Module) -> dict:
    """``summary.json``'s ``student_params``, ``teacher_params`` and ``compression`` (their ratio); shared weights
    count once."""
    counts = [sum(p.numel() for p in m.parameters()) for m in (student, teacher)]
    return {"student_params": counts[0], "teacher_params": counts[1], "compression": round(counts[1] / counts[0], 3)}
