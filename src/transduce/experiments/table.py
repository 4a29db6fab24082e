"""The experiment's table, Table 3 plus Table 2's cost measured: Markdown, CSV, JSON and a PNG of
dev BLEU against parameters and training FLOPs, each file written whole or not at all."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from ..checkpoint.files import AtomicOutput, atomic_write_text
from .plan import Recipe
from .run import DECODING

COLUMNS = (
    "variant",
    "N",
    "d_model",
    "d_ff",
    "h",
    "d_k",
    "d_v",
    "P_drop",
    "eps_ls",
    "positional",
    "train_steps",
    "dev_ppl",
    "dev_bleu",
    "dev_bleu_paper",
    "params",
    "training_flops",
    "train_seconds",
    "device",
    "precision",
    "processes",
    "mfu",
    "peak_flops",
    "peak_source",
    "target_tokens",
    "model",
    "preset",
)
"""The CSV's columns, in order (the JSON has the same keys)."""


PAPER = {  # Table 3 of the paper: PPL (dev), BLEU (dev), params x10^6 (newstest2013, En-De), to compare directions
    "base": (4.92, 25.8, 65),
    "A1": (5.29, 24.9, None),
    "A2": (5.00, 25.5, None),
    "A3": (4.91, 25.8, None),
    "A4": (5.01, 25.4, None),
    "B1": (5.16, 25.1, 58),
    "B2": (5.01, 25.4, 60),
    "C1": (6.11, 23.7, 36),
    "C2": (5.19, 25.3, 50),
    "C3": (4.88, 25.5, 80),
    "C4": (5.75, 24.5, 28),
    "C5": (4.66, 26.0, 168),
    "C6": (5.12, 25.4, 53),
    "C7": (4.75, 26.2, 90),
    "D1": (5.77, 24.6, None),
    "D2": (4.95, 25.5, None),
    "D3": (4.67, 25.3, None),
    "D4": (5.47, 25.7, None),
    "E": (4.92, 25.7, None),
    "big": (4.33, 26.4, 213),
}

SAME = {"paper": (0.01, 0.15), "here": (0.02, 0.5)}
"""What counts as no change against base: (relative perplexity, BLEU points). The paper's figures
are printed to 0.01 PPL and 0.1 BLEU; ours are one seed at a reduced scale, whose noise is larger."""


def _direction(d: float, same: float, lower_is_better: bool) -> str:
    if abs(d) <= same:
        return "="
    return "better" if (d < 0) == lower_is_better else "worse"


def directions(rows: list[dict]) -> list[dict]:
    """For every row but base: the paper's and our change against base, in perplexity and BLEU,
    and whether the direction holds (`=` is a change within `SAME`)."""
    base = next((r for r in rows if r["variant"] == "base"), None)
    if base is None:
        return []
    out = []
    for r in rows:
        v = r["variant"]
        if v == "base" or v not in PAPER:
            continue
        (pp, pb, _), (bp, bb, _) = PAPER[v], PAPER["base"]
        d = {
            "variant": v,
            "paper_ppl": pp,
            "paper_bleu": pb,
            "paper_dppl": pp / bp - 1,
            "paper_dbleu": pb - bb,
            "here_dppl": r["dev_ppl"] / base["dev_ppl"] - 1,
            "here_dbleu": r["dev_bleu"] - base["dev_bleu"],
        }
        for who in ("paper", "here"):
            d[f"{who}_ppl_dir"] = _direction(d[f"{who}_dppl"], SAME[who][0], True)
            d[f"{who}_bleu_dir"] = _direction(d[f"{who}_dbleu"], SAME[who][1], False)
        d["ppl_holds"] = d["paper_ppl_dir"] == d["here_ppl_dir"]
        d["bleu_holds"] = d["paper_bleu_dir"] == d["here_bleu_dir"]
        out.append(d)
    return out


