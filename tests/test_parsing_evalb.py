"""EVALB with COLLINS.prm, count for count the C program.

Every count below was worked out by hand from evalb.c's rules (see transduce.parsing.evalb) and
checked against the C program itself (evalb.c from nikitakit/self-attentive-parser, compiled with
gcc; docs/RESULTS.md, "EVALB"). The C program is not needed to run these tests."""

import pytest

from transduce.errors import DataError
from transduce.parsing.evalb import COLLINS, EvalbParams, evalb, evalb_files, format_report, score_sentence


# (name, gold, test, (length, status, matched, gold brackets, test brackets, crossing, words, correct tags))
# status: 0 scored, 1 error, 2 skipped. Punctuation (, : `` '' .) is deleted with its word, TOP is
# deleted, labels are cut at - and =, ADVP = PRT; `length` (for the <= 40 cut) counts punctuation.
CASES = [
    # PP attachment: gold NP(the man with a telescope) is missing from the test tree; the 6 others
    # (S, NP I, VP, NP the man, PP, NP a telescope) match. Nothing crosses.
    (
        "wrong attachment",
        "(TOP (S (NP (PRP I)) (VP (VBD saw) (NP (NP (DT the) (NN man)) (PP (IN with) (NP (DT a) (NN telescope))))) (. .)))",
        "(TOP (S (NP (PRP I)) (VP (VBD saw) (NP (DT the) (NN man)) (PP (IN with) (NP (DT a) (NN telescope)))) (. .)))",
        (8, 0, 6, 7, 6, 0, 7, 7),
    ),
    # test NP(I saw) crosses gold VP(saw the man); test VP(the man) has the span of gold NP, another label
    (
        "crossing brackets",
        "(TOP (S (NP (PRP I)) (VP (VBD saw) (NP (DT the) (NN man)))))",
        "(TOP (S (NP (PRP I) (VBD saw)) (VP (DT the) (NN man))))",
        (4, 0, 1, 4, 3, 1, 4, 4),
    ),
    # S-TPC, NP-SBJ-1, VP=2, ADVP-MNR are cut to S, NP, VP, ADVP: all four match
    (
        "function tags",
        "(TOP (S (NP (NNP John)) (VP (VBZ runs) (ADVP (RB fast)))))",
        "(TOP (S-TPC (NP-SBJ-1 (NNP John)) (VP=2 (VBZ runs) (ADVP-MNR (RB fast)))))",
        (3, 0, 4, 4, 4, 0, 3, 3),
    ),
    # EQ_LABEL ADVP PRT: the particle's bracket matches; its tag (RP vs RB) does not
    (
        "PRT vs ADVP",
        "(TOP (S (NP (PRP He)) (VP (VBD gave) (PRT (RP up)))))",
        "(TOP (S (NP (PRP He)) (VP (VBD gave) (ADVP (RB up)))))",
        (3, 0, 4, 4, 4, 0, 3, 2),
    ),
    (
        "PRT vs ADJP",
        "(TOP (S (NP (PRP He)) (VP (VBD gave) (PRT (RP up)))))",
        "(TOP (S (NP (PRP He)) (VP (VBD gave) (ADJP (JJ up)))))",
        (3, 0, 3, 4, 4, 0, 3, 2),
    ),
    # extra unaries S-S, NP-NP, VP-VP: a bracket matches once only (multisets), so 3 of 6 test
    # brackets match; the final period is not a word, so S spans the same 2 words
    (
        "extra unaries",
        "(TOP (S (NP (PRP He)) (VP (VBD left)) (. .)))",
        "(TOP (S (S (NP (NP (PRP He))) (VP (VP (VBD left))) (. .))))",
        (3, 0, 3, 3, 6, 0, 2, 2),
    ),
    # a phrase labelled "." over a word is deleted (its label is a DELETE_LABEL); an NP over the
    # period spans no word once the period is deleted, so it is deleted too
    (
        "punctuation as a phrase",
        "(TOP (S (NP (PRP He)) (VP (VBD left) (NP (NN today))) (. .)))",
        "(TOP (S (NP (PRP He)) (VP (VBD left) (. (NN today))) (NP (. .))))",
        (4, 0, 3, 4, 3, 0, 3, 3),
    ),
    (
        "flat tree",
        "(TOP (S (NP (PRP I)) (VP (VBD saw) (NP (DT the) (NN man))) (. .)))",
        "(TOP (S (PRP I) (VBD saw) (DT the) (NN man) (. .)))",
        (5, 0, 1, 4, 1, 0, 4, 4),
    ),
    # a word less: "Length unmatch (4|3)", an error sentence, nothing counted
    (
        "length mismatch",
        "(TOP (S (NP (PRP I)) (VP (VBD saw) (NP (DT the) (NN man))) (. .)))",
        "(TOP (S (NP (PRP I)) (VP (VBD saw) (NP (NN man))) (. .)))",
        (5, 1, 0, 0, 0, 0, 0, 0),
    ),
    # the period tagged NN is a word in the test tree only: "Length unmatch (2|3)"
    (
        "punctuation tagged as a word",
        "(TOP (S (NP (PRP I)) (VP (VBD left)) (. .)))",
        "(TOP (S (NP (PRP I)) (VP (VBD left)) (NN .)))",
        (3, 1, 0, 0, 0, 0, 0, 0),
    ),
    (
        "different word",
        "(TOP (S (NP (PRP I)) (VP (VBD left)) (. .)))",
        "(TOP (S (NP (PRP You)) (VP (VBD left)) (. .)))",
        (3, 1, 0, 0, 0, 0, 0, 0),
    ),
    # no test tree (a parser that gave up): skipped, not an error
    ("empty test line", "(TOP (S (NP (PRP I)) (VP (VBD left)) (. .)))", "", (3, 2, 0, 0, 0, 0, 0, 0)),
]


