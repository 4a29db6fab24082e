"""EVALB (Sekine and Collins, 1997) with COLLINS.prm: the bracket scores of every parsing result
in the literature, Table 4's included, computed count for count as the C program does.

    result = evalb(gold_lines, test_lines)          # one bracketed tree per line, line for line
    result.all.f1, result.short.f1                  # all sentences, and those of <= 40 words
    print(format_report(result))                    # the C program's summary

Each step is one of evalb.c's functions, named in its docstring or comment; the non-obvious rules:
a terminal labelled DELETE_LABEL (COLLINS: punctuation, ``-NONE-``) is removed with its word, yet
punctuation counts in the sentence length of the <= 40 cut (only DELETE_LABEL_FOR_LENGTH does
not); labels are cut at the first ``-`` or ``=``; brackets match as a multiset; recall, precision
and F1 are over the corpus, not averaged per sentence.

It differs from the C program only on input that program cannot handle: lines and sentences of
any size, an unreadable line is an error sentence, differing line counts are a `DataError`, F1
with no bracket is 0 (not nan), and it never stops early (`EvalbResult.c_program_stops_at` says
where evalb.c would have exited, past MAX_ERROR). QUOTE_LABEL (unused by COLLINS.prm) is not
implemented.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from ..errors import DataError

_SPACE = " \t\n\v\f\r"  # C's isspace in the "C" locale
_SPACES = re.compile(f"[{_SPACE}]*")
_WORD = re.compile(f"[^{_SPACE}()]*")  # up to a space or a bracket


@dataclass(frozen=True)
class EvalbParams:
    """A parameter file's settings. The defaults are COLLINS.prm's."""

    delete_labels: frozenset[str] = frozenset({"TOP", "-NONE-", ",", ":", "``", "''", "."})
    delete_labels_for_length: frozenset[str] = frozenset({"-NONE-"})
    eq_labels: tuple[tuple[str, str], ...] = (("ADVP", "PRT"),)
    eq_words: tuple[tuple[str, str], ...] = ()
    cutoff_len: int = 40
    labeled: bool = True
    max_error: int = 10

    @classmethod
    def from_file(cls, path: str | Path) -> "EvalbParams":
        """Read an EVALB parameter file (e.g. COLLINS.prm): DELETE_LABEL, DELETE_LABEL_FOR_LENGTH,
        EQ_LABEL, EQ_WORD, CUTOFF_LEN, LABELED, MAX_ERROR; DEBUG is ignored."""
        from ..data.text import read_lines

        delete, delete_len, eq_labels, eq_words = set(), set(), [], []
        values = {"cutoff_len": 40, "labeled": True, "max_error": 10}
        for n, line in enumerate(read_lines(path), start=1):
            line = line.rstrip(_SPACE)
            if line.startswith("#") or len(line) < 3:
                continue
            parts = line.split(None, 1)
            key, value = parts[0], parts[1].strip() if len(parts) > 1 else ""
            if key == "DELETE_LABEL":
                delete.add(value)
            elif key == "DELETE_LABEL_FOR_LENGTH":
                delete_len.add(value)
            elif key in ("EQ_LABEL", "EQ_WORD"):
                pair = value.split()
                if len(pair) != 2:
                    raise DataError(f"{key} needs two values", path, n)
                (eq_labels if key == "EQ_LABEL" else eq_words).append((pair[0], pair[1]))
            elif key in ("CUTOFF_LEN", "MAX_ERROR", "LABELED", "DEBUG"):
                try:
                    number = int(value)
                except ValueError:
                    raise DataError(f"{key} needs a number, not {value!r}", path, n) from None
                if key != "DEBUG":
                    values[key.lower()] = bool(number) if key == "LABELED" else number
            elif key == "QUOTE_LABEL":
                raise DataError("QUOTE_LABEL is not implemented (COLLINS.prm does not use it)", path, n)
            else:
                raise DataError(f"unknown keyword {key!r}", path, n)
        return cls(frozenset(delete), frozenset(delete_len), tuple(eq_labels), tuple(eq_words), **values)

    def label_eq(self, a: str, b: str) -> bool:
        """evalb.c's label_comp: equal, or an EQ_LABEL pair (either way round)."""
        return a == b or (a, b) in self.eq_labels or (b, a) in self.eq_labels

    def word_eq(self, a: str, b: str) -> bool:
        """evalb.c's word_comp."""
        return a == b or (a, b) in self.eq_words or (b, a) in self.eq_words


COLLINS = EvalbParams()
"""COLLINS.prm: the parameters of every WSJ parsing result since Collins (1997)."""


@dataclass
class _Bracket:
    start: int
    end: int
    label: str
    result: int = 0  # evalb.c's: 0 unmatched, 1 matched, 5 deleted


@dataclass
class _Sentence:
    words: list[tuple[str, str]]  # (word, tag) of the terminals kept
    brackets: list[_Bracket]
    length: int  # terminals except DELETE_LABEL_FOR_LENGTH ones (evalb.c's r_wn1, for the gold line)
    errors: list[str]


