"""Load benchmark of `transduce serve` on loopback: N concurrent clients, with and without
dynamic batching. Measured, not asserted (docs/RESULTS.md, "Serving").

    python -m benchmarks.serve_load runs/m30k --clients 8 --requests 400 --seconds 90
    python -m benchmarks.serve_load m30k-ct2 --engine ct2

`--soak`: the server's memory (resident set) against requests served, under varied requests.

    python -m benchmarks.serve_load RUN --soak --requests 10000 --warmup 1000 --out soak/
    python -m benchmarks.serve_load RUN --soak --server-env TRANSDUCE_KERNEL_CACHE=1024 --label k1024 --out soak/

Method: docs/serve.md, "What serve_load.py measures".
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    model: str, port: int, extra: list[str], threads: int, env_extra: dict | None = None, src: Path | None = None
) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), **(env_extra or {})}
    src = src or Path(__file__).resolve().parents[1] / "src"
    env["PYTHONPATH"] = f"{src}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(src)
    cmd = [
        sys.executable,
        "-m",
        "transduce",
        "serve",
        model,
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--threads",
        str(threads),
        *extra,
    ]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_healthy(httpx, url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {proc.stdout.read()}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not become healthy")


def load(
    httpx, url: str, lines: list[str], clients: int, requests: int, seconds: float, per_request: int, body_extra: dict
) -> dict:
    counter = itertools.count()
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop_at = time.time() + seconds

    def client() -> None:
        with httpx.Client(timeout=120) as c:
            while time.time() < stop_at:
                k = next(counter)
                if k >= requests:
                    return
                batch = [lines[(k * per_request + i) % len(lines)] for i in range(per_request)]
                t0 = time.perf_counter()
                r = c.post(url + "/translate", json={"sentences": batch, **body_extra})
                dt = time.perf_counter() - t0
                with lock:
                    if r.status_code != 200 or len(r.json()["translations"]) != len(batch):
                        errors.append(f"{r.status_code} {r.text[:200]}")
                    else:
                        latencies.append(dt)

    # one warm-up request (first-call costs: weight packing, allocations)
    httpx.post(url + "/translate", json={"sentences": lines[:2], **body_extra}, timeout=120)
    info0 = httpx.get(url + "/info").json()["stats"]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    info = httpx.get(url + "/info").json()["stats"]
    done = len(latencies)
    qs = statistics.quantiles(latencies, n=100) if done >= 2 else [float("nan")] * 99
    rounds = info["rounds"] - info0["rounds"]
    return {
        "requests": done,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "wall_s": wall,
        "requests_per_s": done / wall,
        "sentences_per_s": done * per_request / wall,
        "p50_ms": qs[49] * 1000,
        "p99_ms": qs[98] * 1000,
        "rounds": rounds,
        "jobs_per_round": (info["jobs"] - info0["jobs"]) / rounds if rounds else float("nan"),
    }


# -- soak: memory against requests served ------------------------------------------------------------


def proc_memory(pid: int) -> dict:
    """The process's VmRSS, VmSize and VmHWM (peak RSS) in MB, from /proc/PID/status."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = {"VmRSS:": "rss_mb", "VmSize:": "vms_mb", "VmHWM:": "hwm_mb"}.get(line.split(maxsplit=1)[0])
            if key:
                out[key] = int(line.split()[1]) / 1024
    return out


def soak_requests(lines: list[str], seed: int, max_beam: int = 12):
    """An endless, seeded stream of varied requests: (path, body)."""
    rng = random.Random(seed)
    while True:

        def sentence() -> str:
            return " ".join(rng.choice(lines) for _ in range(rng.choice((1, 1, 1, 1, 2, 3, 4))))

        beam = 12 if rng.random() < 0.02 else rng.choice((1, 2, 3, 4, 4, 4, 5, 6, 8))
        beam = min(beam, max_beam)
        if rng.random() < 0.1:
            yield "/attention", {"source": sentence(), "beam": beam, "weights": True, "page": rng.random() < 0.3}
            continue
        greedy = rng.random() < 0.05
        count = 32 if rng.random() < 0.02 else rng.choice((1, 1, 1, 1, 2, 2, 3, 4, 4, 6, 8, 16))
        body = {
            "sentences": [sentence() for _ in range(count)],
            "beam": beam,
            "n_best": 1 if greedy else rng.randint(1, min(beam, 4)),
            "greedy": greedy,
            "scores": rng.random() < 0.5,
        }
        yield "/translate", body


