"""The decoding engines (Section 6.1): what searches a batch of source ids (with EOS) for its
candidates, each run by `transduce.decoding.streaming.stream_lines`: `TorchSearch`, `CT2Search`."""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

from ..config import Config
from ..data.batching import pad_batch
from ..data.vocab import Vocab, open_vocabs
from .search import DEFAULT_ALPHA, DEFAULT_BEAM, DEFAULT_MAX_LEN_OFFSET, beam_search, greedy_decode
from .search import length_penalty as paper_length_penalty
from ..export.ct2 import INFO, is_ct2_dir, pieces
from ..extras import require
from .streaming import (
    DEFAULT_BATCH_SIZE, DEFAULT_BATCH_TOKENS, DEFAULT_CHUNK_LINES, DEFAULT_MAX_INPUT_TOKENS, Candidate, check_search,
    input_token_limit, one_line, stream_lines,
)


@dataclass
class TorchSearch:
    """transduce's search on each batch of source ids, on the model's parameters' device and dtype;
    with fp32 weights `bf16` runs it under bf16 autocast. Scores are fp32 either way."""

    model: torch.nn.Module
    tgt_vocab: Vocab
    greedy: bool
    beam: int
    alpha: float
    max_len_offset: int
    n_best: int
    bf16: bool
    constraint: object = None
    penalty: str = "paper"  # `decode.beam_search`'s: "hf" searches as Hugging Face generate (not the paper)

    def __call__(self, sources: list[list[int]]) -> list[list[Candidate]]:
        model = self.model
        param = next(model.parameters())
        src = pad_batch(sources, model.config.pad_id).to(param.device)
        autocast = (torch.autocast(device_type=param.device.type, dtype=torch.bfloat16)
                    if self.bf16 and param.dtype != torch.bfloat16 else contextlib.nullcontext())  # bf16 weights need none
        with torch.inference_mode(), autocast:
            if self.greedy:
                outs = greedy_decode(model, src, max_len_offset=self.max_len_offset)  # the model's special ids
                return [[Candidate(o, math.nan, math.nan, one_line(self.tgt_vocab.decode(o)))] for o in outs]
            hyps = beam_search(model, src, beam_size=self.beam, alpha=self.alpha, max_len_offset=self.max_len_offset,
                               n_best=self.n_best, constraint=self.constraint,
                               penalty=self.penalty)
        for hs in hyps:
            for h in hs:
                h.text = one_line(self.tgt_vocab.decode(h.tokens))
        return [hs or [Candidate([], -math.inf, -math.inf, "")] for hs in hyps]


@dataclass
class CT2Model:
    """An exported CTranslate2 model, loaded: what `--engine ct2` runs."""

    translator: object  # the ctranslate2.Translator
    config: Config
    src_vocab: Vocab
    tgt_vocab: Vocab
    description: str
    max_positions: int
    quantization: str
    compute_type: str

    @property
    def precision(self) -> "_Precision":
        """What `transduce translate` prints about the precision (as `transduce.precision.Choice`)."""
        from ..fast.cpu import has_vnni

        saturates = self.compute_type.startswith("int8") and not has_vnni()  # docs/export.md, "int8 without VNNI"
        return _Precision(f"precision {self.compute_type} (CTranslate2; exported as {self.quantization})"
                          + ("; no VNNI on this CPU: int8 scores move, a trained model's BLEU holds" if saturates else ""))

    def translate_stream(self, lines: Iterable[str], *, beam: int = DEFAULT_BEAM, alpha: float = DEFAULT_ALPHA,
                         max_len_offset: int = DEFAULT_MAX_LEN_OFFSET, n_best: int = 1, greedy: bool = False,
                         batch_tokens: int = DEFAULT_BATCH_TOKENS, batch_size: int = DEFAULT_BATCH_SIZE,
                         max_input_tokens: int | None = DEFAULT_MAX_INPUT_TOKENS,
                         chunk_lines: int = DEFAULT_CHUNK_LINES, length_penalty: str = "paper",
                         source_name: str = "input", warn: Callable[[str], None] | None = None,
                         advance: Callable[[int], None] | None = None, bf16: bool = False, workers: int = 1,
                         ) -> Iterator[list[Candidate]]:
        """`transduce.decoding.translate.translate_stream` with CTranslate2 as the engine: the same input
        handling and options; `length_penalty` "paper" (default) or "ct2" (its own). `bf16` is
        ignored (the precision is the exported one or `load_ct2`'s compute_type). PAD and BOS are
        suppressed before CTranslate2's softmax, and the output limit is one per batch (greedy
        outputs are cut to each sentence's own)."""
        check_search(greedy, n_best, beam)
        if workers != 1:
            raise ValueError("--workers is for transduce's engine; CTranslate2 decodes in one worker with --threads "
                             "intra-op threads")
        if length_penalty not in ("paper", "ct2"):
            raise ValueError(f"length_penalty must be 'paper' or 'ct2', not {length_penalty!r}")
        limit = input_token_limit(max_input_tokens, max_len_offset, self.max_positions)
        search = CT2Search(self, greedy, beam, alpha, max_len_offset, n_best, length_penalty)
        yield from stream_lines(search, self.src_vocab, lines, limit=limit, chunk_lines=chunk_lines,
                                batch_tokens=batch_tokens, batch_size=batch_size, source_name=source_name, warn=warn,
                                advance=advance)


