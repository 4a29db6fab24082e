"""Helpers of the server tests: an app served by uvicorn in a thread, `transduce serve` started as
a user starts it (a subprocess), and waiting for a condition."""

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

SRC = str(Path(__file__).resolve().parents[1] / "src")


@contextlib.contextmanager
def live(app):
    """The app served by uvicorn on a free loopback port, in a thread: yields its base URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(condition, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, "timed out"
        time.sleep(0.01)


def start_serve(args: list[str], *, prelude: str = "", env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`transduce serve ARGS` in a subprocess on a free port (after `prelude`, Python run first in
    that process: how a test slows the model down), once /health says ok: (the process, its URL)."""
    port = free_port()
    code = f"{prelude}\nimport sys\nfrom transduce.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "serve", *args, "--port", str(port)],
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"transduce serve did not start:\n{out}\n{err}")
        time.sleep(0.1)