def soak(
    httpx,
    url: str,
    pid: int,
    lines: list[str],
    clients: int,
    requests: int,
    warmup: int,
    every: int,
    seed: int,
    csv_path: Path,
    max_seconds: float = float("inf"),
) -> tuple[list[dict], list[str]]:
    """Send `warmup + requests` varied requests from `clients` threads; RSS against requests served
    (each sample also appended to `csv_path` as it is taken)."""
    fields = ["requests", "seconds", "rss_mb", "vms_mb", "hwm_mb"]
    with open(csv_path, "w", newline="") as f:
        csv.DictWriter(f, fieldnames=fields).writeheader()

    def record(sample: dict) -> None:
        samples.append(sample)
        with open(csv_path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=fields).writerow(sample)

    stream = soak_requests(lines, seed)
    lock = threading.Lock()
    total = warmup + requests
    state = {"sent": 0, "done": 0}
    samples: list[dict] = []
    errors: list[str] = []
    t0 = time.perf_counter()
    record({"requests": 0, "seconds": 0.0, **proc_memory(pid)})

    def client() -> None:
        with httpx.Client(timeout=600) as c:
            while True:
                with lock:
                    if state["sent"] >= total or len(errors) > 10 or time.perf_counter() - t0 > max_seconds:
                        return
                    state["sent"] += 1
                    path, body = next(stream)
                try:
                    r = c.post(url + path, json=body)
                    ok = r.status_code == 200 and (
                        path != "/translate" or len(r.json()["translations"]) == len(body["sentences"])
                    )
                    problem = None if ok else f"{path} {r.status_code} {r.text[:200]}"
                except httpx.HTTPError as e:
                    problem = f"{path} {type(e).__name__}: {e}"
                with lock:
                    if problem:
                        errors.append(problem)
                    state["done"] += 1
                    if state["done"] % every == 0 or state["done"] == total:
                        record({"requests": state["done"], "seconds": time.perf_counter() - t0, **proc_memory(pid)})
                        if state["done"] % (every * 10) == 0:
                            print(
                                f"  {state['done']} requests, RSS {samples[-1]['rss_mb']:.0f} MB",
                                file=sys.stderr,
                                flush=True,
                            )

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return samples, errors


def metric(httpx, url: str, name: str) -> float | None:
    text = httpx.get(url + "/metrics", timeout=30).text
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def run_soak(args, lines: list[str]) -> int:
    import httpx

    env = dict(kv.split("=", 1) for kv in args.server_env)
    label = args.label or ("-".join(f"{k}={v}" for k, v in env.items()) or "default")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    engine = ["--engine", args.engine] if args.engine == "ct2" else ["--precision", args.precision]
    proc = start_server(args.model, port, engine, args.threads, env, Path(args.server_src) if args.server_src else None)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(httpx, url, proc, timeout=900)
        loaded = proc_memory(proc.pid)
        stem = out / f"soak-{label}"
        samples, errors = soak(
            httpx,
            url,
            proc.pid,
            lines,
            args.clients,
            args.requests,
            args.warmup,
            args.sample_every,
            args.seed,
            Path(f"{stem}.csv"),
            max_seconds=args.soak_minutes * 60 if args.soak_minutes else float("inf"),
        )
        info = httpx.get(url + "/info").json()
        rss_metric = metric(httpx, url, "process_resident_memory_bytes")
    finally:
        proc.terminate()
        proc.wait(60)
    after_warmup = next((s for s in samples if s["requests"] >= args.warmup), samples[-1])
    end = samples[-1]
    summary = {
        "loaded_rss_mb": loaded["rss_mb"],
        "warmup_rss_mb": after_warmup["rss_mb"],
        "end_rss_mb": end["rss_mb"],
        "growth_after_warmup_percent": 100 * (end["rss_mb"] / after_warmup["rss_mb"] - 1),
        "peak_rss_mb": end.get("hwm_mb"),
        "requests": end["requests"],
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "seconds": end["seconds"],
        "requests_per_s": end["requests"] / end["seconds"] if end["seconds"] else None,
        "metrics_rss_mb": rss_metric / 2**20 if rss_metric is not None else None,
    }
    settings = {
        "model": info.get("model"),
        "model_detail": info.get("model_detail"),
        "size": info.get("size"),
        "precision": info.get("precision"),
        "engine": args.engine,
        "threads": args.threads,
        "clients": args.clients,
        "warmup": args.warmup,
        "requests": args.requests,
        "seed": args.seed,
        "server_env": env,
        "server_src": args.server_src,
        "label": label,
    }
    Path(f"{stem}.json").write_text(
        json.dumps({"settings": settings, "summary": summary, "samples": samples}, indent=1)
    )
    plot_soak(
        [(label, samples)],
        f"{stem}.png",
        args.warmup,
        f"{info.get('model')} ({info.get('size')}, "
        f"{info.get('precision')}), {args.threads} threads, {args.clients} clients",
    )
    print(json.dumps(summary, indent=1))
    print(f"wrote {stem}.csv, {stem}.json" + (f", {stem}.png" if Path(f"{stem}.png").exists() else ""))
    return 0 if not errors else 1


