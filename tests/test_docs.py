"""Every name the paper-to-code map lists must exist, so the map cannot rot; no line of the docs is over 160 characters."""

import importlib
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "paper_map.md"


def resolve(dotted: str):
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_every_mapped_name_exists():
    names = sorted(set(re.findall(r"`(transduce(?:\.\w+)+)`", DOC.read_text(encoding="utf-8"))))
    assert len(names) > 40
    missing = []
    for name in names:
        try:
            resolve(name)
        except (ImportError, AttributeError):
            missing.append(name)
    assert not missing, f"docs/paper_map.md names what does not exist: {missing}"


def _items(text: str) -> list[str]:
    """The map's list items ("- **3.1** · what the paper says · *code*: ..."), continuation lines joined."""
    items: list[str] = []
    for line in text.splitlines():
        if line.startswith("- "):
            items.append(line[2:])
        elif line.startswith("  ") and items:
            items[-1] += " " + line.strip()
        elif not line.strip() and items and not items[-1].endswith("\n"):
            items[-1] += "\n"
    return [i.strip() for i in items]


def test_every_section_3_and_5_subsection_is_mapped():
    first_cells = [
        re.match(r"\*\*(.+?)\*\*", item).group(1)
        for item in _items(DOC.read_text(encoding="utf-8"))
        if item.startswith("**")
    ]
    for sec in ["3.1", "3.2.1", "3.2.2", "3.2.3", "3.3", "3.4", "3.5", "5.1", "5.3", "5.4", "eq. 1", "eq. 2", "eq. 3"]:
        assert any(sec in cell for cell in first_cells), sec


def _deviation_rows():
    """(deviation, option, default) of each item of the deviations list: "- WHAT · *option*: NAMES · *default*: VALUE"."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Every deviation from the paper, in one place", 1)[1].split("\n## ", 1)[0]
    rows = []
    for item in _items(section):
        m = re.fullmatch(r"(.+) · \*option\*: (.+) · \*default\*: (`[^`]+`)", item.strip(), re.S)
        assert m, f"docs/paper_map.md: a deviation without its option and default: {item[:80]}"
        rows.append([m.group(1), m.group(2), m.group(3)])
    return rows


def test_every_deviation_defaults_to_the_papers_choice():
    """The deviations table names each option and the paper's value: the code's default must be it."""
    import dataclasses
    import json

    rows = _deviation_rows()
    assert len(rows) >= 10
    for deviation, options, default in rows:
        expected = json.loads(
            default.strip("`").replace("True", "true").replace("False", "false").replace("None", "null")
        )
        for name in re.findall(r"`(transduce(?:\.\w+)+)`", options):
            owner, field = name.rsplit(".", 1)
            cls = resolve(owner)
            assert dataclasses.is_dataclass(cls), name
            assert getattr(cls(), field) == expected, f"{name} defaults to {getattr(cls(), field)!r}, not {expected!r}"


def test_vocabulary_size_default_is_listed_as_not_the_papers():
    """`prepare --vocab-size` defaults to a small corpus's size, not 5.1's 37000: the map says so."""
    from transduce.defaults import VOCAB_SIZE

    text = DOC.read_text(encoding="utf-8")
    intro = text.split("## Every deviation from the paper, in one place", 1)[1].split("\n- ", 1)[0]
    assert VOCAB_SIZE != 37000
    assert f"defaults to {VOCAB_SIZE} pieces" in intro and "--vocab-size 37000" in intro


def test_no_line_of_the_docs_is_over_160_characters():
    """README.md and docs/*.md read in a terminal and a diff: lines of at most 160 characters
    (a table too wide for that is written as a list)."""
    root = DOC.parents[1]
    long = [
        f"{path.relative_to(root)}:{n}: {len(line)} characters"
        for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if len(line) > 160
    ]
    assert not long, "lines over 160 characters:\n" + "\n".join(long)
