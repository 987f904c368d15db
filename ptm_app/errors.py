"""User-facing errors: one clear line naming the thing and the fix, never a traceback.

``PtmError`` and its kinds; ``guarded`` runs a command and turns what the user caused (our ``PtmError``s,
jsonargparse's multi-line validation errors, Lightning settings clashes) into one ``error:`` line and an exit
status; config files are read and checked here (``read_yaml``, ``check_config_files``), and an optional package
a feature needs is named with its install line (``require_deepspeed``).
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Optional


class PtmError(Exception):
    """An error caused by the user's input (config, data, paths, hardware).

    ``main.py`` prints ``error: <message>`` on one line and exits with status 2.
    The message must name the offending thing and say how to fix it.
    """

    exit_code = 2
    last: "PtmError | None" = None  # the latest one raised: config parsing may wrap it in another error

    def __init__(self, *args):
        super().__init__(*args)
        PtmError.last = self

    def __str__(self) -> str:  # keep it on one line
        return " ".join(str(a) for a in self.args).replace("\n", " ")


TRUST_HINT = "if you made this file yourself, pass --trust_checkpoint (python: trust=True)"


class CheckpointUnsafe(PtmError):
    """A checkpoint whose unpickling would build objects other than plain data (it could run code), or whose data
    would choose a path, a module or code (a tokenizer file name, a module class, a DeepSpeed ``latest``)."""


class DataFormatError(PtmError):
    """A malformed line in a data file; the message starts with ``file:line``."""

    def __init__(self, path, line: int, problem: str, fix: str = "fix or remove that line"):  # noqa: D107
        super().__init__(f"{path}:{line}: {problem}; {fix}")


def not_utf8_lines(where: str | Path, lines) -> PtmError:
    """The first of ``lines`` (bytes) that is not UTF-8, as ``where:line`` with the byte; a newline byte never occurs
    inside a UTF-8 character, so line by line finds it."""
    for line_no, raw in enumerate(lines, 1):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return DataFormatError(where, line_no, f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte "
                                                   f"{exc.start + 1} of the line)",
                                   "save it as UTF-8 (e.g. iconv -f latin1 -t utf-8)")
    return PtmError(f"{where} is not UTF-8 text; save it as UTF-8")


def require_deepspeed(what: str = "strategy DeepSpeed") -> None:
    """DeepSpeed strategies and DeepSpeed checkpoints need the ``deepspeed`` extra."""
    from lightning.fabric.strategies.deepspeed import _DEEPSPEED_AVAILABLE

    if not _DEEPSPEED_AVAILABLE:
        raise PtmError(f"{what} needs the deepspeed package; install it with: "
                       "DS_BUILD_OPS=0 .venv/bin/pip install -c constraints-cpu.txt -e '.[deepspeed]'")


_HELP = "python main.py fit --help lists the keys"


def one_line(exc: Exception, help_hint: str = _HELP) -> str:
    """jsonargparse's multi-line message as one line: the key, what was expected and what was given; ``help_hint``
    says where the keys are listed."""
    text = str(exc)
    group = re.search(r'Parser key "([^"]+)"', text)
    prefix = f"{group.group(1)}." if group else ""
    if group and "class_path" in text:
        prefix += "init_args."
    option = re.search(r"Option '([^']+)' is not accepted", text) or re.search(r"Key '([^']+)' is not expected", text)
    if option:
        return f"unknown config key '{prefix}{option.group(1)}'; check its spelling ({help_hint})"
    unrecognized = re.search(r"[Uu]nrecognized arguments: (.+)", text)
    if unrecognized:
        return f"unknown command-line argument {unrecognized.group(1).strip()}; check its spelling ({help_hint})"
    absent = re.search(r"File does not exist: '([^']+)'", text)
    if absent:
        what = "config file" if not group or group.group(1) == "config" else f"{group.group(1)}: file"
        return f"{what} {absent.group(1)} does not exist; check the path"
    missing = re.search(r'[Kk]ey "([^"]+)" is required', text)
    if missing:
        return f"{missing.group(1)} is required; {help_hint}"
    klass = re.search(r"import path string: ([\w.]+)", text) or re.search(r"[Ii]mport path '([\w.]+)'", text)
    if klass:
        where = group.group(1) if group else "config"
        return f"unknown class '{klass.group(1)}' for '{where}'; use one of ptm_app's modules (configs/README.md lists the shipped recipes)"
    keys = re.findall(r'Parser key "([^"]+)"', text)
    wrong = re.search(r"Expected an? (.+?)\. Got value: (.+)", text)
    if len(keys) > 1 and wrong:  # a bad value of a nested setting: name the full key and what it accepts
        wanted = re.sub(r"<class '([\w.]+)'>", r"\1", wrong.group(1).replace("typing.", ""))
        choices = re.fullmatch(r"Literal\[(.*)\]", wanted)
        wanted = f"one of {choices.group(1)}" if choices else wanted
        return f"{prefix}{keys[-1]}: expected {wanted}, got {wrong.group(2).strip()}; {help_hint}"
    lines = [ln.strip(" -") for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("Parser key")]
    detail = [ln for ln in lines if not ln.startswith(("Subtypes", "Given value", "Errors", "Expected a"))] or lines
    message = " ".join(detail[:3]).replace("typing.", "")[:400]
    return (prefix.rstrip(".") + ": " if prefix else "") + message + ("" if help_hint == _HELP else f"; {help_hint}")


def option_error(exc: Exception, command: str, kinds: dict[str, Any], positional: Optional[str] = None) -> str:
    """jsonargparse's error for a command of the table (``main.COMMANDS``) as one line naming the option and the fix:
    an unknown option (with the closest known one), a missing one, a value of the wrong type (what is expected)."""
    import difflib

    text = str(exc)
    hint = f"python main.py {command} --help lists the options"
    shown = {name: (name.upper() if name == positional else f"--{name}") for name in kinds}
    unrecognized = re.search(r"[Uu]nrecognized arguments: (.+)", text)
    if unrecognized:
        given = unrecognized.group(1).strip()
        name = given.split()[0].lstrip("-").split("=")[0]
        close = difflib.get_close_matches(name, [*kinds, "config"], n=1) if given.startswith("--") else []
        return (f"unknown command-line argument {given}; {f'did you mean --{close[0]}? ' if close else ''}"
                f"options are --name value ({hint})")
    required = re.search(r"arguments are required: (.+)", text) or re.search(r'[Kk]ey "([^"]+)" is required', text)
    if required:
        names = [shown.get(n.strip().lstrip("-"), n.strip()) for n in required.group(1).split(",")]
        return f"{command} needs {' and '.join(names)}; {hint}"
    key = re.search(r'Parser key "([^"]+)"', text)
    if key and key.group(1) in kinds:
        given = re.search(r"Given value: (.*)", text) or re.search(r"Got value: (.*)", text)
        value = given.group(1).strip() if given else "the value given"
        return f"{key.group(1)}: {value} is not {expected(kinds[key.group(1)])} ({hint})"
    return one_line(exc, hint)


def expected(kind: Any) -> str:
    """A type hint in words: ``Optional[Literal['cls', 'mean']]`` -> ``one of cls, mean``."""
    import types
    from typing import Literal, Union, get_args, get_origin

    origin, args = get_origin(kind), get_args(kind)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return " or ".join(expected(a) for a in inner) if inner else "null"
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin is list:
        return f"a list whose items are {expected(args[0])}" if args else "a list"
    if origin is dict:
        return "a mapping"
    words = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    if kind in words:
        return words[kind]
    return f"a {getattr(kind, '__name__', str(kind))} mapping" if isinstance(kind, type) else str(kind)


def read_yaml(path: str | os.PathLike):
    """The YAML file ``path`` parsed (safely); a syntax error is one line naming the file and the line where the
    parser found it (``file:line:column``), with where the construct it was reading began."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except UnicodeDecodeError:
        with open(path, "rb") as fh:
            raise not_utf8_lines(path, fh) from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = exc.problem or exc.context or "cannot parse it"
        started = (f" ({exc.context} that began at line {exc.context_mark.line + 1})"
                   if exc.problem and exc.context and exc.context_mark is not None else "")
        raise PtmError(f"{where}: invalid YAML: {problem}{started}; fix the YAML there") from None
    except yaml.YAMLError as exc:
        raise PtmError(f"{path}: invalid YAML: {' '.join(str(exc).split())}; fix the file") from None



