"""`transduce train --lr PEAK`: the schedule's peak as Hugging Face's and fairseq's users give it
(equation 3 scaled to reach PEAK at step --warmup), refused with --lr-scale or when not positive;
and the one line that says a regime is sized for GPUs when it would train on a CPU for days."""

import math

import pytest

from train_data import make_data
from transduce.cli import build_parser
from transduce.cli.train import resolve_config, say_if_sized_for_gpus
from transduce.config import get_preset
from transduce.errors import UsageError
from transduce.train.options import BASE_CPU_TOKENS_PER_S, TrainOptions, cpu_hours, lr_scale_for_peak
from transduce.train.schedule import learning_rate


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_data(tmp_path_factory.mktemp("data") / "data")


def config_for(data, tmp_path, *flags):
    args = build_parser(only="train").parse_args(
        ["train", "--data", str(data), "--run-dir", str(tmp_path / "run"), "--preset", "small", *flags]
    )
    return resolve_config(args)[0]


@pytest.mark.parametrize("peak, warmup", [(1e-3, 100), (3e-5, 4000), (5e-4, 1)])
def test_lr_is_the_peak_of_equation_3(data, tmp_path, peak, warmup):
    t = config_for(data, tmp_path, "--lr", str(peak), "--warmup", str(warmup)).train
    d_model = get_preset("small").model.d_model
    assert t.warmup_steps == warmup and t.lr_scale == pytest.approx(lr_scale_for_peak(peak, d_model, warmup))
    rates = [learning_rate(step, d_model, warmup, t.lr_scale) for step in range(1, 2 * warmup + 2)]
    assert max(rates) == pytest.approx(peak) and rates.index(max(rates)) + 1 == warmup


def test_lr_with_the_presets_warmup(data, tmp_path):
    t = config_for(data, tmp_path, "--lr", "2e-4").train
    assert learning_rate(t.warmup_steps, 256, t.warmup_steps, t.lr_scale) == pytest.approx(2e-4)
    assert config_for(data, tmp_path).train.lr_scale == 1.0  # without it: the preset's factor


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--lr", "1e-4", "--lr-scale", "2"],
            "give --lr (the peak rate) or --lr-scale (equation 3's factor), not both",
        ),
        (["--lr", "0"], "--lr must be a positive rate, not 0"),
        (["--lr=-1e-3"], "--lr must be a positive rate, not -0.001"),
        (["--lr", "nan"], "--lr must be a positive rate, not nan"),
    ],
)
def test_bad_lr_is_a_one_line_error(data, tmp_path, flags, message):
    with pytest.raises(UsageError) as e:
        config_for(data, tmp_path, *flags)
    assert str(e.value) == message


def test_base_on_a_cpu_says_it_wants_gpus(capsys):
    """The yardstick is base's own measured rate: its 100,000 steps of 25,000 tokens take
    2.5e9 / 545 s on 2 cores; a laptop preset says nothing."""
    base = get_preset("base")
    assert cpu_hours(base, 2) == pytest.approx(100_000 * 25_000 / BASE_CPU_TOKENS_PER_S / 3600)
    assert cpu_hours(base, 4) == pytest.approx(cpu_hours(base, 2) / 2)
    say_if_sized_for_gpus(base, TrainOptions(device="cpu", threads=2))
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and "sized for GPUs" in line and "--preset multi30k" in line
    assert f"about {math.floor(cpu_hours(base, 2) / 24 + 0.5):,} days" in line
    for name in ("multi30k", "tiny", "parse-cpu"):
        say_if_sized_for_gpus(get_preset(name), TrainOptions(device="cpu", threads=2))
    assert capsys.readouterr().out == ""
