"""Beam search's self-attention cache: copy the rows every step, or never copy and look them up?

    python benchmarks/cache_indirection.py                 # base size, 32 sentences x beam 4
    python benchmarks/cache_indirection.py --lengths 20,35,69 --threads 2

transduce's decoder (`transduce.cache`) keeps the self-attention keys/values of each hypothesis in
its own row and, when beam search reorders the hypotheses, gathers the rows into a new buffer as
it appends the next position: one copy of the whole cache per step. The alternative that
FasterTransformer calls cache indirection never moves a cached position: position s of beam slot
j stays where step s wrote it, and each hypothesis keeps the slot of its ancestor at every
position. Attention then scores the query of every beam of a sentence against the keys of all k
slots (k times the products, but each key read once, as in `MultiHeadAttention.attend`'s folded
encoder-decoder attention) and masks the positions that belong to other ancestors.

This script times one decoding step's self-attention work for both, with base-size shapes
(h = 8, d_k = 64, six layers, keys and values), in fp32, for several cache lengths t:

* copy: gather the t cached positions of K and of V by parent row into the next buffer (what the
  cache does), append, then scores = K q, softmax, weights V per row (`kernels.decode_attention`);
* indirection: write the new position in place, then per sentence scores = Q K^T over the k * t
  slot positions plus an additive ancestry mask, softmax, weights V.

* gather (`--compiled`): never move a cached position either, but keep per hypothesis the
  physical row that holds each of its positions (`ptr`, R x t integers, gathered by parent each
  step) and let `torch.compile` (Inductor's C++ backend) fuse the row lookup into the attention
  products, so that no gathered copy is ever written: scores over t positions, not k * t.
  The first call compiles (time printed separately); shapes are dynamic, so t does not recompile.

Only the self-attention part differs; the linear layers are the same in both and not timed.
Results on dev-2c (docs/RESULTS.md): the copy beats indirection up to t ~ 50 (session 7); the
compiled gather beats the copy by 0.3-1.4 ms per step at t = 20-52, about 2% of a decoding
step, too little for a run-time compiler and a second cache layout (session 8). The decoder
keeps the copy.
"""

from __future__ import annotations

import argparse
import time

import torch


def timed(fn, repeats: int) -> float:
    """Seconds per call, best of three rounds of `repeats` calls after a warm-up."""
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - t0) / repeats)
    return best


def check_same_attention(B: int = 3, k: int = 4, h: int = 2, d: int = 8, T: int = 7) -> float:
    """Both layouts give the same attention output: max |difference| on random data, where each
    hypothesis' own rows are gathered from the slots along its ancestry."""
    slots_k, slots_v = torch.randn(B, h, T, k, d), torch.randn(B, h, T, k, d)
    ancestor = torch.randint(0, k, (B, k, T))
    q = torch.randn(B, k, h, d)
    # the copy layout: row (b, i) holds position s of slot ancestor[b, i, s]
    idx = ancestor.permute(0, 2, 1)[:, None, :, :, None].expand(B, h, T, k, d)  # (B, h, T, k hyps, d)
    rows_k = slots_k.gather(3, idx).permute(0, 3, 1, 2, 4)  # (B, k, h, T, d)
    rows_v = slots_v.gather(3, idx).permute(0, 3, 1, 2, 4)
    w = (torch.einsum("bihd,bihtd->biht", q, rows_k) * d**-0.5).softmax(-1)
    copy_out = torch.einsum("biht,bihtd->bihd", w, rows_v)
    own = ancestor.unsqueeze(-1) == torch.arange(k)  # (B, k hyps, T, k slots)
    bias = torch.zeros(B, 1, k, T * k).masked_fill_(~own.view(B, 1, k, T * k), float("-inf"))
    scores = torch.einsum("bihd,bhsd->bhis", q, slots_k.reshape(B, h, T * k, d)) * d**-0.5
    ind_out = torch.einsum("bhis,bhsd->bihd", (scores + bias).softmax(-1), slots_v.reshape(B, h, T * k, d))
    return float((copy_out - ind_out).abs().max())


def gather_attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, ptr: torch.Tensor) -> torch.Tensor:
    """Attention of q (R, h, d) over the positions 0..T-1 of each hypothesis r, position j read
    from physical row ptr[r, j] of keys/values (R, h, >= T, d). Eager PyTorch materialises the
    gathered rows; under torch.compile the lookup is fused into the products."""
    T = ptr.size(1)
    j = torch.arange(T, device=q.device)
    scores = (q[:, None] * keys[ptr, :, j]).sum(-1) * q.size(-1) ** -0.5  # (R, T, h)
    weights = scores.softmax(1)
    return (weights[..., None] * values[ptr, :, j]).sum(1)  # (R, h, d)


