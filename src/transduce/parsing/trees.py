"""Constituency trees (Section 6.3): reading them (one per line, or PTB .mrg trees over many
lines), cleaning raw treebank trees (`clean`), and Vinyals et al.'s (2015) linearization, which
the paper follows, there and back::

    (TOP (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .)))
    ->  (S (NP XX XX )NP (VP XX )VP XX )S        (with tags: (S (NP DT NN )NP (VP VBD )VP . )S)

The way back (`delinearize`) repairs any output into a well-formed tree over exactly the input
words, counting each repair by kind (`Repairs`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Iterable, Iterator, Sequence, Union

from ..errors import DataError

XX = "XX"
"""The symbol of a word whose part-of-speech tag is normalised away (Vinyals et al. 2015)."""
WRAPPERS = ("TOP", "ROOT", "")
"""Labels of the outer bracket that holds a sentence's tree; it is not linearized."""
UNKNOWN = ("⁇", "<unk>")
"""How an unknown target symbol comes out of a vocabulary: never a leaf, always dropped."""

_TOKEN = re.compile(r"\(|\)|[^\s()]+")


@dataclass
class Tree:
    """A constituent: a label and its children, constituents or (a preterminal) a single word."""

    label: str
    children: list[Union["Tree", str]] = field(default_factory=list)

    @property
    def is_preterminal(self) -> bool:
        return len(self.children) == 1 and isinstance(self.children[0], str)

    def bottom_up(self) -> list["Tree"]:
        """Every node, each after all of its children. A loop, as every walk here: a model's output
        may nest deeper than Python's recursion limit."""
        order: list[Tree] = []
        stack: list[Tree] = [self]
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(c for c in node.children if isinstance(c, Tree))
        return order[::-1]

    def preterminals(self) -> Iterator["Tree"]:
        """The preterminals (tag, word), left to right."""
        stack: list[Tree] = [self]
        while stack:
            node = stack.pop()
            if node.is_preterminal:
                yield node
            else:
                stack.extend(reversed([c for c in node.children if isinstance(c, Tree)]))

    def leaves(self) -> list[str]:
        """The words, left to right."""
        return [p.children[0] for p in self.preterminals()]

    def tags(self) -> list[str]:
        """The part-of-speech tags, left to right."""
        return [p.label for p in self.preterminals()]

    def with_tags(self, tags: Sequence[str]) -> "Tree":
        """A copy whose preterminals carry `tags` (one per word)."""
        tags = list(tags)
        if len(tags) != len(self.leaves()):
            raise ValueError(f"{len(tags)} tags for {len(self.leaves())} words")
        copies: dict[int, Tree] = {}
        for node in self.bottom_up():
            copies[id(node)] = Tree(
                node.label, list(node.children) if node.is_preterminal else [copies[id(c)] for c in node.children]
            )  # type: ignore[arg-type]
        copy = copies[id(self)]
        for p, tag in zip(copy.preterminals(), tags):
            p.label = tag
        return copy

    def __str__(self) -> str:
        """One line, the mirror's format: ``(TOP (S (NP (DT The) (NN cat)) ...))``."""
        parts: list[str] = []
        stack: list[Tree | str] = [self]  # nodes to write, and text to write as it is
        while stack:
            node = stack.pop()
            if isinstance(node, str):
                parts.append(node)
            elif node.is_preterminal:
                parts.append(f"({node.label} {node.children[0]})")
            else:
                parts.append(f"({node.label}")
                stack.append(")")
                for c in reversed(node.children):
                    stack += [c, " "]
        return "".join(parts)


class _Reader:
    """Builds trees from a stream of bracket tokens; a tree is complete when its brackets close."""

    def __init__(self, path: str | Path | None):
        self.path = path
        self.stack: list[Tree] = []
        self.start = 0  # line where the tree being read began
        self.expect_label = False

    def feed(self, text: str, line: int | None) -> Iterator[Tree]:
        for tok in _TOKEN.findall(text):
            if self.expect_label:  # the token after "(": a label, or "(" / ")" for an unlabelled node
                self.expect_label = False
                if tok not in "()":
                    self.stack[-1].label = tok
                    continue
            if tok == "(":
                node = Tree("")
                if self.stack:
                    if any(isinstance(c, str) for c in self.stack[-1].children):
                        raise DataError("a constituent beside a word inside one bracket", self.path, line)
                    self.stack[-1].children.append(node)
                else:
                    self.start = line
                self.stack.append(node)
                self.expect_label = True
            elif tok == ")":
                if not self.stack:
                    raise DataError("')' without an open bracket", self.path, line)
                node = self.stack.pop()
                if not self.stack:
                    yield node
            else:
                if not self.stack:
                    raise DataError(f"text outside brackets: {tok!r}", self.path, line)
                top = self.stack[-1]
                if top.children:
                    what = "two words" if isinstance(top.children[0], str) else "a word beside constituents"
                    raise DataError(f"{what} inside one bracket ({top.label} ... {tok})", self.path, line)
                top.children.append(tok)

    def finish(self) -> None:
        if self.stack:
            raise DataError(
                f"{len(self.stack)} bracket(s) never closed in the tree that starts here", self.path, self.start
            )


