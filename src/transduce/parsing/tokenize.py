"""Raw English -> Penn Treebank tokens, for `transduce parse` (the parser was trained on them).

A port of the Treebank's own tokenizer, Robert MacIntyre's tokenizer.sed (1995), rule for rule
in its order, with NLTK's TreebankWordTokenizer's two refinements that match the WSJ trees'
leaves: a comma or colon inside a number stays (``1,000``), and brackets are written as the
treebank writes them (``-LRB-``). One sentence per line: only a final period is split off.
"""

from __future__ import annotations

import re

_RULES: list[tuple[re.Pattern, str]] = [
    (re.compile(p), r)
    for p, r in [
        # opening double quotes
        (r'^"', r"`` "),
        (r'([ (\[{<])"', r"\1 `` "),
        # ellipsis, then punctuation: , and : only when not inside a number
        (r"\.\.\.", r" ... "),
        (r"([,:])([^\d])", r" \1 \2"),
        (r"([,:])$", r" \1 "),
        (r"[;@#$%&]", r" \g<0> "),
        # a final period (with the closing brackets and quotes after it)
        (r"([^.])([.])([\])}>\"']*)\s*$", r"\1 \2\3 "),
        (r"[?!]", r" \g<0> "),
        (r"[\]\[(){}<>]", r" \g<0> "),
        (r"--", r" -- "),
    ]
]
_END_RULES: list[tuple[re.Pattern, str]] = [
    (re.compile(p), r)
    for p, r in [
        (r'"', r" '' "),
        (r"([^'])' ", r"\1 ' "),
        (r"'([sSmMdD]) ", r" '\1 "),
        (r"('ll|'re|'ve|n't|'LL|'RE|'VE|N'T) ", r" \1 "),
        (r" ([Cc])annot ", r" \1an not "),
        (r" ([Dd])'ye ", r" \1' ye "),
        (r" ([Gg])imme ", r" \1im me "),
        (r" ([Gg])onna ", r" \1on na "),
        (r" ([Gg])otta ", r" \1ot ta "),
        (r" ([Ll])emme ", r" \1em me "),
        (r" ([Mm])ore'n ", r" \1ore 'n "),
        (r" '([Tt])is ", r" '\1 is "),
        (r" '([Tt])was ", r" '\1 was "),
        (r" ([Ww])anna ", r" \1an na "),
    ]
]
BRACKETS = {"(": "-LRB-", ")": "-RRB-", "[": "-LSB-", "]": "-RSB-", "{": "-LCB-", "}": "-RCB-"}
"""How the treebank writes brackets: sections 02-21 have -LRB- -RRB- (about 1,150 each) and
-LCB- -RCB- (about 215 each), no square brackets; those get the later convention, -LSB- -RSB-."""


def ptb_tokenize(text: str) -> list[str]:
    """The Penn Treebank tokens of one sentence of raw English."""
    s = text.strip()
    for pattern, repl in _RULES:
        s = pattern.sub(repl, s)
    s = f" {s} "
    for pattern, repl in _END_RULES:
        s = pattern.sub(repl, s)
        if pattern.pattern.endswith(" ") and pattern.search(s):  # overlapping matches (a b c): once more
            s = pattern.sub(repl, s)
    return [BRACKETS.get(t, t) for t in s.split()]


def escape_brackets(tokens: list[str]) -> list[str]:
    """Tokens given as they are (`transduce parse --tokenized`) with their brackets written the
    treebank's way: a bracket on its own as in `BRACKETS` (``(`` -> ``-LRB-``), and a round
    bracket inside a token (``:)``) as ``-LRB-`` / ``-RRB-`` too: left as it is, it would break
    the brackets of the tree printed around it, and the model never saw one."""
    return [BRACKETS.get(t) or t.replace("(", "-LRB-").replace(")", "-RRB-") for t in tokens]