@pytest.mark.parametrize("name,gold,test,expected", CASES, ids=[c[0] for c in CASES])
def test_hand_checked_sentence(name, gold, test, expected):
    s, _ = score_sentence(gold, test)
    assert (s.length, s.status, s.matched, s.gold, s.test, s.crossing, s.words, s.correct_tags) == expected


def test_hand_checked_corpus_totals():
    """All the cases as one corpus: evalb.c prints 73.53 recall, 80.65 precision, 76.92 F1,
    matched 25 / gold 34 / test 31, 12 sentences, 3 errors, 1 skipped, 29 words, 27 tags right."""
    r = evalb([c[1] for c in CASES], [c[2] for c in CASES])
    t = r.all
    assert (t.sentences, t.errors, t.skipped, t.valid) == (12, 3, 1, 8)
    assert (t.matched, t.gold, t.test, t.crossing, t.words, t.correct_tags) == (25, 34, 31, 1, 29, 27)
    assert (round(t.recall, 2), round(t.precision, 2), round(t.f1, 2)) == (73.53, 80.65, 76.92)
    assert (round(t.complete_match, 2), round(t.average_crossing, 2), round(t.tagging_accuracy, 2)) == (
        25.0,
        0.12,
        93.10,
    )
    assert r.short.sentences == 12  # every sentence has at most 40 words
    report = format_report(r)
    assert "Bracketing FMeasure       =  76.92" in report and "Number of Skip  sentence  =      1" in report


def test_length_cut_counts_punctuation_but_not_empty_elements():
    """The <= 40 subset is chosen by the gold length with punctuation (only -NONE- left out)."""
    words = " ".join(f"(NN w{i})" for i in range(39))
    gold = f"(TOP (S (NP {words}) (-NONE- *T*) (, ,) (. .)))"  # 39 words + 2 punctuation = 41
    r = evalb([gold, f"(TOP (S (NP {words}) (-NONE- *T*) (. .)))"], [gold, gold])
    assert [s.length for s in r.sentences] == [41, 40]
    assert (r.all.sentences, r.short.sentences) == (2, 1)