def parse_tree(text: str) -> Tree:
    """One bracketed tree (ValueError if `text` is not exactly one)."""
    reader = _Reader(None)
    try:
        trees = list(reader.feed(text, None))
        reader.finish()
    except DataError as e:
        raise ValueError(f"not a tree: {e.message}: {text[:80]!r}") from None
    if len(trees) != 1:
        raise ValueError(f"expected one tree, found {len(trees)}: {text[:80]!r}")
    return trees[0]


def read_trees(path: str | Path) -> Iterator[Tree]:
    """The trees of a file (plain or .gz): one per line, or PTB .mrg trees over many lines."""
    from ..data.text import read_lines

    reader = _Reader(path)
    for n, line in enumerate(read_lines(path), start=1):
        yield from reader.feed(line, n)
    reader.finish()


def read_tree_lines(path: str | Path) -> list[Tree | None]:
    """A file of one tree per line, line for line (an empty line is None), for scoring."""
    from ..data.text import read_lines

    out: list[Tree | None] = []
    for n, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            out.append(None)
            continue
        reader = _Reader(path)
        trees = list(reader.feed(line, n))
        reader.finish()
        if len(trees) != 1:
            raise DataError(f"{len(trees)} trees on one line (one tree per line expected)", path, n)
        out.append(trees[0])
    return out


def strip_function_tags(label: str) -> str:
    """``NP-SBJ-2`` -> ``NP``, ``PP-LOC=3`` -> ``PP``; labels that start with ``-`` stay."""
    return label if label.startswith("-") else re.split(r"[-=]", label, maxsplit=1)[0] or label


def clean(tree: Tree) -> Tree | None:
    """The standard WSJ preprocessing: empty elements (``-NONE-``) and the constituents left empty
    removed, function tags cut from phrase labels and an unlabelled root named ``TOP`` (None if
    nothing is left). The mirror's trees are already clean."""
    cleaned: dict[int, Tree | None] = {}
    for node in tree.bottom_up():
        if node.is_preterminal:
            cleaned[id(node)] = None if node.label == "-NONE-" else Tree(node.label, list(node.children))
            continue
        kids = [k for k in (cleaned[id(c)] for c in node.children if isinstance(c, Tree)) if k is not None]
        cleaned[id(node)] = Tree(strip_function_tags(node.label), kids) if kids else None  # type: ignore[arg-type]
    out = cleaned[id(tree)]
    if out is not None and out.label == "":
        out.label = "TOP"
    return out


def linearize(tree: Tree, tags: bool = False) -> list[str]:
    """Vinyals et al.'s sequence for `tree`: ``(LABEL`` entering a constituent, ``)LABEL`` leaving
    it, ``XX`` for a word (with `tags`, its part-of-speech tag); an outer TOP over one constituent
    is left out."""

    def children(node: Tree) -> list[Tree]:
        for c in node.children:
            if not isinstance(c, Tree):
                raise ValueError(f"constituent {node.label} has a bare word {c!r} beside constituents")
        return node.children  # type: ignore[return-value]

    out: list[str] = []
    stack: list[Tree | str] = [tree]
    if tree.label in WRAPPERS and not tree.is_preterminal:
        first = tree.children[0] if len(tree.children) == 1 else None
        if isinstance(first, Tree) and not first.is_preterminal:
            stack = [first]  # the outer bracket over one constituent: left out
        else:  # an outer bracket over a word, or over several constituents: its children side by side
            stack = children(tree)[::-1]
    while stack:  # nodes to walk, and closing brackets to write
        node = stack.pop()
        if isinstance(node, str):
            out.append(node)
        elif node.is_preterminal:
            if tags and (node.label[:1] in ("(", ")") or node.label in UNKNOWN or not node.label):
                raise ValueError(f"part-of-speech tag {node.label!r} cannot be a target symbol")
            out.append(node.label if tags else XX)
        else:
            out.append("(" + node.label)
            stack += [")" + node.label, *children(node)[::-1]]
    return out


