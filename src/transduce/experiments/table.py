"""The experiment's table, as Table 3 prints it plus Table 2's cost columns measured: Markdown for
people, CSV and JSON for scripts, a PNG of dev BLEU against parameters and against training FLOPs.
Every file is written whole or not at all."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from ..checkpoint import atomic_write_text
from ..translate import AtomicOutput
from .plan import Recipe
from .run import DECODING

COLUMNS = ("variant", "N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "positional", "train_steps",
           "dev_ppl", "dev_bleu", "dev_bleu_paper", "params", "training_flops", "train_seconds", "device",
           "precision", "processes", "mfu", "peak_flops", "peak_source", "target_tokens", "model", "preset")
"""The CSV's columns, in order (the JSON has the same keys)."""


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _cells(r: dict) -> list[str]:
    mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
    pos = "" if r["positional"] == "sinusoidal" else " (learned positions)"
    return [f"{r['variant']}{pos}", str(r["N"]), str(r["d_model"]), str(r["d_ff"]), str(r["h"]), str(r["d_k"]),
            str(r["d_v"]), f"{r['P_drop']:g}", f"{r['eps_ls']:g}", f"{r['train_steps']:,}", f"{r['dev_ppl']:.2f}",
            f"{r['dev_bleu']:.1f}", f"{r['dev_bleu_paper']:.1f}", f"{r['params'] / 1e6:.2f}",
            f"{r['training_flops']:.2e}", _duration(r["train_seconds"]), r["device"], r["precision"], mfu]


def markdown(rows: list[dict], recipe: Recipe, data_dir: Path, planned: int, average: bool) -> str:
    """Table 3 with Table 2's measured cost, and what it was made with."""
    head = ["", "N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "train steps", "PPL (dev)",
            "BLEU (dev)", "BLEU (dev, paper's tok.)", "params x10^6", "training FLOPs", "wall time", "device",
            "precision", "MFU"]
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
        + ("the average of the last checkpoints (6.1: 5, big 20; not 6.2's choice)" if average else
           "the final model (6.2: \"no checkpoint averaging\")")
        + f", beam {DECODING['beam']}, alpha {DECODING['alpha']}, max length input + {DECODING['max_len_offset']}; "
        "BLEU (dev) is sacreBLEU (detokenized, cased), BLEU (dev, paper's tok.) the paper's tokenized convention",
        "- training FLOPs: model FLOPs of the batches trained on (transduce.flops: 2mnk per product, "
        "training = 3x forward); wall time: all sessions of the run, validation and checkpoints included; "
        f"MFU against the peak {'; '.join(peaks) or '-'}",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def plot_png(rows: list[dict], recipe: Recipe) -> bytes | None:
    """Dev BLEU against parameters and against training FLOPs, each point named; None without
    matplotlib (the `views` extra)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import NullFormatter
    except ImportError:
        return None
    fig = Figure(figsize=(11, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    for ax, key, label in zip(fig.subplots(1, 2), ("params", "training_flops"),
                              ("parameters (x10^6)", "training FLOPs")):
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
    fig.suptitle("Table 3 variants: " + ("the paper's scale" if not recipe.reduced else
                 f"REDUCED SCALE (widths x{recipe.scale:g}, depth x{recipe.depth_scale:g}), not the paper's"),
                 fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def write_table(out: Path, rows: list[dict], recipe: Recipe, data_dir: Path, planned: int,
                average: bool = False) -> list[Path]:
    """OUT/table.md, table.csv, table.json and table.png (when matplotlib is installed); returns
    the paths written."""
    written = []
    summary = {"scale": recipe.scale_note(), "reduced_scale": recipe.reduced, "recipe": recipe.to_dict(),
               "data_dir": str(data_dir), "decoding": DECODING, "checkpoint_average": average, "rows": rows}
    for name, text in (("table.md", markdown(rows, recipe, data_dir, planned, average)), ("table.csv", to_csv(rows)),
                       ("table.json", json.dumps(summary, indent=2) + "\n")):
        atomic_write_text(out / name, text)
        written.append(out / name)
    png = plot_png(rows, recipe) if rows else None
    if png is not None:
        f = AtomicOutput(out / "table.png")
        f.write(png)
        f.commit()
        written.append(out / "table.png")
    return written
