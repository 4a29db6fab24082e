"""`transduce docs`: the documentation that ships inside the package (docs/*.md, as
`transduce/docs/`), printed by topic, so that a help page's "details: transduce docs TOPIC" is
there wherever transduce is installed, a wheel included. Reads text files only: no PyTorch."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from importlib import resources
from pathlib import Path

from ..errors import UsageError
from .options import epilog

DESCRIPTION = """\
Print a page of transduce's documentation (the docs/ of the source tree, shipped in
the package): without TOPIC the list of pages; with a SECTION only that section.
details: transduce docs cli"""
EPILOG = epilog(
    "transduce docs",
    "transduce docs decoding | less",
    "transduce docs cli prepare",
)


def add_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("arguments")
    g.add_argument("topic", nargs="?", metavar="TOPIC", help="a page, e.g. training (default: the list)")
    g.add_argument("section", nargs="?", metavar="SECTION", help="one section of it, by its heading's first words")


def docs_dir() -> Path:
    """Where the pages are: the package's docs/ (a wheel's copy; in a source checkout a link to the
    repository's docs/)."""
    return Path(str(resources.files("transduce") / "docs"))


def topics() -> dict[str, Path]:
    """Each page's topic (its file name without .md, lower case) and its file."""
    home = docs_dir()
    if not home.is_dir():
        raise UsageError(f"{home}: no documentation here (this installation was built without docs/)")
    return {p.stem.lower(): p for p in sorted(home.glob("*.md"))}


def title(path: Path) -> str:
    """A page's first heading, without its #."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return ""


def section(text: str, name: str, where: str) -> str:
    """The section of `text` whose heading starts with `name` (any level, case ignored), up to the
    next heading of its level or above."""
    lines = text.splitlines()
    heads = [(i, len(m.group(1)), m.group(2)) for i, line in enumerate(lines) if (m := re.match(r"(#+) +(.*)", line))]
    want = name.lower().strip()
    for n, (i, level, heading) in enumerate(heads):
        if heading.lower().strip("`").startswith(want) or heading.lower().startswith(want):
            end = next((j for j, lv, _ in heads[n + 1 :] if lv <= level), len(lines))
            return "\n".join(lines[i:end]).rstrip() + "\n"
    names = ", ".join(h for _, lv, h in heads if lv == 2)
    raise UsageError(f"{where} has no section {name!r}; its sections: {names}")


def run(args: argparse.Namespace) -> int:
    pages = topics()
    if args.topic is None:
        width = max(map(len, pages))
        print("transduce docs TOPIC prints a page; the pages:")
        for name, path in pages.items():
            print(f"  {name:<{width}}  {title(path)}")
        return 0
    topic = args.topic.lower().removesuffix(".md").removeprefix("docs/")
    if topic not in pages:
        near = difflib.get_close_matches(topic, pages, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else f"; the pages: {', '.join(pages)}"
        raise UsageError(f"no page {args.topic!r}{hint}")
    text = pages[topic].read_text(encoding="utf-8")
    sys.stdout.write(section(text, args.section, f"transduce docs {topic}") if args.section else text)
    return 0
