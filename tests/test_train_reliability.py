"""Training survives what clusters and laptops do to it: SIGTERM and SIGINT, damaged
checkpoints, two trainers on one run directory, a failed checkpoint write, non-finite losses.
Each failure is injected into a real run of a toy model."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from train_data import make_data
from transduce import checkpoint as checkpointing
from transduce.checkpoint import run_dir  # where save_checkpoint writes its tensors
from transduce.checkpoint import (
    DamagedCheckpoint,
    RunLock,
    RunLocked,
    latest_checkpoint,
    list_checkpoints,
    load_for_inference,
)
from transduce.errors import TrainingStopped
from transduce.train import step as step_module
from transduce.train.signals import EXIT_INTERRUPTED
from transduce.train.trainer import train

from test_train_resume import assert_identical, options, params, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def full(data, tmp_path_factory):
    run = tmp_path_factory.mktemp("full") / "run"
    return run, params(train(tiny_config(9), data, run, options()).model)


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "logs" / "train.jsonl").read_text().splitlines()]


# --- signals: a real `transduce train` process -----------------------------------------------------

CLI_STEPS = 1500


def cli(data: Path, run: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "transduce",
        "train",
        "--data",
        str(data),
        "--run-dir",
        str(run),
        "--set",
        "model.n_layers=1",
        "--set",
        "model.d_model=16",
        "--set",
        "model.d_ff=32",
        "--set",
        "model.n_heads=2",
        "--max-steps",
        str(CLI_STEPS),
        "--warmup",
        "50",
        "--batch-tokens",
        "48",
        "--threads",
        "1",
        "--precision",
        "fp32",
        "--valid-every",
        "0",
        "--save-every-steps",
        "500",
        "--save-every-minutes",
        "0",
        "--keep-last",
        "0",
        "--log-every",
        "10",
        "--no-tensorboard",
        "--quiet",
        "--device",
        "cpu",
        *extra,
    ]


@pytest.fixture(scope="module")
def cli_full(data, tmp_path_factory):
    run = tmp_path_factory.mktemp("cli") / "run"
    subprocess.run(cli(data, run), check=True, capture_output=True, text=True, timeout=300)
    return load_file(str(run / "model" / "model.safetensors"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_checkpoints_exits_75_and_resume_is_exact(sig, data, cli_full, tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen(cli(data, run), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = run / "logs" / "train.jsonl"
    deadline = time.monotonic() + 120
    while not (log.is_file() and '"train"' in log.read_text()):  # the loop runs: signal it
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.05)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_INTERRUPTED, out
    stopped = latest_checkpoint(run)
    step = int(stopped.name.split("_")[1])
    assert 0 < step < CLI_STEPS
    assert f"interrupted at step {step} by {sig.name}" in out and "run the same command again" in out
    assert records(run)[-1] == {**records(run)[-1], "type": "interrupted", "step": step, "signal": sig.name}
    assert not (run / "model").exists()  # not finished: no final model

    resumed = subprocess.run(cli(data, run), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    after = load_file(str(run / "model" / "model.safetensors"))
    assert after.keys() == cli_full.keys()
    for k in after:
        assert torch.equal(after[k], cli_full[k]), k


# --- damaged checkpoints -------------------------------------------------------------------------


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_a_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) * 2 // 3] ^= 0x10  # inside the tensors, past the header
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage,name",
    [(truncate, "model.safetensors"), (flip_a_bit, "model.safetensors"), (flip_a_bit, "optimizer.safetensors")],
)
def test_resume_falls_back_to_the_newest_intact_checkpoint(damage, name, full, data, tmp_path, capsys):
    full_run, full_params = full
    run = tmp_path / "run"
    shutil.copytree(full_run, run)
    shutil.rmtree(run / "model")
    damage(run / "checkpoints" / "step_0000009" / name)
    with pytest.raises(DamagedCheckpoint, match=f"step_0000009/{name}: damaged"):
        checkpointing.verify(run / "checkpoints" / "step_0000009")

    result = train(tiny_config(9), data, run, options(resume=True))
    said = capsys.readouterr().out
    assert f"step_0000009/{name}: damaged" in said
    assert "resuming from step_0000008, the newest intact checkpoint: 1 step lost" in said
    assert (run / "checkpoints" / "step_0000009.damaged").is_dir()  # set aside, not deleted
    assert_identical(params(result.model), full_params)  # the lost step is trained again, exactly


def test_inference_and_average_refuse_a_damaged_file_on_one_line(full, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(full[0], run)
    flip_a_bit(run / "checkpoints" / "step_0000008" / "model.safetensors")
    with pytest.raises(DamagedCheckpoint, match="step_0000008/model.safetensors: damaged"):
        load_for_inference(run, checkpoint="8")
    with pytest.raises(DamagedCheckpoint, match="step_0000008/model.safetensors: damaged"):
        load_for_inference(run, average=3)
    flip_a_bit(run / "model" / "model.safetensors")
    for command in (["translate", str(run / "model")], ["average", str(run), "--average", "3"]):
        p = subprocess.run([sys.executable, "-m", "transduce", *command], input="", capture_output=True, text=True)
        assert p.returncode == 2 and "model.safetensors: damaged" in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


# --- one writer ----------------------------------------------------------------------------------

HOLDER = """
import sys, time
from transduce.checkpoint import RunLock
RunLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(600)
"""


def test_a_second_trainer_is_refused_while_the_first_holds_the_run(data, tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunLocked, match=f"another trainer \\(process {holder.pid} on "):
            train(tiny_config(2), data, run, options())
        assert not (run / "checkpoints").exists()  # nothing written
    finally:
        holder.kill()  # kill -9: the kernel releases the lock
        holder.wait()
    assert train(tiny_config(2), data, run, options()).step == 2
    with RunLock(run):  # released at the end of the run
        pass


# --- a failed checkpoint write (a full disk) -----------------------------------------------------


def test_a_failed_checkpoint_write_stops_cleanly_and_resumes_exactly(full, data, tmp_path, monkeypatch):
    _, full_params = full
    run = tmp_path / "run"
    real = run_dir.save_tensors
    calls = {"n": 0}

    def disk_fills_at_the_second_checkpoint(tensors, path):
        calls["n"] += 1
        if calls["n"] == 3:  # checkpoint 1 writes optimizer + rng; checkpoint 2's optimizer fails
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(tensors, path)

    monkeypatch.setattr(run_dir, "save_tensors", disk_fills_at_the_second_checkpoint)
    with pytest.raises(
        TrainingStopped,
        match="step 4 could not be written .*No space left on device.*"
        "step_0000002 and `latest` are intact.*2 steps lost",
    ):
        train(tiny_config(9), data, run, options())
    assert [s for s, _ in list_checkpoints(run)] == [2] and latest_checkpoint(run).name == "step_0000002"
    assert not list((run / "checkpoints").glob(".tmp-*"))  # the half-written one is gone
    assert records(run)[-1]["type"] == "checkpoint_failed"

    monkeypatch.setattr(run_dir, "save_tensors", real)  # space freed
    result = train(tiny_config(9), data, run, options(resume=True))
    assert_identical(params(result.model), full_params)


# --- non-finite losses ---------------------------------------------------------------------------


def nan_on(monkeypatch, calls_to_poison: set[int]):
    """Make the loss of the given training micro-batches (1-based; validation does not count) NaN,
    as a corrupt batch would."""
    real = step_module.label_smoothed_nll
    calls = {"n": 0}

    def poisoned(logits, *args, **kwargs):
        calls["n"] += torch.is_grad_enabled()
        if torch.is_grad_enabled() and calls["n"] in calls_to_poison:
            logits = logits * float("nan")
        return real(logits, *args, **kwargs)

    monkeypatch.setattr(step_module, "label_smoothed_nll", poisoned)


def test_a_nan_batch_is_skipped_counted_and_logged(data, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    nan_on(monkeypatch, {7})  # step 4's first micro-batch (two per step)
    result = train(tiny_config(9), data, run, options(save_every_steps=3))
    assert result.step == 9 and all(torch.isfinite(p).all() for p in result.model.parameters())
    skipped = [r for r in records(run) if r["type"] == "skipped"]
    assert len(skipped) == 1 and skipped[0]["step"] == 4 and skipped[0]["reason"] == "non-finite"
    assert skipped[0]["batches"][0]["epoch"] == 0 and len(skipped[0]["batches"]) == 2
    assert "step 4: non-finite loss (nan)" in capsys.readouterr().out


def test_a_skipped_step_changes_no_parameter_and_no_optimizer_state(data, tmp_path):
    from transduce.data.batching import ParallelDataset
    from transduce.model import Transformer
    from transduce.train.step import build_optimizer, set_lr, train_step

    dataset = ParallelDataset.load(data, "train")
    config = tiny_config(5)
    model = Transformer(config.model)
    optimizer = build_optimizer(model, config)
    set_lr(optimizer, 1e-3)
    batch = dataset.collate(list(range(6)))
    assert train_step(model, optimizer, [batch], label_smoothing=0.1).updated
    saved, adam = params(model), {k: v.clone() for k, v in checkpointing.optimizer_tensors(optimizer, model).items()}
    model.encoder.embed.weight.data[5] = float("nan")  # a corrupt row: NaN loss for the batches that use it
    result = train_step(model, optimizer, [batch], label_smoothing=0.1)
    assert not result.updated and not torch.isfinite(result.grad_norm)
    now = params(model)
    for k in saved:
        if "embed" not in k:
            assert torch.equal(now[k], saved[k]), k
    assert_identical(checkpointing.optimizer_tensors(optimizer, model), adam)


def test_nan_steps_in_a_row_stop_with_the_weights_from_before_them(full, data, tmp_path, monkeypatch):
    full_run, _ = full
    run = tmp_path / "run"
    nan_on(monkeypatch, set(range(9, 1000)))  # from step 5 on, every batch
    with pytest.raises(
        TrainingStopped, match="3 steps in a row had a non-finite loss.*after step 4.*run the same command again"
    ):
        train(tiny_config(9), data, run, options(max_nonfinite=3))
    latest = latest_checkpoint(run)
    assert latest.name == "step_0000004"
    ours = load_file(str(latest / "model.safetensors"))
    theirs = load_file(str(full_run / "checkpoints" / "step_0000004" / "model.safetensors"))
    assert_identical(ours, theirs)  # the weights of step 4, untouched by the NaN steps
    assert [r["step"] for r in records(run) if r["type"] == "skipped"] == [5, 5, 5]


def test_under_torchrun_a_signal_to_one_rank_stops_every_rank_at_the_same_step(data, tmp_path):
    """SIGTERM to rank 1 alone: both ranks stop after the same step (one all-reduce per step),
    rank 0 writes the checkpoint, and the same torchrun command again finishes the run."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "run"
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--nnodes",
        "1",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port),
        "-m",
        "transduce",
    ]
    args = cli(data, run)[3:]  # after `python -m transduce`
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(torchrun + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    log = run / "logs" / "train.jsonl"
    deadline = time.monotonic() + 120
    while not (log.is_file() and '"train"' in log.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.05)
    workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    rank1 = [
        int(pid)
        for pid in workers
        if "RANK=1"
        in Path(f"/proc/{pid}/environ").read_bytes().replace(b"\0", b"\n").decode(errors="replace").split("\n")
    ]
    assert len(rank1) == 1, workers
    os.kill(rank1[0], signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    stopped = [r for r in records(run) if r["type"] == "interrupted"]
    assert len(stopped) == 1 and stopped[0]["signal"] == "a signal to another rank", out
    step = stopped[0]["step"]
    assert latest_checkpoint(run).name == f"step_{step:07d}" and 0 < step < CLI_STEPS
    done = subprocess.run(
        torchrun[:-4] + ["--master_port", str(port + 1), "-m", "transduce"] + args,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert [r["step"] for r in records(run) if r["type"] == "end"] == [CLI_STEPS]


def test_the_same_signal_twice_at_once_is_one_request_in_a_torchrun_worker_only():
    """torchrun forwards the signal it gets to its workers, and Slurm or systemd signal every
    process of the job too: a worker gets the same SIGTERM twice at once, and must still stop with
    a checkpoint. Outside torchrun a second press still ends the process at once. (In processes of
    their own: the second signal may end the process.)"""
    code = (
        "import os, signal, time; from transduce.train.signals import StopSignals\n"
        "with StopSignals() as stop:\n    os.kill(os.getpid(), signal.SIGTERM); os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(0.5)\nprint('survived', stop.requested)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    worker = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "TORCHELASTIC_RUN_ID": "test"},
    )
    assert worker.returncode == 0 and worker.stdout.strip() == "survived SIGTERM", worker.stderr
    alone = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert alone.returncode == -signal.SIGTERM and "survived" not in alone.stdout
    assert "SIGTERM again: exiting now" in alone.stderr


def test_under_torchrun_sigterm_to_every_process_of_the_job_stops_with_a_checkpoint(data, tmp_path):
    """As Slurm's --signal=TERM or systemd's stop do it: torchrun and both workers get SIGTERM at
    once (and the workers again from torchrun). The run stops at one step with a checkpoint, and
    its log's last record says so (torchrun's own exit status is then 1, not 75: docs/cluster.md)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "run"
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--nnodes",
        "1",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port),
        "-m",
        "transduce",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        torchrun + cli(data, run)[3:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    log = run / "logs" / "train.jsonl"
    deadline = time.monotonic() + 120
    while not (log.is_file() and '"train"' in log.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.05)
    workers = [
        int(pid)
        for pid in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    ]
    assert len(workers) == 2
    for pid in [proc.pid, *workers]:
        os.kill(pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert "exiting now, without a checkpoint" not in out, out[-3000:]
    last = records(run)[-1]
    assert last["type"] == "interrupted" and last["signal"] == "SIGTERM", out[-3000:]
    assert latest_checkpoint(run).name == f"step_{last['step']:07d}" and 0 < last["step"] < CLI_STEPS


def test_an_fp16_overflow_skipped_by_the_loss_scaler_is_reported_as_not_taken(data, monkeypatch):
    """The GradScaler's own skip (a non-finite gradient, as an fp16 overflow makes) is a step not
    taken, like a NaN without a scaler; the scaler lowers its scale."""
    from transduce.data.batching import ParallelDataset
    from transduce.model import Transformer
    from transduce.train.step import build_optimizer, set_lr, train_step

    config = tiny_config(5)
    model = Transformer(config.model)
    optimizer = build_optimizer(model, config)
    set_lr(optimizer, 1e-3)
    batch = ParallelDataset.load(data, "train").collate(list(range(6)))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    nan_on(monkeypatch, {1})
    saved = params(model)
    result = train_step(model, optimizer, [batch], label_smoothing=0.1, scaler=scaler)
    assert not result.updated and scaler.get_scale() == 512.0
    assert_identical(params(model), saved)
    assert train_step(model, optimizer, [batch], label_smoothing=0.1, scaler=scaler).updated
