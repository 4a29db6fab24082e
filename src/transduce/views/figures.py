"""PNG figures of attention weights, drawn with matplotlib from the JSON of `weights.to_json`: the
paper's Figures 3-5 (`lines_figure`), heatmaps and the batch's masks. Layers and heads are numbered
from 1, as in the paper. The same input gives the same PNG bytes (Agg, DejaVu Sans, a fixed DPI).
"""

from __future__ import annotations

import io

from ..errors import UsageError
from .weights import TYPE_NAMES, TYPES

DPI = 150
# One colour per head (head 1 first); more heads than colours reuse them
HEAD_COLORS = [
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
    "#393b79",
    "#637939",
    "#8c6d31",
    "#843c39",
    "#7b4173",
    "#3182bd",
]

MASK_COLORS = {"allowed": "#2b6cb0", "padding": "#d0d0d0", "causal": "#fbd38d", "both": "#a0a0a0", "window": "#606060"}
STYLE = {"font.family": "DejaVu Sans", "font.size": 8, "axes.titlesize": 9, "figure.titlesize": 10}


def require_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("PNG figures need matplotlib: pip install 'transduce[views]'") from None


def head_color(head: int) -> str:
    """The colour of head `head` (from 0), the same in the figures and the page."""
    return HEAD_COLORS[head % len(HEAD_COLORS)]


def _png(fig) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None}, bbox_inches="tight", pad_inches=0.1)
    return buf.getvalue()


def _figure(width: float, height: float, layout: str | None = None):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout=layout)


def _side_tokens(data: dict, sentence: int, kind: str) -> tuple[list[str], list[str]]:
    """Query and key labels. A decoder query is labelled by the token its position predicts, with
    an arrow ("→Hund": the position that reads "brauner" and predicts "Hund"), so that
    encoder-decoder attention reads as an alignment of output tokens to source tokens; decoder
    keys are the tokens read (<s> first)."""
    s = data["sentences"][sentence]
    q = s["source"] if kind == "encoder" else ["\u2192" + t for t in s["predicts"]]
    k = s["target"] if kind == "decoder_self" else s["source"]
    return q, k


def _title(data: dict, kind: str, layer: int, heads: list[int], query: int | None, q_tokens: list[str]) -> str:
    hs = (
        "all heads"
        if len(heads) == data["n_heads"]
        else ("head " if len(heads) == 1 else "heads ") + ", ".join(str(h + 1) for h in heads)
    )
    t = f"{TYPE_NAMES[kind]}, layer {layer + 1} of {data['n_layers']}, {hs}"
    if query is not None:
        t += f"; query {query + 1} \u201c{q_tokens[query]}\u201d only"
    return t


def _chosen(data: dict, sentence: int, kind: str, layer: int, heads: list[int] | None, query: int | None):
    """(heads, query labels, key labels, the layer's weights) of a choice (all from 0), matplotlib
    required; a UsageError for a choice the data does not have."""
    require_matplotlib()
    heads = list(range(data["n_heads"])) if heads is None else heads
    if kind not in TYPES:
        raise UsageError(f"unknown attention type {kind!r}: one of {', '.join(TYPES)}")
    if not 0 <= sentence < len(data["sentences"]):
        raise UsageError(f"sentence {sentence + 1}: there are {len(data['sentences'])}")
    if not 0 <= layer < data["n_layers"]:
        raise UsageError(f"layer {layer + 1}: the model has layers 1 to {data['n_layers']}")
    bad = [h + 1 for h in heads if not 0 <= h < data["n_heads"]]
    if bad or not heads:
        raise UsageError(f"heads {bad or 'none'}: the model has heads 1 to {data['n_heads']}")
    if query is not None and not 0 <= query < len(_side_tokens(data, sentence, kind)[0]):
        raise UsageError(f"query position {query + 1}: out of range")
    return (heads, *_side_tokens(data, sentence, kind), data["sentences"][sentence]["attention"][kind][layer])


