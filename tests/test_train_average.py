"""Checkpoint averaging (Section 6.1): `transduce average RUN_DIR --average K`."""

import pytest
import torch

from transduce.checkpoint import load_model
from transduce.config import Config, ModelConfig, TrainConfig
from transduce.model import Transformer
from transduce.cli import main
from transduce.checkpoint import TrainingState, save_checkpoint
from transduce.train.step import build_optimizer


def _run_with_checkpoints(run_dir, n: int, separate: bool = False, average_last: int = 5):
    model_config = ModelConfig(src_vocab_size=20, n_layers=1, d_model=8, d_ff=16, n_heads=2)
    if separate:
        model_config = ModelConfig(
            src_vocab_size=20,
            tgt_vocab_size=17,
            share_embeddings=False,
            tie_output=False,
            n_layers=1,
            d_model=8,
            d_ff=16,
            n_heads=2,
        )
    config = Config(model=model_config, train=TrainConfig(average_last=average_last))
    states = []
    for step in range(1, n + 1):
        torch.manual_seed(step)
        model = Transformer(config.model)
        save_checkpoint(run_dir, model, config, build_optimizer(model, config), TrainingState(step=step), {})
        states.append({k: v.clone() for k, v in model.state_dict().items()})
    return states


def average(run_dir, last=None, out=None) -> int:
    """`transduce average RUN_DIR [--average K] [--out DIR]`."""
    return main(
        ["average", str(run_dir)] + (["--average", str(last)] if last else []) + (["--out", str(out)] if out else [])
    )


@pytest.mark.parametrize("separate", [False, True])
def test_average_of_two_is_the_elementwise_mean(tmp_path, separate):
    states = _run_with_checkpoints(tmp_path, 3, separate)
    out = tmp_path / "avg"
    assert average(tmp_path, last=2, out=out) == 0
    model, config = load_model(out)  # a model directory: loads strictly
    got = model.state_dict()
    for k, v in got.items():
        expected = ((states[1][k].double() + states[2][k].double()) / 2).float()  # the last two
        assert torch.equal(v, expected), k
    name = "encoder.layers.0.self_attn.in_proj.weight"
    assert not torch.equal(got[name], states[1][name]) and not torch.equal(got[name], states[2][name])
    # a shared (tied) matrix stays one matrix after averaging
    if not separate:
        assert model.encoder.embed.weight is model.decoder.embed.weight


def test_default_k_is_the_runs_average_last_and_default_output_dir(tmp_path, capsys):
    _run_with_checkpoints(tmp_path, 4, average_last=3)  # (5 for base, 20 for big)
    assert average(tmp_path) == 0
    assert "averaged 3 checkpoints (step_0000002 ... step_0000004)" in capsys.readouterr().out
    load_model(tmp_path / "avg_last3")


def test_too_few_checkpoints_is_a_clear_error(tmp_path, capsys):
    _run_with_checkpoints(tmp_path, 2)
    assert average(tmp_path, last=5) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("transduce average: error:") and "--average 2" in err and "\n" not in err
    assert average(tmp_path / "nope", last=1) == 2


def test_too_few_checkpoints_for_average_names_the_callers_flag(tmp_path):
    from transduce.checkpoint import load_for_inference

    _run_with_checkpoints(tmp_path, 2)
    with pytest.raises(ValueError) as e:
        load_for_inference(tmp_path, average=5)  # translate/evaluate/export --average 5: the same flag as average
    assert "use --average 2" in str(e.value) and "--last" not in str(e.value)
    with pytest.raises(ValueError, match="--average must be at least 1"):
        load_for_inference(tmp_path, average=0)


def test_a_damaged_checkpoint_is_a_one_line_error(tmp_path, capsys):
    _run_with_checkpoints(tmp_path, 2)
    weights = tmp_path / "checkpoints" / "step_0000002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert average(tmp_path, last=2) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("transduce average: error:") and "step_0000002" in err and "\n" not in err


def test_out_must_be_new_or_empty_and_never_the_run_or_its_checkpoints(tmp_path, capsys):
    run = tmp_path / "run"
    _run_with_checkpoints(run, 2)
    data = tmp_path / "data"  # e.g. a prepared data directory
    data.mkdir()
    (data / "data.json").write_text("{}")

    def refused(*argv: str) -> str:
        capsys.readouterr()
        assert main(["average", str(run), "--average", "2", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("transduce average: error: ") and err.count("\n") == 1
        return err

    before = sorted(p.name for p in run.rglob("*"))
    assert "is not empty" in refused("--out", str(data)) and sorted(p.name for p in data.iterdir()) == ["data.json"]
    for out in (run, run / "checkpoints", run / "checkpoints" / "step_0000002", run / "checkpoints" / "x"):
        assert "is the run directory or one of its checkpoints" in refused("--out", str(out), "--overwrite")
    assert sorted(p.name for p in run.rglob("*")) == before  # nothing written into the run
    # --overwrite writes into a non-empty directory, keeping its other files; an empty one needs no --overwrite
    assert main(["average", str(run), "--average", "2", "--out", str(data), "--overwrite"]) == 0
    assert (data / "model.safetensors").is_file() and (data / "data.json").read_text() == "{}"
    (tmp_path / "empty").mkdir()
    assert average(run, last=2, out=tmp_path / "empty") == 0
    # the default RUN_DIR/avg_lastK is the command's own: written again without --overwrite
    assert average(run, last=2) == 0 and average(run, last=2) == 0
    # ... and so is an earlier average named as --out inside the run directory (scripts/multi30k.sh
    # run again), but not another model directory elsewhere
    assert main(["average", str(run), "--average", "2", "--out", str(run / "avg_last2")]) == 0
    assert "is not empty" in refused("--out", str(tmp_path / "empty"))
