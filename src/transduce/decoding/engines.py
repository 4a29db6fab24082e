"""The decoding engines (Section 6.1): what searches a batch of source ids (with EOS) for its
candidates with a `settings.SearchSettings`, each run by `transduce.decoding.streaming.stream_lines`
(through `translate.translate_stream`): `TorchSearch`, `CT2Search`, and `engine_search`, which
chooses between them by the model."""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import Config
from ..data.batching import pad_batch
from ..data.vocab import Vocab, open_vocabs
from .search import beam_search, greedy_decode
from .search import length_penalty as paper_length_penalty
from ..export.ct2 import INFO, is_ct2_dir, pieces
from ..extras import require
from .settings import SearchSettings
from .shortlist import Shortlist, Shortlisted
from .streaming import BatchSearch, Candidate, one_line


@dataclass
class TorchSearch:
    """transduce's search on each batch of source ids, on the model's parameters' device and dtype;
    with fp32 weights `bf16` runs it under bf16 autocast. Scores are fp32 either way."""

    model: torch.nn.Module
    tgt_vocab: Vocab
    settings: SearchSettings  # its length_penalty "paper" or "hf" (`search.beam_search`'s penalty: not the paper)
    bf16: bool
    constraint: object = None
    shortlist: Shortlist | None = None  # Not in the paper: each batch searched over its candidates only

    def __call__(self, sources: list[list[int]]) -> list[list[Candidate]]:
        model, s = self.model, self.settings
        param = next(model.parameters())
        src = pad_batch(sources, model.config.pad_id).to(param.device)
        vocab = None
        if self.shortlist is not None:
            vocab = self.shortlist.candidates(sources, model.config.special_ids.to_dict().values()).to(param.device)
            model = Shortlisted(model, vocab)
        autocast = (
            torch.autocast(device_type=param.device.type, dtype=torch.bfloat16)
            if self.bf16 and param.dtype != torch.bfloat16
            else contextlib.nullcontext()
        )  # bf16 weights need none
        with torch.inference_mode(), autocast:
            if s.greedy:
                outs = greedy_decode(
                    model, src, max_len_offset=s.max_len_offset, vocab=vocab
                )  # the model's special ids
                return [[Candidate(o, math.nan, math.nan, one_line(self.tgt_vocab.decode(o)))] for o in outs]
            hyps = beam_search(
                model,
                src,
                beam_size=s.beam,
                alpha=s.alpha,
                max_len_offset=s.max_len_offset,
                n_best=s.n_best,
                constraint=self.constraint,
                penalty=s.length_penalty,
                vocab=vocab,
            )
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
        from ..cpu import has_vnni

        saturates = self.compute_type.startswith("int8") and not has_vnni()  # docs/export.md, "int8 without VNNI"
        return _Precision(
            f"precision {self.compute_type} (CTranslate2; exported as {self.quantization})"
            + ("; no VNNI on this CPU: int8 scores move, a trained model's BLEU holds" if saturates else "")
        )


@dataclass
class _Precision:
    text: str
    warning: str | None = None

    def line(self) -> str:
        return self.text


def load_ct2(
    path: str | os.PathLike, *, device: str = "cpu", compute_type: str = "default", threads: int = 0
) -> CT2Model:
    """Load a directory written by `export_ct2` (`compute_type`, `threads`: CTranslate2's)."""
    ctranslate2 = require("ctranslate2", "the ct2 engine")
    path = Path(path)
    if not is_ct2_dir(path):
        raise FileNotFoundError(
            f"{path}: not a CTranslate2 model written by `transduce export ct2` (no {INFO} and model.bin)"
        )
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
    translator = ctranslate2.Translator(
        str(path), device=device.split(":")[0], device_index=index, compute_type=compute_type, intra_threads=threads
    )
    return CT2Model(
        translator,
        config,
        sv,
        tv,
        f"CTranslate2 model {path} ({info['quantization']}"
        f"{'' if compute_type == 'default' else ', computed ' + compute_type})",
        int(info["max_positions"]),
        info["quantization"],
        translator.compute_type,
    )


