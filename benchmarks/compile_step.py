"""`torch.compile` on the decoding step against transduce's own flat step (`fast.step.FastDecoder`):
the same beam search over the same batch, timed per decoder step, interleaved round after round.

    python -m benchmarks.compile_step                          # the small preset, fp32, one thread
    python -m benchmarks.compile_step --precision bf16 --threads 2 --preset base

Variants: `model` (the model's own `Decoder`, eager, as built), `compiled` (that `Decoder` under
`torch.compile(dynamic=True)`: the cache grows a position a step), `ready` (`ready.make_ready`: the
weights packed, the `FastDecoder` step; the default of every command), `ready+compiled` (the
`FastDecoder` under `torch.compile`). Random weights, EOS banned so every sentence runs to its
limit. Method and results: docs/speed.md, "torch.compile against the flat step".
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from transduce.config import get_preset
from transduce.decoding.ready import make_ready
from transduce.decoding.search import beam_search
from transduce.model import Transformer
from transduce.precision import choose_decoding_precision


def build(preset: str, vocab: int, seed: int) -> Transformer:
    c = get_preset(preset).model
    torch.manual_seed(seed)
    config = type(c)(**{**c.__dict__, "src_vocab_size": vocab, "tgt_vocab_size": vocab})
    model = Transformer(config).eval()
    with torch.no_grad():  # EOS made rare: every sentence decodes to its limit
        model.decoder.embed.weight[config.eos_id].zero_()
    return model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.compile_step", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="small", help="model size (default small: the main job's)")
    p.add_argument("--vocab", type=int, default=8000, help="vocabulary size (default 8000)")
    p.add_argument("--sentences", type=int, default=32, help="sentences in the batch (default 32)")
    p.add_argument("--source-len", type=int, default=20, help="source tokens each (default 20)")
    p.add_argument("--beam", type=int, default=4, help="beam size (default 4)")
    p.add_argument("--steps", type=int, default=30, help="decoder steps (default 30)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="fp32 or bf16 weights (default fp32)")
    p.add_argument("--threads", type=int, default=1, help="PyTorch threads (default 1)")
    p.add_argument("--rounds", type=int, default=5, help="rounds, the variants taking turns (default 5)")
    p.add_argument("--variants", default="model,compiled,ready,ready+compiled", help="comma-separated")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    base = build(a.preset, a.vocab, seed=1).to(device)
    if a.precision == "bf16":
        base = base.to(torch.bfloat16)
    g = torch.Generator().manual_seed(2)
    src = torch.randint(4, a.vocab, (a.sentences, a.source_len), generator=g).to(device)
    src[:, -1] = base.config.eos_id
    models, compile_s, failed = {}, {}, {}
    for v in a.variants.split(","):
        m = copy.deepcopy(base)
        if v.startswith("ready"):
            make_ready(m, choose_decoding_precision(a.precision, device))
        if v.endswith("compiled"):
            m.decoder = torch.compile(m.decoder, dynamic=True)
        t = time.perf_counter()
        try:
            with torch.inference_mode():  # the first search compiles (and warms up the others)
                beam_search(m, src, beam_size=a.beam, max_len_offset=a.steps - a.source_len)
        except Exception as e:  # noqa: BLE001 - a variant torch.compile cannot make is a result too
            failed[v] = f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"
            continue
        compile_s[v], models[v] = time.perf_counter() - t, m
    times: dict[str, list[float]] = {v: [] for v in models}
    outs = {}
    for _ in range(a.rounds):
        for v, m in models.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            with torch.inference_mode():
                hyps = beam_search(m, src, beam_size=a.beam, max_len_offset=a.steps - a.source_len)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[v].append((time.perf_counter() - t) / a.steps * 1e3)
            outs[v] = [h[0].tokens for h in hyps]
    first = next(iter(models))
    print(
        f"{a.preset}, vocabulary {a.vocab:,}, {a.sentences} sentences x beam {a.beam}, {a.steps} steps, {a.precision}, "
        f"{a.threads} thread(s), {device}; torch {torch.__version__}; ms a step, median of {a.rounds} rounds:"
    )
    ref = statistics.median(times[first])
    for v, ts in times.items():
        med = statistics.median(ts)
        same = "same outputs" if outs[v] == outs[first] else "outputs differ"
        print(f"  {v:16s} {med:8.2f} ms  ({ref / med:.2f}x {first}; first search {compile_s[v]:.1f} s; {same})")
    for v, why in failed.items():
        print(f"  {v:16s} failed: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