def test_unreadable_test_line_is_an_error_sentence():
    gold = "(TOP (S (NP (PRP I)) (VP (VBD left))))"
    for bad in (
        "(TOP (S (NP (PRP I)) (VP (VBD left))",
        "(TOP (S (NP (PRP I) x) (VP (VBD left))))",
        "(TOP (S (NP (PRP I)) (VP (VBD left)))))",
    ):
        s, errors = score_sentence(gold, bad)
        assert s.status == 1 and errors >= 1
        r = evalb([gold], [bad])
        assert (r.all.errors, r.all.matched, r.all.gold, r.all.test) == (1, 0, 0, 0)  # an error adds no bracket


def test_unlabeled_and_parameter_file(tmp_path):
    prm = tmp_path / "x.prm"
    prm.write_text("# comment\nLABELED 0\nDELETE_LABEL TOP\nCUTOFF_LEN 2\nEQ_LABEL ADVP PRT\n")
    p = EvalbParams.from_file(prm)
    assert not p.labeled and p.cutoff_len == 2 and p.delete_labels == {"TOP"}
    s, _ = score_sentence("(TOP (S (NP (PRP He)) (VP (VBD left))))", "(TOP (X (Y (PRP He)) (Z (VBD left))))", params=p)
    assert (s.matched, s.gold, s.test) == (3, 3, 3)
    prm.write_text("QUOTE_LABEL POS\n")
    with pytest.raises(DataError, match="QUOTE_LABEL"):
        EvalbParams.from_file(prm)


@pytest.mark.corpus("ptb-wsj")
def test_collins_prm_in_the_mirror_is_the_default(mirror):
    assert EvalbParams.from_file(mirror / "ptb-wsj" / "COLLINS.prm") == COLLINS


def test_line_counts_must_agree():
    with pytest.raises(DataError, match="line counts differ"):
        evalb(["(TOP (NN a))"], [])


def test_c_program_error_limit_is_reported():
    gold = ["(TOP (S (NN a) (NN b)))"] * 13
    r = evalb(gold, ["(TOP (S (NN a)))"] * 13)
    assert r.all.errors == 13 and r.c_program_stops_at == 12  # evalb.c exits at its 12th error


# --- real data: the figures of docs/RESULTS.md -----------------------------------------------------


@pytest.mark.corpus("ptb-wsj")
def test_dev_gold_against_itself(mirror):
    """Section 22 against itself: 30,633 brackets (evalb.c's totals line), 35,508 words."""
    ptb = mirror / "ptb-wsj"
    r = evalb_files(ptb / "dev.trees.gz", ptb / "dev.trees.gz")
    t = r.all
    assert (t.sentences, t.errors, t.skipped) == (1700, 0, 0)
    assert (t.matched, t.gold, t.test, t.words, t.correct_tags) == (30633, 30633, 30633, 35508, 35508)
    assert t.f1 == 100.0


@pytest.mark.corpus("ptb-wsj")
def test_test_gold_against_auto_tagged_test(mirror):
    """Section 23 against its Stanford-tagged copy: exactly 1 error (line 1962, where a quote
    tagged POS instead of '' is a word in one tree only), 44,258 brackets all matched, tagging
    accuracy 48,484 / 49,874 = 97.21, as evalb.c prints."""
    ptb = mirror / "ptb-wsj"
    r = evalb_files(ptb / "test.trees.gz", ptb / "test.auto-pos.trees.gz")
    t = r.all
    assert (t.sentences, t.errors, t.skipped) == (2416, 1, 0)
    assert [s.line for s in r.sentences if s.status == 1] == [1962]
    assert (t.matched, t.gold, t.test, t.words, t.correct_tags) == (44258, 44258, 44258, 49874, 48484)
    assert round(t.tagging_accuracy, 2) == 97.21
    assert (r.short.sentences, r.short.errors) == (2245, 1)
