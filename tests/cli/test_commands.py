"""The command table (``ptm_app.main.COMMANDS``): every subcommand is a typed, documented function parsed by
jsonargparse, its ``--help`` generated from the signature and docstring, and bad input is one line."""
import inspect
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from ptm_app.main import COMMANDS, LIGHTNING, Command, command_argv, given_texts, main

ROOT = Path(__file__).resolve().parents[2]
ENTRIES = {f"{name} {key}" if isinstance(entry, dict) else name: e
           for name, entry in COMMANDS.items() for key, e in (entry.items() if isinstance(entry, dict) else [("", entry)])}


def needs_extra(entry: Command) -> bool:
    import importlib.util

    return entry.extra is not None and importlib.util.find_spec(entry.extra[0]) is None


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_every_command_is_a_typed_documented_function(name):
    entry = ENTRIES[name]
    if needs_extra(entry):
        pytest.skip(f"{entry.extra[1]} extra not installed")
    import docstring_parser

    function = entry.function()
    hints = typing.get_type_hints(function)
    parameters = inspect.signature(function).parameters
    documented = {p.arg_name for p in docstring_parser.parse(function.__doc__ or "").params}
    assert function.__doc__ and function.__doc__.strip().splitlines()[0], name
    for parameter in parameters:
        assert parameter in hints, f"{name}: --{parameter} has no type"
        assert parameter in documented, f"{name}: --{parameter} has no help line"
    if entry.positional is not None:
        assert entry.positional in parameters


def test_the_top_level_help_is_generated_from_the_table(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in [*LIGHTNING, *COMMANDS]:
        assert f"\n    {name} " in out or f"\n    {name}\n" in out, name
    # each line is the function's own first docstring line
    from ptm_app.experiments.report import report

    first = report.__doc__.strip().splitlines()[0].rstrip(".")
    assert " ".join(first.split()[:4]) in " ".join(out.split())


@pytest.mark.parametrize("name", ["embed", "report", "data prepare", "prune", "probe"])
def test_a_commands_help_lists_every_parameter(name, capsys):
    entry = ENTRIES[name]
    assert main([*name.split(), "--help"]) == 0  # main returns, it does not leak jsonargparse's SystemExit
    out = capsys.readouterr().out
    for parameter in inspect.signature(entry.function()).parameters:
        assert f"--{parameter} " in out or f"--{parameter}\n" in out, parameter


@pytest.mark.parametrize("argv, line", [
    (["exprot", "--ckpt_path", "x"], "error: unknown command 'exprot'; did you mean 'export'? use one of fit,"),
    (["embed", "--ckpt_pth", "x"], "error: unknown command-line argument --ckpt_pth x; did you mean --ckpt_path?"),
    (["embed"], "error: embed needs --ckpt_path; python main.py embed --help lists the options"),
    (["prune", "--ckpt_path", "x"], "error: prune needs --output_dir; python main.py prune --help"),
    (["report"], "error: report needs RUNS; python main.py report --help"),
    (["embed", "--ckpt_path", "x", "--pooling", "max"], "error: pooling: max is not one of cls, mean, scalar_mix"),
    (["generate", "--ckpt_path", "x", "--prompt", "a", "--max_new_tokens", "many"],
     "error: max_new_tokens: many is not an integer"),
    (["serve", "--ckpt_path", "x", "--batch_timeout", "soon"], "error: batch_timeout: soon is not a number"),
    (["data", "frobnicate"], "error: unknown data command 'frobnicate'; use one of prepare, list"),
    (["sweep", "a.yaml", "b.yaml"], "error: one PLAN is expected, got 2: a.yaml b.yaml"),
])
def test_bad_input_is_one_line_naming_the_option(argv, line, capsys):
    if argv[0] == "serve" and needs_extra(ENTRIES["serve"]):
        pytest.skip("serve extra not installed")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(line), err


def test_a_bad_option_from_a_real_process_is_one_line_without_usage_or_traceback(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "main.py"), "quantize", "--ckpt_path", "x", "--output_dir",
                          str(tmp_path / "q"), "--backend", "int4"], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 2
    assert out.stderr.strip() == ("error: backend: int4 is not one of torch_ao, weight_only, q8bert_static "
                                  "(python main.py quantize --help lists the options)"), out.stderr[-1500:]
    assert out.stdout == ""


def test_options_reach_the_function_in_jsonargparse_form():
    from ptm_app.inference.embed import embed
    from ptm_app.experiments.report import report

    # repeated and several-after-one list options are one list; a bool option may stand alone
    assert command_argv(embed, ["--ckpt_path", "m", "--text", "a b", "--normalize", "--text", "c", "d",
                                "--similarity"], None) == \
        ["--ckpt_path", "m", "--text", '["a b", "c", "d"]', "--normalize", "true", "--similarity", "true"]
    assert command_argv(embed, ["--text=x", "--normalize", "false"], None) == ["--text", '["x"]', "--normalize",
                                                                                "false"]
    # leading bare values fill the positional list; a YAML list given whole stays as it is
    assert command_argv(report, ["r1", "r2", "--stages", "test"], "runs") == \
        ["--runs", '["r1", "r2"]', "--stages", '["test"]']
    assert command_argv(report, ["--runs", "[a, b]"], "runs") == ["--runs", "[a, b]"]
    assert command_argv(embed, ["--text", "[CLS] is a token"], None) == ["--text", '["[CLS] is a token"]']


@pytest.mark.parametrize("argv, ours", [
    (["--ckpt_path", "run", "--text", "a"], True),
    (["--ckpt_path", "run", "--input=f.jsonl"], True),
    (["--ckpt_path", "run", "--question", "q", "--context", "c"], True),
    (["--ckpt_path", "run"], True),  # a given-inputs run missing its inputs: told so in one line
    (["--help"], True),
    (["--config", "c.yaml"], False),
    (["--config", "c.yaml", "--ckpt_path", "best"], False),
    (["-c", "c.yaml", "--help"], False),
])
def test_predict_goes_to_lightning_only_with_a_config(argv, ours):
    assert given_texts(argv) is ours


def test_no_hand_written_parser_is_left():
    found = [str(p.relative_to(ROOT)) for p in (ROOT / "ptm_app").rglob("*.py")
             if "argparse.ArgumentParser" in p.read_text() or "USAGE = " in p.read_text()]
    assert found == []


def test_top_level_help_imports_no_command_module():
    """``python main.py --help`` reads the summaries from the sources: no command module (nor torch) is imported,
    so it answers at once."""
    import subprocess
    import sys

    code = ("import sys; from ptm_app.main import print_help; print_help(); "
            "loaded = [m for m in sys.modules if m.startswith(('torch', 'lightning', 'ptm_app.inference', "
            "'ptm_app.experiments', 'ptm_app.analysis'))]; print('LOADED', loaded)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "LOADED []" in out
    assert "Export a ptm_app checkpoint" in out and "knowledge-report" in out
