"""Every name the paper-to-code map lists must exist, so the map cannot rot."""

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


def test_every_section_3_and_5_subsection_is_mapped():
    first_cells = [line.split("|")[1] for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith("| ")]
    for sec in ["3.1", "3.2.1", "3.2.2", "3.2.3", "3.3", "3.4", "3.5", "5.1", "5.3", "5.4", "eq. 1", "eq. 2", "eq. 3"]:
        assert any(sec in cell for cell in first_cells), sec


def _deviation_rows():
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Every deviation from the paper, in one place", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| deviation")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_every_deviation_defaults_to_the_papers_choice():
    """The deviations table names each option and the paper's value: the code's default must be it."""
    import dataclasses
    import json

    rows = _deviation_rows()
    assert len(rows) >= 10
    for deviation, options, default in rows:
        expected = json.loads(default.strip("`").replace("True", "true").replace("False", "false")
                              .replace("None", "null"))
        for name in re.findall(r"`(transduce(?:\.\w+)+)`", options):
            owner, field = name.rsplit(".", 1)
            cls = resolve(owner)
            assert dataclasses.is_dataclass(cls), name
            assert getattr(cls(), field) == expected, f"{name} defaults to {getattr(cls(), field)!r}, not {expected!r}"


def test_vocabulary_size_default_is_listed_as_not_the_papers():
    """`prepare --vocab-size` defaults to a small corpus's size, not 5.1's 37000: the map says so."""
    from transduce.data.vocab import DEFAULT_VOCAB_SIZE

    text = DOC.read_text(encoding="utf-8")
    intro = text.split("## Every deviation from the paper, in one place", 1)[1].split("| deviation", 1)[0]
    assert DEFAULT_VOCAB_SIZE != 37000
    assert f"defaults to {DEFAULT_VOCAB_SIZE} pieces" in intro and "--vocab-size 37000" in intro
