"""Documents in, documents out (transduce.documents): a small document of each format built here
with its own library (runs of formatting, a link, a table, a header and footer, notes, an image,
subtitle timings), translated by a scripted translator that upper-cases every word it is given
(so a segment left untranslated is seen in lower case), and opened again with that library:
every text translated, in ONE call of the translator, the formatting runs, links, tables,
headers and footers, notes and timings where they were. Then the inline tags' edge cases, files
that cannot be read, and `transduce translate --file` with a tiny model."""

import re
import zipfile
from io import BytesIO

import pytest

docx = pytest.importorskip("docx")
pptx = pytest.importorskip("pptx")
odf = pytest.importorskip("odf")
srt = pytest.importorskip("srt")

from transduce.documents import (  # noqa: E402
    DocumentError,
    Translator,
    format_of,
    output_name,
    read,
    translate_document,
)
from transduce.documents.inline import Piece, tagged, untagged  # noqa: E402

_TOKEN = re.compile(r"\w+|[^\w\s]")
URL = "https://example.org/manual"


class Marking:
    """The scripted translator (`text.markup.Translator`): every word upper-cased, each output
    token aligned with the source token it came from; the sentences of each call remembered."""

    def __init__(self):
        self.calls: list[list[str]] = []

    def translate(self, sentences: list[str]) -> list[str]:
        self.calls.append(list(sentences))
        return [re.sub(r"[^\W\d_]+", lambda m: m.group().upper(), s) for s in sentences]

    def align(self, sources: list[str], outputs: list[str]) -> list[list[tuple[int, int, int, int]]]:
        return [[(*m.span(), *m.span()) for m in _TOKEN.finditer(o)] for o in outputs]  # upper-casing keeps offsets


def translated(data: bytes, fmt: str):
    """The file translated by `Marking`, and the translator (asserted to be called once)."""
    marking = Marking()
    out = translate_document(read(data, fmt, f"test{fmt}"), marking, "en")
    assert len(marking.calls) == 1, "a document's sentences go to the translator as one batch"
    return out, marking


def no_lower(texts) -> None:
    """Nothing left untranslated: no lower-case letter in any text."""
    left = [t for t in texts if any(c.islower() for c in t)]
    assert not left, f"untranslated: {left}"


def png() -> bytes:
    from PIL import Image  # python-pptx's dependency

    buf = BytesIO()
    Image.new("RGB", (4, 4), (200, 30, 30)).save(buf, "PNG")
    return buf.getvalue()


# -- Word ------------------------------------------------------------------------------------------


def add_hyperlink(paragraph, url: str, text: str) -> None:
    """A w:hyperlink (python-docx has no call that adds one) to an external URL, a run inside."""
    from docx.opc.constants import RELATIONSHIP_TYPE
    from docx.oxml import OxmlElement
    from docx.oxml.ns import qn

    rid = paragraph.part.relate_to(url, RELATIONSHIP_TYPE.HYPERLINK, is_external=True)
    link = OxmlElement("w:hyperlink")
    link.set(qn("r:id"), rid)
    run = OxmlElement("w:r")
    style = OxmlElement("w:rPr")
    underline = OxmlElement("w:u")
    underline.set(qn("w:val"), "single")
    style.append(underline)
    run.append(style)
    t = OxmlElement("w:t")
    t.text = text
    run.append(t)
    link.append(run)
    paragraph._p.append(link)


def build_docx() -> bytes:
    d = docx.Document()
    section = d.sections[0]
    section.header.paragraphs[0].text = "the header of every page"
    footer = section.footer.paragraphs[0]
    footer.add_run("the footer, ")
    footer.add_run("in italics").italic = True
    p = d.add_paragraph("a dog ")
    p.add_run("runs fast").bold = True
    p.add_run(" in ")
    p.add_run("the park").italic = True
    p.add_run(".")
    p = d.add_paragraph("read ")
    add_hyperlink(p, URL, "the manual")
    p.add_run(" first.")
    p = d.add_paragraph("look at ")
    p.add_run().add_picture(BytesIO(png()))
    p.add_run(" this picture")
    table = d.add_table(rows=2, cols=2)
    table.cell(0, 0).text = "first cell"
    table.cell(0, 1).text = "second cell"
    table.cell(1, 0).paragraphs[0].add_run("bold cell").bold = True
    table.cell(1, 1).text = "42"
    out = BytesIO()
    d.save(out)
    return out.getvalue()


