"""Office Open XML: Word (.docx, python-docx) and PowerPoint (.pptx, python-pptx). A paragraph's
text lies in runs side by side, each with its run properties (bold, italic, a character style,
a hyperlink's target); runs of the same properties are one stretch of text. The stretch of the
properties that cover most of the paragraph is its plain text, each other a tag; what is not text
(an image, a field, a line break in PowerPoint, a footnote mark) is kept whole in its place. The
translation is written back as new runs, each a copy of a run of its tag's properties.

Word: every paragraph of the body (tables and text boxes included), of every header and footer,
of the footnotes, endnotes and comments; a hyperlink's runs stay inside a copy of the hyperlink.
PowerPoint: every paragraph of every slide (text boxes, placeholders, groups, tables) and of its
notes."""

from __future__ import annotations

import copy
from collections import Counter
from io import BytesIO

from ..extras import require
from .base import Document, opened
from .inline import Paragraph, Piece

W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"

BREAK = b"\n"
"""The key of a line break (PowerPoint's a:br): text of no formatting of its own."""

_NOISE = {"lang", "altLang", "dirty", "err", "noProof", "smtClean", "smtId", "bmk", "hint"}
"""Run properties that are not formatting (spell checking, the language, editing marks)."""


def _key(rpr) -> bytes:
    """A run's properties less those that are not formatting: runs of equal keys look alike."""
    if rpr is None:
        return b""
    from lxml import etree

    rpr = copy.deepcopy(rpr)
    for el in [rpr, *rpr.iter()]:
        for name in list(el.attrib):
            local = name.split("}")[-1]
            if local in _NOISE or local.startswith("rsid"):
                del el.attrib[name]
        if el is not rpr and etree.QName(el).localname in _NOISE:
            el.getparent().remove(el)
    return etree.tostring(rpr)


class Runs:
    """One paragraph's runs: the text runs, each with its chain of containers (a Word hyperlink)
    and its key, and the things kept whole; taken apart into a `Paragraph` and put back."""

    def __init__(self, p, items: list[tuple], make):
        """`items`: in order, ("text", run, chain, key, text) (a key of BREAK: a line break, text
        "\n" of no formatting of its own) or ("atom", element, chain); `make(run, text)`: the new
        elements of `text` in a copy of `run`."""
        self.p, self.items, self.make = p, items, make
        texts = [it for it in items if it[0] == "text" and it[3] is not BREAK]
        chars = Counter()
        for _, _, chain, key, text in texts:
            if not chain:
                chars[key] += len(text)
        base = chars.most_common(1)[0][0] if chars else None
        plain = [it for it in texts if not it[2] and it[3] == base] or texts
        self.template = (plain[0][1], plain[0][2]) if plain else None  # the runs of untagged text are its copies
        self.shells = {_ids(it[2]): _shell(it[2]) for it in items if it[2]}
        self.paragraph = Paragraph()
        tags: dict[tuple, int] = {}
        atom: list | None = None
        for it in items:
            if it[0] == "atom":
                if atom is None:  # things side by side are one thing
                    atom = []
                    self.paragraph.atom(atom)
                atom.append((it[1], it[2]))
                continue
            atom = None
            _, run, chain, key, text = it
            if key is BREAK or (run, chain) == self.template or (not chain and key == base):
                self.paragraph.text(text)
                continue
            ident = (_ids(chain), key)
            if ident not in tags:
                tags[ident] = self.paragraph.tag((run, chain))
            self.paragraph.text(text, (tags[ident],))

    def apply(self, paragraph: Paragraph, pieces: list[Piece]) -> None:
        """Replace the runs by the translation's: new runs where the first run was."""
        elements = [(it[1], it[2]) for it in self.items]
        tops = list({id(t): t for t in (chain[0] if chain else el for el, chain in elements)}.values())
        at = min(self.p.index(t) for t in tops)
        for el, _ in elements:
            el.getparent().remove(el)
        for top in tops:  # a container (a hyperlink) that held runs and holds none now
            if top.getparent() is self.p and not any(True for _ in top.iter(W + "r", A + "r")):
                self.p.remove(top)
        for el in self._build(paragraph, pieces):
            self.p.insert(at, el)
            at += 1

    def _build(self, paragraph: Paragraph, pieces: list[Piece]) -> list:
        """The new top-level elements: runs, or copies of their containers holding them."""
        out: list = []
        last = None
        for piece in pieces:
            if piece.atom is not None:
                made = paragraph.payloads[piece.atom - 1]
            else:
                run, chain = paragraph.payloads[piece.stack[-1] - 1] if piece.stack else self.template
                made = [(el, chain) for el in self.make(run, piece.text)]
            for el, chain in made:
                if not chain:
                    out.append(el)
                    last = None
                    continue
                if last is None or last[0] != _ids(chain):
                    top, inner = _fill(self.shells[_ids(chain)])
                    out.append(top)
                    last = (_ids(chain), inner)
                last[1].append(el)
        return out


def _ids(chain: tuple) -> tuple:
    return tuple(map(id, chain))


def _shell(chain: tuple):
    """A copy of a container chain's outer element without its runs, a marker where runs go."""
    top = copy.deepcopy(chain[0])
    inner = top
    for i in range(1, len(chain)):
        inner = inner[chain[i - 1].index(chain[i])]
    inner.append(inner.makeelement("{transduce}runs"))
    for run in list(top.iter(W + "r", A + "r")):
        run.getparent().remove(run)
    return top