def read_sentence(line: str, params: EvalbParams = COLLINS) -> _Sentence:
    """evalb.c's read_line: the terminals kept, the brackets with their spans and the length."""
    words: list[tuple[str, str]] = []
    brackets: list[_Bracket] = []
    stack: list[int] = []
    errors: list[str] = []
    length = 0
    p, n = 0, len(line)
    while p < n:
        c = line[p]
        if c in _SPACE:
            p += 1
        elif c == "(":
            label = _WORD.match(line, p + 1).group()
            p = q = p + 1 + len(label)
            if p < n and line[p] in _SPACE:
                q = _SPACES.match(line, q).end()
                word = _WORD.match(line, q).group()
                q += len(word)
                if q < n and line[q] == ")":  # a terminal (LABEL word)
                    if label not in params.delete_labels_for_length:
                        length += 1
                    if label not in params.delete_labels:
                        words.append((word, label))
                    p = q + 1
                    continue
                if q >= n or line[q] != "(":
                    # evalb.c: "More than two elements in a bracket", then it cannot read on
                    errors.append("More than two elements in a bracket")
                    return _Sentence(words, brackets, length, errors)
            stack.append(len(brackets))
            brackets.append(_Bracket(len(words), -1, label))
        elif c == ")":
            if not stack:
                errors.append("Bracketing unbalance (too many close bracket)")
                return _Sentence(words, brackets, length, errors)
            brackets[stack.pop()].end = len(words)
            p += 1
        else:
            errors.append("Reading sentence")
            return _Sentence(words, brackets, length, errors)
    if stack:
        errors.append("Bracketing is unbalanced (too many open bracket)")
    return _Sentence(words, brackets, length, errors)


@dataclass
class SentenceResult:
    """One line of the C program's table."""

    line: int
    length: int  # the gold sentence's, for the <= CUTOFF_LEN cut (punctuation included)
    status: int  # 0 scored, 1 error, 2 skipped (the test tree has no word)
    matched: int = 0
    gold: int = 0
    test: int = 0
    crossing: int = 0
    words: int = 0
    correct_tags: int = 0
    error: str = ""


@dataclass
class EvalbTotals:
    """The summary block of the C program, for all sentences or for the short ones."""

    sentences: int = 0
    errors: int = 0
    skipped: int = 0
    matched: int = 0
    gold: int = 0
    test: int = 0
    crossing: int = 0
    complete: int = 0
    no_crossing: int = 0
    two_or_less_crossing: int = 0
    words: int = 0
    correct_tags: int = 0

    def add(self, s: SentenceResult) -> None:
        self.sentences += 1
        self.errors += s.status == 1
        self.skipped += s.status == 2
        if s.status:
            return
        for name in ("matched", "gold", "test", "words", "crossing", "correct_tags"):
            setattr(self, name, getattr(self, name) + getattr(s, name))
        self.complete += s.gold == s.test == s.matched
        self.no_crossing += s.crossing == 0
        self.two_or_less_crossing += s.crossing <= 2

    @property
    def valid(self) -> int:
        return self.sentences - self.errors - self.skipped

    @property
    def recall(self) -> float:
        return 100.0 * self.matched / self.gold if self.gold else 0.0

    @property
    def precision(self) -> float:
        return 100.0 * self.matched / self.test if self.test else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def complete_match(self) -> float:
        return 100.0 * self.complete / self.valid if self.valid else 0.0

    @property
    def average_crossing(self) -> float:
        return self.crossing / self.valid if self.valid else 0.0

    @property
    def tagging_accuracy(self) -> float:
        return 100.0 * self.correct_tags / self.words if self.words else 0.0

    def as_dict(self) -> dict:
        rates = ("valid", "recall", "precision", "f1", "complete_match", "average_crossing", "tagging_accuracy")
        return {**asdict(self), **{name: getattr(self, name) for name in rates}}


@dataclass
class EvalbResult:
    """The C program's summary for all sentences and the short ones, and its table."""

    all: EvalbTotals
    short: EvalbTotals  # sentences of at most `cutoff_len` words (punctuation counted)
    cutoff_len: int
    sentences: list[SentenceResult] = field(repr=False)
    c_program_stops_at: int | None = None  # where evalb.c would exit without a summary

    def as_dict(self) -> dict:
        return {
            "all": self.all.as_dict(),
            f"len<={self.cutoff_len}": self.short.as_dict(),
            "c_program_stops_at": self.c_program_stops_at,
            "errors": [{"line": s.line, "error": s.error} for s in self.sentences if s.status == 1],
        }