def lines_figure(
    data: dict,
    *,
    sentence: int = 0,
    kind: str = "encoder",
    layer: int = 0,
    heads: list[int] | None = None,
    query: int | None = None,
    layout: str = "columns",
) -> bytes:
    """The paper's figure: PNG bytes (layer, heads, query, sentence from 0)."""
    heads, q_tok, k_tok, w = _chosen(data, sentence, kind, layer, heads, query)  # matplotlib checked first
    from matplotlib import rc_context

    rows = [query] if query is not None else range(len(q_tok))
    n = max(len(q_tok), len(k_tok))
    with rc_context(STYLE):
        if layout == "columns":
            fig = _figure(5.0, 1.0 + 0.2 * n)
        elif layout == "rows":
            fig = _figure(1.2 + 0.2 * n, 3.6)
        else:
            raise UsageError(f"unknown layout {layout!r}: columns or rows")
        ax = fig.add_axes((0.0, 0.02, 1.0, 0.88))
        ax.set_axis_off()

        def at(side: int, i: int) -> tuple[float, float]:  # side 0: queries, 1: keys
            if layout == "columns":
                return (0.3 + 0.4 * side, n - i)
            return (i + 1, 1.0 - side)

        for h in heads:
            for i in rows:
                for j, v in enumerate(w[h][i]):
                    if v > 0.005:
                        (x0, y0), (x1, y1) = at(0, i), at(1, j)
                        ax.plot(
                            [x0, x1],
                            [y0, y1],
                            color=head_color(h),
                            alpha=min(1.0, v),
                            linewidth=2.0,
                            solid_capstyle="butt",
                        )
        for side, toks in ((0, q_tok), (1, k_tok)):
            for i, t in enumerate(toks):
                x, y = at(side, i)
                strong = query is None or side == 1 or i == query
                kw = dict(
                    color="black" if strong else "#999999", fontweight="bold" if query == i and side == 0 else "normal"
                )
                if layout == "columns":
                    ax.text(
                        x + (-0.01 if side == 0 else 0.01), y, t, ha="right" if side == 0 else "left", va="center", **kw
                    )
                else:
                    ax.text(
                        x,
                        y + (0.03 if side == 0 else -0.03),
                        t,
                        rotation=90,
                        ha="center",
                        va="bottom" if side == 0 else "top",
                        **kw,
                    )
        side_kw = dict(color="#666666", fontstyle="italic", fontsize=7)
        if layout == "columns":  # each column headed by what it is
            ax.text(0.29, n + 0.75, "queries", ha="right", va="center", **side_kw)
            ax.text(0.71, n + 0.75, "keys", ha="left", va="center", **side_kw)
            ax.set_xlim(0, 1)
            ax.set_ylim(0.3, n + 1.0)
        else:  # each row named at its left
            ax.text(0.55, 1.0, "queries", ha="right", va="center", **side_kw)
            ax.text(0.55, 0.0, "keys", ha="right", va="center", **side_kw)
            ax.set_xlim(-0.6, n + 0.7)
            ax.set_ylim(-0.9, 1.9)
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], color=head_color(h), linewidth=3, label=f"head {h + 1}") for h in heads]
        fig.legend(
            handles=handles,
            loc="upper center",
            ncol=min(len(heads), 8),
            frameon=False,
            fontsize=7,
            bbox_to_anchor=(0.5, 0.96),
        )
        fig.suptitle(_title(data, kind, layer, heads, query, q_tok), y=0.995, va="top", fontsize=8)
        return _png(fig)