def directions_markdown(rows: list[dict]) -> list[str]:
    ds = directions(rows)
    if not ds:
        return []
    lines = [
        "",
        "## Against the paper: each row's change against base, there and here",
        "",
        f"Direction: better / worse / `=` (within {100 * SAME['paper'][0]:g}% PPL and {SAME['paper'][1]:g} BLEU "
        f"for the paper, {100 * SAME['here'][0]:g}% and {SAME['here'][1]:g} here: one seed at a reduced scale).",
        "",
        "| | paper PPL | paper BLEU | paper: PPL vs base | here: PPL vs base | holds | paper: BLEU vs base "
        "| here: BLEU vs base | holds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for d in ds:
        lines.append(
            f"| {d['variant']} | {d['paper_ppl']:.2f} | {d['paper_bleu']:.1f} "
            f"| {100 * d['paper_dppl']:+.1f}% {d['paper_ppl_dir']} | {100 * d['here_dppl']:+.1f}% {d['here_ppl_dir']} "
            f"| {'yes' if d['ppl_holds'] else '**no**'} "
            f"| {d['paper_dbleu']:+.1f} {d['paper_bleu_dir']} | {d['here_dbleu']:+.1f} {d['here_bleu_dir']} "
            f"| {'yes' if d['bleu_holds'] else '**no**'} |"
        )
    held = sum(d["ppl_holds"] for d in ds), sum(d["bleu_holds"] for d in ds)
    lines += [
        "",
        f"The paper's direction holds here for {held[0]} of {len(ds)} rows in perplexity and {held[1]} "
        f"of {len(ds)} in BLEU.",
    ]
    return lines


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _cells(r: dict) -> list[str]:
    mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
    pos = "" if r["positional"] == "sinusoidal" else " (learned positions)"
    return [
        f"{r['variant']}{pos}",
        str(r["N"]),
        str(r["d_model"]),
        str(r["d_ff"]),
        str(r["h"]),
        str(r["d_k"]),
        str(r["d_v"]),
        f"{r['P_drop']:g}",
        f"{r['eps_ls']:g}",
        f"{r['train_steps']:,}",
        f"{r['dev_ppl']:.2f}",
        f"{r['dev_bleu']:.1f}",
        f"{r['dev_bleu_paper']:.1f}",
        f"{r['params'] / 1e6:.2f}",
        f"{r['training_flops']:.2e}",
        _duration(r["train_seconds"]),
        r["device"],
        r["precision"],
        mfu,
    ]


def markdown(rows: list[dict], recipe: Recipe, data_dir: Path, planned: int, average: bool) -> str:
    """Table 3 with Table 2's measured cost, and what it was made with."""
    head = [
        "",
        "N",
        "d_model",
        "d_ff",
        "h",
        "d_k",
        "d_v",
        "P_drop",
        "eps_ls",
        "train steps",
        "PPL (dev)",
        "BLEU (dev)",
        "BLEU (dev, paper's tok.)",
        "params x10^6",
        "training FLOPs",
        "wall time",
        "device",
        "precision",
        "MFU",
    ]
    peaks = sorted({r["peak_source"] for r in rows})
    lines = [
        "# Table 3 (Variations on the Transformer architecture), with Table 2's training cost measured",
        "",
        f"**Scale: {recipe.scale_note()}.**",
        "",
        f"- data: `{data_dir}`, development set = its validation split; {len(rows)} of {planned} rows done",
        f"- recipe: {recipe.updates:,} updates for base (big: 3x, as 100K vs 300K), {recipe.max_tokens:,} tokens per "
        f"update and side, warmup {recipe.warmup}, lr scale {recipe.lr_scale:g}, cooldown {recipe.cooldown:g}, "
        f"a checkpoint every {recipe.save_every} updates, seed {recipe.seed}",
        "- dev perplexity per subword token and dev BLEU of "
        + (
            "the average of the last checkpoints (6.1: 5, big 20; not 6.2's choice)"
            if average
            else 'the final model (6.2: "no checkpoint averaging")'
        )
        + f", beam {DECODING['beam']}, length penalty gnmt:{DECODING['alpha']}, max length input + {DECODING['max_len_offset']}; "
        "BLEU (dev) is sacreBLEU (detokenized, cased), BLEU (dev, paper's tok.) the paper's tokenized convention",
        "- training FLOPs: model FLOPs of the batches trained on (transduce.flops: 2mnk per product, "
        "training = 3x forward); wall time: all sessions of the run, validation and checkpoints included; "
        f"MFU against the peak {'; '.join(peaks) or '-'}",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    lines += directions_markdown(rows)
    return "\n".join(lines) + "\n"


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def plot_png(rows: list[dict], recipe: Recipe) -> bytes | None:
    """Dev BLEU against parameters and against training FLOPs; None without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import NullFormatter
    except ImportError:
        return None
    fig = Figure(figsize=(11, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    for ax, key, label in zip(
        fig.subplots(1, 2), ("params", "training_flops"), ("parameters (x10^6)", "training FLOPs")
    ):
        xs = [r[key] / (1e6 if key == "params" else 1) for r in rows]
        ys = [r["dev_bleu"] for r in rows]
        ax.scatter(xs, ys)
        for x, y, r in zip(xs, ys, rows):
            ax.annotate(r["variant"], (x, y), textcoords="offset points", xytext=(4, 3), fontsize=8)
        ax.set_xlabel(label)
        ax.set_ylabel("dev BLEU (sacreBLEU)")
        if key == "training_flops":
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3)
    fig.suptitle(
        "Table 3 variants: "
        + (
            "the paper's scale"
            if not recipe.reduced
            else f"REDUCED SCALE (widths x{recipe.scale:g}, depth x{recipe.depth_scale:g}), not the paper's"
        ),
        fontsize=10,
    )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def write_table(
    out: Path, rows: list[dict], recipe: Recipe, data_dir: Path, planned: int, average: bool = False
) -> list[Path]:
    """OUT/table.md, .csv, .json and .png (with matplotlib); returns the paths written."""
    written = []
    summary = {
        "scale": recipe.scale_note(),
        "reduced_scale": recipe.reduced,
        "recipe": recipe.to_dict(),
        "data_dir": str(data_dir),
        "decoding": DECODING,
        "checkpoint_average": average,
        "rows": rows,
        "against_paper": directions(rows),
    }
    for name, text in (
        ("table.md", markdown(rows, recipe, data_dir, planned, average)),
        ("table.csv", to_csv(rows)),
        ("table.json", json.dumps(summary, indent=2) + "\n"),
    ):
        atomic_write_text(out / name, text)
        written.append(out / name)
    png = plot_png(rows, recipe) if rows else None
    if png is not None:
        f = AtomicOutput(out / "table.png")
        f.write(png)
        f.commit()
        written.append(out / "table.png")
    return written