def check_config_files(argv: list[str]) -> dict[str, Any]:
    """Every ``--config FILE`` / ``-c FILE`` that exists is valid YAML (``read_yaml``: the file and line of an
    error, which jsonargparse's message lacks) and includes no other config (a ``config:`` key: jsonargparse loads
    it, then lets the including file's groups replace its groups whole, so ``trainer: {max_steps: 3}`` silently
    drops every other trainer setting of the base; repeated ``--config`` merges key by key); a renamed one names
    its new path (``check_renamed``); any other missing one is left to the parser (``one_line`` names it).  Returns
    the settings read, by file, for the checks that need the class registry (``module_classes.check_class_paths``)."""
    read = {}
    for i, arg in enumerate(argv):
        value = arg.split("=", 1)[1] if arg.startswith("--config=") else \
            argv[i + 1] if arg in ("--config", "-c") and i + 1 < len(argv) else None
        if value is not None:
            check_renamed(value)
        if value is not None and os.path.isfile(value):
            settings = read[value] = read_yaml(value)
            if isinstance(settings, dict) and "config" in settings:
                raise PtmError(f"{value}: a config does not include another ('config: {settings['config']}'): "
                               f"jsonargparse would replace whole groups such as trainer: with this file's; give both "
                               f"in order instead: --config {settings['config']} --config {value}")
    return read


