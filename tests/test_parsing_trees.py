"""Trees: reading (one per line and .mrg), cleaning, Vinyals et al.'s linearization, and the way
back with every kind of repair; the round trip on every tree of WSJ sections 22 and 23."""

import pytest

from transduce.data.text import read_lines
from transduce.errors import DataError
from transduce.parsing.trees import (
    Repairs,
    Tree,
    clean,
    delinearize,
    is_well_formed,
    linearize,
    parse_tree,
    read_tree_lines,
    read_trees,
)

CAT = "(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (PRP it)))) (. .)))"


def test_linearize_as_vinyals_et_al():
    t = parse_tree(CAT)
    assert " ".join(linearize(t)) == "(S (NP XX XX )NP (VP XX (PP XX (NP XX )NP )PP )VP XX )S"
    assert " ".join(linearize(t, tags=True)) == "(S (NP DT NN )NP (VP VBD (PP IN (NP PRP )NP )PP )VP . )S"
    assert str(t) == CAT and t.leaves() == "The cat sat on it .".split()
    assert t.tags() == ["DT", "NN", "VBD", "IN", "PRP", "."]


def test_round_trip_small():
    t = parse_tree(CAT)
    back, rep = delinearize(linearize(t), t.leaves())
    assert rep.total == 0 and back.leaves() == t.leaves() and set(back.tags()) == {"XX"}
    assert delinearize(linearize(t), t.leaves(), pos=t.tags())[0] == t  # gold tags put back
    assert delinearize(linearize(t, tags=True), t.leaves(), tags=True)[0] == t  # the model's own tags
    one = parse_tree("(TOP (UH Hello))")  # no constituent at all: only the word's symbol
    assert linearize(one) == ["XX"] and delinearize(["XX"], ["Hello"], pos=["UH"])[0] == one


@pytest.mark.parametrize(
    "symbols,words,repairs,tree",
    [
        # unbalanced: a bracket left open is closed at the end
        ("(S (NP XX XX )NP (VP XX", "a b c", dict(unclosed=2), "(TOP (S (NP (XX a) (XX b)) (VP (XX c))))"),
        # a close with nothing open is dropped
        ("(S XX )S )S XX", "a b", dict(unmatched_closes=1, missing_leaves=0, extra_roots=1), "(TOP (S (XX a)) (XX b))"),
        # a close with another label closes the innermost constituent, which keeps its label
        ("(S (NP XX )VP XX )S", "a b", dict(mismatched_closes=1), "(TOP (S (NP (XX a)) (XX b)))"),
        # more XX than words: dropped; the constituent left empty is dropped too
        (
            "(S (NP XX XX )NP (VP XX )VP )S",
            "a b",
            dict(extra_leaves=1, empty_constituents=1),
            "(TOP (S (NP (XX a) (XX b))))",
        ),
        # fewer XX than words: the rest go at the end, into the innermost open constituent ...
        (
            "(S (NP XX )NP (VP XX",
            "a b c d",
            dict(missing_leaves=2, unclosed=2),
            "(TOP (S (NP (XX a)) (VP (XX b) (XX c) (XX d))))",
        ),
        # ... or, everything closed, into the last top-level constituent
        ("(S (NP XX )NP )S", "a b", dict(missing_leaves=1), "(TOP (S (NP (XX a)) (XX b)))"),
        # symbols that are neither brackets nor XX (an unknown-token mark, a tag in XX mode)
        ("(S ⁇ XX NN )S", "a", dict(unknown_symbols=2), "(TOP (S (XX a)))"),
        # nothing but garbage: the words still make a tree
        (")S )NP", "a b", dict(unmatched_closes=2, missing_leaves=2, extra_roots=1), "(TOP (XX a) (XX b))"),
        ("", "a", dict(missing_leaves=1), "(TOP (XX a))"),
        # two top-level constituents are kept side by side under TOP
        ("(NP XX )NP (VP XX )VP", "a b", dict(extra_roots=1), "(TOP (NP (XX a)) (VP (XX b)))"),
    ],
)
def test_repairs(symbols, words, repairs, tree):
    out, rep = delinearize(symbols, words.split())
    assert str(out) == tree
    assert rep == Repairs(**repairs)
    assert out.leaves() == words.split()  # always exactly the input words, in order
    assert is_well_formed(symbols, len(words.split())) == (rep.total == 0)


def test_repairs_add_up_and_summarize():
    total = Repairs(unclosed=2) + Repairs(unclosed=1, extra_leaves=3)
    assert total.total == 6 and total.summary() == "6 repairs: 3 extra_leaves, 3 unclosed"
    assert Repairs().summary() == "no repairs"


def test_tags_mode_keeps_predicted_tags_and_gold_tags_win():
    out, rep = delinearize("(S (NP DT NN )NP VBD )S", ["The", "cat", "sat"], tags=True)
    assert rep.total == 0 and out.tags() == ["DT", "NN", "VBD"]
    out, _ = delinearize("(S (NP DT NN )NP VBD )S", ["The", "cat", "sat"], tags=True, pos=["DT", "NN", "VBZ"])
    assert out.tags() == ["DT", "NN", "VBZ"]


