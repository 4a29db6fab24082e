"""Every command held to one vocabulary of flags (docs/cli.md), every help page to one screen.

The vocabulary is `transduce.cli.options.VOCABULARY`: one name per concept wherever the concept
appears, the old spellings hidden aliases that still set the same destination."""

import argparse
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from transduce.cli import SUBCOMMANDS, build_parser, main
from transduce.cli.options import OLD_SPELLINGS, VOCABULARY, WIDTH

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src"), "COLUMNS": "200"}


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


PARSERS = subparsers()

OLD = {  # command -> old spelling -> (argv that uses it, the destination, the value it must give)
    "translate": {"--output": (["m", "--output", "x"], "out", Path("x")),
                  "--max-tokens": (["m", "--max-tokens", "7"], "batch_tokens", 7),
                  "--max-input-tokens": (["m", "--max-input-tokens", "7"], "max_input_tokens", 7),
                  "--bf16": (["m", "--bf16"], "precision", "bf16"), "--int8": (["m", "--int8"], "precision", "int8")},
    "parse": {"--output": (["m", "--output", "x"], "out", Path("x")),
              "--max-input-tokens": (["m", "--max-input-tokens", "7"], "max_input_tokens", 7)},
    "evaluate": {"--save-hyp": (["m", "--save-hyp", "x"], "out", Path("x")),
                 "--src-file": (["m", "--src-file", "x"], "input", Path("x")),
                 "--max-input-tokens": (["m", "--max-input-tokens", "7"], "max_input_tokens", 7)},
    "average": {"--force": (["r", "--force"], "overwrite", True),
                "--last": (["r", "--last", "3"], "average", 3)},
    "export": {"--force": (["ct2", "m", "-o", "x", "--force"], "overwrite", True)},
    "prepare": {"--no-progress": (["-o", "x", "--no-progress"], "quiet", True),
                "--force": (["-o", "x", "--force"], "overwrite", True)},
    "train": {"--max-tokens": (["--run-dir", "r", "--max-tokens", "7"], "max_tokens", 7),
              "--no-progress": (["--run-dir", "r", "--no-progress"], "progress", False)},
    "experiment": {"--updates": (["--data", "d", "-o", "x", "--updates", "7"], "max_steps", 7),
                   "--max-tokens": (["--data", "d", "-o", "x", "--max-steps", "1", "--max-tokens", "7"],
                                    "update_tokens", 7),
                   "--save-every": (["--data", "d", "-o", "x", "--max-steps", "1", "--save-every", "7"],
                                    "save_every_steps", 7),
                   "--no-progress": (["--data", "d", "-o", "x", "--max-steps", "1", "--no-progress"], "quiet", True),
                   "--average": (["--data", "d", "-o", "x", "--max-steps", "1", "--average"], "score_averaged", True)},
    "serve": {"--max-tokens": (["m", "--max-tokens", "7"], "max_input_tokens", 7)},
    "attention": {"--max-tokens": (["m", "--max-tokens", "7"], "keep_tokens", 7),
                  "--max-input-tokens": (["m", "--max-input-tokens", "7"], "keep_tokens", 7),
                  "--target": (["m", "a", "--target", "x"], "target_text", ["x"]),
                  "-t": (["m", "a", "-t", "x"], "target_text", ["x"])},
    "synthetic": {"--save": (["--save", "x"], "out", "x")},
}

DEST = {("train", "max_tokens"): "batch_tokens", ("train", "progress"): "quiet",
        **{(c, "max_input_tokens"): "truncate_input" for c in ("translate", "evaluate", "parse")}}
"""train's flags set its TrainOptions fields, translate's --truncate-input the decoding option
`max_input_tokens`: the concept each of these destinations is."""


def concept_of(command: str, action: argparse.Action):
    dest = DEST.get((command, action.dest), action.dest)
    return next((c for c in VOCABULARY if c.dest == dest), None)


def help_of(command: str) -> str:
    return PARSERS[command].format_help()


def test_every_subcommand_has_a_parser():
    assert set(PARSERS) == set(SUBCOMMANDS)


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_help_page_is_one_screen(command):
    """At most 50 lines of at most 80 columns: a short description, examples, one line per
    option with its default, and where the details are (a doc that exists)."""
    text = help_of(command)
    lines = text.splitlines()
    assert len(lines) <= 50, f"transduce {command} --help: {len(lines)} lines"
    assert all(len(line) <= WIDTH for line in lines), [line for line in lines if len(line) > WIDTH]
    details = [line for line in lines if line.startswith("details: ")]
    assert len(details) == 1, command
    for doc in re.findall(r"docs/[\w.-]+\.md", details[0]):
        assert (REPO / doc).is_file(), doc
    examples = [line for line in lines if line.startswith("  transduce ") or line.startswith("  torchrun ")
                or line.startswith("  echo ")]
    assert 2 <= len(examples) <= 4, command
    wrapped = [line for line in lines if re.match(r" {20,}\S", line)]  # an option's help continued
    assert not wrapped, (command, wrapped)


