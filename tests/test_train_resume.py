"""Checkpoints: exact resume (dropout on) and atomic writes (a failed write keeps the old latest)."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from transduce.checkpoint import load_model
from transduce.config import Config, ModelConfig, TrainConfig
from transduce.model import Transformer
from transduce import checkpoint as checkpointing
from transduce.checkpoint import run_dir  # where save_checkpoint writes its tensors
from transduce.checkpoint import (
    TrainingState,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from train_data import VOCAB, make_data
from transduce.train.step import build_optimizer
from transduce.train.trainer import TrainOptions, train


def tiny_config(max_steps: int) -> Config:
    model = ModelConfig(
        src_vocab_size=VOCAB, n_layers=1, d_model=16, d_ff=32, n_heads=2, dropout=0.3, attention_dropout=0.1
    )
    return Config(model=model, train=TrainConfig(warmup_steps=4, max_steps=max_steps, checkpoint_minutes=0))


def options(**kw) -> TrainOptions:
    base = dict(
        max_tokens=48,
        update_freq=2,
        threads=1,
        progress=False,
        tensorboard=False,
        valid_every=3,
        save_every_steps=2,
        keep_last=0,
        log_every=2,
        seed=3,
        precision="fp32",
    )  # two fresh runs compared bit for bit: not auto's timed probe
    return TrainOptions(**{**base, **kw})


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory):
    run = tmp_path_factory.mktemp("full") / "run"
    result = train(tiny_config(9), data, run, options())
    return run, params(result.model)


def test_uninterrupted_run_crosses_epochs_and_writes_checkpoints(uninterrupted):
    run, _ = uninterrupted
    steps = [s for s, _ in list_checkpoints(run)]
    assert steps == [2, 4, 6, 8, 9]
    state = json.loads((run / "checkpoints" / "step_0000009" / "trainer_state.json").read_text())
    assert state["epoch"] >= 1  # the run went past an epoch boundary
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_0000009"


def test_resume_from_a_mid_run_checkpoint_is_exact(uninterrupted, data, tmp_path):
    """As if the process died after writing step 4: resume and finish; same bits as never stopping."""
    full_run, full_params = uninterrupted
    run = tmp_path / "run"
    shutil.copytree(full_run, run)
    for step, path in list_checkpoints(run):
        if step > 4:
            shutil.rmtree(path)
    (run / "checkpoints" / "latest").write_text("step_0000004\n")
    shutil.rmtree(run / "model")

    result = train(tiny_config(9), data, run, options(resume=True))
    assert result.step == 9
    assert_identical(params(result.model), full_params)
    model, _ = load_model(run / "model")
    assert_identical(params(model), full_params)


def test_stop_and_resume_is_exact(uninterrupted, data, tmp_path):
    """Stopped at step 3 (mid-epoch, odd step, dropout on), resumed to 9."""
    _, full_params = uninterrupted
    run = tmp_path / "run"
    first = train(tiny_config(3), data, run, options())
    assert first.step == 3 and latest_checkpoint(run).name == "step_0000003"
    result = train(tiny_config(9), data, run, options(resume=True))
    assert_identical(params(result.model), full_params)
    records = [json.loads(line) for line in (run / "logs" / "train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["type"] == "start"] == [0, 3]


def test_without_resume_a_run_dir_with_checkpoints_is_refused(uninterrupted, data, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(uninterrupted[0], run)
    with pytest.raises(Exception, match="run the same command again.*--restart"):
        train(tiny_config(9), data, run, options(resume=False))


# --- the command line: run the same command again and it resumes --------------------------------------

CLI = [
    "--preset",
    "base",
    "--set",
    "model.n_layers=1",
    "--set",
    "model.d_model=16",
    "--set",
    "model.d_ff=32",
    "--set",
    "model.n_heads=2",
    "--set",
    "model.dropout=0.3",
    "--warmup",
    "4",
    "--max-steps",
    "9",
    "--save-every-minutes",
    "0",
    "--batch-tokens",
    "48",
    "--update-freq",
    "2",
    "--valid-every",
    "3",
    "--save-every-steps",
    "2",
    "--keep-last",
    "0",
    "--log-every",
    "2",
    "--seed",
    "3",
    "--precision",
    "fp32",
    "--threads",
    "1",
    "--quiet",
    "--no-tensorboard",
]


def files(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


@pytest.fixture(scope="module")
def cli_run(data, tmp_path_factory):
    """`transduce train` run through to step 9 by one command."""
    from transduce.cli import main

    run = tmp_path_factory.mktemp("cli") / "run"
    assert main(["train", "--data", str(data), "--run-dir", str(run), *CLI]) == 0
    return run


def interrupted_copy(run: Path, to: Path, after: int) -> Path:
    """`run` as if its process had died after writing the checkpoint of step `after`."""
    shutil.copytree(run, to)
    for step, path in list_checkpoints(to):
        if step > after:
            shutil.rmtree(path)
    (to / "checkpoints" / "latest").write_text(f"step_{after:07d}\n")
    shutil.rmtree(to / "model")
    return to


def test_running_the_same_command_again_resumes_from_the_newest_intact_checkpoint(cli_run, data, tmp_path, capsys):
    """README: "run the same command again and it resumes from its newest intact checkpoint", and
    ends with the parameters of the run never stopped."""
    from transduce.cli import main

    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8").split())
    assert "run the same command again and it resumes from its newest intact checkpoint" in readme

    run = interrupted_copy(cli_run, tmp_path / "run", after=6)
    weights = run / "checkpoints" / "step_0000006" / "model.safetensors"
    damaged = bytearray(weights.read_bytes())
    damaged[-1] ^= 0xFF  # the newest checkpoint damaged: step 4 is the newest intact one
    weights.write_bytes(bytes(damaged))
    capsys.readouterr()
    assert main(["train", "--data", str(data), "--run-dir", str(run), *CLI]) == 0
    out = capsys.readouterr().out
    assert "resuming from step_0000004, the newest intact checkpoint: 2 steps lost" in out, out
    done, _ = load_model(run / "model")
    never_stopped, _ = load_model(cli_run / "model")
    assert_identical(params(done), params(never_stopped))
    records = [json.loads(line) for line in (run / "logs" / "train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["type"] == "start"] == [0, 4]

    # intact: one line says where it resumes
    run = interrupted_copy(cli_run, tmp_path / "again", after=8)
    assert main(["train", "--data", str(data), "--run-dir", str(run), *CLI]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("resuming")]
    assert lines == [f"resuming {run} from step_0000008, its newest checkpoint (step 8)"]
    assert_identical(params(load_model(run / "model")[0]), params(never_stopped))


def test_another_config_is_refused_in_one_line_naming_the_fields(cli_run, data, tmp_path, capsys):
    from transduce.cli import main

    run = interrupted_copy(cli_run, tmp_path / "run", after=4)
    before = files(run)
    changed = [*CLI, "--set", "model.dropout=0.2", "--warmup", "5"]
    capsys.readouterr()
    assert main(["train", "--data", str(data), "--run-dir", str(run), *changed]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"transduce train: error: {run} was trained with another config: "
    ), err
    assert "model.dropout 0.2 (the run's 0.3)" in err and "train.warmup_steps 5 (the run's 4)" in err, err
    assert "--restart" in err and "max_steps" not in err
    assert files(run) == before  # nothing written
    # a longer run is the same config: it continues
    assert main(["train", "--data", str(data), "--run-dir", str(run), *CLI, "--max-steps", "10"]) == 0
    assert latest_checkpoint(run).name == "step_0000010"
    with pytest.raises(SystemExit):  # resuming is what the same command does: there is no --resume
        main(["train", "--run-dir", str(run), "--resume", *CLI])
    assert "unrecognized arguments: --resume" in capsys.readouterr().err


def test_restart_replaces_the_checkpoints_only_once_the_new_run_has_started(cli_run, data, tmp_path, capsys):
    from transduce.cli import main

    run = interrupted_copy(cli_run, tmp_path / "run", after=6)
    before = files(run)
    empty = make_data(tmp_path / "empty", n_train=0)  # the new run cannot start: nothing is replaced
    assert main(["train", "--data", str(empty), "--run-dir", str(run), "--restart", *CLI]) == 2
    assert "the training split is empty" in capsys.readouterr().err
    assert files(run) == before
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--run-dir",
                str(run),
                "--restart",
                *CLI,
                "--set",
                "model.dropout=0.2",
                "--max-steps",
                "3",
            ]
        )
        == 0
    )
    assert "--restart: the earlier run's checkpoints/ in" in capsys.readouterr().out
    assert [s for s, _ in list_checkpoints(run)] == [2, 3]
    assert not [p for p in run.iterdir() if p.name.startswith(".replaced")]
    records = [json.loads(line) for line in (run / "logs" / "train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["type"] == "start"] == [0, 0]
    assert load_model(run / "model")[1].model.dropout == 0.2


def _tiny_training_objects():
    torch.manual_seed(0)
    config = tiny_config(10)
    model = Transformer(config.model)
    optimizer = build_optimizer(model, config)
    src = torch.randint(4, VOCAB, (3, 5))
    model(src, src).float().pow(2).mean().backward()
    optimizer.step()
    return config, model, optimizer


def test_failed_write_leaves_previous_latest_loadable(tmp_path, monkeypatch):
    config, model, optimizer = _tiny_training_objects()
    rng = {"cpu/rank0": torch.get_rng_state()}
    save_checkpoint(tmp_path, model, config, optimizer, TrainingState(step=1, epoch=0, position=7), rng)
    saved = params(model)
    exp_avg = {k: v.clone() for k, v in checkpointing.optimizer_tensors(optimizer, model).items()}

    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    real_save = run_dir.save_tensors

    def fail_on_rng(tensors, path):  # the weights and Adam's state are written, then the disk fills up
        if path.name == checkpointing.RNG:
            real_save(tensors, path.with_name("partial"))
            raise OSError(28, "No space left on device")
        real_save(tensors, path)

    monkeypatch.setattr(run_dir, "save_tensors", fail_on_rng)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, model, config, optimizer, TrainingState(step=2), rng)
    monkeypatch.undo()

    # A hard crash mid-write (no cleanup) leaves a temporary directory: ignored.
    crashed = tmp_path / "checkpoints" / ".tmp-step_0000003-12345"
    crashed.mkdir()
    (crashed / "model.safetensors").write_bytes(b"\x00" * 10)

    ckpt_dir = tmp_path / "checkpoints"
    assert sorted(p.name for p in ckpt_dir.iterdir() if not p.name.startswith(".tmp")) == ["latest", "step_0000001"]
    assert latest_checkpoint(tmp_path).name == "step_0000001"
    fresh = Transformer(config.model)
    fresh_opt = build_optimizer(fresh, config)
    loaded = load_checkpoint(latest_checkpoint(tmp_path), fresh, fresh_opt)
    assert (loaded.state.step, loaded.state.position) == (1, 7)
    assert_identical(params(fresh), saved)
    reloaded = checkpointing.optimizer_tensors(fresh_opt, fresh)
    assert reloaded.keys() == exp_avg.keys() and all(torch.equal(reloaded[k], exp_avg[k]) for k in reloaded)
    assert torch.equal(loaded.rng["cpu/rank0"], rng["cpu/rank0"])
    # the checkpoint directory is also a plain model directory
    model_only, _ = load_model(latest_checkpoint(tmp_path))
    assert_identical(params(model_only), saved)

    # The next successful save cleans up, moves `latest`, and keep_last prunes.
    save_checkpoint(tmp_path, model, config, optimizer, TrainingState(step=2), rng, keep_last=1)
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["latest", "step_0000002"]
    assert latest_checkpoint(tmp_path).name == "step_0000002"


def test_a_last_checkpoint_off_the_interval_does_not_take_the_place_of_one_averaged(tmp_path):
    """keep_last K keeps K checkpoints written at the interval, besides the newest: a run that ends
    between two intervals (the usual end with 10-minute checkpoints) still has the K that
    `transduce average --average K` averages (6.1)."""
    from transduce.checkpoint.averaging import last_checkpoints

    config, model, optimizer = _tiny_training_objects()
    for step in (10, 20, 30, 40):
        save_checkpoint(tmp_path, model, config, optimizer, TrainingState(step=step, on_interval=True), {}, keep_last=3)
    save_checkpoint(tmp_path, model, config, optimizer, TrainingState(step=43, on_interval=False), {}, keep_last=3)
    names = [p.name for _, p in list_checkpoints(tmp_path)]
    assert names == ["step_0000020", "step_0000030", "step_0000040", "step_0000043"]
    assert [p.name for p in last_checkpoints(tmp_path, 3)] == names[:3]
    # the next one at the interval: the old off-interval one goes, K at the interval stay
    save_checkpoint(tmp_path, model, config, optimizer, TrainingState(step=50, on_interval=True), {}, keep_last=3)
    assert [p.name for _, p in list_checkpoints(tmp_path)] == ["step_0000030", "step_0000040", "step_0000050"]


def test_latest_pointer_to_a_missing_checkpoint_falls_back_to_newest(tmp_path):
    config, model, optimizer = _tiny_training_objects()
    for step in (1, 2):
        save_checkpoint(tmp_path, model, config, optimizer, TrainingState(step=step), {})
    (tmp_path / "checkpoints" / "latest").write_text("step_0000099\n")
    assert latest_checkpoint(tmp_path).name == "step_0000002"


def test_no_pickle_in_a_checkpoint(uninterrupted):
    run, _ = uninterrupted
    for f in (run / "checkpoints" / "step_0000009").iterdir():
        assert f.suffix in (".safetensors", ".json"), f.name