def test_reading_mrg_multiline_and_cleaning(tmp_path):
    mrg = tmp_path / "wsj_0001.mrg"
    mrg.write_text(
        "( (S \n    (NP-SBJ-1 (NNP Pierre) (NNP Vinken) )\n    (VP (MD will) \n"
        "      (VP (VB join) (NP (-NONE- *-1) )\n        (NP (DT the) (NN board) )))\n    (. .) ))\n"
        "( (S (NP-SBJ (PRP It)) (VP=2 (VBD ended)) (-LRB- -LRB-) (. .)) )\n"
    )
    trees = list(read_trees(mrg))
    assert len(trees) == 2 and trees[0].label == ""
    assert str(clean(trees[0])) == (
        "(TOP (S (NP (NNP Pierre) (NNP Vinken)) (VP (MD will) (VP (VB join) (NP (DT the) (NN board)))) (. .)))"
    )
    assert str(clean(trees[1])) == "(TOP (S (NP (PRP It)) (VP (VBD ended)) (-LRB- -LRB-) (. .)))"


@pytest.mark.parametrize(
    "text,message",
    [
        ("(S (NP a)", "never closed"),
        ("(S (NP a)))", "without an open bracket"),
        ("(S (NP a b))", "two words"),
        ("word (S (NP a))", "outside brackets"),
        ("(S a (NP b))", "beside"),
    ],
)
def test_bad_trees_name_the_file_and_line(tmp_path, text, message):
    f = tmp_path / "bad.trees"
    f.write_text("(TOP (NN ok))\n" + text + "\n")
    with pytest.raises(DataError, match=message) as e:
        list(read_trees(f))
    assert e.value.path == str(f) and e.value.line == 2
    with pytest.raises(ValueError):
        parse_tree(text)


def test_read_tree_lines_keeps_empty_lines(tmp_path):
    f = tmp_path / "parsed.txt"
    f.write_text("(TOP (NN a))\n\n(TOP (NN b))\n")
    assert [None if t is None else str(t) for t in read_tree_lines(f)] == ["(TOP (NN a))", None, "(TOP (NN b))"]


@pytest.mark.corpus("ptb-wsj")
@pytest.mark.parametrize("name", ["dev", "test"])
def test_round_trip_every_tree_of_sections_22_and_23(mirror, name):
    """Linearize, then rebuild from the words: every tree comes back exactly, in both variants
    (XX with the gold tags put back, and the tag-keeping sequence on its own), and the mirror's
    trees are clean already and print back as their own line."""
    path = mirror / "ptb-wsj" / f"{name}.trees.gz"
    lines = list(read_lines(path))
    trees = list(read_trees(path))
    assert len(trees) == len(lines) == {"dev": 1700, "test": 2416}[name]
    for line, t in zip(lines, trees):
        assert str(t) == line
        assert clean(t) == t
        words = t.leaves()
        back, rep = delinearize(linearize(t), words, pos=t.tags())
        assert back == t and rep.total == 0
        back, rep = delinearize(linearize(t, tags=True), words, tags=True)
        assert back == t and rep.total == 0
    assert sum(len(t.leaves()) for t in trees) == {"dev": 40117, "test": 56684}[name]  # PROVENANCE.md's counts


def test_tree_with_tags_copy():
    t = parse_tree(CAT)
    u = t.with_tags(["X"] * 6)
    assert u.tags() == ["X"] * 6 and t.tags()[0] == "DT"
    with pytest.raises(ValueError):
        t.with_tags(["X"])
    assert Tree("NP", ["a"]).is_preterminal


def test_deep_nesting_is_walked_without_recursion():
    """A model's output nests as deep as it likes (a long sentence's limit is input + 300
    symbols, past Python's recursion limit of 1,000): the way back, printing, the gold tags put
    back, cleaning, linearizing and the picture all loop instead of recursing."""
    from transduce.parsing.svg import tree_svg

    n = 3000
    symbols = ["(S"] * n + ["XX", "XX"] + [")S"] * n
    tree, rep = delinearize(symbols, ["a", "b"])
    assert rep.total == 0
    text = str(tree)
    assert text == "(TOP " + "(S " * n + "(XX a) (XX b)" + ")" * (n + 1)
    assert str(parse_tree(text)) == text
    assert linearize(tree) == symbols
    assert str(clean(tree)) == text
    assert tree.with_tags(["DT", "NN"]).tags() == ["DT", "NN"] and tree.tags() == ["XX", "XX"]
    svg = tree_svg(tree)
    assert svg.count(">S<") == n and ">a<" in svg
    # never closed, and emptied: the repairs too
    tree, rep = delinearize(["(S"] * n + ["(NP"] * n + ["XX"], ["a"])
    assert rep.unclosed == 2 * n and rep.empty_constituents == 0 and tree.leaves() == ["a"]
    tree, rep = delinearize(["(S"] * n + [")S"] * n + ["(NP", "XX", ")NP"], ["a"])
    assert rep.empty_constituents == n and str(tree) == "(TOP (NP (XX a)))"


def test_svg_draws_tags_just_above_their_words():
    """As svg.py's docstring says: every tag on the row just above the words, whatever its depth,
    so that a shallow word's tag is not left high above it."""
    import re

    from transduce.parsing.svg import tree_svg

    svg = tree_svg(parse_tree(CAT))
    y = {m[2]: float(m[1]) for m in re.finditer(r'<text x="[\d.]+" y="([\d.]+)"[^>]*>([^<]+)<', svg)}
    assert y["DT"] == y["VBD"] == y["IN"] == y["PRP"]  # tags at depths 3 to 5
    assert y["The"] == y["it"] > y["DT"] > y["NP"]
    assert y["The"] - y["DT"] == y["S"] - y["TOP"]  # one row apart
