"""Red-team inputs (issue 25): weights-only checkpoints, sharded directories and exports crafted the way someone
else's run could be, each of whose data would choose a path to write, a module to import or code to run.

A *marker module* stands for the attacker's code: a ``.py`` on ``sys.path`` that, when imported, writes a file.
Crafted class names point at it; the ``auto_map`` tokenizers name it.  Each attack is made from a real tiny run
(the ``victim`` fixture)."""
from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

MARKER_MODULE = "ptm_redteam_marker"
QUIET = {"accelerator": "cpu", "devices": 1, "log_every_n_steps": 1, "enable_progress_bar": False,
         "enable_model_summary": False}


def config_file(tmp: Path, name: str, model: dict, data: dict, steps: int = 2) -> Path:
    cfg = {"seed_everything": 1, "trainer": {"max_steps": steps, "val_check_interval": steps,
                                             "limit_val_batches": 1, **QUIET}, "model": model, "data": data}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def classifier_data(corpus: Path) -> dict:
    return {"class_path": "TaskDataModule",
            "init_args": {"source": str(corpus), "max_length": 32, "batch_size": 8,
                          "tokenizer": {"train": "wordpiece", "vocab_size": 100, "min_frequency": 1}}}


@dataclass
class Victim:
    """The tiny runs the attacks are made from (a classifier and a causal LM) and their configs."""

    config: Path
    run: Path
    clm_config: Path
    clm_run: Path

    @property
    def ckpt(self) -> Path:
        return self.run / "checkpoints" / "last.ckpt"


@dataclass
class Marker:
    """The attacker's module: importing ``name`` writes ``file``."""

    name: str
    file: Path

    def fired(self) -> bool:
        return self.file.exists() or self.name in sys.modules


def _craft(victim_ckpt: Path, target: Path, change) -> Path:
    ckpt = torch.load(victim_ckpt, weights_only=True)
    change(ckpt)
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, target)
    return target


def _evil_tokenizer_config(ckpt: dict) -> None:
    import json

    files = ckpt["ptm_app"]["tokenizer"]
    config = json.loads(files["tokenizer_config.json"])
    config["auto_map"] = {"AutoTokenizer": [f"{MARKER_MODULE}.EvilTokenizer", None]}
    files["tokenizer_config.json"] = json.dumps(config)


@dataclass
class Attack:
    """One crafted input: ``path`` (a checkpoint file, a sharded directory or an export directory), the words its
    one-line refusal must name, and where a successful attack would write."""

    name: str
    path: Path
    names: tuple[str, ...]
    escapes: tuple[Path, ...] = ()


CHECKPOINT_ATTACKS = ("tokenizer_absolute", "tokenizer_dotdot", "class_path", "module_record", "tokenizer_auto_map")
SHARDED_ATTACKS = ("deepspeed_latest_absolute", "deepspeed_latest_dotdot", "deepspeed_symlinked_tag")
EXPORT_ATTACKS = ("export_module_config", "export_auto_map")


def make_attack(kind: str, victim: Victim, marker: Marker, where: Path) -> Attack:
    """The crafted input ``kind`` under ``where`` (the test's sandbox: ``where / 'outside'`` is what it must not
    reach)."""
    outside = where / "outside"
    outside.mkdir(exist_ok=True)
    foreign = f"{marker.name}.Evil"
    if kind == "tokenizer_absolute":
        target = outside / "escaped_absolute.txt"
        path = _craft(victim.ckpt, where / "attack.ckpt",
                      lambda c: c["ptm_app"]["tokenizer"].__setitem__(str(target), "written from a checkpoint"))
        return Attack(kind, path, (str(target),), (target,))
    if kind == "tokenizer_dotdot":
        name = "../../escaped_dotdot.txt"
        path = _craft(victim.ckpt, where / "attack.ckpt",
                      lambda c: c["ptm_app"]["tokenizer"].__setitem__(name, "written from a checkpoint"))
        temp = Path(tempfile.gettempdir())
        return Attack(kind, path, (name,), (temp / "escaped_dotdot.txt", temp.parent / "escaped_dotdot.txt"))
    if kind == "class_path":
        path = _craft(victim.ckpt, where / "attack.ckpt",
                      lambda c: c["hyper_parameters"].__setitem__("_class_path", foreign))
        return Attack(kind, path, (foreign, "--trust_checkpoint"))
    if kind == "module_record":
        path = _craft(victim.ckpt, where / "attack.ckpt", lambda c: c["ptm_app"].__setitem__("module", foreign))
        return Attack(kind, path, (foreign, "--trust_checkpoint"))
    if kind == "tokenizer_auto_map":
        path = _craft(victim.ckpt, where / "attack.ckpt", _evil_tokenizer_config)
        return Attack(kind, path, ("tokenizer_config.json", "auto_map", f"{marker.name}.EvilTokenizer"))
    if kind.startswith("deepspeed"):
        return _deepspeed_attack(kind, marker, where, outside)
    if kind.startswith("export"):
        return _export_attack(kind, victim, marker, where)
    raise ValueError(kind)


class _Imports:
    """Unpickling this imports the marker module (as DeepSpeed's ``torch.load(weights_only=False)`` would)."""

    def __init__(self, name: str):
        self.name = name

    def __reduce__(self):
        return __import__, (self.name,)


def _evil_states(directory: Path, marker: Marker) -> None:
    """DeepSpeed's model-state file, whose unpickling imports the marker."""
    directory.mkdir(parents=True, exist_ok=True)
    torch.save({"module": _Imports(marker.name)}, directory / "mp_rank_00_model_states.pt")


def _deepspeed_attack(kind: str, marker: Marker, where: Path, outside: Path) -> Attack:
    shard = where / "attack.ckpt"
    shard.mkdir()
    (shard / "global_step2").mkdir()
    torch.save({"module": {}, "ptm_app": {}}, shard / "global_step2" / "mp_rank_00_model_states.pt")
    _evil_states(outside / "global_step9", marker)
    if kind == "deepspeed_latest_absolute":
        (shard / "latest").write_text(str(outside / "global_step9"))
        return Attack(kind, shard, ("latest", str(outside / "global_step9")))
    if kind == "deepspeed_latest_dotdot":
        (shard / "latest").write_text("../outside/global_step9")
        return Attack(kind, shard, ("latest", "../outside/global_step9"))
    (shard / "latest").write_text("global_step9")
    (shard / "global_step9").symlink_to(outside / "global_step9", target_is_directory=True)
    return Attack(kind, shard, ("global_step9", "symlink"))


def _export_attack(kind: str, victim: Victim, marker: Marker, where: Path) -> Attack:
    import json

    from ptm_app.inference.export import MODULE_CONFIG, export_checkpoint

    out = export_checkpoint(victim.ckpt, where / "attack_export")
    if kind == "export_module_config":
        (out / MODULE_CONFIG).write_text(json.dumps({"module": f"{marker.name}.Evil", "hparams": {}, "aliases": {}}))
        return Attack(kind, out, (f"{marker.name}.Evil", "--trust_checkpoint"))
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": [f"{marker.name}.EvilTokenizer", None]}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / f"{marker.name}.py").write_text((marker.file.parent / f"{marker.name}.py").read_text())  # shipped with it
    return Attack(kind, out, ("auto_map", "tokenizer_config.json"))
