"""Parsing with a trained model, and scoring it on a treebank split (Section 6.3).

Sentences (lists of Penn Treebank tokens) are decoded as `transduce.decoding.translate.translate_stream`
translates, with the paper's parsing settings, and each output is repaired into a tree over
exactly those words. Scores are EVALB's the publication way, gold tags put back before scoring.
"""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

from ..defaults import PARSE_ALPHA, PARSE_BATCH_SIZE, PARSE_BEAM, PARSE_MAX_LEN_OFFSET
from .evalb import COLLINS, EvalbParams, EvalbResult, evalb
from .trees import Repairs, Tree, delinearize


@dataclass
class Parse:
    """One sentence's parse."""

    tree: Tree | None  # (TOP ...) over exactly the sentence's words; None for an empty sentence
    repairs: Repairs
    symbols: list[str]  # the model's output sequence, before any repair


def is_parsing_model(metadata: dict | None) -> bool:
    """Whether a model's data.json says it was trained on a treebank (`prepare --dataset ptb-wsj`)."""
    return bool(metadata) and metadata.get("task") == "parsing"


def predicts_tags(metadata: dict | None) -> bool:
    """Whether its target sequences carry part-of-speech tags (`prepare --keep-tags`) or XX."""
    return bool(metadata and metadata.get("linearization", {}).get("tags"))


def parse_stream(
    model,
    src_vocab,
    tgt_vocab,
    sentences: Iterable[Sequence[str]],
    *,
    tags: bool = False,
    beam: int = PARSE_BEAM,
    alpha: float = PARSE_ALPHA,
    max_len_offset: int = PARSE_MAX_LEN_OFFSET,
    batch_size: int = PARSE_BATCH_SIZE,
    constrained: bool = False,
    **options,
) -> Iterator[Parse]:
    """Parse `sentences` (each a list of words), one `Parse` per sentence, in order. `tags`: the
    model outputs part-of-speech tags rather than XX (`predicts_tags`). `constrained`: only
    well-formed trees (`constrain`; not in the paper). Other options are `translate_stream`'s."""
    from ..decoding.translate import translate_stream

    sentences = (list(s) for s in sentences)
    pending: deque[list[str]] = deque()

    def lines() -> Iterator[str]:
        for words in sentences:
            if any(not w or any(c.isspace() for c in w) for w in words):
                raise ValueError(f"a word is empty or holds a space: {words!r}")
            pending.append(words)
            yield " ".join(words)

    search = None
    if constrained:
        from .constrain import TreeConstraint

        search = TreeConstraint(tgt_vocab, tags=tags, src_vocab=src_vocab)
    stream = translate_stream(
        model,
        src_vocab,
        tgt_vocab,
        lines(),
        beam=beam,
        alpha=alpha,
        max_len_offset=max_len_offset,
        batch_size=batch_size,
        constraint=search,
        **options,
    )
    for cands in stream:
        words = pending.popleft()
        if not words:
            yield Parse(None, Repairs(), [])
            continue
        symbols = cands[0].text.split()
        tree, repairs = delinearize(symbols, words, tags=tags)
        yield Parse(tree, repairs, symbols)


@dataclass
class ParserScores:
    """EVALB of a parser on a treebank split."""

    gold_tags: EvalbResult  # the gold tags put back before scoring: how publications report F1
    own_tags: EvalbResult | None  # with the parser's own tags (None when it produced XX)
    repairs: Repairs | None  # what turning the outputs into trees took (None: read from a file)
    repaired_sentences: int
    sentences: int

    def as_dict(self) -> dict:
        d = {
            "evalb_gold_tags": self.gold_tags.as_dict(),
            "repairs": self.repairs and self.repairs.as_dict(),
            "repaired_sentences": self.repaired_sentences,
            "sentences": self.sentences,
        }
        if self.own_tags is not None:
            d["evalb_own_tags"] = self.own_tags.as_dict()
        return d


def score_parses(
    gold: Sequence[Tree],
    parsed: Sequence[Tree | None],
    *,
    own_tags: bool,
    repairs: Sequence[Repairs] | None = None,
    params: EvalbParams = COLLINS,
) -> ParserScores:
    """EVALB of `parsed` against `gold`, the gold tags put back (and with their own if `own_tags`)."""
    gold_lines = [str(t) for t in gold]
    # a parse of other words keeps its own tags: EVALB counts it as an error
    with_gold_tags = [
        "" if p is None else str(p.with_tags(g.tags()) if p.leaves() == g.leaves() else p) for g, p in zip(gold, parsed)
    ]
    total = sum(repairs, Repairs()) if repairs is not None else None
    repairs = list(repairs or [])
    return ParserScores(
        gold_tags=evalb(gold_lines, with_gold_tags, params, ("gold", "parses")),
        own_tags=evalb(gold_lines, ["" if p is None else str(p) for p in parsed], params, ("gold", "parses"))
        if own_tags
        else None,
        repairs=total,
        repaired_sentences=sum(r.total > 0 for r in repairs),
        sentences=len(gold),
    )


def format_scores(s: ParserScores, cutoff: int = 40) -> str:
    """A few lines for a person: F1 (recall, precision) for all sentences and the short ones."""
    lines = []
    for title, r in (("gold tags put back (as published)", s.gold_tags), ("the parser's own tags", s.own_tags)):
        if r is None:
            continue
        for name, t in (("all", r.all), (f"len<={cutoff}", r.short)):
            lines.append(
                f"EVALB (COLLINS.prm), {title}, {name}: F1 {t.f1:.2f} (recall {t.recall:.2f}, precision "
                f"{t.precision:.2f}; matched {t.matched:,} / gold {t.gold:,} / test {t.test:,} brackets; "
                f"{t.sentences:,} sentences, {t.errors} errors, {t.skipped} skipped; tagging "
                f"{t.tagging_accuracy:.2f})"
            )
    if s.repairs is not None:
        lines.append(
            f"repairs: {s.repaired_sentences} of {s.sentences:,} outputs were not well-formed trees; "
            f"{s.repairs.summary()}"
        )
    return "\n".join(lines)


def evaluate_parser(
    loaded,
    gold: Sequence[Tree],
    *,
    progress: bool = False,
    warn: Callable[[str], None] | None = None,
    source_name: str = "treebank",
    **options,
) -> tuple[ParserScores, list[Parse]]:
    """Parse the words of `gold` with `loaded` (a `LoadedModel`) and score the parses."""
    from tqdm import tqdm

    tags = predicts_tags(loaded.metadata)
    with tqdm(
        total=len(gold), desc="parse", unit=" sentences", mininterval=1, file=sys.stderr, disable=not progress
    ) as bar:
        parses = list(
            parse_stream(
                loaded.model,
                loaded.src_vocab,
                loaded.tgt_vocab,
                (t.leaves() for t in gold),
                tags=tags,
                warn=warn,
                source_name=source_name,
                advance=bar.update,
                **options,
            )
        )
    scores = score_parses(gold, [p.tree for p in parses], own_tags=tags, repairs=[p.repairs for p in parses])
    return scores, parses