def runs(paragraph) -> list[tuple[str, bool, bool]]:
    return [(r.text, bool(r.bold), bool(r.italic)) for r in paragraph.runs]


def test_docx_round_trip():
    assert read(build_docx(), ".docx").segments == [
        "a dog <r1>runs fast</r1> in <r2>the park</r2>.",
        "read <r1>the manual</r1> first.",
        "look at <r1/> this picture",
        "first cell",
        "second cell",
        "bold cell",
        "42",
        "the header of every page",
        "the footer, <r1>in italics</r1>",
    ]
    out, marking = translated(build_docx(), ".docx")
    assert marking.calls[0] == [
        "a dog runs fast in the park.",
        "read the manual first.",
        "look at this picture",
        "first cell",
        "second cell",
        "bold cell",
        "42",
        "the header of every page",
        "the footer, in italics",
    ]
    d = docx.Document(BytesIO(out))  # opens in python-docx
    body = d.paragraphs
    assert runs(body[0]) == [
        ("A DOG ", False, False),
        ("RUNS FAST", True, False),
        (" IN ", False, False),
        ("THE PARK", False, True),
        (".", False, False),
    ]
    assert body[1].text == "READ THE MANUAL FIRST."
    (link,) = body[1].hyperlinks
    assert link.address == URL and link.text == "THE MANUAL" and link.runs[0].underline
    assert len(d.inline_shapes) == 1  # the picture, between its two runs
    kinds = ["picture" if r._r.xpath(".//w:drawing") else r.text for r in body[2].runs]
    assert kinds == ["LOOK AT ", "picture", "THIS PICTURE"]
    cells = d.tables[0]
    assert [c.text for c in cells._cells] == ["FIRST CELL", "SECOND CELL", "BOLD CELL", "42"]
    assert cells.cell(1, 0).paragraphs[0].runs[0].bold
    section = d.sections[0]
    assert section.header.paragraphs[0].text == "THE HEADER OF EVERY PAGE"
    assert runs(section.footer.paragraphs[0]) == [("THE FOOTER, ", False, False), ("IN ITALICS", False, True)]
    with zipfile.ZipFile(BytesIO(out)) as z:
        xml = "".join(z.read(n).decode() for n in z.namelist() if re.match(r"word/(document|header|footer)", n))
    no_lower(re.findall(r"<w:t(?: [^>]*)?>([^<]*)</w:t>", xml))


class Reordering(Marking):
    """A translator that moves the words of one sentence (German word order), aligned as it moved
    them; every other sentence as `Marking`."""

    SOURCE, OUTPUT = "a dog runs fast in the park.", "im Park rennt schnell ein Hund."
    WORDS = {"im": "in", "Park": "park", "rennt": "runs", "schnell": "fast", "ein": "a", "Hund": "dog", ".": "."}

    def translate(self, sentences):
        return [self.OUTPUT if s == self.SOURCE else out for s, out in zip(sentences, super().translate(sentences))]

    def align(self, sources, outputs):
        links = super().align(sources, outputs)
        for k, source in enumerate(sources):
            if source == self.SOURCE:
                spans = {m.group(): m.span() for m in _TOKEN.finditer(source)}
                links[k] = [(*m.span(), *spans[self.WORDS[m.group()]]) for m in _TOKEN.finditer(outputs[k])]
        return links


def test_docx_runs_follow_their_tags():
    """A translation that moves the tagged words: each goes into a run of its tag's formatting,
    wherever the translator put it."""
    out = translate_document(read(build_docx(), ".docx"), Reordering(), "en")
    d = docx.Document(BytesIO(out))
    assert runs(d.paragraphs[0]) == [
        ("im ", False, False),
        ("Park", False, True),
        (" ", False, False),
        ("rennt schnell", True, False),
        (" ein Hund.", False, False),
    ]


