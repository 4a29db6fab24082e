"""A picture of a tree for a person: a standalone SVG file, no dependency, opens in any browser.

The words sit on the bottom row in sentence order, each constituent centred above its children,
one row per depth, lines from each node to its children; part-of-speech tags (or XX) just above
their words. Text widths are estimated from the number of characters (no font metrics needed).
"""

from __future__ import annotations

from html import escape

from .trees import Tree

CHAR_W = 7.5  # estimated width of a character at FONT px
FONT = 13
ROW_H = 44
PAD = 12


def tree_svg(tree: Tree, title: str | None = None) -> str:
    """The SVG document of `tree`."""
    nodes: list[tuple[float, int, str, bool]] = []  # x, row, text, is_word
    edges: list[tuple[float, int, float, int]] = []
    rows = {id(tree): 0}  # a constituent's row: its depth (loops, not recursion: trees may nest deeply)
    for node in reversed(tree.bottom_up()):  # parents first
        for c in node.children:
            if isinstance(c, Tree):
                rows[id(c)] = rows[id(node)] + 1
    depth = max(rows.values()) + 1  # the words' row; their tags just above it
    xs: dict[int, float] = {}
    x_next = PAD
    for node in tree.preterminals():  # left to right
        word = str(node.children[0])
        w = max(len(word), len(node.label)) * CHAR_W
        xs[id(node)] = x = x_next + w / 2
        x_next += w + 2 * PAD
        nodes += [(x, depth - 1, node.label, False), (x, depth, word, True)]
        edges.append((x, depth - 1, x, depth))
    for node in tree.bottom_up():  # children first: each constituent centred above its children
        if node.is_preterminal:
            continue
        kids = [c for c in node.children if isinstance(c, Tree)]
        xs[id(node)] = x = (xs[id(kids[0])] + xs[id(kids[-1])]) / 2 if kids else x_next
        row = rows[id(node)]
        nodes.append((x, row, node.label, False))
        edges += [(x, row, xs[id(c)], depth - 1 if c.is_preterminal else row + 1) for c in kids]
    width = x_next + PAD
    height = (depth + 1) * ROW_H + 2 * PAD + (ROW_H if title else 0)
    top = PAD + (ROW_H if title else 0)

    def y(row: int) -> float:
        return top + row * ROW_H + FONT

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" font-size="{FONT}">',
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    if title:
        out.append(f'<text x="{PAD}" y="{PAD + FONT}" fill="#333">{escape(title)}</text>')
    for x1, r1, x2, r2 in edges:
        out.append(
            f'<line x1="{x1:.1f}" y1="{y(r1) + 4:.1f}" x2="{x2:.1f}" y2="{y(r2) - FONT:.1f}" '
            'stroke="#999" stroke-width="1"/>'
        )
    for x, row, text, is_word in nodes:
        style = 'fill="#000"' if is_word else 'fill="#1f4e9c" font-weight="bold"'
        out.append(f'<text x="{x:.1f}" y="{y(row):.1f}" text-anchor="middle" {style}>{escape(text)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
