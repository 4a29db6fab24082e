"""What a server costs to keep running, and what it tells clients: oneDNN's per-shape caches
bounded (the memory of products of many shapes stays flat), free memory given back after
rounds, the process's memory, CPU and open files in /metrics, and no path of the server's
file system in anything a client receives."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from serving import SRC  # noqa: E402
from tiny_models import make_model  # noqa: E402

from transduce import memory  # noqa: E402
from transduce.serve.app import create_app, torch_engine  # noqa: E402
from transduce.serve.batcher import Batcher  # noqa: E402
from transduce.serve.backend import model_name, public_model, scrub  # noqa: E402
from transduce.memory import malloc_stats, release_free_memory  # noqa: E402
from transduce.decoding.ready import load_translation_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPES = """
import os, sys, torch
from transduce.serve.app import create_app
create_app(lambda: None)  # bounds the caches, as `transduce serve` does, before the first product
from transduce.fast.decode import PackedWeight, can_pack
from transduce.memory import malloc_stats
if not can_pack(torch.float32, "cpu"):
    print("null"); sys.exit()
torch.set_num_threads(1)
w = PackedWeight(torch.randn(512, 128))
with torch.inference_mode():
    w(torch.randn(3, 128), None)
    before = malloc_stats()["in_use"]
    for rows in range(4, 204):  # 200 shapes, each a new oneDNN primitive
        w(torch.randn(rows, 128), None)
    print((malloc_stats()["in_use"] - before) / 2**20)