def test_the_help_does_not_depend_on_the_terminal():
    out = [subprocess.run([sys.executable, "-m", "transduce", "translate", "--help"], capture_output=True, text=True,
                          env={**ENV, "COLUMNS": str(cols)}, check=True).stdout for cols in (60, 200)]
    assert out[0] == out[1]


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_no_visible_option_uses_an_old_spelling(command):
    text = help_of(command)
    for old in OLD_SPELLINGS:
        assert not re.search(re.escape(old) + r"(?![\w-])", text), f"transduce {command} --help shows {old}"


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_each_concept_has_its_one_name(command):
    """Wherever a concept of the vocabulary is a flag, it is the vocabulary's name (and short
    form), shown in the help; and a flag named as a concept sets that concept."""
    for action in PARSERS[command]._actions:
        if not action.option_strings:
            continue
        renamed = getattr(action, "renamed_to", None)
        if renamed is not None:  # a command's own old name (hidden_alias): its new name sets the same destination
            assert action.help == argparse.SUPPRESS
            assert any(renamed in a.option_strings and a.dest == action.dest and a.help != argparse.SUPPRESS
                       for a in PARSERS[command]._actions), (command, action.option_strings, renamed)
            continue
        concept = concept_of(command, action)
        if concept is not None and action.help == argparse.SUPPRESS:  # a hidden alias of its own
            assert set(action.option_strings) <= set(concept.old), (command, action.option_strings)
        elif concept is not None:
            assert concept.name in action.option_strings, (command, action.option_strings, concept.name)
            if concept.short:
                assert concept.short in action.option_strings, (command, concept.name)
        for c in VOCABULARY:
            if c.name in action.option_strings:
                assert concept is c, (command, c.name, action.dest)


@pytest.mark.parametrize("command, old", [(c, o) for c, olds in OLD.items() for o in olds])
def test_every_old_spelling_still_parses_to_the_new_destination(command, old):
    argv, dest, value = OLD[command][old]
    args = build_parser().parse_args([command, *argv])
    assert getattr(args, dest) == value


def test_the_old_spellings_are_all_tested():
    tested = {o for olds in OLD.values() for o in olds}
    assert OLD_SPELLINGS <= tested
    for command, parser in PARSERS.items():  # and every command's own hidden alias
        for action in parser._actions:
            if getattr(action, "renamed_to", None):
                assert set(action.option_strings) <= set(OLD.get(command, {})), (command, action.option_strings)


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_one_meaning_per_flag_name(command):
    """A visible flag name means one thing wherever it appears: the same destination and, for
    --average, always the number K of checkpoints averaged (never a switch)."""
    for action in PARSERS[command]._actions:
        if action.help == argparse.SUPPRESS:
            continue
        if "--average" in action.option_strings:
            assert action.dest == "average" and action.type is int and action.metavar == "K", command
        if "--max-input-tokens" in action.option_strings:  # serve's refusal; translate's cut is --truncate-input
            assert command == "serve" and "never cut" in action.help, command
        if "--tgt" in action.option_strings:
            assert action.metavar == "LANG", command  # a language; a target text is attention's --target-text
        if "--json" in action.option_strings:
            assert action.nargs is None, command  # always a FILE: never takes MODEL by surprise


def test_evaluate_json_never_swallows_model():
    args = build_parser().parse_args(["evaluate", "--json", "report.json", "runs/multi30k-en-de"])
    assert (args.json, str(args.model_path)) == ("report.json", "runs/multi30k-en-de")
    assert build_parser().parse_args(["evaluate", "runs/base", "--json", "-"]).json == "-"


