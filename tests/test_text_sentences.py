"""transduce.text.sentences: a text cut into sentences and what lies between them, and put back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from transduce.text import sentences
from transduce.text.sentences import Piece, rejoin, split, split_all, rejoin_all, translate_text, translate_texts

PARAGRAPH = (
    "Two dogs are playing in the snow. A man is riding a bike. A woman in a red dress sings on a stage "
    "while children watch her."
)


def test_a_paragraph_is_three_sentences_with_their_spaces():
    pieces = split(PARAGRAPH, "en")
    assert [p.text for p in pieces if p.translate] == [
        "Two dogs are playing in the snow.",
        "A man is riding a bike.",
        "A woman in a red dress sings on a stage while children watch her.",
    ]
    assert [p.text for p in pieces if not p.translate] == [" ", " "]


def test_line_breaks_and_whitespace_are_pieces_kept_as_they_are():
    text = "  Dr. Müller kam am 1. Januar.\n\nZ. B. hier...  Ja!\r\n"
    pieces = split(text, "de")
    assert pieces == [
        Piece("  ", False),
        Piece("Dr. Müller kam am 1. Januar.", True),
        Piece("\n\n", False),
        Piece("Z. B. hier...", True),
        Piece("  ", False),
        Piece("Ja!", True),
        Piece("\r\n", False),
    ]


def test_modes_are_deepls():
    text = "A dog\nruns. A cat sleeps."
    assert [p.text for p in split(text, "en", "on") if p.translate] == ["A dog", "runs.", "A cat sleeps."]
    nonewlines = [p for p in split(text, "en", "nonewlines") if p.translate]
    assert [p.text for p in nonewlines] == ["A dog\nruns.", "A cat sleeps."]
    assert nonewlines[0].source == "A dog runs."
    assert split(" " + text + " ", "en", "off") == [Piece(" ", False), Piece(text, True), Piece(" ", False)]
    with pytest.raises(ValueError, match="one of on, off, nonewlines"):
        split(text, "en", "yes")


def test_nothing_to_translate_is_kept():
    assert split("", "en") == []
    assert split(" \n ", "en") == [Piece(" \n ", False)]
    assert split("Hi! :-) ...", "en") == [Piece("Hi!", True), Piece(" :-) ...", False)]


def test_language_codes_with_regions_and_unknown_languages():
    assert [p.text for p in split("Das ist z. B. gut. Ja.", "de-DE") if p.translate] == ["Das ist z. B. gut.", "Ja."]
    assert [p.text for p in split("Hello there. Bye.", "xx") if p.translate] == ["Hello there.", "Bye."]


def test_rejoin_puts_outputs_in_their_places():
    pieces = split("One two. Three four.\n Five six. ", "en")
    assert rejoin(pieces, ["1", "2", "3"]) == "1 2\n 3 "
    with pytest.raises(ValueError, match="2 outputs for 3 sentences"):
        rejoin(pieces, ["1", "2"])


def test_all_sentences_of_all_texts_in_one_batch():
    calls = []

    def upper(batch):
        calls.append(list(batch))
        return [s.upper() for s in batch]

    texts = [PARAGRAPH, "", "One line.\nTwo lines. Three."]
    out = translate_texts(upper, texts, "en")
    assert len(calls) == 1 and len(calls[0]) == 6
    assert out == [PARAGRAPH.upper(), "", "ONE LINE.\nTWO LINES. THREE."]
    assert translate_text(upper, "x. y.", "en", "off") == "X. Y."
    layouts, batch = split_all(texts, "en")
    assert rejoin_all(layouts, batch) == texts


def test_a_translator_that_loses_a_sentence_is_an_error():
    with pytest.raises(ValueError, match="1 translations for 2 sentences"):
        translate_text(lambda batch: batch[:1], "One. Two.", "en")


TEXT = st.lists(
    st.sampled_from(list("ab .!?…\"'()\n\r\t\u00a0\u2028Z3:-") + ["Dr.", "z. B.", "...", "\r\n", "M. "]), max_size=40
).map("".join) | st.text(max_size=40)


@settings(max_examples=300, deadline=None)
@given(TEXT, st.sampled_from(sentences.MODES), st.sampled_from(["en", "de", "fr"]))
def test_the_pieces_are_the_text(text, mode, lang):
    pieces = split(text, lang, mode)
    assert "".join(p.text for p in pieces) == text
    assert all(p.text for p in pieces)
    assert not any(not a.translate and not b.translate for a, b in zip(pieces, pieces[1:]))
    for p in pieces:
        if p.translate:
            assert p.text == p.text.strip() and sentences.words(p.text)
            if mode == "on":
                assert sentences._LINE_BREAK.search(p.text) is None
    assert rejoin(pieces, [p.text for p in pieces if p.translate]) == text


@pytest.mark.parametrize("space", ["\u00a0", "\u3000", "\u2009"])
def test_a_multi_byte_space_before_a_period_does_not_break_the_splitter(space):
    # sentencex 1.0.32 panics (a Rust slice inside a multi-byte character) on a capital, such a space and
    # a period; the splitter sees ASCII spaces there, and the pieces are still the text
    text = f"Dr. Z{space}. Then another one. And a third."
    for mode in sentences.MODES:
        pieces = split(text, "en", mode)
        assert "".join(p.text for p in pieces) == text
    assert [p.text for p in split(text, "en", "on") if p.translate][-1] == "And a third."


def test_a_splitter_panic_keeps_the_text_whole_and_other_errors_pass(monkeypatch):
    import sentencex

    class PanicException(BaseException):  # as pyo3 names a Rust panic
        pass

    def panics(lang, text):
        raise PanicException("byte index is not a char boundary")

    sentences._splitters.cache_clear()
    monkeypatch.setattr(sentencex, "segment", panics)
    try:
        pieces = split("One here. Two there.", "xx", "on")  # sentencex alone: no end found, one piece
        assert [p.text for p in pieces if p.translate] == ["One here. Two there."]
        monkeypatch.setattr(sentencex, "segment", lambda lang, text: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            split("One here. Two there.", "xx", "on")
    finally:
        sentences._splitters.cache_clear()