def test_without_an_alignment_the_tags_land_in_proportion():
    """An engine that gives no attention (CTranslate2): `Translator` without an aligner; the
    runs come back in order, each translated, where they were in proportion."""
    upper = Translator(lambda sentences: [s.upper() for s in sentences])
    d = docx.Document(BytesIO(translate_document(read(build_docx(), ".docx"), upper, "en")))
    assert runs(d.paragraphs[0]) == [
        ("A DOG ", False, False),
        ("RUNS FAST", True, False),
        (" IN ", False, False),
        ("THE PARK", False, True),
        (".", False, False),
    ]


# -- PowerPoint --------------------------------------------------------------------------------------


def build_pptx() -> bytes:
    from pptx.util import Inches

    prs = pptx.Presentation()
    slide = prs.slides.add_slide(prs.slide_layouts[5])  # a title only
    slide.shapes.title.text = "the first slide"
    frame = slide.shapes.add_textbox(Inches(1), Inches(2), Inches(6), Inches(1)).text_frame
    p = frame.paragraphs[0]
    for text, bold, link in (
        ("a dog ", False, None),
        ("runs", True, None),
        (" to ", False, None),
        ("the site", False, URL),
    ):
        r = p.add_run()
        r.text = text
        r.font.bold = bold or None
        if link:
            r.hyperlink.address = link
    frame.add_paragraph().text = "one line\vanother line"  # \v: a line break (a:br)
    table = slide.shapes.add_table(2, 2, Inches(1), Inches(4), Inches(4), Inches(1)).table
    for (i, j), text in {(0, 0): "first cell", (0, 1): "second cell", (1, 0): "third cell", (1, 1): "7"}.items():
        table.cell(i, j).text = text
    slide.notes_slide.notes_text_frame.text = "what the speaker says"
    out = BytesIO()
    prs.save(out)
    return out.getvalue()


def test_pptx_round_trip():
    assert read(build_pptx(), ".pptx").segments == [
        "the first slide",
        "a dog <r1>runs</r1> to <r2>the site</r2>",
        "one line\nanother line",
        "first cell",
        "second cell",
        "third cell",
        "7",
        "what the speaker says",
    ]
    out, marking = translated(build_pptx(), ".pptx")
    assert marking.calls[0] == [
        "the first slide",
        "a dog runs to the site",
        "one line",
        "another line",
        "first cell",
        "second cell",
        "third cell",
        "7",
        "what the speaker says",
    ]
    slide = pptx.Presentation(BytesIO(out)).slides[0]  # opens in python-pptx
    assert slide.shapes.title.text == "THE FIRST SLIDE"
    frame = next(s for s in slide.shapes if s.has_text_frame and s != slide.shapes.title).text_frame
    first, second = frame.paragraphs
    assert [(r.text, bool(r.font.bold)) for r in first.runs] == [
        ("A DOG ", False),
        ("RUNS", True),
        (" TO ", False),
        ("THE SITE", False),
    ]
    assert first.runs[3].hyperlink.address == URL
    assert second.text == "ONE LINE\vANOTHER LINE"  # the line break where it was
    table = next(s for s in slide.shapes if s.has_table).table
    assert [table.cell(i, j).text for i in range(2) for j in range(2)] == [
        "FIRST CELL",
        "SECOND CELL",
        "THIRD CELL",
        "7",
    ]
    assert slide.notes_slide.notes_text_frame.text == "WHAT THE SPEAKER SAYS"
    no_lower(r.text for s in slide.shapes if s.has_text_frame for p in s.text_frame.paragraphs for r in p.runs)


# -- OpenDocument ------------------------------------------------------------------------------------