def score_sentence(
    gold_line: str, test_line: str, line: int = 0, params: EvalbParams = COLLINS
) -> tuple[SentenceResult, int]:
    """evalb.c's calc_result for one pair of lines; also the number of errors it reports. A test
    tree with no word is skipped; other words, or an unreadable line, an error."""
    gold, test = read_sentence(gold_line, params), read_sentence(test_line, params)
    errors = gold.errors + test.errors
    result = SentenceResult(line, gold.length, 1 if errors else 0)
    unmatched = [
        f"Words unmatch ({gw}|{tw})" for (gw, _), (tw, _) in zip(gold.words, test.words) if not params.word_eq(gw, tw)
    ]
    if not test.words:
        result.status = 2
    elif len(gold.words) != len(test.words) or unmatched:
        errors.append(
            unmatched[0]
            if len(gold.words) == len(test.words)
            else f"Length unmatch ({len(gold.words)}|{len(test.words)})"
        )
        result.status = 1
    else:
        _score_brackets(gold, test, params, result)
    result.error = "; ".join(errors)
    return result, len(errors)


def _score_brackets(gold: _Sentence, test: _Sentence, params: EvalbParams, result: SentenceResult) -> None:
    """evalb.c's massage_data, the matching and the crossing brackets, counted into `result`."""
    for brackets in (gold.brackets, test.brackets):  # massage_data
        for b in brackets:
            b.result = 0
            if b.start == b.end:
                b.result = 5
                continue
            b.label = re.split(r"[-=]", b.label, maxsplit=1)[0]  # modify_label: up to the first - or =
            if any(params.label_eq(b.label, d) for d in params.delete_labels):
                b.result = 5
    for g in gold.brackets:
        if g.result == 5:
            continue
        for t in test.brackets:
            if (
                t.result == 0
                and g.start == t.start
                and g.end == t.end
                and (not params.labeled or params.label_eq(g.label, t.label))
            ):
                g.result = t.result = 1
                result.matched += 1
                break
    live_gold = [g for g in gold.brackets if g.result != 5]
    for t in test.brackets:
        if t.result == 5:
            continue
        if any((g.start < t.start < g.end < t.end) or (t.start < g.start < t.end < g.end) for g in live_gold):
            result.crossing += 1
    result.gold = len(live_gold)
    result.test = sum(t.result != 5 for t in test.brackets)
    result.words = len(gold.words)
    result.correct_tags = sum(params.label_eq(gt, tt) for (_, gt), (_, tt) in zip(gold.words, test.words))


def evalb(
    gold: Sequence[str], test: Sequence[str], params: EvalbParams = COLLINS, names: tuple[str, str] = ("gold", "test")
) -> EvalbResult:
    """Score `test` trees against `gold` trees, one bracketed tree per line, line for line."""
    gold, test = list(gold), list(test)
    if len(gold) != len(test):
        longer = names[0] if len(gold) > len(test) else names[1]
        raise DataError(f"{len(gold)} gold trees but {len(test)} test trees (line counts differ)", longer)
    result = EvalbResult(EvalbTotals(), EvalbTotals(), params.cutoff_len, [])
    reported = 0
    for n, (g, t) in enumerate(zip(gold, test), start=1):
        s, errors = score_sentence(g, t, n, params)
        reported += errors
        if result.c_program_stops_at is None and reported > params.max_error + 1:
            result.c_program_stops_at = n
        result.sentences.append(s)
        result.all.add(s)
        if s.length <= params.cutoff_len:
            result.short.add(s)
    return result


def evalb_files(gold_path: str | Path, test_path: str | Path, params: EvalbParams = COLLINS) -> EvalbResult:
    """`evalb -p COLLINS.prm GOLD TEST` on two files (plain or .gz, one tree per line)."""
    from ..data.text import read_lines

    return evalb(list(read_lines(gold_path)), list(read_lines(test_path)), params, (str(gold_path), str(test_path)))


def format_report(result: EvalbResult) -> str:
    """The C program's summary: its '-- All --' and '-- len<=40 --' blocks, plus the counts."""
    out = []
    for title, t in (("All", result.all), (f"len<={result.cutoff_len}", result.short)):
        out += [
            f"-- {title} --",
            f"Number of sentence        = {t.sentences:6d}",
            f"Number of Error sentence  = {t.errors:6d}",
            f"Number of Skip  sentence  = {t.skipped:6d}",
            f"Number of Valid sentence  = {t.valid:6d}",
            f"Bracketing Recall         = {t.recall:6.2f}",
            f"Bracketing Precision      = {t.precision:6.2f}",
            f"Bracketing FMeasure       = {t.f1:6.2f}",
            f"Complete match            = {t.complete_match:6.2f}",
            f"Average crossing          = {t.average_crossing:6.2f}",
            f"No crossing               = {100.0 * t.no_crossing / t.valid if t.valid else 0.0:6.2f}",
            f"2 or less crossing        = {100.0 * t.two_or_less_crossing / t.valid if t.valid else 0.0:6.2f}",
            f"Tagging accuracy          = {t.tagging_accuracy:6.2f}",
            f"Matched brackets          = {t.matched:6d}",
            f"Gold brackets             = {t.gold:6d}",
            f"Test brackets             = {t.test:6d}",
            "",
        ]
    if result.c_program_stops_at is not None:
        out.append(
            f"note: evalb.c would have stopped at line {result.c_program_stops_at} (past its MAX_ERROR), "
            "printing no summary"
        )
    return "\n".join(out).rstrip("\n")
