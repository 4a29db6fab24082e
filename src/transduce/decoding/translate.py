"""Translation: text in, translations out, line for line (Section 6.1's decoding), with transduce's
own engine (`engines.TorchSearch`) streamed by `streaming.stream_lines`. The model is one
`transduce.decoding.ready` made ready (`load_for_decoding`, or `make_ready` on a model of one's own).
"""

from __future__ import annotations

import sys
from typing import Callable, Iterable, Iterator, Sequence

from tqdm import tqdm

from ..data.vocab import Vocab
from .search import DEFAULT_ALPHA, DEFAULT_BEAM, DEFAULT_MAX_LEN_OFFSET
from .engines import TorchSearch
from .streaming import (
    DEFAULT_BATCH_SIZE, DEFAULT_BATCH_TOKENS, DEFAULT_CHUNK_LINES, DEFAULT_MAX_INPUT_TOKENS, Candidate, check_search,
    input_token_limit, stream_lines,
)


def translate_stream(model, src_vocab: Vocab, tgt_vocab: Vocab, lines: Iterable[str], *, beam: int = DEFAULT_BEAM,
                     alpha: float = DEFAULT_ALPHA, max_len_offset: int = DEFAULT_MAX_LEN_OFFSET, n_best: int = 1,
                     greedy: bool = False, batch_tokens: int = DEFAULT_BATCH_TOKENS, batch_size: int = DEFAULT_BATCH_SIZE,
                     max_input_tokens: int | None = DEFAULT_MAX_INPUT_TOKENS, bf16: bool = False,
                     chunk_lines: int = DEFAULT_CHUNK_LINES, source_name: str = "input",
                     warn: Callable[[str], None] | None = None, advance: Callable[[int], None] | None = None,
                     constraint=None, workers: int = 1, length_penalty: str = "paper") -> Iterator[list[Candidate]]:
    """Translate `lines` (any iterable); yield, for every line in order, its `n_best` best
    candidates (best first; one empty candidate for an empty line). Lines over the limit
    (`streaming.input_token_limit`: `max_input_tokens`, and learned positions' table) are cut and
    reported through `warn("SOURCE:LINE: ...")`; `advance(n)` is called as lines are done.

    The model runs in eval mode (restored after), as it is given: made ready (`ready.make_ready`:
    its precision, packed weights, the flat decoding step) it is fast; one not made ready computes
    the same through its own layers (the scores equal but for float rounding), slower. With fp32
    weights `bf16=True` runs under bf16 autocast. `constraint` restricts the beam search (not with
    `greedy`). `workers` > 1 (CPU, Linux): batches decoded in that many forked processes
    (`streaming.Workers`), the output unchanged. `length_penalty` "hf" (not the paper): the beam
    search as Hugging Face generate's (`decode.beam_search(penalty="hf")`).
    """
    if greedy and constraint is not None:
        raise ValueError("constrained decoding is a beam search: use beam 1 instead of greedy")
    check_search(greedy, n_best, beam)
    if beam < 1 or batch_tokens < 1 or batch_size < 1 or chunk_lines < 1 or workers < 1:
        raise ValueError("beam, batch_tokens, batch_size, chunk_lines and workers must be positive")
    if workers > 1 and next(model.parameters()).device.type != "cpu":
        raise ValueError("workers are for the CPU: on a GPU, decode with one process (workers=1)")
    mc = model.config
    limit = input_token_limit(max_input_tokens, max_len_offset,
                              mc.max_positions if getattr(mc, "positional", "sinusoidal") == "learned" else None)
    search = TorchSearch(model, tgt_vocab, greedy, beam, alpha, max_len_offset, n_best, bf16, constraint, length_penalty)
    was_training = model.training
    model.eval()
    try:
        yield from stream_lines(search, src_vocab, lines, limit=limit, chunk_lines=chunk_lines, batch_tokens=batch_tokens,
                                batch_size=batch_size, workers=workers, source_name=source_name, warn=warn,
                                advance=advance)
    finally:
        model.train(was_training)


def translate_lines(model, src_vocab: Vocab, tgt_vocab: Vocab, lines: Sequence[str] | Iterable[str], *,
                    warn: Callable[[str], None] | None = None, progress: bool = False, **options) -> list[str]:
    """The best translation of each line, in order ("" for an empty line), as `translate_stream`
    decodes it with `options` (its keyword arguments). `warn` defaults to printing on stderr;
    `progress` shows a tqdm bar."""
    lines = list(lines)
    if warn is None:
        warn = lambda msg: print(f"warning: {msg}", file=sys.stderr)  # noqa: E731
    with tqdm(total=len(lines), desc="translate", unit=" lines", mininterval=1, disable=not progress) as bar:
        return [c[0].text for c in translate_stream(model, src_vocab, tgt_vocab, lines, warn=warn, advance=bar.update,
                                                    **options)]
