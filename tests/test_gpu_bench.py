"""benchmarks/gpu.py's plumbing, tiny, on the CPU (--dry): what a GPU machine runs must not fail there
for a reason the CPU could have shown (the first GPU run found two such bugs)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_benchmark_dry_run_measures_every_part_and_writes_the_profiles(tmp_path):
    pytest.importorskip("transformers")  # the Hugging Face peer
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.gpu",
            "--out",
            str(tmp_path),
            "--dry",
            "--presets",
            "base",
            "--settings",
            "bf16,bf16-blocked-loss,bf16-math",
            "--peers",
            "hf,torch",
            "--decode-sentences",
            "4",
            "--profile",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    report = json.loads((tmp_path / "gpu.json").read_text())
    assert not report["errors"]
    settings = {r["setting"] for r in report["train"]}
    assert settings == {
        "bf16",
        "bf16-blocked-loss",
        "bf16-math",
        "hf bf16",
        "hf bf16 no-cuDNN",
        "torch bf16",
        "torch bf16 no-cuDNN",
    }
    assert all(r["tokens_per_s"] > 0 and r["batch_tokens"] > 0 for r in report["train"])
    assert [t["preset"] for t in report["table2"]] == ["base"]
    assert report["table2"][0]["hours_8_gpus"] * 8 == pytest.approx(report["table2"][0]["hours_one_gpu"])
    systems = ("transduce", "transduce-chunked", "transduce-modules", "hf")
    assert {(r["system"], r["precision"]) for r in report["decode"]} == {
        (s, p) for s in systems for p in ("fp32", "bf16")
    }
    assert all(r["same_hypotheses"] for r in report["decode"] if r["system"] in systems[1:3])  # exact variants
    assert all("error" not in r and r["sentences_per_s"] > 0 for r in report["decode"])
    profiles = sorted(p.name for p in tmp_path.glob("profile_*.txt"))
    assert profiles == sorted(
        [f"profile_decode_{s}_{p}.txt" for s in systems for p in ("fp32", "bf16")]
        + [
            "profile_train_base_hf.txt",
            "profile_train_base_torch.txt",
            "profile_train_base_transduce.txt",
            "profile_train_base_transduce_blocked-loss.txt",
        ]
    )
    for p in tmp_path.glob("profile_*.txt"):
        text = p.read_text()
        assert "profiling failed" not in text and "operator calls" in text
    assert "vs best peer" in (tmp_path / "gpu.md").read_text()


def test_the_modules_variant_takes_the_flat_step_away_and_puts_it_back():
    """`transduce-modules` (what the GPU benchmark measures the flat step against) decodes through
    the model's own `Decoder` for the duration, then the `FastDecoder` is back (that the flat step is the
    model's step bit for bit off the CPU: tests/test_fast_step.py, run on CUDA by
    scripts/gpu_check.sh)."""
    sys.path.insert(0, str(REPO / "tests"))
    from benchmarks import gpu
    from test_fast_step import _model
    from transduce.fast.step import FastDecoder, install
    from transduce.model import Decoder

    model = _model()
    assert install(model)
    with gpu.decode_variant(model, "transduce-modules"):
        assert type(model.decoder) is Decoder
    assert isinstance(model.decoder, FastDecoder)