def build_odt() -> bytes:
    from odf.opendocument import OpenDocumentText
    from odf.style import Footer, Header, MasterPage, PageLayout, Style, TextProperties
    from odf.table import Table, TableCell, TableColumn, TableRow
    from odf.text import A, LineBreak, P, Span

    doc = OpenDocumentText()
    bold = Style(name="Bold", family="text")
    bold.addElement(TextProperties(fontweight="bold"))
    doc.automaticstyles.addElement(bold)
    layout = PageLayout(name="pm1")
    doc.automaticstyles.addElement(layout)
    page = MasterPage(name="Standard", pagelayoutname=layout)
    header, footer = Header(), Footer()
    header.addElement(P(text="the header of every page"))
    footer.addElement(P(text="the footer"))
    page.addElement(header)
    page.addElement(footer)
    doc.masterstyles.addElement(page)
    p = P(text="a dog ")
    p.addElement(Span(stylename=bold, text="runs fast"))
    p.addText(" to ")
    p.addElement(A(href=URL, type="simple", text="the site"))
    p.addText(".")
    doc.text.addElement(p)
    p = P(text="one line")
    p.addElement(LineBreak())
    p.addText("another line")
    doc.text.addElement(p)
    table = Table(name="T")
    table.addElement(TableColumn(numbercolumnsrepeated=2))
    for texts in (("first cell", "second cell"), ("third cell", "7")):
        row = TableRow()
        for text in texts:
            cell = TableCell()
            cell.addElement(P(text=text))
            row.addElement(cell)
        table.addElement(row)
    doc.text.addElement(table)
    out = BytesIO()
    doc.write(out)
    return out.getvalue()


def test_odt_round_trip():
    from odf import teletype
    from odf.opendocument import load
    from odf.style import Footer, Header
    from odf.text import A, LineBreak, P, Span

    assert read(build_odt(), ".odt").segments == [
        "the header of every page",
        "the footer",
        "a dog <r1>runs fast</r1> to <r2>the site</r2>.",
        "one line\nanother line",
        "first cell",
        "second cell",
        "third cell",
        "7",
    ]
    out, marking = translated(build_odt(), ".odt")
    assert marking.calls[0] == [
        "the header of every page",
        "the footer",
        "a dog runs fast to the site.",
        "one line",
        "another line",
        "first cell",
        "second cell",
        "third cell",
        "7",
    ]
    doc = load(BytesIO(out))  # opens in odfpy
    body = doc.text.getElementsByType(P)
    assert [teletype.extractText(p) for p in body] == [
        "A DOG RUNS FAST TO THE SITE.",
        "ONE LINE\nANOTHER LINE",
        "FIRST CELL",
        "SECOND CELL",
        "THIRD CELL",
        "7",
    ]
    (span,) = body[0].getElementsByType(Span)
    assert teletype.extractText(span) == "RUNS FAST" and span.getAttribute("stylename") == "Bold"
    (link,) = body[0].getElementsByType(A)
    assert teletype.extractText(link) == "THE SITE" and link.getAttribute("href") == URL
    assert len(body[1].getElementsByType(LineBreak)) == 1
    header, footer = (doc.masterstyles.getElementsByType(k)[0] for k in (Header, Footer))
    assert teletype.extractText(header) == "THE HEADER OF EVERY PAGE" and teletype.extractText(footer) == "THE FOOTER"


def test_odp_slides_and_notes():
    from odf import teletype
    from odf.draw import Frame, Page, TextBox
    from odf.opendocument import OpenDocumentPresentation, load
    from odf.presentation import Notes
    from odf.style import MasterPage, PageLayout, Style, TextProperties
    from odf.text import P, Span

    doc = OpenDocumentPresentation()
    layout = PageLayout(name="PM1")
    doc.automaticstyles.addElement(layout)
    master = MasterPage(name="Default", pagelayoutname=layout)
    doc.masterstyles.addElement(master)
    bold = Style(name="B", family="text")
    bold.addElement(TextProperties(fontweight="bold"))
    doc.automaticstyles.addElement(bold)
    page = Page(name="page1", masterpagename=master)
    notes = Notes()
    for parent, p in ((page, P(text="a slide with ")), (notes, P(text="what the speaker says"))):
        frame, box = Frame(width="20cm", height="3cm", x="1cm", y="1cm"), TextBox()
        box.addElement(p)
        frame.addElement(box)
        parent.addElement(frame)
        if parent is page:
            p.addElement(Span(stylename=bold, text="bold words"))
    page.addElement(notes)
    doc.presentation.addElement(page)
    data = BytesIO()
    doc.write(data)
    out, marking = translated(data.getvalue(), ".odp")
    assert marking.calls[0] == ["a slide with bold words", "what the speaker says"]
    slide, notes = load(BytesIO(out)).presentation.getElementsByType(P)  # opens in odfpy
    assert (
        teletype.extractText(slide) == "A SLIDE WITH BOLD WORDS"
        and teletype.extractText(notes) == "WHAT THE SPEAKER SAYS"
    )
    assert teletype.extractText(slide.getElementsByType(Span)[0]) == "BOLD WORDS"


