"""Translation: text in, translations out, line for line (Section 6.1's decoding), through either
engine (`engines.engine_search`: transduce's own or an export's in CTranslate2) streamed by
`streaming.stream_lines`: `translate_stream` is the one front door, `translate_lines` its list
form. A PyTorch model is one `transduce.decoding.ready` made ready (`load_for_decoding`, or
`make_ready` on a model of one's own), a CTranslate2 export one `engines.load_ct2` loaded.
"""

from __future__ import annotations

import sys
from typing import Callable, Iterable, Iterator, Sequence

from tqdm import tqdm

from ..data.vocab import Vocab
from ..defaults import ALPHA, BATCH_SIZE, BATCH_TOKENS, BEAM, CHUNK_LINES, MAX_INPUT_TOKENS, MAX_LEN_OFFSET
from .engines import engine_search
from .settings import SearchSettings
from .streaming import Candidate, input_token_limit, stream_lines


def translate_stream(
    model,
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    lines: Iterable[str],
    *,
    beam: int = BEAM,
    alpha: float = ALPHA,
    length_penalty: str = "paper",
    max_len_offset: int = MAX_LEN_OFFSET,
    n_best: int = 1,
    greedy: bool = False,
    batch_tokens: int = BATCH_TOKENS,
    batch_size: int = BATCH_SIZE,
    max_input_tokens: int | None = MAX_INPUT_TOKENS,
    bf16: bool = False,
    chunk_lines: int = CHUNK_LINES,
    source_name: str = "input",
    warn: Callable[[str], None] | None = None,
    advance: Callable[[int], None] | None = None,
    constraint=None,
    workers: int = 1,
    shortlist=None,
) -> Iterator[list[Candidate]]:
    """Translate `lines` (any iterable); yield, for every line in order, its `n_best` best
    candidates (best first; one empty candidate for an empty line). Lines over the limit
    (`streaming.input_token_limit`: `max_input_tokens`, and a position table's) are cut and
    reported through `warn("SOURCE:LINE: ...")`; `advance(n)` is called as lines are done.

    The search: `beam`, `alpha`, `length_penalty`, `max_len_offset`, `n_best`, `greedy`, the fields
    of `settings.SearchSettings` (checked there). `model`: a PyTorch Transformer, run in eval mode
    (restored after) as it is given: made ready (`ready.make_ready`: its precision, packed weights,
    the flat decoding step) it is fast; one not made ready computes the same through its own
    layers (the scores equal but for float rounding), slower. With fp32 weights `bf16=True` runs
    under bf16 autocast. `constraint` restricts the beam search (not with `greedy`). `workers` > 1
    (CPU, Linux): batches decoded in that many forked processes (`streaming.Workers`), the output
    unchanged. `shortlist` (a `shortlist.Shortlist`; not in the paper, not exact): each batch
    searched over the target tokens its sources make likely. Or `model` a CTranslate2 export (`engines.CT2Model`, with its own vocabularies):
    the same input handling, its precision the export's, no `constraint`, one worker.
    """
    settings = SearchSettings(
        beam=beam,
        alpha=alpha,
        length_penalty=length_penalty,
        max_len_offset=max_len_offset,
        n_best=n_best,
        greedy=greedy,
    )
    if batch_tokens < 1 or batch_size < 1 or chunk_lines < 1 or workers < 1:
        raise ValueError("batch_tokens, batch_size, chunk_lines and workers must be positive")
    search, positions = engine_search(
        model, src_vocab, tgt_vocab, settings, bf16=bf16, constraint=constraint, workers=workers, shortlist=shortlist
    )
    limit = input_token_limit(max_input_tokens, max_len_offset, positions)
    was_training = getattr(model, "training", None)  # None: a CTranslate2 model, which has no training mode
    if was_training is not None:
        model.eval()
    try:
        yield from stream_lines(
            search,
            src_vocab,
            lines,
            limit=limit,
            chunk_lines=chunk_lines,
            batch_tokens=batch_tokens,
            batch_size=batch_size,
            workers=workers,
            source_name=source_name,
            warn=warn,
            advance=advance,
        )
    finally:
        if was_training is not None:
            model.train(was_training)


def translate_lines(
    model,
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    lines: Sequence[str] | Iterable[str],
    *,
    warn: Callable[[str], None] | None = None,
    progress: bool = False,
    **options,
) -> list[str]:
    """The best translation of each line, in order ("" for an empty line), as `translate_stream`
    decodes it with `options` (its keyword arguments). `warn` defaults to printing on stderr;
    `progress` shows a tqdm bar."""
    lines = list(lines)
    if warn is None:
        warn = lambda msg: print(f"warning: {msg}", file=sys.stderr)  # noqa: E731
    with tqdm(total=len(lines), desc="translate", unit=" lines", mininterval=1, disable=not progress) as bar:
        return [
            c[0].text
            for c in translate_stream(model, src_vocab, tgt_vocab, lines, warn=warn, advance=bar.update, **options)
        ]