# Configs renamed to configs/<stage>/<model>_<method>_<data>.yaml (issue 27): old "<folder>/<stem>" -> new, so an old
# path given to --config (or named by a plan) is one line naming the new file.  Paths are written without the
# configs/ prefix and .yaml suffix here so that the test that every config path the repository names exists
# (tests/cli/test_config_hub.py) does not read them as references.
RENAMED_CONFIGS = {
    "pretrain/albert": "pretrain/albert_mlm_sop_brown",
    "pretrain/bart": "pretrain/bart_dae_brown",
    "pretrain/bert": "pretrain/bert_mlm_nsp_brown",
    "pretrain/bert_mlm": "pretrain/bert_mlm_bbc",
    "pretrain/clip_emoji": "pretrain/clip_contrastive_emoji",
    "pretrain/electra": "pretrain/electra_rtd_brown",
    "pretrain/elmo": "pretrain/elmo_bilm_brown",
    "pretrain/gpt_clm": "pretrain/gpt2_clm_bbc",
    "pretrain/infoword": "pretrain/infoword_dim_mlm_brown",
    "pretrain/mass": "pretrain/mass_seq2seq_mlm_brown",
    "pretrain/mbart": "pretrain/mbart_dae_bible",
    "pretrain/mmlm": "pretrain/mbert_mlm_quran_bible",
    "pretrain/roberta": "pretrain/roberta_mlm_brown",
    "pretrain/simcse": "pretrain/simcse_contrastive_brown",
    "pretrain/spanbert": "pretrain/spanbert_span_mlm_sbo_brown",
    "pretrain/t5": "pretrain/t5_span_corruption_brown",
    "pretrain/unilm": "pretrain/unilm_unified_mlm_brown",
    "pretrain/visualbert_emoji": "pretrain/visualbert_mlm_itm_emoji",
    "pretrain/xlm": "pretrain/xlm_tlm_bible",
    "pretrain/xlm_mix": "pretrain/xlm_clm_mlm_tlm_quran_bible",
    "pretrain/xlnet": "pretrain/xlnet_plm_brown",
    "adapt/ulmfit_1_lm": "pretrain/minilm_ulmfit_lm_bbc",
    "finetune/bbc_minilm": "adapt/minilm_full_bbc",
    "finetune/brown_pos_minilm": "adapt/minilm_full_brown_pos",
    "finetune/mt_en_es": "adapt/mbart_full_bible_en_es",
    "finetune/mt_en_es_scratch": "adapt/bart_scratch_bible_en_es",
    "finetune/openmoji_minilm": "adapt/minilm_full_openmoji",
    "finetune/squad2_minilm": "adapt/minilm_full_squad2",
    "finetune/squad_minilm": "adapt/minilm_full_squad",
    "finetune/tweets_confidence_minilm": "adapt/minilm_full_tweets_confidence",
    "finetune/tweets_minilm": "adapt/minilm_full_tweets",
    "finetune/tweets_minilm_freelb": "adapt/minilm_freelb_tweets",
    "finetune/wnut16_minilm": "adapt/minilm_full_wnut16",
    "finetune/wordnet_choice_minilm": "adapt/minilm_full_wordnet_choice",
    "finetune/wordnet_pairs_minilm": "adapt/minilm_full_wordnet_pairs",
    "finetune/wordnet_qa_minilm": "adapt/minilm_full_wordnet_qa",
    "finetune/wordnet_supersense_minilm": "adapt/minilm_full_wordnet_supersense",
    "adapt/bitfit_tweets": "adapt/minilm_bitfit_tweets",
    "adapt/features_scalar_mix_brown_pos": "adapt/minilm_features_scalar_mix_brown_pos",
    "adapt/features_scalar_mix_tweets": "adapt/minilm_features_scalar_mix_tweets",
    "adapt/features_top_tweets": "adapt/minilm_features_top_tweets",
    "adapt/features_top_wordnet_qa": "adapt/minilm_features_top_wordnet_qa",
    "adapt/finetune_strategies_bbc": "adapt/minilm_ulmfit_strategies_bbc",
    "adapt/headlines_bbc_bert2bert": "adapt/bert2bert_full_bbc_headlines",
    "adapt/headlines_bbc_gpt_prompt": "adapt/gpt2_tldr_prompt_bbc_headlines",
    "adapt/headlines_bbc_smollm2": "adapt/smollm2_lora_bbc_headlines",
    "adapt/houlsby_multitask_minilm": "adapt/minilm_houlsby_multitask_mix",
    "adapt/houlsby_tweets": "adapt/minilm_houlsby_tweets",
    "adapt/houlsby_wordnet_qa": "adapt/minilm_houlsby_wordnet_qa",
    "adapt/icl_bbc_smollm2": "adapt/smollm2_icl_bbc",
    "adapt/icl_tweets": "adapt/gpt2_icl_tweets",
    "adapt/icl_tweets_smollm2": "adapt/smollm2_icl_tweets",
    "adapt/lora_bbc": "adapt/minilm_lora_bbc",
    "adapt/lora_brown_pos": "adapt/minilm_lora_brown_pos",
    "adapt/lora_headlines_bert2bert": "adapt/bert2bert_lora_bbc_headlines",
    "adapt/lora_tweets": "adapt/minilm_lora_tweets",
    "adapt/multitask_choice_minilm": "adapt/minilm_multitask_tweets_choice",
    "adapt/multitask_minilm": "adapt/minilm_multitask_mix",
    "adapt/multitask_then_tweets": "adapt/minilm_after_multitask_tweets",
    "adapt/pet_few_shot_bbc": "adapt/minilm_pet_few_shot_bbc",
    "adapt/pet_zero_shot_bbc": "adapt/minilm_pet_zero_shot_bbc",
    "adapt/prefix_tweets": "adapt/minilm_prefix_tweets",
    "adapt/prompt_brown_pos": "adapt/minilm_prompt_brown_pos",
    "adapt/prompt_tweets": "adapt/minilm_prompt_tweets",
    "adapt/soft_prompt_bbc": "adapt/minilm_soft_prompt_bbc",
    "adapt/ulmfit_2_classifier": "adapt/minilm_ulmfit_classifier_bbc",
    "knowledge/ernie_brown": "knowledge/ernie_entity_mlm_brown",
    "knowledge/sensebert_brown": "knowledge/sensebert_mlm_supersense_brown",
    "knowledge/libert_brown": "knowledge/libert_mlm_lexrel_brown",
    "knowledge/kepler_brown": "knowledge/kepler_mlm_transe_brown",
    "knowledge/mlm_brown": "knowledge/bert_wwm_mlm_brown",
    "knowledge/kadapter_factual": "knowledge/minilm_kadapter_factual_wordnet_kg",
    "knowledge/kadapter_linguistic": "knowledge/minilm_kadapter_linguistic_brown_pos",
    "knowledge/kadapter_wordnet_pairs": "knowledge/minilm_kadapter_wordnet_pairs",
    "knowledge/kadapter_wordnet_supersense": "knowledge/minilm_kadapter_wordnet_supersense",
    "knowledge/frozen_minilm_wordnet_pairs": "knowledge/minilm_frozen_wordnet_pairs",
    "knowledge/frozen_minilm_wordnet_supersense": "knowledge/minilm_frozen_wordnet_supersense",
    "compress/bilstm_bbc_no_teacher": "compress/bilstm_no_teacher_bbc",
    "compress/distill_bbc_3layer": "compress/minilm_distill_3layer_bbc",
    "compress/distill_bbc_albert": "compress/minilm_distill_albert_bbc",
    "compress/distill_bbc_bilstm": "compress/minilm_distill_bilstm_bbc",
    "compress/distill_bbc_cnn": "compress/minilm_distill_cnn_bbc",
    "compress/distill_pretrain_minilm": "compress/minilm_distill_mlm_bbc",
    "compress/distill_smollm2": "compress/smollm2_distill_llama_bbc",
    "compress/early_exit_bbc_deebert": "compress/minilm_deebert_bbc",
    "compress/early_exit_bbc_pabee": "compress/minilm_pabee_bbc",
    "compress/prune_heads_bbc": "compress/minilm_prune_heads_bbc",
    "compress/prune_layers_bbc": "compress/minilm_prune_layers_bbc",
    "compress/prune_magnitude_bbc": "compress/minilm_prune_magnitude_bbc",
    "compress/quantize_qat_bbc": "compress/minilm_qat_bbc",
    "compress/report_bbc": "compress/minilm_report_bbc",
    "compress/report_tweets": "compress/minilm_report_tweets",
    "compress/theseus_bbc": "compress/minilm_theseus_bbc",
    "analysis/attack_bbc_minilm": "analysis/minilm_attack_bbc",
    "analysis/attack_tweets_minilm": "analysis/minilm_attack_tweets",
    "analysis/attention_minilm": "analysis/minilm_attention_brown",
    "analysis/contextuality_minilm": "analysis/minilm_contextuality_brown",
    "analysis/knowledge_probe_smollm2": "analysis/smollm2_lama_wordnet",
    "analysis/probe_minilm": "analysis/minilm_probe_linear_mix",
    "analysis/probe_mlp_minilm_smollm2": "analysis/minilm_smollm2_probe_mlp_brown_pos",
    "analysis/probe_own_pretrained": "analysis/bert_probe_linear_mix",
    "analysis/robustness_bbc_minilm": "analysis/minilm_robustness_bbc",
    "analysis/robustness_tweets_minilm": "analysis/minilm_robustness_tweets",
    "demo/mlm_minilm_bbc": "demo/minilm_mlm_bbc",
    "demo/finetune_bbc": "demo/demo_mlm_full_bbc",
}