def plot_soak(runs: list[tuple[str, list[dict]]], path: str, warmup: int, title: str) -> None:
    """RSS against requests served, one line per run (nothing without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, samples in runs:
        ax.plot([s["requests"] for s in samples], [s["rss_mb"] for s in samples], label=label)
    if warmup:
        ax.axvline(warmup, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("requests served")
    ax.set_ylabel("server RSS (MB)")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="MODEL for `transduce serve` (with --engine ct2: an exported CTranslate2 directory)")
    p.add_argument("--engine", choices=("torch", "ct2"), default="torch")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    p.add_argument("--requests", type=int, default=400, help="requests per mode at most (default 400)")
    p.add_argument("--seconds", type=float, default=90, help="seconds per mode at most (default 90)")
    p.add_argument("--soak-minutes", type=float, help="--soak: stop sending after this many minutes (default: none)")
    p.add_argument("--per-request", type=int, default=1, help="sentences per request (default 1)")
    p.add_argument("--threads", type=int, default=2, help="the server's CPU threads (default 2)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--precision", default="auto", help="the torch engine's --precision (default auto)")
    p.add_argument("--split", default="test_2016_flickr", help="Multi30k split whose English side is sent")
    p.add_argument("--modes", default="batching,no-batching", help="comma-separated: batching, no-batching")
    g = p.add_argument_group("soak")
    g.add_argument(
        "--soak", action="store_true", help="record the server's RSS against requests served (varied requests)"
    )
    g.add_argument("--warmup", type=int, default=1000, help="requests before the growth is measured (default 1000)")
    g.add_argument("--sample-every", type=int, default=100, help="requests between RSS samples (default 100)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable for the server (repeatable)",
    )
    g.add_argument(
        "--server-src", metavar="DIR", help="the transduce source tree the server runs (default: this one's src)"
    )
    g.add_argument("--label", help="names the output files (default: the --server-env settings)")
    g.add_argument("--out", default="soak", help="output directory (default soak/)")
    args = p.parse_args()
    import httpx

    from transduce.data.datasets import fetch
    from transduce.data.text import read_lines

    lines = list(read_lines(Path(fetch("multi30k", args.split, "en"))))
    if args.soak:
        return run_soak(args, lines)
    engine = ["--engine", args.engine] if args.engine == "ct2" else ["--precision", args.precision]
    results = {}
    for mode in args.modes.split(","):
        port = free_port()
        proc = start_server(args.model, port, engine + ([] if mode == "batching" else ["--no-batching"]), args.threads)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(httpx, url, proc)
            results[mode] = load(
                httpx, url, lines, args.clients, args.requests, args.seconds, args.per_request, {"beam": args.beam}
            )
        finally:
            proc.terminate()
            proc.wait(30)
        print(f"{mode}: {results[mode]}", file=sys.stderr, flush=True)
    print(
        f"\n{args.clients} clients, {args.per_request} sentence(s) per request, beam {args.beam}, engine {args.engine}, "
        f"server threads {args.threads}\n"
    )
    print("| mode | requests | requests/s | sentences/s | p50 latency | p99 latency | requests per decoding round |")
    print("|---|---|---|---|---|---|---|")
    for mode, r in results.items():
        print(
            f"| {mode} | {r['requests']} ({r['errors']} errors) in {r['wall_s']:.1f} s | {r['requests_per_s']:.2f} | "
            f"{r['sentences_per_s']:.2f} | {r['p50_ms']:.0f} ms | {r['p99_ms']:.0f} ms | {r['jobs_per_round']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