def engine_search(
    model,
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    settings: SearchSettings,
    *,
    bf16: bool = False,
    constraint=None,
    workers: int = 1,
    shortlist: Shortlist | None = None,
) -> tuple[BatchSearch, int | None]:
    """(the search of `model`'s engine on a batch of source ids, the rows of the position table
    that input and output must fit: None for none): transduce's (`TorchSearch`) for a PyTorch
    model, CTranslate2's (`CT2Search`) for a `CT2Model`; what the engine cannot do refused in one line."""
    penalty = settings.length_penalty
    if isinstance(model, CT2Model):
        if workers != 1:
            raise ValueError(
                "--workers is for transduce's engine; CTranslate2 decodes in one worker with --threads intra-op threads"
            )
        if constraint is not None:
            raise ValueError("constrained decoding is transduce's engine's, not CTranslate2's")
        if shortlist is not None:
            raise ValueError(
                "a shortlist is transduce's engine's: CTranslate2 takes its own (vocabulary map) at export"
            )
        if penalty not in ("paper", "ct2"):
            raise ValueError(
                f"CTranslate2's engine ranks by the paper's length penalty or its own (ct2), not {penalty!r}"
            )
        return CT2Search(model, src_vocab, tgt_vocab, settings), model.max_positions
    if penalty not in ("paper", "hf"):
        raise ValueError(
            f"transduce's engine ranks by the paper's length penalty or Hugging Face's (hf), not {penalty!r}"
        )
    if settings.greedy and constraint is not None:
        raise ValueError("constrained decoding is a beam search: use beam 1 instead of greedy")
    if shortlist is not None:
        if constraint is not None:
            raise ValueError("a constrained search is over the whole vocabulary: no shortlist")
        if shortlist.target_size != len(tgt_vocab):
            raise ValueError(
                f"the shortlist is of a target vocabulary of {shortlist.target_size:,} tokens, this model's "
                f"has {len(tgt_vocab):,}: make it with `transduce shortlist` for this model"
            )
    if workers > 1 and next(model.parameters()).device.type != "cpu":
        raise ValueError("workers are for the CPU: on a GPU, decode with one process (workers=1)")
    mc = model.config
    learned = getattr(mc, "positional", "sinusoidal") == "learned"
    return TorchSearch(model, tgt_vocab, settings, bf16, constraint, shortlist), mc.max_positions if learned else None


@dataclass
class CT2Search:
    """CTranslate2's search on a batch of source ids (with EOS), as `stream_lines` runs it: its
    settings' length_penalty "paper" (CTranslate2's hypotheses ranked by the paper's penalty) or
    "ct2" (its own, |Y|^alpha). PAD and BOS are suppressed before CTranslate2's softmax, and the
    output limit is one per batch (greedy outputs are cut to each sentence's own)."""

    model: CT2Model
    src_vocab: Vocab
    tgt_vocab: Vocab
    settings: SearchSettings

    def __call__(self, sources: list[list[int]]) -> list[list[Candidate]]:
        model, s = self.model, self.settings
        greedy, alpha = s.greedy, s.alpha
        src_pieces, tgt_pieces = pieces(self.src_vocab), pieces(self.tgt_vocab)
        tgt_ids = {p: i for i, p in enumerate(tgt_pieces)}
        ids = model.config.model.special_ids
        eos_piece = tgt_pieces[ids.eos]
        suppress = [
            [tgt_pieces[ids.pad]],
            [tgt_pieces[ids.bos]],
        ]  # never real output tokens (as transduce.decoding.search)
        source = [[src_pieces[t] for t in toks[:-1]] for toks in sources]  # CT2 adds the EOS
        max_lens = [len(toks) + s.max_len_offset for toks in sources]  # tokens with EOS, per sentence
        lp = 0.0 if greedy or alpha == 0 else alpha
        paper = s.length_penalty == "paper"
        out = model.translator.translate_batch(
            source,
            beam_size=1 if greedy else s.beam,
            num_hypotheses=1 if greedy else (s.beam if paper else s.n_best),
            length_penalty=lp,
            return_scores=True,
            return_end_token=True,
            max_input_length=0,
            max_decoding_length=max(max_lens),
            min_decoding_length=0,
            suppress_sequences=suppress,
        )
        nan = float("nan")
        results = []
        for res, max_len in zip(out, max_lens):
            cands = []
            for hyp, score in zip(res.hypotheses, res.scores):
                ended = bool(hyp) and hyp[-1] == eos_piece
                length = len(hyp)  # |Y| with EOS when it ended with one
                toks = [tgt_ids[p] for p in (hyp[:-1] if ended else hyp)]
                text = one_line(self.tgt_vocab.decode(toks[:max_len] if greedy else toks))
                if greedy:  # the sentence's own maximum (exact for greedy)
                    cands.append(Candidate(tokens=toks[:max_len], score=nan, logprob=nan, text=text))
                    continue
                logprob = score * (length**lp if length else 1.0)
                if paper:
                    score = logprob / paper_length_penalty(length, alpha)
                cands.append(Candidate(tokens=toks, score=score, logprob=logprob, text=text))
            if paper:
                cands.sort(key=lambda c: -c.score)
            results.append(cands[: s.n_best] or [Candidate(tokens=[], score=-math.inf, logprob=-math.inf, text="")])
        return results
