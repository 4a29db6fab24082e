"""Table 1, measured: the fits and the report of `table1.py`'s points (exponents of n, the tables
of table1.md, the figure)."""

from __future__ import annotations

import datetime
import math
import subprocess
import sys
from pathlib import Path

import torch

from transduce.cpu import cpu_name

PAPER = {  # Table 1: complexity per layer, sequential operations, maximum path length
    "self-attention": ("O(n²·d)", "O(1)", "O(1)"),
    "restricted (masked)": ("O(r·n·d)", "O(1)", "O(n/r)"),
    "restricted (banded)": ("O(r·n·d)", "O(1)", "O(n/r)"),
    "recurrent": ("O(n·d²)", "O(n)", "O(n)"),
    "convolution": ("O(k·n·d²)", "O(1)", "O(log_k(n))"),
    "separable": ("O(k·n·d + n·d²)", "O(1)", "O(log_k(n))"),
}


def exponent(ns: list[int], values: list[float]) -> float | None:
    """Least-squares slope of log(value) on log(n) over the larger half of the points (at least 3)."""
    pts = [(n, v) for n, v in zip(ns, values) if v and v > 0]
    pts = pts[len(pts) // 2 :] if len(pts) >= 6 else pts[-3:]
    if len(pts) < 2:
        return None
    xs, ys = [math.log(n) for n, _ in pts], [math.log(v) for _, v in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((a - mx) * (b - my) for a, b in zip(xs, ys)) / sum((a - mx) ** 2 for a in xs)


def machine() -> dict:
    name = cpu_name()
    caps = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    isa = [
        f
        for f in (
            "avx2",
            "fma3",
            "avx512_f",
            "avx512_bw",
            "avx512_vnni",
            "avx512_bf16",
            "avx512_fp16",
            "amx_tile",
            "amx_bf16",
            "amx_int8",
        )
        if caps.get(f)
    ]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "cpu": name,
        "isa": isa,
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": caps.get("num_physical_cores"),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "commit": commit,
        "date": datetime.date.today().isoformat(),
        "command": " ".join(["python", *sys.argv]),
    }


def fmt(v, unit=""):
    if v is None:
        return "–"
    if isinstance(v, float) and unit == "":
        return f"{v:.2f}"
    return f"{v}{unit}"


def summarize(result: dict) -> dict:
    """Per layer type: the fitted exponents, and the crossover lengths (attention vs the rest)."""
    out = {}
    for kind, pts in result["points"].items():
        ns = [p["n"] for p in pts]
        out[kind] = {
            "flops_exponent": exponent(ns, [p["flops_fwd"] for p in pts]),
            "time_exponent": exponent(ns, [p["time_fwd"] + p["time_bwd"] for p in pts]),
            "time_fwd_exponent": exponent(ns, [p["time_fwd"] for p in pts]),
            "memory_exponent": exponent(ns, [p.get("memory") for p in pts]),
        }
        if kind.startswith("self") or kind.startswith("restricted"):
            out[kind]["attention_flops_exponent"] = exponent(ns, [p["flops_attention_fwd"] for p in pts])
    cross = {}
    att = {p["n"]: p["time_fwd"] + p["time_bwd"] for p in result["points"].get("self-attention", [])}
    for other in ("recurrent", "convolution", "separable", "restricted (banded)"):
        o = {p["n"]: p["time_fwd"] + p["time_bwd"] for p in result["points"].get(other, [])}
        both = sorted(set(att) & set(o))
        first = None  # the smallest n from which attention is slower at every larger n measured
        for n in reversed(both):
            if att[n] <= o[n]:
                break
            first = n
        cross[other] = first
    return {"fits": out, "attention_slower_from_n": cross}


def markdown(result: dict) -> str:
    m, s = result["machine"], result["summary"]
    lines = [
        f"CPU: {m['cpu']} ({m['cores']} cores; ISA: {', '.join(m['isa'])}; torch {m['torch']}, "
        f"capability {m['torch_capability']}, {m['threads']} threads), {m['date']}, commit {m['commit']}.",
        f"Command: `{m['command']}`. d = {result['d']}, r = {result['r']}, k = {result['k']}, batch 1, fp32.",
        "",
        "| layer type | Table 1: complexity | FLOPs exponent (fwd; eq. 1 alone) | time exponent (fwd+bwd; fwd) | "
        f"FLOPs fwd at n = {result['largest']} | time fwd+bwd | peak memory | Table 1: sequential ops | "
        "traced dependent products (n₁ → n₂) | Table 1: max path | layers needed (n→1; 1→n) | products on the path |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    seq, path = result["sequential"], result["path"]
    for kind in result["points"]:
        f, pts = s["fits"][kind], result["points"][kind]
        last = pts[-1]
        att = f.get("attention_flops_exponent")
        pl = path.get(kind.replace(" (banded)", " (masked)"), {})
        lines.append(
            f"| {kind} | {PAPER[kind][0]} | {fmt(f['flops_exponent'])}{'; ' + fmt(att) if att is not None else ''} | "
            f"{fmt(f['time_exponent'])}; {fmt(f['time_fwd_exponent'])} | {last['flops_fwd'] / 1e9:.2f} G (n = {last['n']}) | "
            f"{(last['time_fwd'] + last['time_bwd']) * 1e3:.1f} ms | "
            f"{fmt(None if last.get('memory') is None else round(last['memory'] / 2**20, 1), ' MiB')} | {PAPER[kind][1]} | "
            f"{seq[kind][0]} → {seq[kind][1]} | {PAPER[kind][2]} | {fmt(pl.get('forward', {}).get('layers'))}; "
            f"{fmt(pl.get('backward', {}).get('layers'))} | {fmt(pl.get('forward', {}).get('products_on_path'))} |"
        )
    pl = path.get("dilated convolution", {})
    lines.append(
        f"| dilated convolution (path only) | O(k·n·d²) | | | | | | O(1) | | O(log_k(n)) | "
        f"{fmt(pl.get('forward', {}).get('layers'))}; {fmt(pl.get('backward', {}).get('layers'))} | "
        f"{fmt(pl.get('forward', {}).get('products_on_path'))} |"
    )
    lines += [
        "",
        f"Sequential products traced at n₁ = {result['seq_n'][0]} and n₂ = {result['seq_n'][1]} (d = 16); "
        f"path lengths at n = {result['path_n']} (d = 16, r = {result['path_r']} for the restricted layers, "
        f"k = {result['k']}, the dilated one causal with dilation k^l in layer l), '–': never (a causal layer) or not measured.",
        "",
    ]
    ns = sorted({p["n"] for pts in result["points"].values() for p in pts})
    lines += [
        "Forward + backward time (ms) by n:",
        "",
        "| layer type | " + " | ".join(map(str, ns)) + " |",
        "|---|" + "---|" * len(ns),
    ]
    for kind, pts in result["points"].items():
        by = {p["n"]: (p["time_fwd"] + p["time_bwd"]) * 1e3 for p in pts}
        lines.append(f"| {kind} | " + " | ".join(f"{by[n]:.2f}" if n in by else "–" for n in ns) + " |")
    lines += [
        "",
        "The smallest n from which self-attention (forward + backward) is slower than each other layer type "
        "at every larger n measured: "
        + "; ".join(f"{k} from n = {fmt(v)}" for k, v in s["attention_slower_from_n"].items())
        + " ('–': not even at the largest n measured for both).",
    ]
    if result["stopped"]:
        lines += [
            "",
            "Stopped: " + "; ".join(f"{k} after n = {v['n']} ({v['why']})" for k, v in result["stopped"].items()),
        ]
    return "\n".join(lines) + "\n"


def figure(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for kind, pts in result["points"].items():
        ns = [p["n"] for p in pts]
        axes[0].loglog(ns, [(p["time_fwd"] + p["time_bwd"]) * 1e3 for p in pts], "o-", label=kind, markersize=3)
        axes[1].loglog(ns, [p["flops_fwd"] for p in pts], "o-", label=kind, markersize=3)
    axes[0].set(xlabel="n (positions)", ylabel="forward + backward time (ms)", title="time per layer")
    axes[1].set(xlabel="n (positions)", ylabel="forward FLOPs (counted)", title="FLOPs per layer")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    m = result["machine"]
    fig.suptitle(
        f"Table 1 measured: d = {result['d']}, r = {result['r']}, k = {result['k']}, fp32, "
        f"{m['cpu']}, {m['threads']} threads",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