@dataclass
class Repairs:
    """What `delinearize` changed to turn an output sequence into a well-formed tree, by kind."""

    unknown_symbols: int = 0  # neither a bracket nor a word's symbol: dropped
    unmatched_closes: int = 0  # )X with no open constituent: dropped
    mismatched_closes: int = 0  # )X closing a constituent opened with another label: closes it
    extra_leaves: int = 0  # word symbols beyond the number of words: dropped
    missing_leaves: int = 0  # words without a symbol: added at the end
    unclosed: int = 0  # constituents still open at the end: closed
    empty_constituents: int = 0  # holding no word: dropped
    extra_roots: int = 0  # top-level constituents beyond the first: kept side by side under TOP

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    def __add__(self, other: "Repairs") -> "Repairs":
        return Repairs(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def summary(self) -> str:
        """e.g. ``2 repairs: 1 unclosed, 1 missing_leaves`` (or ``no repairs``)."""
        kinds = [f"{v} {k}" for k, v in self.as_dict().items() if v]
        return f"{self.total} repairs: {', '.join(kinds)}" if kinds else "no repairs"


def is_leaf_symbol(symbol: str, tags: bool) -> bool:
    """Whether an output symbol stands for a word: ``XX``, or with `tags` any but a bracket or UNK."""
    if tags:
        return bool(symbol) and symbol[0] not in "()" and symbol not in UNKNOWN
    return symbol == XX


def delinearize(
    symbols: Sequence[str] | str,
    words: Sequence[str],
    *,
    tags: bool = False,
    pos: Sequence[str] | None = None,
) -> tuple[Tree, Repairs]:
    """The tree ``(TOP ...)`` an output sequence (a list, or a string split on whitespace)
    describes, over exactly `words` in order, and the `Repairs` it took. Each word's tag: from
    `pos` if given (e.g. the gold tags), else the sequence's own (`tags`), else ``XX``."""
    if isinstance(symbols, str):
        symbols = symbols.split()
    words = list(words)
    if pos is not None and len(pos) != len(words):
        raise ValueError(f"{len(pos)} tags for {len(words)} words")
    rep = Repairs()
    root = Tree("TOP")
    stack = [root]
    n = 0  # words placed
    for sym in symbols:
        if sym.startswith("("):
            node = Tree(sym[1:])
            stack[-1].children.append(node)
            stack.append(node)
        elif sym.startswith(")"):
            if len(stack) == 1:
                rep.unmatched_closes += 1
                continue
            if stack.pop().label != sym[1:]:
                rep.mismatched_closes += 1
        elif is_leaf_symbol(sym, tags):
            if n == len(words):
                rep.extra_leaves += 1
                continue
            stack[-1].children.append(Tree(sym if tags else XX, [words[n]]))
            n += 1
        else:
            rep.unknown_symbols += 1
    if n < len(words):  # at the end: into the innermost open constituent, else the last top-level one
        rep.missing_leaves += len(words) - n
        target = stack[-1]
        if target is root and root.children and not root.children[-1].is_preterminal:  # type: ignore[union-attr]
            target = root.children[-1]  # type: ignore[assignment]
        target.children.extend(Tree(XX, [w]) for w in words[n:])
    rep.unclosed += len(stack) - 1

    for node in root.bottom_up():  # drop constituents without words, the innermost first
        if not node.is_preterminal:
            kept = [c for c in node.children if isinstance(c, Tree) and (c.is_preterminal or c.children)]
            rep.empty_constituents += len(node.children) - len(kept)
            node.children = kept  # type: ignore[assignment]
    rep.extra_roots += max(0, len(root.children) - 1)
    if pos is not None:
        root = root.with_tags(pos)
    assert root.leaves() == words
    return root, rep


def is_well_formed(symbols: Sequence[str] | str, n_words: int, tags: bool = False) -> bool:
    """Whether `symbols` describe a tree over `n_words` words with no repair at all."""
    return delinearize(symbols, [str(i) for i in range(n_words)], tags=tags)[1].total == 0


def tree_lines(trees: Iterable[Tree | None]) -> Iterator[str]:
    """One line per tree (an empty line for None)."""
    for t in trees:
        yield "" if t is None else str(t)
