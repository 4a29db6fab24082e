"""Load benchmark of `transduce serve` on loopback: N concurrent clients, with and without
dynamic batching. Measured, not asserted (docs/RESULTS.md, "Serving and export").

    python benchmarks/serve_load.py runs/m30k --clients 8 --requests 400 --seconds 90
    python benchmarks/serve_load.py m30k-ct2 --engine ct2

For each mode (batching: the server's defaults, 10 ms wait; no batching: `--no-batching`, each
request decoded on its own) the script starts `transduce serve MODEL` as a process of its own,
waits for /health, then runs N client threads, each sending one request after the other (its
next sentences of the Multi30k test source, `--per-request` sentences each) until `--requests`
requests are done or `--seconds` have passed. It records every request's latency and reports
requests/s, sentences/s, p50/p99 latency, and the jobs per decoding round the server saw (/info).
Every answer is checked to be a 200 with one translation per sentence.
"""

from __future__ import annotations

import argparse
import itertools
import os
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


def start_server(model: str, port: int, extra: list[str], threads: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    src = Path(__file__).resolve().parents[1] / "src"
    env["PYTHONPATH"] = f"{src}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(src)
    cmd = [sys.executable, "-m", "transduce", "serve", model, "--port", str(port), "--log-level", "warning",
           "--threads", str(threads), *extra]
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


def load(httpx, url: str, lines: list[str], clients: int, requests: int, seconds: float, per_request: int,
         body_extra: dict) -> dict:
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
    return {"requests": done, "errors": len(errors), "first_error": errors[0] if errors else None, "wall_s": wall,
            "requests_per_s": done / wall, "sentences_per_s": done * per_request / wall,
            "p50_ms": qs[49] * 1000, "p99_ms": qs[98] * 1000, "rounds": rounds,
            "jobs_per_round": (info["jobs"] - info0["jobs"]) / rounds if rounds else float("nan")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="MODEL for `transduce serve` (with --engine ct2: an exported CTranslate2 directory)")
    p.add_argument("--engine", choices=("torch", "ct2"), default="torch")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    p.add_argument("--requests", type=int, default=400, help="requests per mode at most (default 400)")
    p.add_argument("--seconds", type=float, default=90, help="seconds per mode at most (default 90)")
    p.add_argument("--per-request", type=int, default=1, help="sentences per request (default 1)")
    p.add_argument("--threads", type=int, default=2, help="the server's CPU threads (default 2)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--precision", default="auto", help="the torch engine's --precision (default auto)")
    p.add_argument("--split", default="test_2016_flickr", help="Multi30k split whose English side is sent")
    p.add_argument("--modes", default="batching,no-batching", help="comma-separated: batching, no-batching")
    args = p.parse_args()
    import httpx

    from transduce.data.datasets import fetch

    from transduce.data.text import read_lines

    lines = list(read_lines(Path(fetch("multi30k", args.split, "en"))))
    engine = ["--engine", args.engine] if args.engine == "ct2" else ["--precision", args.precision]
    results = {}
    for mode in args.modes.split(","):
        port = free_port()
        proc = start_server(args.model, port, engine + ([] if mode == "batching" else ["--no-batching"]), args.threads)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(httpx, url, proc)
            results[mode] = load(httpx, url, lines, args.clients, args.requests, args.seconds, args.per_request,
                                 {"beam": args.beam})
        finally:
            proc.terminate()
            proc.wait(30)
        print(f"{mode}: {results[mode]}", file=sys.stderr, flush=True)
    print(f"\n{args.clients} clients, {args.per_request} sentence(s) per request, beam {args.beam}, engine {args.engine}, "
          f"server threads {args.threads}\n")
    print("| mode | requests | requests/s | sentences/s | p50 latency | p99 latency | requests per decoding round |")
    print("|---|---|---|---|---|---|---|")
    for mode, r in results.items():
        print(f"| {mode} | {r['requests']} ({r['errors']} errors) in {r['wall_s']:.1f} s | {r['requests_per_s']:.2f} | "
              f"{r['sentences_per_s']:.2f} | {r['p50_ms']:.0f} ms | {r['p99_ms']:.0f} ms | {r['jobs_per_round']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
