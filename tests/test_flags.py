"""Every command held to one vocabulary of flags (docs/cli.md), every help page to one screen.

The vocabulary is `transduce.cli.options.VOCABULARY`: one name per concept wherever the concept
appears, and no other: the spellings of the versions before it are refused, as any unknown flag."""

import argparse
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from transduce.cli import SUBCOMMANDS, build_parser, main
from transduce.cli.options import LENGTH_PENALTIES, SHORT_FORMS, VOCABULARY, WIDTH

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src"), "COLUMNS": "200"}


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


PARSERS = subparsers()

REFUSED = {  # command -> a spelling of an earlier, unreleased version -> argv that uses it: refused
    "translate": {
        "--output": ["m", "--output", "x"],
        "--max-tokens": ["m", "--max-tokens", "7"],
        "--max-input-tokens": ["m", "--max-input-tokens", "7"],
        "--alpha": ["m", "--alpha", "0.6"],
        "--ct2-length-penalty": ["m", "--ct2-length-penalty", "ct2"],
    },
    "parse": {
        "--output": ["m", "--output", "x"],
        "--max-input-tokens": ["m", "--max-input-tokens", "7"],
        "--alpha": ["m", "--alpha", "0.3"],
    },
    "evaluate": {
        "--save-hyp": ["m", "--save-hyp", "x"],
        "--src-file": ["m", "--src-file", "x"],
        "--max-input-tokens": ["m", "--max-input-tokens", "7"],
        "--alpha": ["m", "--alpha", "1"],
    },
    "average": {"--force": ["r", "--force"], "--last": ["r", "--last", "3"]},
    "export": {"--force": ["ct2", "m", "-o", "x", "--force"]},
    "prepare": {"--no-progress": ["-o", "x", "--no-progress"], "--force": ["-o", "x", "--force"]},
    "train": {
        "--max-tokens": ["--run-dir", "r", "--max-tokens", "7"],
        "--no-progress": ["--run-dir", "r", "--no-progress"],
        "--resume": ["--run-dir", "r", "--resume"],
    },
    "experiment": {
        "--updates": ["--data", "d", "-o", "x", "--max-steps", "1", "--updates", "7"],
        "--max-tokens": ["--data", "d", "-o", "x", "--max-steps", "1", "--max-tokens", "7"],
        "--save-every": ["--data", "d", "-o", "x", "--max-steps", "1", "--save-every", "7"],
        "--no-progress": ["--data", "d", "-o", "x", "--max-steps", "1", "--no-progress"],
        "--average": ["--data", "d", "-o", "x", "--max-steps", "1", "--average"],
    },
    "serve": {
        "--max-tokens": ["m", "--max-tokens", "7"],
        "--alpha": ["m", "--alpha", "1"],
        "--ct2-length-penalty": ["m", "--ct2-length-penalty", "ct2"],
    },
    "attention": {
        "--max-tokens": ["m", "--max-tokens", "7"],
        "--max-input-tokens": ["m", "--max-input-tokens", "7"],
        "--target": ["m", "a", "--target", "x"],
        "-t": ["m", "a", "-t", "x"],
        "--alpha": ["m", "a", "--alpha", "1"],
    },
    "synthetic": {"--save": ["--save", "x"]},
}
"""Every spelling an earlier version accepted as a hidden alias (for a version never released):
each now an unknown flag, and no prefix of a flag either (abbreviations are off)."""

DEST = {
    ("train", "max_tokens"): "batch_tokens",
    ("train", "progress"): "quiet",
    **{(c, "max_input_tokens"): "truncate_input" for c in ("translate", "evaluate", "parse")},
}
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
    m = re.fullmatch(r"details: transduce docs (\w+)(?: (\w+))?(?: \(and ([\w, ]+)\))?", details[0])
    assert m, (command, details[0])  # a page a wheel's user can reach: `transduce docs TOPIC [SECTION]`
    for topic in [m.group(1), *(m.group(3) or "").replace(",", " ").split()]:
        assert (REPO / "docs" / f"{topic}.md").is_file(), (command, topic)
    if m.group(2):
        assert re.search(
            rf"^#+ {m.group(2)}\b", (REPO / "docs" / f"{m.group(1)}.md").read_text(encoding="utf-8"), re.M | re.I
        )
    examples = [
        line
        for line in lines
        if line.startswith("  transduce ") or line.startswith("  torchrun ") or line.startswith("  echo ")
    ]
    assert 2 <= len(examples) <= 4, command
    wrapped = [line for line in lines if re.match(r" {20,}\S", line)]  # an option's help continued
    assert not wrapped, (command, wrapped)


