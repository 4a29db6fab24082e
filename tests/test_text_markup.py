"""transduce.text.markup: HTML and text with inline tags translated a sentence at a time, the tags
put around the words the translator's alignment gives, everything else kept as written. A scripted
translator whose alignment is known: each sentence's tokens upper-cased, in order or reversed."""

from __future__ import annotations

import re

import pytest

from transduce.text.blocks import parse
from transduce.text.markup import plan, proportional_links, translate_html, translate_tagged

TOKEN = re.compile(r"\w+|[^\w\s]")


class Scripted:
    """Tokens (words, punctuation) upper-cased, reversed if `reverse`; each output token aligned
    to the source token it came from. Records its calls."""

    def __init__(self, reverse: bool = False):
        self.reverse, self.calls = reverse, []

    def translate(self, sentences):
        self.calls.append(("translate", list(sentences)))
        out = []
        for s in sentences:
            tokens = [m.group().upper() for m in TOKEN.finditer(s)]
            out.append(" ".join(reversed(tokens) if self.reverse else tokens))
        return out

    def align(self, sources, outputs):
        self.calls.append(("align", list(sources)))
        links = []
        for s, o in zip(sources, outputs):
            src = [m.span() for m in TOKEN.finditer(s)]
            tgt = [m.span() for m in TOKEN.finditer(o)]
            order = list(reversed(src)) if self.reverse else src
            links.append([(t0, t1, *order[j]) for j, (t0, t1) in enumerate(tgt)])
        return links


def test_the_issues_example_keeps_the_bold_word_bold():
    assert translate_html("<p>A dog <b>runs</b>.</p>", "en", Scripted()) == "<p>A DOG <b>RUNS</b> .</p>"
    assert translate_html("<p>A dog <b>runs</b>.</p>", "en", Scripted(reverse=True)) == "<p>. <b>RUNS</b> DOG A</p>"


def test_sentences_of_a_block_across_tags_in_one_call():
    t = Scripted()
    out = translate_html(
        '<p>One <a href="/x?a=1&amp;b=2">two three</a> four. Five <i>six</i>.</p><p>Seven.</p>', "en", t
    )
    assert out == '<p>ONE <a href="/x?a=1&amp;b=2">TWO THREE</a> FOUR . FIVE <i>SIX</i> .</p><p>SEVEN .</p>'
    assert t.calls == [
        ("translate", ["One two three four.", "Five six.", "Seven."]),
        ("align", ["One two three four.", "Five six."]),
    ]  # "Seven." has no tag to place


def test_reordered_words_carry_their_tags_nested():
    out = translate_html("<p>The <b>very <i>red</i></b> car <u>stops</u>.</p>", "en", Scripted(reverse=True))
    assert out == "<p>. <u>STOPS</u> CAR <b><i>RED</i> VERY</b> THE</p>"


def test_kept_as_written():
    doc = (
        '<!DOCTYPE html>\n<html><head><style>p { color: red }</style><script>var s = "<p>no</p>";</script></head>'
        '<body><!-- note --><pre>keep  <b>this</b></pre><p translate="no">Not this.</p>'
        "<p>Use <code>ls -l</code> now.</p><p>  </p><p>:-)</p></body></html>"
    )
    out = translate_html(doc, "en", Scripted())
    assert out == doc.replace("Use <code>ls -l</code> now.", "USE <code>ls -l</code> NOW .")


def test_void_tags_entities_and_line_breaks():
    doc = "<p>Tom &amp; Jerry&nbsp;run.<br>A cat<img src='c.png' alt=\"&lt;c&gt;\"> sleeps.</p>"
    out = translate_html(doc, "en", Scripted())
    assert out == "<p>TOM &amp; JERRY RUN .<br>A CAT <img src='c.png' alt=\"&lt;c&gt;\">SLEEPS .</p>"
    assert translate_html("<p>One.\n  Two.</p>", "en", Scripted()) == "<p>ONE .\n  TWO .</p>"  # HTML's own whitespace
    assert translate_html("<p>One<br>two</p>", "en", Scripted(), mode="off") == "<p>ONE <br>TWO</p>"  # one sentence


def test_a_tag_around_whole_sentences_and_their_space():
    assert translate_html("<p><b>Hello. </b>World.</p>", "en", Scripted()) == "<p><b>HELLO . </b>WORLD .</p>"
    assert translate_html("<p><i>Hello world.</i></p>", "en", Scripted(reverse=True)) == "<p><i>. WORLD HELLO</i></p>"


def test_a_tag_open_across_blocks():
    out = translate_html("<p>Unclosed <b>bold</p><p>here</b> end.</p>", "en", Scripted())
    assert out == "<p>UNCLOSED <b>BOLD</p><p>HERE</b> END .</p>"


def test_tagged_texts_every_tag_inline():
    t = Scripted(reverse=True)
    out = translate_tagged(["The <x1>red</x1> car<x2/> goes &amp; <x3 k='v'>stops</x3>.", "Plain text.", ""], "en", t)
    assert out == [". <x3 k='v'>STOPS</x3> &amp; <x2/>GOES CAR <x1>RED</x1> THE", ". TEXT PLAIN", ""]
    assert t.calls[0] == ("translate", ["The red car goes & stops.", "Plain text."])


def test_line_breaks_of_tagged_text_split_sentences():
    out = translate_tagged(["First <b>line</b>\nsecond line"], "en", Scripted(reverse=True))
    assert out == ["<b>LINE</b> FIRST\nLINE SECOND"]


def test_a_job_for_a_caller_that_batches_itself():
    job = plan(["<p>A <b>b</b>.</p>", "<p>C.</p>"], "en")
    assert job.sentences == ["A b.", "C."] and job.aligned == [0]
    assert job.render(["X Y.", "Z."], [[(0, 1, 0, 1), (2, 3, 2, 3), (3, 4, 3, 4)]]) == [
        "<p>X <b>Y</b>.</p>",
        "<p>Z.</p>",
    ]
    with pytest.raises(ValueError, match="1 outputs and 1 alignments for 2 sentences"):
        job.render(["X"], [[]])


def test_parse_remembers_spans():
    (block,) = [p for p in parse("<p>A <b>big <i>red</i></b> dog</p>") if not isinstance(p, str)]
    assert block.text == "A big red dog"
    assert [(t.start, t.end, t.open, t.close, t.parent) for t in block.tags] == [
        (2, 9, "<b>", "</b>", None),
        (6, 9, "<i>", "</i>", 0),
    ]


def test_no_alignment_places_tags_in_proportion():
    job = plan(["<p>A dog <b>runs</b> fast.</p>"], "en")
    assert job.render(["Ein Hund rennt schnell."], [[]]) == ["<p>Ein Hund <b>rennt</b> schnell.</p>"]
    assert proportional_links("a b", "x y z") == [(0, 1, 0, 1), (2, 3, 0, 1), (4, 5, 2, 3)]
    assert proportional_links("", "x") == []
