"""benchmarks/gpu.py's plumbing, tiny, on the CPU (--dry): what a GPU lease runs must not fail there
for a reason the CPU could have shown (the first lease found two such bugs)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_gpu_benchmark_dry_run_measures_every_part_and_writes_the_profiles(tmp_path):
    pytest.importorskip("transformers")  # the Hugging Face peer
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--out", str(tmp_path), "--dry", "--presets", "base",
         "--settings", "bf16,bf16-math", "--peers", "hf,torch", "--decode-sentences", "4", "--profile"],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    report = json.loads((tmp_path / "gpu.json").read_text())
    assert not report["errors"]
    settings = {r["setting"] for r in report["train"]}
    assert settings == {"bf16", "bf16-math", "hf bf16", "hf bf16 no-cuDNN", "torch bf16", "torch bf16 no-cuDNN"}
    assert all(r["tokens_per_s"] > 0 and r["batch_tokens"] > 0 for r in report["train"])
    assert [t["preset"] for t in report["table2"]] == ["base"]
    assert report["table2"][0]["hours_8_gpus"] * 8 == pytest.approx(report["table2"][0]["hours_one_gpu"])
    assert {(r["system"], r["precision"]) for r in report["decode"]} == {
        (s, p) for s in ("transduce", "hf") for p in ("fp32", "bf16")}
    profiles = sorted(p.name for p in tmp_path.glob("profile_*.txt"))
    assert profiles == ["profile_decode_hf_bf16.txt", "profile_decode_hf_fp32.txt", "profile_decode_transduce_bf16.txt",
                        "profile_decode_transduce_fp32.txt", "profile_train_base_hf.txt", "profile_train_base_torch.txt",
                        "profile_train_base_transduce.txt"]
    for p in tmp_path.glob("profile_*.txt"):
        text = p.read_text()
        assert "profiling failed" not in text and "operator calls" in text
    assert "vs best peer" in (tmp_path / "gpu.md").read_text()