def test_a_commands_own_old_name_says_its_new_name(tmp_path, capsys):
    assert main(["translate", str(tmp_path / "nope"), "--max-input-tokens", "5"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("transduce translate: note: --max-input-tokens is now --truncate-input "
                      "(the old name goes in a later release)"), err
    assert len(err) == 2 and err[1].startswith("transduce translate: error: ")
    assert main(["experiment", "--data", str(tmp_path / "nope"), "-o", str(tmp_path / "x"), "--max-steps", "1",
                 "--average"]) == 2
    assert "--average is now --score-averaged" in capsys.readouterr().err


def test_an_old_spelling_says_its_new_name_on_one_line(tmp_path, capsys):
    missing = str(tmp_path / "missing.txt")
    argv = ["prepare", "--train-src", missing, "--train-tgt", missing, "--valid-src", missing, "--valid-tgt", missing,
            "-o", str(tmp_path / "out"), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "transduce prepare: note: --no-progress is now --quiet (the old name goes in a later release)"
    assert len(err) == 2 and err[1].startswith("transduce prepare: error: ")


def test_the_decoding_flags_have_the_same_defaults_wherever_they_decode_as_translate():
    """attention's translation decodes as translate does (6.1): the same flags, the same defaults."""
    parser = build_parser()
    translate = parser.parse_args(["translate", "m"])
    attention = parser.parse_args(["attention", "m", "a"])
    for name in ("beam", "alpha", "max_len_offset", "greedy", "device", "threads", "checkpoint", "average", "vocab"):
        assert getattr(attention, name) == getattr(translate, name), name
    assert (translate.beam, translate.alpha, translate.max_len_offset) == (4, 0.6, 50)
    parse = parser.parse_args(["parse", "m"])
    assert (parse.beam, parse.alpha, parse.max_len_offset) == (21, 0.3, 300)  # 6.3
    shared = {"--beam", "--alpha", "--max-len-offset", "--device", "--threads", "--checkpoint", "--vocab"}
    for command in ("translate", "evaluate", "parse", "serve", "attention"):
        flags = {s for a in PARSERS[command]._actions for s in a.option_strings}
        assert shared <= flags, command


# --- `transduce --help` and `--version` ------------------------------------------------------------


def test_the_top_level_help_lists_each_subcommand_once_without_importing_torch():
    code = ("import sys\nfrom transduce.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'transduce --help imported torch'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) <= 30
    for command in SUBCOMMANDS:
        assert sum(1 for line in lines if line.split()[:1] == [command]) == 1, command


def test_version_is_the_installed_one_and_imports_no_torch():
    code = ("import sys\nfrom transduce.cli import main\n"
            "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'transduce --version imported torch'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"transduce {version('transduce')}\n"


# --- suggestions, inputs checked first ------------------------------------------------------------


@pytest.mark.parametrize("argv, line", [
    (["info", "--preset", "multi30"], "unknown preset 'multi30'; did you mean 'multi30k'?"),
    (["info", "--set", "model.norm_frist=true"], "no field model.norm_frist; did you mean model.norm_first?"),
    (["info", "--set", "trian.warmup_steps=10"], "did you mean train.warmup_steps?"),
    (["train", "--data", ".", "--run-dir", "r", "--preset", "multi30"], "did you mean 'multi30k'?"),
])
def test_a_misspelled_preset_or_field_suggests_the_nearest(argv, line, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"transduce {argv[0]}: error: ") and err[0].endswith(line), err
    assert not (tmp_path / "r").exists()


def test_prepare_checks_every_input_file_before_any_work(tmp_path, capsys):
    text = tmp_path / "a.txt"
    text.write_text("a b\n")
    out = tmp_path / "out"
    argv = ["prepare", "--train-src", str(text), "--train-tgt", str(text), "--valid-src", str(text),
            "--valid-tgt", str(tmp_path / "nope.txt"), "-o", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"transduce prepare: error: {tmp_path / 'nope.txt'}: no such file\n"
    assert not out.exists()


def test_average_takes_dash_o(tmp_path, capsys):
    from test_train_average import _run_with_checkpoints

    _run_with_checkpoints(tmp_path / "run", 2)
    assert main(["average", str(tmp_path / "run"), "--average", "2", "-o", str(tmp_path / "avg")]) == 0
    assert (tmp_path / "avg" / "model.safetensors").is_file()


# --- every --help at once: no PyTorch, no library module that imports it --------------------------


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_help_imports_no_torch(command):
    """`transduce COMMAND --help` builds the command's parser from light modules only (the run
    functions import the library): checked in a fresh interpreter's sys.modules, not by timing."""
    code = ("import sys\nfrom transduce.cli import main\n"
            f"try:\n    main([{command!r}, '--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('torch', 'numpy', 'safetensors', 'transduce.model', 'transduce.config') "
            "if m in sys.modules)\n"
            "assert not heavy, heavy\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: transduce {command}")


def test_the_values_the_help_mirrors_are_the_librarys():
    """`transduce.cli.defaults` holds, for the help, values the library defines: each still equal."""
    import dataclasses
    import importlib

    from transduce.cli.defaults import MIRRORS

    for source, value in MIRRORS.items():
        module, _, name = source.partition(":")
        cls, _, field = name.partition(".")
        found = getattr(importlib.import_module(module), cls)
        if field:
            found = next(f.default for f in dataclasses.fields(found) if f.name == field)
        assert found == value, source


def test_train_config_flags_have_the_config_fields_types():
    from transduce.cli.fields import field_type
    from transduce.cli.train import CONFIG_FLAGS
    from transduce.config import TrainConfig

    for dest, (name, kind, _, _) in CONFIG_FLAGS.items():
        assert field_type(TrainConfig, name) is kind, dest