def _fill(shell):
    """A fresh copy of a shell: (its top, the element runs go into)."""
    top = copy.deepcopy(shell)
    marker = next(top.iter("{transduce}runs"))
    inner = marker.getparent()
    inner.remove(marker)
    return top, inner


# -- Word --------------------------------------------------------------------------------------------

_W_CONTAINERS = {W + t for t in ("hyperlink", "smartTag", "ins", "sdt", "sdtContent", "customXml", "moveTo")}
_W_TEXT = {W + t for t in ("rPr", "t", "tab", "br", "cr", "noBreakHyphen", "softHyphen", "lastRenderedPageBreak")}
_W_MARKS = {
    W + t
    for t in ("pPr", "bookmarkStart", "bookmarkEnd", "commentRangeStart", "commentRangeEnd", "permStart", "permEnd")
}


def _word_items(p) -> list[tuple]:
    """A Word paragraph's runs and things, in order (a complex field, begin to end, one thing)."""
    items: list[tuple] = []
    depth = 0

    def walk(el, chain):
        nonlocal depth
        for child in el:
            if child.tag in _W_CONTAINERS:
                walk(child, chain + (child,))
            elif child.tag == W + "r":
                chars = [f.get(W + "fldCharType") for f in child.iter(W + "fldChar")]
                textual = all(
                    c.tag in _W_TEXT and (c.tag != W + "br" or c.get(W + "type") in (None, "textWrapping"))
                    for c in child
                )
                if depth == 0 and not chars and textual:
                    items.append(("text", child, chain, _key(child.find(W + "rPr")), child.text))
                else:
                    items.append(("atom", child, chain))
                depth = max(0, depth + chars.count("begin") - chars.count("end"))
            elif child.tag == W + "proofErr" and not chain:
                p.remove(child)
            elif child.tag not in _W_MARKS and child.tag != W + "sdtPr":
                items.append(("atom", child, chain))

    walk(p, ())
    return items


def _word_run(run, text: str) -> list:
    new = copy.deepcopy(run)
    new.text = text  # a tab as w:tab, a line break as w:br
    return [new]


class Docx(Document):
    """A Word document (.docx)."""

    def __init__(self, data: bytes, name: str):
        super().__init__()
        docx = require("docx", "translating .docx files")
        self.document = opened(docx.Document, data, name, "Word (.docx)")
        from docx.oxml import parse_xml

        self.rewritten = []
        for part in self.document.part.package.iter_parts():
            kind = part.partname.split("/")[-1]
            if not part.partname.startswith("/word/"):
                continue
            if hasattr(part, "element") and kind.startswith(("document", "header", "footer", "comments")):
                root = part.element
            elif kind.startswith(("footnotes", "endnotes")) and part.partname.endswith(".xml"):
                root = parse_xml(part.blob)
                self.rewritten.append((part, root))
            else:
                continue
            for p in list(root.iter(W + "p")):
                runs = Runs(p, _word_items(p), _word_run)
                self.add(runs.paragraph, runs.apply)

    def save(self) -> bytes:
        from lxml import etree

        for part, root in self.rewritten:
            part._blob = etree.tostring(root, xml_declaration=True, encoding="UTF-8", standalone=True)
        out = BytesIO()
        self.document.save(out)
        return out.getvalue()


# -- PowerPoint --------------------------------------------------------------------------------------


def _slide_items(p) -> list[tuple]:
    items: list[tuple] = []
    for child in p:
        if child.tag == A + "r":
            t = child.find(A + "t")
            items.append(("text", child, (), _key(child.find(A + "rPr")), "" if t is None else (t.text or "")))
        elif child.tag == A + "br":
            items.append(("text", child, (), BREAK, "\n"))
        elif child.tag not in (A + "pPr", A + "endParaRPr"):
            items.append(("atom", child, ()))
    return items


def _slide_runs(run, text: str) -> list:
    """Runs of `text` in copies of `run`, an a:br (of the run's properties) at each line break."""
    made = []
    for i, line in enumerate(text.split("\n")):
        if i:
            br = run.makeelement(A + "br")
            if run.find(A + "rPr") is not None:
                br.append(copy.deepcopy(run.find(A + "rPr")))
            made.append(br)
        if line:
            new = copy.deepcopy(run)
            new.text = line
            made.append(new)
    return made


class Pptx(Document):
    """A PowerPoint presentation (.pptx): its slides and their notes."""

    def __init__(self, data: bytes, name: str):
        super().__init__()
        pptx = require("pptx", "translating .pptx files")
        self.presentation = opened(pptx.Presentation, data, name, "PowerPoint (.pptx)")
        for slide in self.presentation.slides:
            roots = [slide.part._element]
            if slide.has_notes_slide:
                roots.append(slide.notes_slide.part._element)
            for root in roots:
                for p in list(root.iter(A + "p")):
                    runs = Runs(p, _slide_items(p), _slide_runs)
                    self.add(runs.paragraph, runs.apply)

    def save(self) -> bytes:
        out = BytesIO()
        self.presentation.save(out)
        return out.getvalue()
