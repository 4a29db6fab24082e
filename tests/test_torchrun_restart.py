"""torchrun's elastic restarts (`--max-restarts`): a worker lost between two checkpoints costs only
the steps since the last one (docs/cluster.md).

Two runs of the same command, `torchrun --standalone --nproc-per-node 2 --max-restarts 1 -m
transduce train ...` (2 CPU processes, gloo, dropout on), side by side: one left alone,
and one whose rank 1 this test kills with SIGKILL (from outside, found by its environment in
/proc) once a checkpoint is written and training has gone past it. torchrun then stops rank 0,
starts both workers again, and the same command continues from the newest checkpoint: weights, Adam,
the position in the batch order and both ranks' RNG states. The two final models must be
bitwise equal.

Without `transduce.train.distributed.attempt_store` the restarted workers could read the killed
attempt's keys from torchrun's store and fail to form the group (3 runs in 4 here).
Slow: three torchrun starts of two processes each, ~20-25 s on a busy 2-core machine."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from train_data import make_data

MAX_STEPS, EVERY = 100, 25


def command(data: Path, run: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--monitor-interval",
        "0.2",
        "-m",
        "transduce",
        "train",
        "--data",
        str(data),
        "--run-dir",
        str(run),
        "--set",
        "model.n_layers=2",
        "--set",
        "model.d_model=32",
        "--set",
        "model.d_ff=64",
        "--set",
        "model.n_heads=2",
        "--batch-tokens",
        "64",
        "--max-steps",
        str(MAX_STEPS),
        "--warmup",
        "4",
        "--save-every-steps",
        str(EVERY),
        "--save-every-minutes",
        "0",
        "--valid-every",
        "0",
        "--log-every",
        "1",
        "--seed",
        "7",
        "--threads",
        "1",
        "--quiet",
        "--no-tensorboard",
        "--precision",
        "fp32",
    ]  # two separate jobs: auto's timed probe could choose differently in each


def records(run: Path) -> list[dict]:
    path = run / "logs" / "train.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    return [json.loads(line) for line in lines if line.endswith("}")]  # a line being written is skipped


def worker(launcher: int, rank: int) -> int | None:
    """The pid of the torchrun child with RANK=rank on its first attempt, found in /proc."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != launcher:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
        if f"RANK={rank}".encode() in environ and b"TORCHELASTIC_RESTART_COUNT=0" in environ:
            return int(entry.name)
    return None


def kill_rank_1_between_checkpoints(proc: subprocess.Popen, run: Path, timeout: float = 240) -> int:
    """Once the first checkpoint is written and a step after it is logged, SIGKILL rank 1; returns
    the last step logged before the kill."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be interrupted"
        steps = [r["step"] for r in records(run) if r["type"] == "train"]
        if (run / "checkpoints" / f"step_{EVERY:07d}").is_dir() and steps and steps[-1] > EVERY:
            pid = worker(proc.pid, rank=1)
            assert pid is not None, "rank 1 not found among torchrun's children"
            os.kill(pid, signal.SIGKILL)
            return steps[-1]
        time.sleep(0.01)
    raise AssertionError("no checkpoint within the time limit")


@pytest.mark.slow
def test_torchrun_restarts_a_killed_worker_and_the_run_ends_bitwise_as_if_uninterrupted(tmp_path):
    t0 = time.perf_counter()
    data = make_data(tmp_path / "data", n_train=400, n_valid=10)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = {name: tmp_path / name for name in ("killed", "alone")}
    procs = {
        name: subprocess.Popen(command(data, run), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for name, run in runs.items()
    }
    try:
        killed_at = kill_rank_1_between_checkpoints(procs["killed"], runs["killed"])
        out = {name: p.communicate(timeout=300)[0] for name, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    for name, p in procs.items():
        assert p.returncode == 0, f"{name}: {out[name][-3000:]}"
    assert "exitcode: -9" in out["killed"] and "local_rank: 1" in out["killed"]  # torchrun saw the SIGKILL

    # The killed run: two attempts, the second resumed from a checkpoint before the kill.
    log = records(runs["killed"])
    starts = [r for r in log if r["type"] == "start"]
    assert [(s["step"], s["restart"], s["world_size"]) for s in starts][0] == (0, 0, 2)
    assert len(starts) == 2 and starts[1]["restart"] == 1
    resumed_at = starts[1]["step"]
    assert resumed_at % EVERY == 0 and EVERY <= resumed_at < killed_at < MAX_STEPS  # steps were lost and redone
    assert f"torchrun restart 1: resuming at step {resumed_at}" in out["killed"]
    assert log[-1]["type"] == "end" and log[-1]["step"] == MAX_STEPS
    assert [r["type"] for r in records(runs["alone"])].count("start") == 1

    # Bitwise the same model as the run that was left alone.
    killed = load_file(str(runs["killed"] / "model" / "model.safetensors"))
    alone = load_file(str(runs["alone"] / "model" / "model.safetensors"))
    assert killed.keys() == alone.keys() and len(killed) > 10
    for name, tensor in alone.items():
        assert torch.equal(killed[name], tensor), name
    print(
        f"\nkilled rank 1 after step {killed_at}, resumed at step {resumed_at}; "
        f"{len(alone)} tensors bitwise equal; {time.perf_counter() - t0:.1f} s"
    )


def test_a_restarted_attempt_sets_up_its_group_under_keys_of_its_own(monkeypatch):
    """What the restarted workers set up their process group through: torchrun's store under a
    prefix naming the attempt (one node), so no key of the killed attempt is read; torchrun's own
    setup on the first attempt, without torchrun's shared store, and across nodes."""
    import torch.distributed as dist

    from transduce.train.distributed import attempt_store

    server = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    server.set("rank_1", "the killed attempt's address")
    store = attempt_store(world=2, local_world=2, restart=1)
    assert not store.check(["rank_1"])  # the stale key is not seen
    store.set("rank_1", "the new address")
    assert server.get("transduce/attempt_1/rank_1") == b"the new address"
    assert server.get("rank_1") == b"the killed attempt's address"
    assert attempt_store(world=2, local_world=2, restart=0) is None  # the first attempt: torchrun's own
    assert attempt_store(world=4, local_world=2, restart=1) is None  # two nodes: the counts may differ
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    assert attempt_store(world=2, local_world=2, restart=1) is None  # a store of its own each attempt