# -- HTML, subtitles, text, EPUB -------------------------------------------------------------------

HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>a small page</title>
<style>p { color: red }</style><script>var x = "not text";</script></head>
<body>
  <h1>the <em>first</em> heading</h1>
  <p>a dog <b>runs</b> &amp; jumps.<br>read <a href="manual.html" title="the manual">the manual</a>, then run
     <code>make all</code> twice.</p>
  <ul><li>one item</li><li><a href="#two">two items</a></li></ul>
  <table><tr><td>a cell &lt;one&gt;</td><td>42</td></tr></table>
  <pre>kept as it is</pre>
  <p translate="no">not this one</p>
  <!-- a comment -->
</body></html>
"""


def test_html_round_trip():
    from lxml import html as lxml_html

    out, marking = translated(HTML.encode(), ".html")
    assert marking.calls[0] == [
        "a small page",
        "the first heading",
        "a dog runs & jumps.",
        "read the manual, then run make all twice.",
        "one item",
        "two items",
        "a cell <one>",
        "42",
    ]
    text = out.decode()
    assert "<title>A SMALL PAGE</title>" in text and "<h1>THE <em>FIRST</em> HEADING</h1>" in text
    assert (
        '<p>A DOG <b>RUNS</b> &amp; JUMPS.<br>READ <a href="manual.html" title="the manual">THE MANUAL</a>, '
        "THEN RUN <code>make all</code> TWICE.</p>"
    ) in text
    assert '<li><a href="#two">TWO ITEMS</a></li>' in text and "<td>A CELL &lt;ONE&gt;</td><td>42</td>" in text
    for kept in (
        '<script>var x = "not text";</script>',
        "<pre>kept as it is</pre>",
        '<p translate="no">not this one</p>',
        "<!-- a comment -->",
        "<style>p { color: red }</style>",
    ):
        assert kept in text
    assert text.replace("\n", "").count("<") == HTML.replace("\n", "").count("<")  # no tag added or lost
    root = lxml_html.fromstring(out)  # opens in lxml

    def kept(el) -> bool:
        return not isinstance(el.tag, str) or el.tag in ("script", "style", "pre", "code") or el.get("translate")

    no_lower(
        [el.text for el in root.iter() if not kept(el) and el.text and el.text.strip()]
        + [el.tail for el in root.iter() if el.tail and el.tail.strip()]
    )


SRT = """1
00:00:01,000 --> 00:00:03,200
a dog runs across
the <i>green</i> park.

2
00:00:04,000 --> 00:00:05,500
{\\an8}the second cue