def test_the_help_does_not_depend_on_the_terminal():
    out = [
        subprocess.run(
            [sys.executable, "-m", "transduce", "translate", "--help"],
            capture_output=True,
            text=True,
            env={**ENV, "COLUMNS": str(cols)},
            check=True,
        ).stdout
        for cols in (60, 200)
    ]
    assert out[0] == out[1]


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_no_option_uses_an_old_spelling(command):
    text = help_of(command)
    for old in {o for olds in REFUSED.values() for o in olds}:
        if not any(old in a.option_strings for a in PARSERS[command]._actions):
            assert not re.search(re.escape(old) + r"(?![\w-])", text), f"transduce {command} --help shows {old}"


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_each_concept_has_its_one_name(command):
    """Wherever a concept of the vocabulary is a flag, it is the vocabulary's name (and short
    form), shown in the help; and a flag named as a concept sets that concept."""
    for action in PARSERS[command]._actions:
        if not action.option_strings:
            continue
        concept = concept_of(command, action)
        if concept is not None and action.help == argparse.SUPPRESS:  # --bf16, --int8: --precision in one word
            assert set(action.option_strings) <= SHORT_FORMS, (command, action.option_strings)
        elif concept is not None:
            assert concept.name in action.option_strings, (command, action.option_strings, concept.name)
            if concept.short:
                assert concept.short in action.option_strings, (command, concept.name)
        for c in VOCABULARY:
            if c.name in action.option_strings:
                assert concept is c, (command, c.name, action.dest)


@pytest.mark.parametrize("command, old", [(c, o) for c, olds in REFUSED.items() for o in olds])
def test_every_old_spelling_is_refused(command, old, capsys):
    """An earlier version's spelling is an unknown flag: status 2 and argparse's line naming it."""
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args([command, *REFUSED[command][old]])
    assert stop.value.code == 2
    assert f"unrecognized arguments: {old}" in capsys.readouterr().err


def test_no_hidden_flag_but_the_short_forms():
    """What the help does not show is --precision's one-word forms and --src-vocab's partner: no
    alias kept for an old name."""
    for command, parser in PARSERS.items():
        for action in parser._actions:
            if action.option_strings and action.help == argparse.SUPPRESS:
                assert set(action.option_strings) <= SHORT_FORMS | {"--tgt-vocab"}, (command, action.option_strings)


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
        if "--vocab" in action.option_strings:
            assert action.metavar == "PATH" and "PATH's vocabulary" in action.help, command  # the vocabulary of PATH
        if "--length-penalty" in action.option_strings:
            assert type(action).__name__ == "LengthPenalty" and action.metavar == "F:A", command


def test_evaluate_json_never_swallows_model():
    args = build_parser().parse_args(["evaluate", "--json", "report.json", "runs/multi30k-en-de"])
    assert (args.json, str(args.model_path)) == ("report.json", "runs/multi30k-en-de")
    assert build_parser().parse_args(["evaluate", "runs/base", "--json", "-"]).json == "-"


def test_the_decoding_flags_have_the_same_defaults_wherever_they_decode_as_translate():
    """attention's translation decodes as translate does (6.1): the same flags, the same defaults."""
    parser = build_parser()
    translate = parser.parse_args(["translate", "m"])
    attention = parser.parse_args(["attention", "m", "a"])
    for name in (
        "beam",
        "length_penalty",
        "alpha",
        "max_len_offset",
        "greedy",
        "device",
        "threads",
        "checkpoint",
        "average",
        "vocab",
    ):
        assert getattr(attention, name) == getattr(translate, name), name
    assert (translate.beam, translate.length_penalty, translate.alpha, translate.max_len_offset) == (4, "gnmt", 0.6, 50)
    parse = parser.parse_args(["parse", "m"])
    assert (parse.beam, parse.alpha, parse.max_len_offset) == (21, 0.3, 300)  # 6.3
    shared = {"--beam", "--length-penalty", "--max-len-offset", "--device", "--threads", "--checkpoint", "--vocab"}
    for command in ("translate", "evaluate", "parse", "serve", "attention"):
        flags = {s for a in PARSERS[command]._actions for s in a.option_strings}
        assert shared <= flags, command