"""


def grown_mb(cache: str) -> float | None:
    """malloc's memory in use after products of 200 shapes, less before, in a fresh process
    with TRANSDUCE_KERNEL_CACHE=cache (MB; None where oneDNN does not pack)."""
    env = {**os.environ, "PYTHONPATH": SRC, "TRANSDUCE_KERNEL_CACHE": cache, "OMP_NUM_THREADS": "1"}
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-c", SHAPES], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_kernel_caches_are_bounded_so_new_shapes_do_not_grow_the_heap():
    if malloc_stats() is None:
        pytest.skip("needs glibc's mallinfo2 to see the heap")
    bounded, unbounded = grown_mb("16"), grown_mb("100000")
    if bounded is None:
        pytest.skip("oneDNN packs no weights on this CPU")
    # unbounded, every shape keeps its primitive (a few hundred KB each); bounded, 16 at most
    assert unbounded > 40 and bounded < 20 and bounded < unbounded / 4, (bounded, unbounded)


def test_building_the_app_sets_the_bound_and_keeps_the_users_own():
    code = (
        "import os; from transduce.serve.app import create_app; create_app(lambda: None); "
        "print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'], os.environ['LRU_CACHE_CAPACITY'])"
    )
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY", "TRANSDUCE_KERNEL_CACHE")
    }

    def run(**env):
        return subprocess.run(
            [sys.executable, "-c", code],
            env={**base, "PYTHONPATH": SRC, **env},
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout.split()

    default = str(memory.DEFAULT_KERNEL_CACHE)
    assert run() == [default, default]  # transduce's training default (16384) replaced
    assert run(TRANSDUCE_KERNEL_CACHE="1000") == ["1000", "1000"]
    assert run(ONEDNN_PRIMITIVE_CACHE_CAPACITY="4096") == ["4096", default]  # the user's own value stays


def test_after_round_runs_on_the_decoding_thread_saying_whether_the_queue_is_empty():
    import threading

    seen = []
    release = threading.Event()

    def translate(sentences, settings):
        release.wait(5)
        return sentences

    b = Batcher(translate, max_wait=0.0, after_round=lambda idle: seen.append((threading.current_thread().name, idle)))
    b.start()
    try:
        first = b.submit(["a"], 1, 2)
        time.sleep(0.1)  # the first round is decoding: the second job waits behind it
        second = b.submit(["b"], 2, 2)
        release.set()
        assert first.future.result(5) == ["a"] and second.future.result(5) == ["b"]
        deadline = time.time() + 5
        while len(seen) < 2 and time.time() < deadline:
            time.sleep(0.01)
    finally:
        b.stop()
    assert seen == [("transduce-batcher", False), ("transduce-batcher", True)]


def test_release_free_memory_gives_pages_back():
    if malloc_stats() is None or not os.path.isfile("/proc/self/status"):
        pytest.skip("needs glibc and /proc")

    def rss() -> int:
        return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) << 10

    blocks = [bytearray(64 << 10) for _ in range(2000)]  # 125 MB, below the mmap threshold: on the heap
    keep = blocks[-1]  # in use above the others: free() alone cannot return them (it trims the top only)
    del blocks
    before = rss()
    assert release_free_memory() is True
    assert before - rss() > 60 << 20, (before, rss())
    del keep


# -- what clients are told -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "description, name, detail",
    [
        (
            "average of the last 5 checkpoints (step_0000100 .. step_0000500) of /srv/runs/multi30k-en-de",
            "multi30k-en-de",
            "average of the last 5 checkpoints (step_0000100 .. step_0000500)",
        ),
        ("/srv/x/runs/multi30k-en-de/avg_last5", "avg_last5", "model directory"),
        ("/srv/runs/m30k/model", "m30k", "final weights"),
        ("runs/m30k/checkpoints/step_0000300", "m30k", "checkpoint step_0000300"),
        (
            "CTranslate2 model /srv/m30k-ct2 (int8, computed float32)",
            "m30k-ct2",
            "CTranslate2 export (int8, computed float32)",
        ),
    ],
)
def test_a_model_is_named_without_its_directories(description, name, detail):
    assert model_name(description) == (name, detail)


def test_scrub_keeps_the_last_part_of_absolute_paths_and_leaves_routes():
    assert scrub("/srv/runs/m30k: no such directory, see /info") == "m30k: no such directory, see /info"
    assert scrub("http://host:8000/a/b stays") == "http://host:8000/a/b stays"


ABSOLUTE = re.compile(r"(?<![\w.:/~#-])(?:/[\w.-]+){2,}")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("where-the-model-lies")
    loaded = load_translation_model(make_model(root))
    return root, loaded


def test_no_absolute_path_reaches_a_client(served):
    """/, /info, /metrics, /openapi.json, /health, /translate, /attention (weights and page), and
    errors (a bad request, a missing route, a model that fails to load naming its path): none
    holds the server's directory, nor any absolute path of two parts or more."""
    from starlette.testclient import TestClient

    root, loaded = served
    bodies = {}
    with TestClient(create_app(torch_engine(loaded))) as c:
        bodies["/"] = c.get("/").text
        info = c.get("/info").json()
        bodies["/info"] = json.dumps(info)
        bodies["/metrics"] = c.get("/metrics").text
        bodies["/openapi.json"] = c.get("/openapi.json").text
        bodies["/health"] = c.get("/health").text
        bodies["/translate"] = c.post(
            "/translate", json={"sentences": ["a dog runs"], "n_best": 2, "scores": True}
        ).text
        bodies["/attention"] = c.post("/attention", json={"source": "a dog runs", "page": True}).text
        bodies["422"] = c.post("/translate", json={"sentences": "not a list"}).text
        bodies["404"] = c.get(str(root)).text
    assert info["model"] == root.name and info["model_detail"] == "final weights"
    assert info["parameters"] == sum(p.numel() for p in loaded.model.parameters()) and info["precision"]

    def fails():
        raise FileNotFoundError(f"{root}/model: neither a model directory nor a run directory")

    with TestClient(create_app(fails)) as c:
        deadline = time.time() + 5
        while "failed" not in (r := c.get("/health")).text and time.time() < deadline:
            time.sleep(0.01)
        bodies["/health failed"] = r.text
    assert "failed" in bodies["/health failed"]
    for where, body in bodies.items():
        assert str(root) not in body and str(root.parent) not in body, where
        assert not ABSOLUTE.search(body), (where, ABSOLUTE.search(body).group())


def test_metrics_carry_the_process_memory_cpu_and_open_files(served):
    from starlette.testclient import TestClient

    _, loaded = served
    with TestClient(create_app(torch_engine(loaded))) as c:
        text = c.get("/metrics").text
    values = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(process_\w+) (\S+)$", text, re.M)}
    if not os.path.isdir("/proc/self"):
        pytest.skip("prometheus-client reads the process's figures from /proc")
    rss = int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) * 1024
    assert 0.5 * rss < values["process_resident_memory_bytes"] < 2 * rss
    assert values["process_virtual_memory_bytes"] >= values["process_resident_memory_bytes"]
    assert values["process_cpu_seconds_total"] > 0 and values["process_open_fds"] >= 3


def test_public_model_says_languages_size_and_precision():
    from transduce.config import Config, ModelConfig

    info = public_model(
        "/srv/runs/m30k/model",
        Config(model=ModelConfig(src_vocab_size=8000, n_layers=3, d_model=256, d_ff=1024, n_heads=4)),
        {"src_lang": "en", "tgt_lang": "de"},
        "bf16",
    )
    assert info == {
        "model": "m30k",
        "model_detail": "final weights",
        "languages": {"src": "en", "tgt": "de"},
        "parameters": 7_568_384,
        "size": "7.6M",
        "precision": "bf16",
    }
