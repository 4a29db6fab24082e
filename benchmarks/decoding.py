"""The decoding workload the speed benchmarks share (`decode_speed.py`, `bench.py`, `gpu.py`):
source ids of realistic lengths from text, batches sorted by length, every hypothesis forced to
one length (`ForcedLength`), the systems built with the same dimensions (transduce, Hugging Face
`MarianMTModel`, CTranslate2) and one batch timed through each (see `decode_speed.py`)."""

from __future__ import annotations

import contextlib
import re
import time
import zlib
from pathlib import Path

import torch

from transduce.config import get_preset
from transduce.decoding.search import beam_search
from transduce.fast import decode as speedups, int8
from transduce.model import Transformer
from transduce.precision import choose_decoding_precision
from transduce.decoding.ready import make_ready

PAD, BOS, EOS = 0, 2, 3
VOCAB = 37000
BEAM = 4
ALPHA = 0.6
MAX_LEN_OFFSET = 50
EXTRA = 10
_PIECES = re.compile(r"\w+|[^\w\s]")


def encode(line: str, vocab_size: int = VOCAB) -> list[int]:
    """Word/punctuation pieces hashed to ids in [4, vocab_size), then EOS."""
    return [4 + zlib.crc32(p.encode("utf-8")) % (vocab_size - 4) for p in _PIECES.findall(line)] + [EOS]


def make_batches(srcs: list[list[int]], batch_size: int) -> list[tuple[list[int], int]]:
    """(sentence indices, forced output length L) per batch, sentences sorted by length."""
    order = sorted(range(len(srcs)), key=lambda i: (len(srcs[i]), i))
    batches = []
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        lens = [len(srcs[i]) for i in idx]
        L = min(max(lens) + EXTRA, min(lens) + MAX_LEN_OFFSET)
        batches.append((idx, L))
    return batches


