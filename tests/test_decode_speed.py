"""benchmarks/decode_speed.py with workers: both ways of handing batches to W forked workers
decode every sentence to its forced length (run_transduce asserts the lengths), and `--schedule`
decides what is timed: one wall time for the whole pass (stream, the default: each free worker
takes the next batch, as `translate --workers` does), or one per group of W consecutive batches
(groups)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run(tmp_path: Path, mirror: Path, *args: str) -> dict:
    out = tmp_path / "result.json"
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.decode_speed",
            "--presets",
            "small",
            "--systems",
            "transduce",
            "--precisions",
            "fp32",
            "--n-sentences",
            "10",
            "--batch-size",
            "2",
            "--threads",
            "2",
            "--repeats",
            "1",
            "--data-dir",
            str(mirror),
            "--json",
            str(out),
            *args,
        ],
        check=True,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    return json.loads(out.read_text())


@pytest.mark.corpus("wmt14-en-de")  # newstest2014, as the benchmark reads it
@pytest.mark.slow
@pytest.mark.parametrize("schedule,timings", [("stream", 1), ("groups", 3)])
def test_workers_decode_every_batch(tmp_path, mirror, schedule, timings):
    result = run(tmp_path, mirror, "--workers", "2", "--schedule", schedule)
    [row] = result["results"]
    assert result["args"]["schedule"] == schedule and result["workers"] == 2
    assert row["sentences"] == 10 and row["seconds"] > 0
    # stream: one pass, one wall time; groups: 5 batches of 2 in groups of 2 workers -> 3 groups
    assert len(row["batch_seconds"]) == timings
    assert row["seconds"] == pytest.approx(sum(row["batch_seconds"]))
