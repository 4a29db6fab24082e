"""Data-parallel training: 2 CPU processes (torchrun, gloo) against one process fed the same batches.

The two ranks take alternate batches of the same list (rank r: batches r, r+2, ...), two per
step each (--update-freq 2, so the no_sync() accumulation path runs); the single process takes
four consecutive batches per step (--update-freq 4). Every step then sees the same union of
batches, normalised by the same token count, so the parameters and the logged losses must agree
up to float rounding; the two ranks must hold identical parameters.
And `torchrun -m transduce train` runs the command itself on 2 processes.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from transduce.config import Config, ModelConfig, TrainConfig
from train_data import VOCAB, make_data
from transduce.train.trainer import TrainOptions, train

STEPS = 4


def config() -> Config:
    # dropout off: the ranks draw from different dropout streams than a single process would
    model = ModelConfig(src_vocab_size=VOCAB, n_layers=1, d_model=16, d_ff=32, n_heads=2, dropout=0.0)
    return Config(model=model, train=TrainConfig(warmup_steps=2, max_steps=STEPS, checkpoint_minutes=0))


OPTIONS = dict(
    max_tokens=40, threads=1, progress=False, tensorboard=False, valid_every=0, log_every=1, seed=5, precision="fp32"
)  # not auto's timed probe: compared runs

WORKER = """
import os, sys
from safetensors.torch import save_file
from transduce.train.trainer import TrainOptions, train
sys.path.insert(0, {test_dir!r})
from test_train_ddp import OPTIONS, config

result = train(config(), {data!r}, {run!r}, TrainOptions(update_freq=2, **OPTIONS))
rank = os.environ["RANK"]
save_file({{k: v.detach().clone() for k, v in result.model.state_dict().items()}}, {out!r} + f"/rank{{rank}}.safetensors")
"""


def comparable(name: str, t: torch.Tensor) -> torch.Tensor:
    """The parameter without the attention key bias (the middle third of in_proj.bias).

    The key bias gets an exactly zero gradient in exact arithmetic (q . b_k is the same for
    every key, and softmax ignores a shift), so it cannot change any output. In floating point
    its gradient is rounding noise whose sign depends on the order of summation (2 ranks x 2
    micro-batches vs 1 x 4), and Adam with eps = 1e-9 (5.3) turns that noise into full-size
    steps. Everything else must agree."""
    if name.endswith("in_proj.bias"):
        third = t.numel() // 3
        return torch.cat([t[:third], t[2 * third :]])
    return t


def losses(run: Path) -> list[float]:
    records = [json.loads(line) for line in (run / "logs" / "train.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["type"] == "train"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_one_process_with_the_union_of_their_batches(tmp_path):
    data = make_data(tmp_path / "data", n_train=100, n_valid=10)
    script = tmp_path / "worker.py"
    script.write_text(
        WORKER.format(test_dir=str(Path(__file__).parent), data=str(data), run=str(tmp_path / "ddp"), out=str(tmp_path))
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
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
        str(free_port()),
        str(script),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]

    rank0 = load_file(str(tmp_path / "rank0.safetensors"))
    rank1 = load_file(str(tmp_path / "rank1.safetensors"))
    for k in rank0:  # (a) the ranks stay in sync
        assert torch.equal(rank0[k], rank1[k]), k

    # (b) one process, four micro-batches per step: the same batches, the same update
    single = train(config(), data, tmp_path / "single", TrainOptions(update_freq=4, **OPTIONS))
    assert single.step == STEPS
    for k, v in single.model.state_dict().items():
        torch.testing.assert_close(comparable(k, rank0[k]), comparable(k, v), rtol=1e-4, atol=1e-5, msg=k)
    ddp_losses, single_losses = losses(tmp_path / "ddp"), losses(tmp_path / "single")
    assert len(ddp_losses) == len(single_losses) == STEPS
    np.testing.assert_allclose(ddp_losses, single_losses, rtol=1e-6)
    # and training moved the parameters at all (the comparison is not vacuous)
    start = json.loads((tmp_path / "ddp" / "logs" / "train.jsonl").read_text().splitlines()[0])
    assert start["world_size"] == 2 and start["update_freq"] == 2
    assert start["batches_per_epoch"] >= 4 * STEPS  # within one epoch (no end-of-epoch shard padding)
    assert single_losses[-1] < single_losses[0]


def test_torchrun_runs_the_transduce_command(tmp_path):
    """`torchrun --nproc_per_node N -m transduce train ...`: the command joins the process group itself."""
    data = make_data(tmp_path / "data", n_train=40, n_valid=4)
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
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
        str(free_port()),
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
        "--batch-tokens",
        "40",
        "--max-steps",
        "2",
        "--valid-every",
        "0",
        "--save-every-minutes",
        "0",
        "--threads",
        "1",
        "--quiet",
        "--no-tensorboard",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    start = json.loads((run / "logs" / "train.jsonl").read_text().splitlines()[0])
    assert start["world_size"] == 2 and start["argv"][1:3] == ["train", "--data"]
    assert (run / "model" / "model.safetensors").is_file()