def renamed_config(path: Any) -> Optional[str]:
    """The new path of a renamed config (``RENAMED_CONFIGS``), in the form it was given (``configs/...`` or an
    absolute path ending so); None for any other path."""
    match = re.fullmatch(r"(.*?)([\w-]+/[\w-]+)\.yaml", str(path))
    if match is None or match.group(2) not in RENAMED_CONFIGS or not match.group(1).endswith("configs/"):
        return None
    return f"{match.group(1)}{RENAMED_CONFIGS[match.group(2)]}.yaml"


def check_renamed(path: Any, what: str = "config file") -> None:
    """One line for a renamed config that no longer exists at ``path``: the new path to use."""
    new = renamed_config(path)
    if new is not None and not os.path.exists(str(path)):
        raise PtmError(f"{what} {path} was renamed to {new}; use that")


def guarded(command: Callable[[list[str]], int], argv: list[str]) -> int:
    """``command(argv)``; bad input is printed as one ``error: ...`` line (exit 2), never a traceback; a SIGTERM
    stop (``last.ckpt`` written) exits 143.  Anything else is a bug of ours and keeps its traceback."""
    try:
        return command(argv)
    except _sigterm():  # Lightning stops on SIGTERM after LastCheckpoint wrote last.ckpt
        print("stopped by SIGTERM; last.ckpt is written, resume with --ckpt_path last", file=sys.stderr)
        return 143
    except PtmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:
        from jsonargparse import ArgumentError

        wrapped = PtmError.last
        if wrapped is not None and str(wrapped) in str(exc).replace("\n", " "):
            print(f"error: {wrapped}", file=sys.stderr)  # our error, raised while the config was instantiated
            return wrapped.exit_code
        if isinstance(exc, ArgumentError):
            print(f"error: {one_line(exc)}", file=sys.stderr)
            return 2
        if _lightning_config_error(exc):
            print(f"error: trainer settings: {' '.join(str(exc).split())}", file=sys.stderr)
            return 2
        raise


def _lightning_config_error(exc: BaseException) -> bool:
    """A ValueError / MisconfigurationException raised inside Lightning itself: a settings clash such as
    ``val_check_interval`` longer than the epoch, not a bug of ours."""
    if "lightning" not in sys.modules:
        return False
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    if not isinstance(exc, (ValueError, MisconfigurationException)):
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}lightning{os.sep}" in tb.tb_frame.f_code.co_filename


def _sigterm() -> type[BaseException]:
    if "lightning" not in sys.modules:
        return _Never
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    return SIGTERMException


class _Never(BaseException):
    """Placeholder exception type that is never raised."""