# --- --length-penalty: one flag, its value names the formula ------------------------------------


@pytest.mark.parametrize(
    "argv, formula, alpha",
    [
        (["translate", "m"], "gnmt", 0.6),  # 6.1's
        (["translate", "m", "--length-penalty", "gnmt:1.2"], "gnmt", 1.2),
        (["translate", "m", "--length-penalty", "gnmt"], "gnmt", 0.6),  # a bare formula: its own default alpha
        (["translate", "m", "--length-penalty", "hf"], "hf", 1.0),  # generate's default
        (["translate", "m", "--length-penalty", "ct2:0.5", "--engine", "ct2"], "ct2", 0.5),
        (["translate", "m", "--length-penalty", "none"], "none", 0.0),
        (["parse", "m"], "gnmt", 0.3),  # 6.3's
        (["parse", "m", "--length-penalty", "gnmt"], "gnmt", 0.3),
        (["evaluate", "m", "--length-penalty", "gnmt"], "gnmt", None),  # the task's, once the model is known
        (["serve", "m", "--length-penalty", "gnmt:0.8"], "gnmt", 0.8),
    ],
)
def test_the_length_penalty_names_its_formula_and_alpha(argv, formula, alpha):
    from transduce.cli.common import check_length_penalty

    args = build_parser().parse_args(argv)
    if alpha is not None:
        check_length_penalty(args)
    assert (args.length_penalty, args.alpha) == (formula, alpha)
    assert formula in LENGTH_PENALTIES


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--length-penalty", "paper"], "--length-penalty paper: the formula is one of gnmt, hf, ct2, none"),
        (["--length-penalty", "gnmt:nan"], "--length-penalty gnmt:nan: alpha must be a finite number >= 0"),
        (["--length-penalty", "gnmt:-1"], "--length-penalty gnmt:-1: alpha must be a finite number >= 0"),
        (["--length-penalty", "gnmt:x"], "--length-penalty gnmt:x: alpha must be a finite number >= 0"),
        (["--length-penalty", "none:1"], "--length-penalty none:1: none takes no alpha"),
        (["--length-penalty", "ct2"], "--length-penalty ct2: --engine torch takes gnmt, hf, none"),
        (["--engine", "ct2", "--length-penalty", "hf"], "--length-penalty hf: --engine ct2 takes gnmt, ct2, none"),
    ],
)
def test_a_bad_length_penalty_is_one_line(tmp_path, capsys, flags, message):
    assert main(["translate", str(tmp_path / "no-such-model"), *flags]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"transduce translate: error: {message}"), err