@dataclass
class _Precision:
    text: str
    warning: str | None = None

    def line(self) -> str:
        return self.text


def load_ct2(path: str | os.PathLike, *, device: str = "cpu", compute_type: str = "default",
             threads: int = 0) -> CT2Model:
    """Load a directory written by `export_ct2` (`compute_type`, `threads`: CTranslate2's)."""
    ctranslate2 = require("ctranslate2", "the ct2 engine")
    path = Path(path)
    if not is_ct2_dir(path):
        raise FileNotFoundError(f"{path}: not a CTranslate2 model written by `transduce export ct2` "
                                f"(no {INFO} and model.bin)")
    info = json.loads((path / INFO).read_text(encoding="utf-8"))
    config = Config.from_dict(info["config"])
    sv, tv = open_vocabs(info["vocab"], path, {"bos": config.model.bos_id})
    device = str(device or "auto")
    if device == "auto":
        try:
            device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
        except Exception:  # noqa: BLE001 - no CUDA runtime at all
            device = "cpu"
    index = int(device.split(":")[1]) if device.startswith("cuda:") else 0
    translator = ctranslate2.Translator(str(path), device=device.split(":")[0], device_index=index,
                                        compute_type=compute_type, intra_threads=threads)
    return CT2Model(translator, config, sv, tv, f"CTranslate2 model {path} ({info['quantization']}"
                    f"{'' if compute_type == 'default' else ', computed ' + compute_type})", int(info["max_positions"]),
                    info["quantization"], translator.compute_type)


@dataclass
class CT2Search:
    """CTranslate2's search on a batch of source ids (with EOS), as `stream_lines` runs it."""

    model: CT2Model
    greedy: bool
    beam: int
    alpha: float
    max_len_offset: int
    n_best: int
    length_penalty: str

    def __call__(self, sources: list[list[int]]) -> list[list[Candidate]]:
        model, greedy, alpha = self.model, self.greedy, self.alpha
        src_pieces, tgt_pieces = pieces(model.src_vocab), pieces(model.tgt_vocab)
        tgt_ids = {p: i for i, p in enumerate(tgt_pieces)}
        ids = model.config.model.special_ids
        eos_piece = tgt_pieces[ids.eos]
        suppress = [[tgt_pieces[ids.pad]], [tgt_pieces[ids.bos]]]  # never real output tokens (as transduce.decoding.search)
        source = [[src_pieces[t] for t in toks[:-1]] for toks in sources]  # CT2 adds the EOS
        max_lens = [len(toks) + self.max_len_offset for toks in sources]  # tokens with EOS, per sentence
        lp = 0.0 if greedy or alpha == 0 else alpha
        paper = self.length_penalty == "paper"
        out = model.translator.translate_batch(
            source, beam_size=1 if greedy else self.beam,
            num_hypotheses=1 if greedy else (self.beam if paper else self.n_best),
            length_penalty=lp, return_scores=True, return_end_token=True, max_input_length=0,
            max_decoding_length=max(max_lens), min_decoding_length=0, suppress_sequences=suppress,
        )
        nan = float("nan")
        results = []
        for res, max_len in zip(out, max_lens):
            cands = []
            for hyp, score in zip(res.hypotheses, res.scores):
                ended = bool(hyp) and hyp[-1] == eos_piece
                length = len(hyp)  # |Y| with EOS when it ended with one
                toks = [tgt_ids[p] for p in (hyp[:-1] if ended else hyp)]
                text = one_line(model.tgt_vocab.decode(toks[:max_len] if greedy else toks))
                if greedy:  # the sentence's own maximum (exact for greedy)
                    cands.append(Candidate(tokens=toks[:max_len], score=nan, logprob=nan, text=text))
                    continue
                logprob = score * (length ** lp if length else 1.0)
                if paper:
                    score = logprob / paper_length_penalty(length, alpha)
                cands.append(Candidate(tokens=toks, score=score, logprob=logprob, text=text))
            if paper:
                cands.sort(key=lambda c: -c.score)
            results.append(cands[:self.n_best] or [Candidate(tokens=[], score=-math.inf, logprob=-math.inf, text="")])
        return results