def heatmap_figure(
    data: dict,
    *,
    sentence: int = 0,
    kind: str = "encoder",
    layer: int = 0,
    heads: list[int] | None = None,
    query: int | None = None,
) -> bytes:
    """One query x key heatmap per head: PNG bytes (a query is outlined, all rows shown)."""
    heads, q_tok, k_tok, w = _chosen(data, sentence, kind, layer, heads, query)  # matplotlib checked first
    from matplotlib import rc_context
    from matplotlib.patches import Rectangle

    cols = min(4, len(heads))
    nrows = (len(heads) + cols - 1) // cols
    cell = 0.16
    pw, ph = 0.9 + cell * len(k_tok), 0.9 + cell * len(q_tok)
    with rc_context({**STYLE, "font.size": 6}):
        fig = _figure(cols * pw + 0.4, nrows * ph + 0.6, layout="constrained")  # room for the labels
        for idx, h in enumerate(heads):
            ax = fig.add_subplot(nrows, cols, idx + 1)
            im = ax.imshow(w[h], cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest", aspect="equal")
            ax.set_title(f"head {h + 1}", color=head_color(h))
            ax.set_xticks(range(len(k_tok)), k_tok, rotation=90)
            ax.set_yticks(range(len(q_tok)), q_tok)
            ax.tick_params(length=0)
            for i in range(len(q_tok)):  # restricted self-attention: the cells the window masks, hatched grey
                for j in range(len(k_tok)):
                    if outside_window(data, kind, i, j):
                        ax.add_patch(
                            Rectangle(
                                (j - 0.5, i - 0.5),
                                1,
                                1,
                                facecolor="#d0d0d0",
                                hatch="////",
                                edgecolor="#808080",
                                linewidth=0,
                            )
                        )
            if query is not None:
                ax.add_patch(
                    Rectangle((-0.5, query - 0.5), len(k_tok), 1, fill=False, edgecolor="#d62728", linewidth=1.2)
                )
        fig.colorbar(im, ax=fig.axes, shrink=0.6, label="weight")
        window = data.get("attention_window")
        note = f"; hatched: outside the window r = {window}" if window is not None and kind != "decoder_cross" else ""
        fig.suptitle(
            _title(data, kind, layer, heads, None, q_tok) + f"  (rows: queries, columns: keys{note})", fontsize=8
        )
        return _png(fig)


def outside_window(data: dict, kind: str, i: int, j: int) -> bool:
    """Whether restricted self-attention (Table 1; `attention_window` r) blocks query i from key j."""
    r = data.get("attention_window")
    return r is not None and kind != "decoder_cross" and abs(i - j) > r


def mask_categories(data: dict, sentence: int, kind: str) -> tuple[list[list[str]], list[bool]]:
    """For one sentence of the padded batch: each (query, key) cell of the mask applied, as
    "allowed", or blocked by "padding", "causal", "both" or "window" (restricted self-attention);
    and which query rows are padding (computed, then ignored)."""
    b = data["batch"]
    src_pad = [p == "<pad>" for p in b["source"][sentence]]
    tgt_pad = [p == "<pad>" for p in b["target"][sentence]]
    q_pad = src_pad if kind == "encoder" else tgt_pad
    k_pad = tgt_pad if kind == "decoder_self" else src_pad
    cats = []
    for i, row in enumerate(b["masks"][kind][sentence]):
        out = []
        for j, allowed in enumerate(row):
            causal = kind == "decoder_self" and j > i
            out.append(
                "allowed"
                if allowed
                else "both"
                if k_pad[j] and causal
                else "padding"
                if k_pad[j]
                else "causal"
                if causal
                else "window"
                if outside_window(data, kind, i, j)
                else "other"
            )
        cats.append(out)
    return cats, q_pad


def masks_figure(data: dict, sentences: list[int] | None = None) -> bytes:
    """The masks of the batch, one row per sentence, one column per attention type: PNG bytes."""
    require_matplotlib()
    from matplotlib import rc_context
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch, Rectangle

    from .weights import readable

    b = data["batch"]
    sentences = list(range(len(b["source"]))) if sentences is None else sentences
    order = ["allowed", "padding", "causal", "both", "window", "other"]
    cmap = ListedColormap([MASK_COLORS.get(c, "#000000") for c in order])
    S, T = len(b["source"][0]), len(b["target"][0])
    cell = 0.2
    widths = [S, S, T]  # key counts: encoder S, cross S, decoder self T
    with rc_context({**STYLE, "font.size": 6.5}):
        fig = _figure(1.2 + cell * (sum(widths) + 12), 1.0 + len(sentences) * (cell * max(S, T) + 1.3))
        kinds = ["encoder", "decoder_cross", "decoder_self"]
        grid = fig.add_gridspec(
            len(sentences), 3, width_ratios=widths, left=0.06, right=0.98, top=0.9, bottom=0.08, wspace=0.35, hspace=0.6
        )
        for r, s in enumerate(sentences):
            src = [readable(p) for p in b["source"][s]]
            tgt = [readable(p) for p in b["target"][s]]
            for c, kind in enumerate(kinds):
                cats, q_pad = mask_categories(data, s, kind)
                ax = fig.add_subplot(grid[r, c])
                ax.imshow(
                    [[order.index(x) for x in row] for row in cats],
                    cmap=cmap,
                    vmin=-0.5,
                    vmax=len(order) - 0.5,
                    interpolation="nearest",
                    aspect="equal",
                )
                q_tok = src if kind == "encoder" else tgt
                k_tok = tgt if kind == "decoder_self" else src
                ax.set_xticks(range(len(k_tok)), k_tok, rotation=90)
                ax.set_yticks(range(len(q_tok)), q_tok)
                ax.tick_params(length=0)
                ax.set_xticks([x - 0.5 for x in range(len(k_tok) + 1)], minor=True)
                ax.set_yticks([y - 0.5 for y in range(len(q_tok) + 1)], minor=True)
                ax.grid(which="minor", color="white", linewidth=0.6)
                ax.tick_params(which="minor", length=0)
                for i, p in enumerate(q_pad):
                    if p:
                        ax.add_patch(
                            Rectangle(
                                (-0.5, i - 0.5),
                                len(k_tok),
                                1,
                                fill=False,
                                hatch="////",
                                edgecolor="#555555",
                                linewidth=0,
                            )
                        )
                ax.set_title(f"sentence {s + 1}: {TYPE_NAMES[kind]}", fontsize=7)
                ax.set_xlabel("keys (may be attended)")
                if c == 0:
                    ax.set_ylabel("queries")
        legend = [
            Patch(facecolor=MASK_COLORS["allowed"], label="may attend (True)"),
            Patch(facecolor=MASK_COLORS["padding"], label="blocked: key is padding"),
            Patch(facecolor=MASK_COLORS["causal"], label="blocked: later position (causal)"),
            Patch(facecolor=MASK_COLORS["both"], label="blocked: both"),
            Patch(facecolor="white", edgecolor="#555555", hatch="////", label="query is padding: computed, ignored"),
        ]
        if data.get("attention_window") is not None:
            legend.insert(
                4,
                Patch(
                    facecolor=MASK_COLORS["window"],
                    label=f"blocked: outside the window (r = {data['attention_window']})",
                ),
            )
        fig.legend(handles=legend, loc="upper center", ncol=len(legend), frameon=False, bbox_to_anchor=(0.5, 0.995))
        return _png(fig)
