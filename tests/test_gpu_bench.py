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
         "--settings", "bf16,bf16-blocked-loss,bf16-math", "--peers", "hf,torch", "--decode-sentences", "4", "--profile"],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    report = json.loads((tmp_path / "gpu.json").read_text())
    assert not report["errors"]
    settings = {r["setting"] for r in report["train"]}
    assert settings == {"bf16", "bf16-blocked-loss", "bf16-math", "hf bf16", "hf bf16 no-cuDNN", "torch bf16", "torch bf16 no-cuDNN"}
    assert all(r["tokens_per_s"] > 0 and r["batch_tokens"] > 0 for r in report["train"])
    assert [t["preset"] for t in report["table2"]] == ["base"]
    assert report["table2"][0]["hours_8_gpus"] * 8 == pytest.approx(report["table2"][0]["hours_one_gpu"])
    systems = ("transduce", "transduce-chunked", "transduce-modules", "transduce-graph", "hf")
    assert {(r["system"], r["precision"]) for r in report["decode"]} == {(s, p) for s in systems for p in ("fp32", "bf16")}
    assert all(r["same_hypotheses"] for r in report["decode"] if r["system"] in systems[1:3])  # exact variants
    assert all("error" not in r and r["sentences_per_s"] > 0 for r in report["decode"])
    profiles = sorted(p.name for p in tmp_path.glob("profile_*.txt"))
    assert profiles == sorted([f"profile_decode_{s}_{p}.txt" for s in systems for p in ("fp32", "bf16")]
                              + ["profile_train_base_hf.txt", "profile_train_base_torch.txt", "profile_train_base_transduce.txt",
                                 "profile_train_base_transduce_blocked-loss.txt"])
    for p in tmp_path.glob("profile_*.txt"):
        text = p.read_text()
        assert "profiling failed" not in text and "operator calls" in text
    assert "vs best peer" in (tmp_path / "gpu.md").read_text()


def test_the_flat_step_off_the_cpu_is_the_models_step_on_sdpa():
    """On a GPU `kernels.apply` installs FastStep with `scaled_dot_product_attention` as its step
    attention where a layer sets none, as the model attends, on unpacked weights; run here on the
    CPU with no step attention set, its logits are the model's bit for bit. `transduce-modules`
    (what a GPU lease measures it against) takes it away for the duration and puts it back."""
    import torch

    sys.path.insert(0, str(REPO / "benchmarks"))
    sys.path.insert(0, str(REPO / "tests"))
    import gpu
    from test_fast_step import _model, _steps
    from test_model import padded_batch
    from transduce import fast_step
    from transduce.fast_step import FastStep
    from transduce.model import Transformer

    for norm_first in (False, True):
        model = _model(norm_first=norm_first)
        assert all(layer.self_attn.step_attention is None for layer in model.decoder.layers)
        src = padded_batch([7, 3, 5], vocab=60, seed=1)
        want = _steps(model, src, lambda t, c: Transformer.decode_step(model, t, c))
        assert fast_step.install(model)
        got = _steps(model, src, model.decode_step)
        assert all(torch.equal(a, b) for a, b in zip(want, got))
        with gpu.decode_variant(model, "transduce-modules"):
            assert "decode_step" not in model.__dict__
        assert isinstance(model.__dict__["decode_step"], FastStep)


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_graph_step_variant_decodes_as_the_model(norm_first):
    """`transduce-graph` (benchmarks/graph_step.py, for the next GPU lease), run eagerly on the
    CPU: fixed buffers with the unwritten positions masked give the model's logits to rounding
    and the model's hypotheses, through rows reordered every step, sentences finishing (the rows
    change), the capacity doubling (4 -> 8 -> 16 positions) and a step handed back to the model."""
    import torch

    sys.path.insert(0, str(REPO / "benchmarks"))
    sys.path.insert(0, str(REPO / "tests"))
    import graph_step
    from test_fast_step import _model, _steps
    from test_model import padded_batch
    from transduce.decode import beam_search
    from transduce.model import Transformer

    model = _model(norm_first=norm_first)
    src = padded_batch([7, 3, 5, 9], vocab=60, seed=1)
    want = _steps(model, src, lambda t, c: Transformer.decode_step(model, t, c), n=10)
    graph_step.install(model, capacity=4)
    got = _steps(model, src, model.decode_step, n=10)
    for a, b in zip(want, got):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        hyps = beam_search(model, src, beam_size=4, alpha=0.6, max_len_offset=12)
        step = model.decode_step
        assert step.state is not None and step.state.capacity >= 8
        graph_step.uninstall(model)
        ref = beam_search(model, src, beam_size=4, alpha=0.6, max_len_offset=12)
    assert [[h.tokens for h in hs] for hs in hyps] == [[h.tokens for h in hs] for hs in ref]
    for hs, rs in zip(hyps, ref):
        assert [h.score for h in hs] == pytest.approx([h.score for h in rs], abs=1e-5)
    # a step the graph does not cover (two positions) after graph steps: the cache is handed back
    graph_step.install(model, capacity=4)
    with torch.inference_mode():
        from transduce.model import padding_mask
        mask = padding_mask(src, model.config.pad_id)
        cache, plain = model.init_cache(model.encode(src, mask), mask), model.init_cache(model.encode(src, mask), mask)
        tokens = torch.full((src.size(0), 1), 2)
        for _ in range(3):
            model.decode_step(tokens, cache)
            Transformer.decode_step(model, tokens, plain)
        two = torch.full((src.size(0), 2), 5)
        torch.testing.assert_close(model.decode_step(two, cache), Transformer.decode_step(model, two, plain),
                                   rtol=1e-5, atol=1e-5)
    graph_step.uninstall(model)