def test_parsing_and_attention_take_the_papers_penalty_or_none(tmp_path, capsys):
    for argv in (
        ["parse", str(tmp_path / "m"), "--length-penalty", "hf"],
        ["attention", str(tmp_path / "m"), "a", "--length-penalty", "hf:1", "--json", str(tmp_path / "a.json")],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.splitlines()
        assert err == [f"transduce {argv[0]}: error: --length-penalty hf: {argv[0]} takes gnmt, none"], err


# --- `transduce --help` and `--version` ------------------------------------------------------------


def test_the_top_level_help_lists_each_subcommand_once_without_importing_torch():
    code = (
        "import sys\nfrom transduce.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'transduce --help imported torch'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) <= 30
    for command in SUBCOMMANDS:
        assert sum(1 for line in lines if line.split()[:1] == [command]) == 1, command


def test_docs_prints_a_page_without_importing_torch():
    code = (
        "import sys\nfrom transduce.cli import main\n"
        "assert main(['docs', 'masks']) == 0\n"
        "assert main(['docs', 'cli', 'prepare']) == 0\n"
        "assert 'torch' not in sys.modules, 'transduce docs imported torch'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith((REPO / "docs" / "masks.md").read_text(encoding="utf-8"))
    assert "\n## prepare\n" in out.stdout and "\n## synthetic" not in out.stdout


def test_docs_names_the_nearest_page_in_one_line(capsys):
    assert main(["docs", "trainig"]) == 2
    assert capsys.readouterr().err == "transduce docs: error: no page 'trainig'; did you mean 'training'?\n"
    assert main(["docs", "cli", "nothing"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("transduce docs: error: transduce docs cli has no section 'nothing'; its sections: ")
        and "\n" == err[-1]
    )


def test_version_is_the_installed_one_and_imports_no_torch():
    code = (
        "import sys\nfrom transduce.cli import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'transduce --version imported torch'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"transduce {version('transduce')}\n"


# --- suggestions, inputs checked first ------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, line",
    [
        (["info", "--preset", "multi30"], "unknown preset 'multi30'; did you mean 'multi30k'?"),
        (["info", "--set", "model.norm_frist=true"], "no field model.norm_frist; did you mean model.norm_first?"),
        (["info", "--set", "trian.warmup_steps=10"], "did you mean train.warmup_steps?"),
        (["train", "--data", ".", "--run-dir", "r", "--preset", "multi30"], "did you mean 'multi30k'?"),
    ],
)
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
    argv = [
        "prepare",
        "--train-src",
        str(text),
        "--train-tgt",
        str(text),
        "--valid-src",
        str(text),
        "--valid-tgt",
        str(tmp_path / "nope.txt"),
        "-o",
        str(out),
    ]
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
    code = (
        "import sys\nfrom transduce.cli import main\n"
        f"try:\n    main([{command!r}, '--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('torch', 'numpy', 'safetensors', 'transduce.model', 'transduce.config') "
        "if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: transduce {command}")


def test_the_defaults_module_imports_nothing_heavy():
    """`transduce.defaults`, which every parser and the library read, imports nothing but the
    standard library (the package's own `__init__` included) and no other module of transduce; with
    every subcommand's parser built, still no PyTorch: checked in a fresh interpreter."""
    code = (
        "import sys\nbefore = set(sys.modules)\nimport transduce.defaults\n"
        "new = set(sys.modules) - before\n"
        "other = sorted(m for m in new if m.split('.')[0] not in sys.stdlib_module_names | {'transduce'})\n"
        "ours = sorted(m for m in new if m.split('.')[0] == 'transduce')\n"
        "assert not other and ours == ['transduce', 'transduce.defaults'], (other, ours)\n"
        "from transduce.cli import build_parser\nbuild_parser()\n"
        "heavy = sorted(m for m in ('torch', 'numpy', 'safetensors', 'transduce.model', 'transduce.config') "
        "if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert out.returncode == 0, out.stderr


LIBRARY_DEFAULTS = {  # "module:NAME", or "module:owner.name" (a dataclass field's or a parameter's default) -> its name there
    "transduce.decoding.search:beam_search.beam_size": "BEAM",
    "transduce.decoding.search:beam_search.alpha": "ALPHA",
    "transduce.decoding.search:beam_search.max_len_offset": "MAX_LEN_OFFSET",
    "transduce.decoding.search:greedy_decode.max_len_offset": "MAX_LEN_OFFSET",
    "transduce.decoding.settings:SearchSettings.beam": "BEAM",
    "transduce.decoding.settings:SearchSettings.alpha": "ALPHA",
    "transduce.decoding.settings:SearchSettings.max_len_offset": "MAX_LEN_OFFSET",
    "transduce.decoding.translate:translate_stream.batch_tokens": "BATCH_TOKENS",
    "transduce.decoding.translate:translate_stream.batch_size": "BATCH_SIZE",
    "transduce.decoding.translate:translate_stream.chunk_lines": "CHUNK_LINES",
    "transduce.decoding.translate:translate_stream.max_input_tokens": "MAX_INPUT_TOKENS",
    "transduce.parsing.parse:parse_stream.beam": "PARSE_BEAM",
    "transduce.parsing.parse:parse_stream.alpha": "PARSE_ALPHA",
    "transduce.parsing.parse:parse_stream.max_len_offset": "PARSE_MAX_LEN_OFFSET",
    "transduce.parsing.parse:parse_stream.batch_size": "PARSE_BATCH_SIZE",
    "transduce.precision:PRECISIONS": "PRECISIONS",
    "transduce.precision:DECODING_PRECISIONS": "DECODING_PRECISIONS",
    "transduce.data.vocab:train_vocab.vocab_size": "VOCAB_SIZE",
    "transduce.data.prepare:prepare.sample_size": "VOCAB_SAMPLE",
    "transduce.data.prepare:prepare.character_coverage": "CHARACTER_COVERAGE",
    "transduce.data.text:FilterReport.max_len": "MAX_LEN",
    "transduce.data.text:FilterReport.max_ratio": "MAX_RATIO",
    "transduce.parsing.data:prepare_treebank.vocab_size": "TREE_VOCAB_SIZE",
    "transduce.parsing.data:prepare_treebank.max_len": "TREE_MAX_LEN",
    "transduce.views.weights:TYPES": "ATTENTION_TYPES",
    "transduce.views.weights:attention_data.max_tokens": "ATTENTION_MAX_TOKENS",
    "transduce.serve.common:Limits.max_body_bytes": "SERVE_MAX_BODY_BYTES",
    "transduce.serve.common:Limits.max_sentences": "SERVE_MAX_SENTENCES",
    "transduce.serve.common:Limits.max_chars": "SERVE_MAX_CHARS",
    "transduce.serve.common:Limits.max_tokens": "SERVE_MAX_TOKENS",
    "transduce.serve.common:Limits.max_queue": "SERVE_MAX_QUEUE",
    "transduce.serve.common:Limits.max_beam": "SERVE_MAX_BEAM",
    "transduce.serve.common:Limits.max_len_offset": "SERVE_MAX_LEN_OFFSET",
    "transduce.serve.batcher:Batcher.max_wait": "SERVE_MAX_WAIT",
    "transduce.serve.listen:server.graceful_timeout": "SERVE_GRACEFUL_TIMEOUT",
    "transduce.experiments.plan:TABLE3": "TABLE3",
}
"""Where the library takes a default that a help page shows: each is `transduce.defaults`' own."""


@pytest.mark.parametrize("where, name", LIBRARY_DEFAULTS.items())
def test_the_library_takes_its_defaults_from_the_defaults_module(where, name):
    import dataclasses
    import importlib
    import inspect

    import transduce.defaults

    module, _, attr = where.partition(":")
    owner, _, parameter = attr.partition(".")
    found = getattr(importlib.import_module(module), owner)
    if parameter and dataclasses.is_dataclass(found):
        found = next(f.default for f in dataclasses.fields(found) if f.name == parameter)
    elif parameter:
        found = inspect.signature(found).parameters[parameter].default
    assert found is getattr(transduce.defaults, name), where


def test_the_help_shows_the_defaults_modules_values():
    """A help page's default is the value the library runs with: `transduce.defaults`' (serve's
    search defaults: translation's and the parser's, chosen by the model)."""
    from transduce import defaults

    serve = " ".join(help_of("serve").split())
    for shown in (
        f"default {defaults.BEAM}; parser {defaults.PARSE_BEAM}",
        f"default {defaults.SERVE_MAX_QUEUE})",
        f"default {defaults.SERVE_GRACEFUL_TIMEOUT:g})",
        f"default {defaults.SERVE_MAX_WAIT * 1000:g})",
    ):
        assert shown in serve, shown
    translate = build_parser().parse_args(["translate", "m"])
    assert (
        translate.beam,
        translate.alpha,
        translate.max_len_offset,
        translate.batch_size,
        translate.batch_tokens,
        translate.chunk_lines,
        translate.max_input_tokens,
    ) == (
        defaults.BEAM,
        defaults.ALPHA,
        defaults.MAX_LEN_OFFSET,
        defaults.BATCH_SIZE,
        defaults.BATCH_TOKENS,
        defaults.CHUNK_LINES,
        defaults.MAX_INPUT_TOKENS,
    )


def test_train_config_flags_have_the_config_fields_types():
    from transduce.cli.fields import field_type
    from transduce.cli.train import CONFIG_FLAGS
    from transduce.config import TrainConfig

    for dest, (name, kind, _, _) in CONFIG_FLAGS.items():
        assert field_type(TrainConfig, name) is kind, dest