3
00:01:06,010 --> 00:01:08,000
<b>the third</b> one
"""


def test_srt_round_trip():
    out, marking = translated(SRT.encode(), ".srt")
    assert read(SRT.encode(), ".srt").segments == [
        "a dog runs across the <r1>green</r1> park.",
        "<r1/>the second cue",
        "<r1>the third</r1> one",
    ]
    assert marking.calls[0] == ["a dog runs across the green park.", "the second cue", "the third one"]
    before, after = list(srt.parse(SRT)), list(srt.parse(out.decode()))  # opens in srt
    assert [(c.index, c.start, c.end) for c in after] == [(c.index, c.start, c.end) for c in before]
    assert [c.content for c in after] == [
        "A DOG RUNS ACROSS\nTHE <i>GREEN</i> PARK.",
        "{\\an8}THE SECOND CUE",
        "<b>THE THIRD</b> ONE",
    ]


def test_txt_round_trip():
    text = "\ufeffthe first line.\r\n\r\n   an indented one & <more>.  \r\n...\r\nlast, without an ending"
    out, marking = translated(text.encode(), ".txt")
    assert marking.calls[0] == ["the first line.", "an indented one & <more>.", "last, without an ending"]
    assert (
        out.decode("utf-8")
        == "\ufeffTHE FIRST LINE.\r\n\r\n   AN INDENTED ONE & <MORE>.  \r\n...\r\nLAST, WITHOUT AN ENDING"
    )


def test_epub_round_trip(tmp_path):
    epub = pytest.importorskip("ebooklib.epub")
    import ebooklib

    book = epub.EpubBook()
    book.set_identifier("test-book")
    book.set_title("a test book")
    book.set_language("en")
    chapters = []
    for i, body in enumerate(
        (
            "<h1>the first chapter</h1><p>a dog <b>runs</b> far.</p>",
            "<h1>the second chapter</h1><p>it <i>comes</i> back.</p>",
        ),
        start=1,
    ):
        c = epub.EpubHtml(title=f"chapter {i}", file_name=f"ch{i}.xhtml", lang="en")
        c.content = body
        book.add_item(c)
        chapters.append(c)
    book.toc = chapters
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", *chapters]
    epub.write_epub(str(tmp_path / "in.epub"), book)
    out, _ = translated((tmp_path / "in.epub").read_bytes(), ".epub")
    (tmp_path / "out.epub").write_bytes(out)
    again = epub.read_epub(str(tmp_path / "out.epub"))  # opens in EbookLib
    texts = {item.file_name: item.get_content().decode() for item in again.get_items_of_type(ebooklib.ITEM_DOCUMENT)}
    assert "<h1>THE FIRST CHAPTER</h1>" in texts["ch1.xhtml"] and "<p>A DOG <b>RUNS</b> FAR.</p>" in texts["ch1.xhtml"]
    assert "<p>IT <i>COMES</i> BACK.</p>" in texts["ch2.xhtml"]
    assert zipfile.ZipFile(BytesIO(out)).namelist()[0] == "mimetype"


# -- the inline tags ---------------------------------------------------------------------------------


def test_tags_there_and_back():
    pieces = [Piece("a "), Piece("b & c", (1,)), Piece(stack=(1,), atom=2), Piece("d", (1, 3))]
    text = tagged(pieces)
    assert text == "a <r1>b &amp; c<r2/><r3>d</r3></r1>"
    assert untagged(text, {1, 3}, {2}) == [
        Piece("a "),
        Piece("b & c", (1,)),
        Piece(stack=(1,), atom=2),
        Piece("d", (1, 3)),
    ]


def test_a_translator_that_loses_tags_loses_no_text_and_no_image():
    """A dropped tag's text is kept (plain), an unclosed one closes at the end, a stray closing
    tag or an unknown tag is dropped, a kept thing left out comes back at the end, once."""
    assert untagged("x <r1>y</r1> <r9>z</r9> </r3>w", {1, 3}, set()) == [Piece("x "), Piece("y", (1,)), Piece(" z w")]
    assert untagged("<r1>open to the end", {1}, set()) == [Piece("open to the end", (1,))]
    assert untagged("<r2/> and <r2/> again", set(), {2, 4}) == [Piece(atom=2), Piece(" and  again"), Piece(atom=4)]


# -- files that cannot be read -------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [".docx", ".pptx", ".odt", ".epub"])
def test_a_broken_file_is_one_line_naming_it(fmt):
    with pytest.raises(DocumentError, match=rf"^report{re.escape(fmt)}: not a readable .*") as e:
        read(b"PK\x03\x04 not really a zip", fmt, f"report{fmt}")
    assert "\n" not in str(e.value)


def test_unknown_formats_and_bad_text_are_refused():
    with pytest.raises(DocumentError, match=r"^notes\.xml: \.xml files are not translated: give one of \.txt"):
        format_of("notes.xml")
    assert format_of("Report.DOCX") == ".docx"
    with pytest.raises(DocumentError, match=r"^in\.txt:2: not UTF-8 text"):
        read("first line\nsecond \xe9".encode("latin-1"), ".txt", "in.txt")
    with pytest.raises(DocumentError, match=r"^in\.srt:2: not a readable SubRip file"):
        read(b"\nnot a cue\n1\n00:00:01,000 --> 00:00:02,000\nfine\n", ".srt", "in.srt")
    assert str(output_name("dir/report.docx", "de")) == "dir/report.de.docx"
    assert str(output_name("report.docx", None)) == "report.translated.docx"
