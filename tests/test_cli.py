import subprocess
import sys

from transduce.cli import main


def test_info_prints_config_and_parameter_count(capsys):
    assert main(["info", "--preset", "table3-C4"]) == 0
    out = capsys.readouterr().out
    assert '"d_model": 256' in out and "parameters:" in out and "Table 3: 28M" in out


def test_info_all_table(capsys):
    assert main(["info", "--all"]) == 0
    out = capsys.readouterr().out
    assert "table3-E" in out and "big" in out and "213M" in out


def test_info_bad_override_is_one_line_error(capsys):
    assert main(["info", "--set", "model.nope=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("transduce info: error:")


def test_console_help_lists_subcommands():
    out = subprocess.run([sys.executable, "-m", "transduce.cli", "--help"], capture_output=True, text=True, check=True).stdout
    for cmd in ("info", "prepare", "train", "average", "translate", "evaluate", "synthetic"):
        assert cmd in out