def pad_batch(srcs: list[list[int]], idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    S = max(len(srcs[i]) for i in idx)
    ids = torch.full((len(idx), S), PAD, dtype=torch.long)
    for row, i in enumerate(idx):
        ids[row, : len(srcs[i])] = torch.tensor(srcs[i])
    return ids, ids != PAD


class ForcedLength:
    """A transduce model whose every hypothesis has exactly `length` tokens (EOS included):
    `decode_step` forbids EOS before that length and allows only EOS at it. Everything else is
    the model's own; the cache is its DecoderCache (whose `length` is the step count)."""

    def __init__(self, model: Transformer):
        self.model, self.config, self.length = model, model.config, 0

    def encode(self, src, src_mask):
        return self.model.encode(src, src_mask)

    def init_cache(self, memory, src_mask):
        return self.model.init_cache(memory, src_mask)

    def decode_step(self, tokens, cache):
        logits = self.model.decode_step(tokens, cache)  # advances cache.length to this step's count
        if cache.length < self.length:
            logits[..., EOS] = float("-inf")
        else:
            eos = logits[..., EOS].clone()
            logits.fill_(float("-inf"))
            logits[..., EOS] = eos
        return logits


SIZES = {"base": VOCAB, "small": 8000}
"""Preset -> vocabulary size."""


def build_transduce(seed: int, preset: str = "base") -> Transformer:
    config = get_preset(preset)
    config.model.src_vocab_size = SIZES[preset]
    torch.manual_seed(seed)
    return Transformer(config.model).eval()


def marian_dims(preset: str) -> dict:
    c = get_preset(preset).model
    return dict(d_model=c.d_model, layers=c.n_layers, heads=c.n_heads, ffn=c.d_ff, vocab=SIZES[preset])


def ct2_pieces(vocab: int) -> list[str]:
    """A synthetic vocabulary for CTranslate2, which takes tokens as strings: the special pieces
    at transduce's ids 0-3, then w4, w5, ..."""
    from transduce.data.vocab import SPECIAL_PIECES

    return [SPECIAL_PIECES[k] for k in ("pad", "unk", "bos", "eos")] + [f"w{i}" for i in range(4, vocab)]


def build_ct2(model: Transformer, directory: Path, threads: int, workers: int = 1) -> dict:
    """The transduce model exported to CTranslate2 (float32) and loaded per compute type:
    {"fp32": Translator(float32), "int8": Translator(int8)}, `workers` inter-op workers with
    threads / workers intra-op threads each."""
    import ctranslate2

    from transduce.config import Config
    from transduce.export.ct2 import TransduceConverter

    vocab = ct2_pieces(model.config.src_vocab_size)
    with torch.no_grad():
        TransduceConverter(model, Config(model=model.config), vocab, vocab).convert(
            str(directory), quantization="float32", force=True
        )
    return {
        p: ctranslate2.Translator(
            str(directory), device="cpu", compute_type=t, intra_threads=threads // workers, inter_threads=workers
        )
        for p, t in (("fp32", "float32"), ("int8", "int8"))
    }


def run_ct2_group(translator, group: list[tuple[list[list[str]], int]]) -> float:
    """Wall time of CTranslate2 decoding the batches of `group` ((tokens, L) each), all submitted
    at once: with inter_threads > 1 its workers take them in parallel."""
    t0 = time.perf_counter()
    pending = [
        translator.translate_batch(
            tokens,
            beam_size=BEAM,
            length_penalty=ALPHA,
            min_decoding_length=L,
            max_decoding_length=L,
            return_end_token=True,
            max_batch_size=0,
            asynchronous=True,
        )
        for tokens, L in group
    ]
    outs = [[r.result() for r in batch] for batch in pending]
    dt = time.perf_counter() - t0
    for out, (_, L) in zip(outs, group):
        lengths = {len(o.hypotheses[0]) for o in out}
        assert lengths == {L}, f"CTranslate2 produced lengths {lengths}, expected {L}"
    return dt


def build_marian(seed: int, d_model: int = 512, layers: int = 6, heads: int = 8, ffn: int = 2048, vocab: int = VOCAB):
    """Hugging Face's MarianMTModel with transduce's architecture (defaults: the base preset)."""
    from transformers import MarianConfig, MarianMTModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    config = MarianConfig(
        vocab_size=vocab,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn,
        activation_function="relu",
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        max_position_embeddings=1024,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=BOS,
        decoder_start_token_id=BOS,
        forced_eos_token_id=EOS,
    )
    torch.manual_seed(seed)
    return MarianMTModel(config).eval()


PRECISIONS = ("fp32", "bf16", "bf16-autocast", "int8")
SYSTEMS = ("transduce", "transduce-nopack", "hf", "ct2")


def runs(system: str, precision: str) -> bool:
    """Whether `system` has a row in `precision` (CTranslate2: fp32 and int8; HF: no int8)."""
    if system == "ct2":
        return precision in ("fp32", "int8")
    return not (system == "hf" and precision == "int8")


def autocast(precision: str):
    if precision == "bf16-autocast":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def cast(model, precision: str):
    """The model's weights in the precision's dtype (bf16 for "bf16", fp32 otherwise)."""
    return model.to(torch.bfloat16 if precision == "bf16" else torch.float32)


def prepare_transduce(model: Transformer, precision: str, pack: bool = True) -> None:
    """The transduce model as `translate --precision P` runs it (`transduce.decoding.ready.make_ready` with
    the choice `--precision P` makes here; bf16-autocast: fp32 weights), with `pack` the weights
    left in fp32/bf16 pre-packed. Undoes what an earlier precision did."""
    int8.dequantize_int8(model)
    speedups.unpack_weights(model)
    cast(model, "fp32")
    choice = choose_decoding_precision("fp32" if precision == "bf16-autocast" else precision)
    if precision == "int8":
        print(f"transduce {choice.line()}", flush=True)
    make_ready(model, choice, pack=pack)


def run_transduce(forced: ForcedLength, src: torch.Tensor, L: int, precision: str) -> float:
    forced.length = L
    t0 = time.perf_counter()
    with torch.inference_mode(), autocast(precision):
        hyps = beam_search(
            forced, src, beam_size=BEAM, alpha=ALPHA, max_len_offset=MAX_LEN_OFFSET, bos_id=BOS, eos_id=EOS
        )
    dt = time.perf_counter() - t0
    lengths = {len(h[0].tokens) + 1 for h in hyps}  # + EOS
    assert lengths == {L}, f"transduce produced lengths {lengths}, expected {L}"
    return dt


def run_hf(marian, src: torch.Tensor, mask: torch.Tensor, L: int, precision: str) -> float:
    t0 = time.perf_counter()
    with torch.inference_mode(), autocast(precision):
        out = marian.generate(
            input_ids=src,
            attention_mask=mask.long(),
            num_beams=BEAM,
            num_return_sequences=1,
            length_penalty=ALPHA,
            min_new_tokens=L - 1,
            max_new_tokens=L,
            do_sample=False,
            early_stopping=False,
        )
    dt = time.perf_counter() - t0
    assert out.shape[1] == L + 1, f"Hugging Face produced {out.shape[1] - 1} tokens, expected {L}"
    assert bool((out[:, -1] == EOS).all()), "Hugging Face outputs do not end in EOS"
    return dt


def profile_ops(run, work: list, rows: int = 25) -> str:
    """torch.profiler's top ops over run(src, mask, L) of each batch of `work` ((src, mask, L) each), summed."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        for src, mask, L in work:
            run(src, mask, L)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)
