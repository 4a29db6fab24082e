"""Sentences in the server, for both APIs and /translate_file: a text split into sentences before
it is decoded and put back together after, its whitespace and line breaks as they were
(`text.sentences`), and HTML translated a sentence at a time with its inline tags placed by the
engine's alignment (`text.markup`; an engine without one: in proportion). Every sentence of a
request is one job of the batcher, so that the sentences of requests that arrive together are
decoded together.

pysbd's segmenter keeps the text it segments on itself (not thread-safe), so every split, and
every rendering of tags, runs on one worker thread of its own, off the event loop; an alignment
runs on the decoding thread, in its turn, as a round of its own (the model is never used by two
threads). docs/serve.md, "Sentences".
"""

from __future__ import annotations

import asyncio
import functools
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

from ..errors import TransduceError
from .common import Problem, Server, languages

log = logging.getLogger("transduce.serve")

# DeepL's spellings of split_sentences (1, 0, "nonewlines"), the words, and JSON's true and false
_MODES = {"1": "on", "on": "on", "true": "on", "0": "off", "off": "off", "false": "off", "nonewlines": "nonewlines"}
SPELLINGS = '"1" or "on", "0" or "off", or "nonewlines"'

_WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="transduce-split")


def mode_of(value, default: str) -> str:
    """The splitting mode ("on", "off", "nonewlines") a request's `split_sentences` asks for, as
    DeepL spells it (a string, a number or a boolean; none or empty: `default`). ValueError else."""
    if value is None or value == "":
        return default
    key = str(value).strip().lower() if not isinstance(value, bool) else ("1" if value else "0")
    if key not in _MODES:
        raise ValueError(f"split_sentences must be {SPELLINGS}, not {value!r}")
    return _MODES[key]


async def off_loop(fn: Callable, *args, **kwargs):
    """`fn(*args, **kwargs)` on the splitting thread, awaited (its extra missing: 501)."""
    try:
        return await asyncio.get_running_loop().run_in_executor(_WORKER, functools.partial(fn, *args, **kwargs))
    except TransduceError as e:  # pysbd or sentencex not installed: what to install, in one line
        raise Problem(501, "not_supported", str(e)) from None


def warm(lang: str) -> None:
    """Load the splitters of `lang` on the splitting thread now, not in the first request's time."""
    from ..text.sentences import split

    def run() -> None:
        try:
            split("Warm. Up.", lang)
        except Exception as e:  # noqa: BLE001 - a request says it again, in its answer
            log.warning("sentence splitting is not available: %s", e)

    _WORKER.submit(run)


def source_language(engine, source: str | None = None) -> str:
    """The language the sentences are split as: the request's source (not "auto"), else the one
    the engine serves (detected, for "auto" among several models), else English's rules."""
    if source and source.lower() != "auto":
        return source
    pair = languages(engine)
    return pair[0] if pair is not None else "en"


def combine(pieces, ranked: Sequence[Sequence], k: int):
    """The k-th candidate of a text split into `pieces`: each sentence's k-th (its last where it
    has fewer) put in its place; its tokens joined, its score and log-probability summed (nan for
    a text with no sentence). `ranked`: the candidates of the text's sentences, in order."""
    from ..decoding.search import Hypothesis
    from ..text.sentences import rejoin

    chosen = [r[min(k, len(r) - 1)] for r in ranked]
    nan = float("nan")
    return Hypothesis(
        tokens=[t for c in chosen for t in c.tokens],
        score=sum(c.score for c in chosen) if chosen else nan,
        logprob=sum(c.logprob for c in chosen) if chosen else nan,
        text=rejoin(pieces, [c.text for c in chosen]),
    )


def per_text(layouts: Sequence, results: Sequence[Sequence]) -> list[list]:
    """The candidates of each text of `layouts` (`sentences.split_all`'s) from those of all their
    sentences, in order: a text's n-th candidate its sentences' n-th put together (`combine`), as
    many as its sentences have at most (one for a text without a sentence: the text as it was)."""
    out, k = [], 0
    for pieces in layouts:
        n = sum(p.translate for p in pieces)
        ranked = results[k : k + n]
        k += n
        out.append([combine(pieces, ranked, i) for i in range(max((len(r) for r in ranked), default=1))])
    return out


async def decode_texts(
    server: Server,
    engine,
    batcher,
    texts: list[str],
    lang: str,
    mode: str,
    search,
    request,
    where: Callable[[int, int, int], str] = lambda k, i, j: f"sentence {k + 1}",
) -> list[list]:
    """The candidates of each text, best first (`per_text`): its sentences (`mode`) decoded with
    those of every other text as one job, each within the limits (`Server.count_tokens`; `where(k,
    i, j)` names the k-th sentence of all, the j-th of text i, in its errors)."""
    from ..text.sentences import split_all

    layouts, sentences = await off_loop(split_all, texts, lang, mode)
    owners = [(i, j) for i, pieces in enumerate(layouts) for j in range(sum(p.translate for p in pieces))]
    tokens = server.count_tokens(engine.encode, sentences, where=lambda k: where(k, *owners[k]))
    results = await server.decode(batcher, sentences, search, tokens, request)
    return per_text(layouts, results)


async def decode_job(
    server: Server,
    engine,
    batcher,
    job,
    search,
    request,
    counter: Server | None = None,
    where: Callable[[int], str] = lambda i: f"sentence {i + 1}",
) -> tuple[list[str], list]:
    """A `text.markup.Job`'s outputs and links: its sentences decoded as one job, then those with
    tags aligned by the engine (`alignments`). `counter`: the server whose limits count them."""
    tokens = (counter or server).count_tokens(engine.encode, job.sentences, where=where)
    results = await server.decode(batcher, job.sentences, search, tokens, request)
    outputs = [cands[0].text for cands in results]
    links = await alignments(
        server, engine, batcher, [job.sentences[j] for j in job.aligned], [outputs[j] for j in job.aligned], request
    )
    return outputs, links


async def alignments(server: Server, engine, batcher, sources: list[str], outputs: list[str], request) -> list:
    """Per (source, output) pair its links, from the engine's alignment, run on the decoding thread
    in its turn; none (the tags placed in proportion) where the engine gives none, or where it
    fails (logged: the translation stands, its tags placed in proportion)."""
    align = getattr(engine, "align", None)
    if align is None or not sources:
        return [[] for _ in sources]

    def run() -> list:
        try:
            return align(sources, outputs)
        except Exception:  # noqa: BLE001 - a tag placed in proportion is better than no translation
            log.exception("the alignment of %d sentences failed: their tags are placed in proportion", len(sources))
            return [[] for _ in sources]

    return await server.wait(batcher, lambda: batcher.call(run), request)


async def translate_html(
    server: Server, engine, batcher, docs: list[str], lang: str, mode: str, search, request
) -> list[str]:
    """HTML documents (or fragments) translated a sentence at a time (`text.markup`): every
    sentence of every document one job, the tags placed by the engine's alignment, the markup
    outside the sentences, and the elements never translated (script, style, pre, code, ...,
    translate="no"), as they were sent."""
    from ..text.markup import plan

    job = await off_loop(plan, docs, lang, mode, html=True)
    outputs, links = await decode_job(server, engine, batcher, job, search, request)
    return await off_loop(job.render, outputs, links)