def check_gather_attend(R: int = 6, h: int = 2, d: int = 8, T: int = 7, fn=gather_attend) -> float:
    """gather_attend equals attention over explicitly gathered rows: max |difference|."""
    keys, values, q = torch.randn(R, h, T + 3, d), torch.randn(R, h, T + 3, d), torch.randn(R, h, d)
    ptr = torch.randint(0, R, (R, T))
    j = torch.arange(T)
    rows_k, rows_v = keys[ptr, :, j].transpose(1, 2), values[ptr, :, j].transpose(1, 2)  # (R, h, T, d)
    w = (torch.einsum("rhd,rhtd->rht", q, rows_k) * d**-0.5).softmax(-1)
    ref = torch.einsum("rht,rhtd->rhd", w, rows_v)
    return float((fn(q, keys, values, ptr) - ref).abs().max())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sentences", type=int, default=32, help="sentences per batch (default 32)")
    p.add_argument("--beam", type=int, default=4, help="beam size (default 4)")
    p.add_argument("--lengths", default="20,35,69", help="cached positions t to time (default 20,35,69)")
    p.add_argument("--layers", type=int, default=6, help="decoder layers (default 6)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--repeats", type=int, default=100, help="calls per timed round (default 100)")
    p.add_argument("--compiled", action="store_true",
                   help="also time the gather layout with torch.compile fusing the lookup into attention")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    B, k, h, d = args.sentences, args.beam, 8, 64
    R = B * k
    scale = d**-0.5
    diff = check_same_attention()
    assert diff < 1e-5, f"the two layouts disagree: max |difference| {diff}"
    print(f"{B} sentences x beam {k}, h={h}, d_k={d}, {args.layers} layers, fp32, {torch.get_num_threads()} threads; "
          f"same attention output in both layouts (max |difference| {diff:.1e})")
    compiled = None
    if args.compiled:
        compiled = torch.compile(gather_attend, dynamic=True)
        t0 = time.perf_counter()
        with torch.inference_mode():
            diff_c = check_gather_attend(fn=compiled)
        assert diff_c < 1e-5, f"the compiled gather attention disagrees: max |difference| {diff_c}"
        print(f"gather layout compiled in {time.perf_counter() - t0:.1f} s; same attention output "
              f"(max |difference| {diff_c:.1e})")
    print(f"{'t':>4}  {'copy ms/step':>12}  {'indirection ms/step':>19}" + ("  gather, compiled ms/step" if compiled else ""))
    for t in (int(x) for x in args.lengths.split(",")):
        T = t + 1
        # copy: the cached rows of the step before, the parents chosen by beam search, a spare buffer
        cached = {name: torch.randn(R, h, t, d) for name in "kv"}
        spare = {name: torch.empty(R * h * (T + 32) * d) for name in "kv"}
        parents = (torch.randint(0, k, (B, k)) + torch.arange(B)[:, None] * k).view(-1)
        q, new = torch.randn(R, h, 1, d), {name: torch.randn(R, h, 1, d) for name in "kv"}

        def copy_step():
            kv = {}
            for name in "kv":
                out = spare[name][: R * h * T * d].view(R, h, T, d)
                torch.index_select(cached[name], 0, parents, out=out[:, :, :t])
                out[:, :, t:] = new[name]
                kv[name] = out.view(R * h, T, d)
            scores = torch.bmm(kv["k"], q.view(R * h, 1, d).transpose(1, 2)).view(R, h, T, 1).transpose(-2, -1) * scale
            weights = scores.softmax(-1).reshape(R * h, 1, T)
            return torch.bmm(weights, kv["v"])

        # indirection: (B, h, positions, slot, d) buffers; the ancestry mask as an additive bias, made once per step
        slots = {name: torch.randn(B, h, T + 32, k, d) for name in "kv"}
        ancestor = torch.randint(0, k, (B, k, T))  # the slot of each hypothesis' ancestor at each position
        ancestor[:, :, t] = torch.arange(k)

        def indirection_step():
            for name in "kv":
                slots[name][:, :, t] = new[name].view(B, k, h, d).transpose(1, 2)
            keys = slots["k"][:, :, :T].reshape(B * h, T * k, d)
            values = slots["v"][:, :, :T].reshape(B * h, T * k, d)
            queries = q.view(B, k, h, d).transpose(1, 2).reshape(B * h, k, d)
            scores = torch.bmm(queries, keys.transpose(1, 2)).view(B, h, k, T * k) * scale
            return torch.bmm((scores + bias).softmax(-1).view(B * h, k, T * k), values)

        def make_bias():  # once per step, shared by the layers
            own = ancestor.unsqueeze(-1) == torch.arange(k)  # (B, k hyps, T, k slots)
            return torch.zeros(B, 1, k, T * k).masked_fill_(~own.view(B, 1, k, T * k), float("-inf"))

        bias = make_bias()
        copy_ms = timed(copy_step, args.repeats) * args.layers * 1e3
        ind_ms = (timed(indirection_step, args.repeats) * args.layers + timed(make_bias, args.repeats)) * 1e3
        line = f"{t:>4}  {copy_ms:>12.2f}  {ind_ms:>19.2f}"
        if compiled is not None:
            # physical rows (R, h, positions, d): each row writes its new position in place; `ptr`
            # (R, t) names the row holding each earlier position, gathered by parent every step
            phys = {name: torch.randn(R, h, T + 32, d) for name in "kv"}
            ptr = (torch.randint(0, k, (R, t)) + torch.arange(B).repeat_interleave(k)[:, None] * k)
            rows = torch.arange(R)[:, None]

            def new_ptr():  # once per step, shared by the layers
                return torch.cat([ptr.index_select(0, parents), rows], 1)

            p_step = new_ptr()

            def gather_layer():
                for name in "kv":
                    phys[name][:, :, t] = new[name][:, :, 0]
                with torch.inference_mode():
                    return compiled(q[:, :, 0], phys["k"], phys["v"], p_step)

            gather_ms = (timed(gather_layer, args.repeats) * args.layers + timed(new_ptr, args.repeats)) * 1e3
            line += f"  {gather_ms:>24.2f}"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
