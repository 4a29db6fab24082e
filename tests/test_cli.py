import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from transduce.cli import SUBCOMMANDS, main, report_errors
from transduce.errors import DataError, UsageError
from train_data import make_data

REPO = Path(__file__).resolve().parents[1]


def test_info_prints_config_and_parameter_count(capsys):
    assert main(["info", "--preset", "table3-C4"]) == 0
    out = capsys.readouterr().out
    assert '"d_model": 256' in out and "parameters:" in out and "Table 3: 28M" in out


def test_info_all_table(capsys):
    assert main(["info", "--all"]) == 0
    out = capsys.readouterr().out
    assert "table3-E" in out and "big" in out and "213M" in out


def test_info_says_the_vocabulary_it_counts_at_and_takes_a_datas(capsys, tmp_path):
    assert main(["info", "--all"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("parameters at a shared vocabulary of 37,000")
    # a parser's separate target vocabulary: the embeddings are then not shared
    assert main(["info", "--preset", "parse-cpu", "--vocab-size", "16000", "--tgt-vocab-size", "103"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert "at vocabularies of 16,000 (source) and 103 (target)" in last
    data = make_data(tmp_path / "data")
    assert main(["info", "--preset", "tiny", "--data", str(data)]) == 0
    out = capsys.readouterr().out
    from transduce.data.batching import read_metadata

    size = read_metadata(data)["vocab"]["size"]["src"]
    assert f'"src_vocab_size": {size}' in out and f"at a shared vocabulary of {size:,}" in out
    assert main(["info", "--data", str(tmp_path / "none")]) == 2
    assert "data.json: no such file" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--set", "model.nope=3"], "bad override"),
        (["--preset", "tiny", "--set", "model.dropout=0.1x"], "bad --set model.dropout=0.1x: expected a number"),
        (["--vocab-size", "-5"], "vocabulary sizes must be at least 1"),
        (["--tgt-vocab-size", "0"], "vocabulary sizes must be at least 1"),
    ],
)
def test_info_bad_override_is_one_line_error(argv, message, capsys):
    assert main(["info", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("transduce info: error:") and message in err[0]


def test_console_help_lists_subcommands():
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    out = subprocess.run(
        [sys.executable, "-m", "transduce", "--help"], capture_output=True, text=True, check=True, env=env
    ).stdout
    for cmd in ("info", "prepare", "train", "average", "translate", "evaluate", "synthetic", "experiment"):
        assert cmd in out


# --- the one error reporter -------------------------------------------------------------------------


def _bad_input(command: str, tmp: Path) -> tuple[list[str], str]:
    """A command line of `command` with bad input, and what its error message must say."""
    missing = str(tmp / "missing.txt")
    (tmp / "a_file").write_text("x\n")
    return {
        "info": (["--set", "model.nope=3"], "bad override"),
        "prepare": (
            [
                "--train-src",
                missing,
                "--train-tgt",
                missing,
                "--valid-src",
                missing,
                "--valid-tgt",
                missing,
                "--out",
                str(tmp / "out"),
                "--quiet",
            ],
            f"{missing}: no such file",
        ),
        "train": (["--data", str(tmp / "nope"), "--run-dir", str(tmp / "run")], "no such data directory"),
        "average": ([str(tmp / "nope")], "no such run directory"),
        "shortlist": ([str(tmp / "nope"), "--train-src", missing, "--train-tgt", missing], "no such directory"),
        "translate": ([str(tmp / "nope")], "no such directory"),
        "parse": ([str(tmp / "nope")], "no such directory"),
        "evaluate": (["--hyp", missing, "--ref", missing], "give --tgt LANG"),
        "synthetic": (["--max-steps", "0", "--out", str(tmp / "a_file" / "model")], "Not a directory"),  # an OSError
        "attention": ([str(tmp / "nope"), "a sentence", "--json", str(tmp / "a.json")], "no such directory"),
        "serve": ([str(tmp / "nope")], "no such directory"),
        "export": (["ct2", str(tmp / "nope"), "-o", str(tmp / "out")], "no such directory"),
        "import": ([str(tmp / "nope"), "-o", str(tmp / "out")], "no such directory"),
        "experiment": (["--data", str(tmp / "nope"), "--out", str(tmp / "out"), "--max-steps", "1"], "no such file"),
        "docs": (["no-such-page"], "no page 'no-such-page'"),
    }[command]


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_reports_bad_input_on_one_line_with_status_2(command, tmp_path, capsys):
    argv, message = _bad_input(command, tmp_path)
    assert main([command, *argv]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error" in line]  # (progress bars may draw lines too)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"transduce {command}: error: ") and message in lines[0], err


@pytest.mark.parametrize(
    "error, line",
    [
        (DataError("invalid UTF-8", "f.txt", 3), "f.txt:3: invalid UTF-8"),
        (UsageError("give --data DIR"), "give --data DIR"),
        (ValueError("two\nlines"), "two lines"),
        (KeyError("a key's message"), "a key's message"),
        (FileNotFoundError("runs/x: no such run directory"), "runs/x: no such run directory"),
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "x.txt"), "x.txt: No such file or directory"),
        (OSError(errno.ENOSPC, "No space left on device", "/out"), "/out: No space left on device"),
    ],
)
def test_the_reporter_turns_bad_input_into_one_line(error, line, capsys):
    def fail():
        raise error

    assert report_errors("transduce x", fail) == 2
    assert capsys.readouterr().err == f"transduce x: error: {line}\n"


def test_the_reporter_is_quiet_on_a_closed_pipe_and_says_interrupted(capsys):
    def closed():
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    def interrupted():
        raise KeyboardInterrupt

    assert report_errors("transduce x", closed) == 0
    assert capsys.readouterr().err == ""
    assert report_errors("transduce x", interrupted) == 130
    assert capsys.readouterr().err == "interrupted\n"
    assert report_errors("transduce x", lambda: None) == 0


def test_a_bug_is_not_bad_input():
    """Anything else is a bug: it keeps its traceback."""
    with pytest.raises(ZeroDivisionError):
        report_errors("transduce x", lambda: 1 / 0)


def test_train_flags_come_from_the_option_fields(tmp_path, capsys):
    """Every TrainOptions field is a flag; booleans on by default are --no-NAME; the options
    built back from the flags are the defaults when no flag is given."""
    import dataclasses

    from transduce.cli import build_parser
    from transduce.cli.fields import from_args
    from transduce.train.trainer import TrainOptions

    from transduce.cli.train import NO_FLAG, RENAMED

    parser = build_parser()
    args = parser.parse_args(["train", "--run-dir", str(tmp_path)])
    assert from_args(TrainOptions, args) == TrainOptions()
    args = parser.parse_args(
        [
            "train",
            "--run-dir",
            str(tmp_path),
            "--quiet",
            "--no-tensorboard",
            "--compile",
            "--batch-tokens",
            "40",
            "--max-minutes",
            "1.5",
            "--precision",
            "bf16",
        ]
    )
    got = from_args(TrainOptions, args)
    assert (got.progress, got.tensorboard, got.resume, got.compile) == (False, False, True, True)
    assert (got.max_tokens, got.max_minutes, got.precision) == (40, 1.5, "bf16")
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    train_help = capsys.readouterr().out
    for f in dataclasses.fields(TrainOptions):  # each under its own name, or the vocabulary's (RENAMED)
        if f.name in NO_FLAG:
            continue
        name = f.name.replace("_", "-")
        shown = RENAMED[f.name][0] if f.name in RENAMED else f"--no-{name}" if f.default is True else f"--{name}"
        assert shown in train_help, f.name
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--run-dir", str(tmp_path), "--precision", "fp64"])  # choices from the field
    data = make_data(tmp_path / "data")  # the TrainConfig flags land in the config
    from transduce.cli.train import resolve_config

    config, _ = resolve_config(
        parser.parse_args(
            [
                "train",
                "--data",
                str(data),
                "--run-dir",
                str(tmp_path / "run"),
                "--warmup",
                "3",
                "--save-every-minutes",
                "0",
                "--lr-scale",
                "2",
            ]
        )
    )
    assert (config.train.warmup_steps, config.train.checkpoint_minutes, config.train.lr_scale) == (3, 0.0, 2.0)


def test_every_command_but_the_extras_own_runs_without_the_optional_packages(tmp_path):
    """The first GPU machine had no pydantic: `transduce train` died building its parser, because
    `serve`'s options imported the HTTP app. The parser must build with every extra missing, and
    `train --help` must work."""
    extras = [
        "pydantic",
        "fastapi",
        "uvicorn",
        "prometheus_client",
        "ctranslate2",
        "transformers",
        "matplotlib",
        "playwright",
        "tensorboard",
    ]
    code = (
        "import sys\n"
        + "".join(f"sys.modules[{m!r}] = None\n" for m in extras)
        + "from transduce.cli import main\nsys.exit(main(['train', '--help']))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    assert out.returncode == 0, out.stderr
    assert "--max-minutes" in out.stdout


def test_ctrl_c_while_the_command_imports_torch_is_interrupted_not_a_traceback():
    """The first seconds of every command import torch (the subcommands' modules); a Ctrl-C there
    printed an import traceback. `import transduce.cli` itself no longer imports torch, so `main`
    catches it."""
    code = (
        "import signal, sys\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever the test runner's is\n"
        "import transduce.cli as cli\n"
        "assert 'torch' not in sys.modules, 'import transduce.cli imported torch'\n"
        "build = cli.build_parser\n"
        "def ready(only=None):  # say so from inside main, where the Ctrl-C must land\n"
        "    print('ready', flush=True)\n"
        "    return build(only)\n"
        "cli.build_parser = ready\n"
        "sys.exit(cli.main(['translate', 'no-model']))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGINT)  # torch takes a second or more to import: main is importing it
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and err == "interrupted\n", (proc.returncode, err)
