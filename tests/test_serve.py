"""`transduce serve`: dynamic batching (with a model that records its batches), every limit,
errors as JSON and never a 500, disconnects, loading, the server's output equal to
`transduce translate`'s, and a property-based test of the API against its own OpenAPI document
(schemathesis, positive and negative cases)."""

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from serving import live, start_serve, until  # noqa: E402
from tiny_models import SRC_WORDS, make_model, sentences  # noqa: E402

from transduce.cli import main  # noqa: E402
from transduce.model import Transformer  # noqa: E402
from transduce.decoding.settings import SearchSettings  # noqa: E402
from transduce.serve.app import Engine, Limits, create_app, torch_engine  # noqa: E402
from transduce.serve.batcher import Batcher, QueueFull  # noqa: E402
from transduce.decoding.ready import load_for_decoding, load_translation_model  # noqa: E402
from transduce.decoding.translate import translate_lines, translate_stream  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


class RecordingTransformer(Transformer):
    """The model, recording the batch size of every `encode`: one per model batch decoded."""

    def __init__(self, config):
        super().__init__(config)
        self.batches: list[int] = []

    def encode(self, src, src_mask=None):
        self.batches.append(src.size(0))
        return super().encode(src, src_mask)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def loaded(model_dir):
    return load_for_decoding(model_dir, precision="fp32")  # made ready as `transduce serve` loads it


@pytest.fixture
def recording(model_dir):
    loaded = load_translation_model(model_dir)
    model = RecordingTransformer(loaded.config.model)
    model.load_state_dict(loaded.model.state_dict())
    loaded.model = model.eval()
    return loaded


def post(url, body, **kw):
    return httpx.post(url + "/translate", json=body, timeout=30, **kw)


# -- batching ----------------------------------------------------------------------------------------


def test_concurrent_requests_share_batches_without_cross_talk(recording, loaded):
    requests = [sentences(SRC_WORDS, 1 + k % 3, seed=100 + k) for k in range(8)]
    expected = [
        translate_lines(loaded.model, loaded.src_vocab, loaded.tgt_vocab, r, beam=2, max_len_offset=4) for r in requests
    ]
    app = create_app(torch_engine(recording), max_wait=0.3)
    results: list = [None] * len(requests)
    with live(app) as url:
        go = threading.Barrier(len(requests))

        def client(k):
            go.wait()
            results[k] = post(url, {"sentences": requests[k], "beam": 2, "max_len_offset": 4})

        threads = [threading.Thread(target=client, args=(k,)) for k in range(len(requests))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = app.state.batcher.stats
    assert all(r.status_code == 200 for r in results)
    assert [[t["text"] for t in r.json()["translations"]] for r in results] == expected  # each its own, in order
    assert stats.jobs == 8 and stats.rounds < 8 and len(recording.model.batches) < 8  # decoded together
    assert sum(recording.model.batches) == sum(map(len, requests))


def test_batcher_rounds_keep_settings_apart_and_respect_the_budget():
    calls = []
    release = threading.Event()

    def translate(sentences, settings):
        release.wait(5)
        calls.append((list(sentences), settings))
        return [f"{settings}:{s}" for s in sentences]

    b = Batcher(translate, max_batch_tokens=20, max_wait=0.2, max_queue=10).start()
    jobs = [b.submit([f"s{i}"], "beam4" if i != 2 else "greedy", tokens=10) for i in range(5)]
    release.set()
    assert [j.future.result(5) for j in jobs] == [[f"{'greedy' if i == 2 else 'beam4'}:s{i}"] for i in range(5)]
    b.stop()
    # each round starts with the oldest job and takes the jobs with its settings, at most 20 tokens:
    # "greedy" on its own, in its turn (no job waits behind younger ones)
    assert calls == [(["s0", "s1"], "beam4"), (["s2"], "greedy"), (["s3", "s4"], "beam4")]


@pytest.mark.parametrize("max_wait", [float("nan"), float("inf"), -0.1])
def test_batcher_refuses_a_max_wait_that_cannot_end(max_wait):
    with pytest.raises(ValueError, match="max_wait a finite number >= 0"):
        Batcher(lambda sentences, settings: sentences, max_wait=max_wait)


def test_batcher_failure_fails_its_round_only_and_cancelled_jobs_are_dropped():
    seen = []
    gate = threading.Event()

    def translate(sentences, settings):
        gate.wait(5)
        seen.append(list(sentences))
        if "boom" in sentences:
            raise RuntimeError("boom")
        return sentences

    b = Batcher(translate, max_wait=0.0, max_queue=2).start()
    first = b.submit(["boom"], "s", 1)
    while b.queued:  # the decoding thread has taken it
        time.sleep(0.01)
    queued = b.submit(["dropped"], "s", 1)
    kept = b.submit(["kept"], "s", 1)
    with pytest.raises(QueueFull):
        b.submit(["one too many"], "s", 1)
    b.cancel(queued)
    gate.set()
    with pytest.raises(RuntimeError, match="boom"):
        first.future.result(5)
    assert kept.future.result(5) == ["kept"]
    b.stop()
    assert seen == [["boom"], ["kept"]] and b.stats.cancelled == 1 and b.stats.failed_rounds == 1


# -- the same output as `transduce translate` -------------------------------------------------------


@pytest.mark.parametrize("greedy", [False, True])
def test_server_output_equals_transduce_translate(model_dir, loaded, tmp_path, capsys, greedy):
    lines = sentences(SRC_WORDS, 15, seed=21) + ["", "a"]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.tsv"
    search = ["--greedy"] if greedy else ["--beam", "3", "--length-penalty", "gnmt:0.8", "--n-best", "2"]
    assert (
        main(
            [
                "translate",
                str(model_dir),
                "-i",
                str(src),
                "-o",
                str(out),
                "--max-len-offset",
                "5",
                "--quiet",
                "--precision",
                "fp32",
                *search,
            ]
        )
        == 0
    )
    capsys.readouterr()
    body = {
        "sentences": lines,
        "max_len_offset": 5,
        "scores": True,
        **({"greedy": True} if greedy else {"beam": 3, "alpha": 0.8, "n_best": 2}),
    }
    from starlette.testclient import TestClient

    with TestClient(create_app(torch_engine(loaded))) as client:
        got = client.post("/translate", json=body).json()["translations"]
    if greedy:
        assert [t["text"] for t in got] == out.read_text(encoding="utf-8").splitlines()
        assert all(t["score"] is None for t, line in zip(got, lines) if line)  # greedy: no score (NaN, null in JSON)
        return
    rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    served = [
        (str(i + 1), str(rank + 1), f"{h['score']:.6f}", f"{h['logprob']:.6f}", h["text"])
        for i, t in enumerate(got)
        for rank, h in enumerate(t["n_best"])
    ]
    assert served == [tuple(r) for r in rows]
    assert [t["text"] for t in got] == [r[4] for r in rows if r[1] == "1"]


def test_ct2_engine_serves_what_translate_engine_ct2_writes(model_dir, tmp_path):
    pytest.importorskip("ctranslate2")
    from starlette.testclient import TestClient

    from transduce.decoding.engines import load_ct2
    from transduce.export.ct2 import export_ct2
    from transduce.serve.app import ct2_engine

    loaded = load_translation_model(model_dir)  # as loaded: a model made ready for decoding is not exported
    ct2 = load_ct2(
        export_ct2(loaded.model, loaded.config, loaded.src_vocab, loaded.tgt_vocab, tmp_path / "ct2"), threads=1
    )
    lines = sentences(SRC_WORDS, 10, seed=31)
    with TestClient(create_app(ct2_engine(ct2))) as client:
        body = client.post("/translate", json={"sentences": lines, "beam": 3, "max_len_offset": 5}).json()
        info = client.get("/info").json()
    expected = translate_stream(ct2, ct2.src_vocab, ct2.tgt_vocab, lines, beam=3, max_len_offset=5)
    assert [t["text"] for t in body["translations"]] == [c[0].text for c in expected]
    assert info["engine"] == "ct2" and info["defaults"]["length_penalty"] == "paper"


# -- limits and errors ----------------------------------------------------------------------------------

LIMITS = Limits(
    max_body_bytes=600, max_sentences=3, max_chars=40, max_tokens=6, max_queue=1, max_beam=4, max_len_offset=8
)


@pytest.fixture(scope="module")
def client(loaded):
    from starlette.testclient import TestClient

    with TestClient(
        create_app(
            torch_engine(loaded, max_tokens=LIMITS.max_tokens),
            limits=LIMITS,
            defaults=SearchSettings(beam=2, max_len_offset=3),
        )
    ) as c:
        yield c


def test_no_page_loads_anything_from_the_internet(client):
    """FastAPI's /docs and /redoc pull scripts from a CDN: they are off; the OpenAPI document is served."""
    assert client.get("/docs").status_code == 404 and client.get("/redoc").status_code == 404
    assert client.get("/openapi.json").json()["paths"].keys() >= {"/translate", "/health", "/info"}


@pytest.mark.parametrize(
    "body, status, limit",
    [
        ({"sentences": ["a"] * 4}, 422, "max_sentences"),
        ({"sentences": ["a", "x" * 41]}, 422, "max_chars"),
        ({"sentences": ["a man runs on the grass with two dogs"]}, 422, "max_tokens"),
        ({"sentences": ["a"], "beam": 5}, 422, "max_beam"),
        ({"sentences": ["a"], "max_len_offset": 9}, 422, "max_len_offset"),
        ({"sentences": ["a b"] * 200}, 413, "max_body_bytes"),
    ],
)
def test_every_limit_is_a_json_error_naming_it(client, body, status, limit):
    r = client.post("/translate", json=body)
    assert r.status_code == status and r.headers["content-type"].startswith("application/json")
    error = r.json()
    assert error["error"] == "limit_exceeded" and error["limit"] == limit and error["value"] == getattr(LIMITS, limit)


def test_body_limit_holds_without_content_length(client):
    def chunks():
        for _ in range(20):
            yield b'{"sentences": ["a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a"]}'

    r = client.post("/translate", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["limit"] == "max_body_bytes"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"sentences": [',
        b"\xff\xfe\x00",
        b'{"sentences": ["\xff\xfe"]}',
        b"",
        b"[]",
        b'"a"',
        b"null",
        b'{"sentences": "a man"}',
        b'{"sentences": [1, 2]}',
        b'{"sentences": ["a"], "beam": "4"}',
        b'{"sentences": ["a"], "alpha": NaN}',
        b'{"sentences": ["a"], "alpha": 1e999}',
        b'{"sentences": ["\\ud800"]}',
        b'{"sentences": ["a"], "beam": 99999999999999999999999}',
        b'{"sentences": ["a"], "unknown": 1}',
        b'{"sentences": ["a"], "greedy": true, "n_best": 2}',
        b'{"sentences": ["a"], "beam": 2, "n_best": 3}',
    ],
)
def test_invalid_requests_are_4xx_json_never_500(client, raw):
    r = client.post("/translate", content=raw, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert r.json()["error"] in ("invalid_json", "invalid_request", "limit_exceeded") and "Traceback" not in r.text


@pytest.mark.parametrize(
    "path, body", [("/translate", b'{"sentences": ["a man runs"]}'), ("/attention", b'{"source": "a"}')]
)
@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", None])
def test_a_body_not_sent_as_json_is_415_saying_so(client, path, body, content_type):
    """curl -d without -H sends application/x-www-form-urlencoded: the answer says what to send."""
    headers = {"content-type": content_type} if content_type else {}
    r = client.post(path, content=body, headers=headers)
    assert r.status_code == 415 and r.json()["error"] == "unsupported_media_type", r.text
    message = r.json()["message"]
    assert message.startswith("the body must be JSON, sent with Content-Type: application/json")
    assert (content_type or "this request has none") in message
    assert (
        client.post(path, content=body, headers={"content-type": "application/json; charset=utf-8"}).status_code == 200
    )
    assert 415 in {int(s) for s in client.app.fastapi.openapi()["paths"][path]["post"]["responses"]}


@pytest.mark.parametrize("path", ["/", "/health", "/info", "/metrics", "/openapi.json"])
def test_get_routes_answer_head_without_a_body(client, path):
    get, head = client.get(path), client.head(path)
    assert head.status_code == get.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    assert "head" not in client.app.fastapi.openapi()["paths"].get(path, {})


def test_queue_full_is_429_with_retry_after_and_a_disconnect_leaves_the_others_alone(loaded):
    """One request decoding (held at a gate), one waiting (the queue's limit, 1): the next gets 429.
    The waiting client goes away: its job leaves the queue, never decoded; the held request and
    the next ones are answered."""
    gate, entered, seen = threading.Event(), threading.Event(), []

    def translate(lines, search):
        entered.set()
        gate.wait(10)
        seen.append(list(lines))
        return list(
            translate_stream(
                loaded.model,
                loaded.src_vocab,
                loaded.tgt_vocab,
                lines,
                beam=search.beam,
                max_len_offset=search.max_len_offset,
            )
        )

    app = create_app(Engine(translate, loaded.src_vocab.encode, {}), limits=Limits(max_queue=1), max_wait=0.0)
    batcher = app.state.batcher
    answers = {}
    body = {"beam": 2, "max_len_offset": 3}
    with live(app) as url:

        def send(name, text):
            answers[name] = post(url, {"sentences": [text], **body})

        held = threading.Thread(target=send, args=("held", "a man runs"))
        held.start()
        assert entered.wait(10)  # being decoded
        gone = _open_request(url, {"sentences": ["gone away"], **body})
        until(lambda: batcher.queued == 1)
        r = post(url, {"sentences": ["two children"]})
        assert r.status_code == 429 and r.json()["limit"] == "max_queue" and int(r.headers["retry-after"]) >= 1
        gone.close()  # the waiting client goes away
        until(lambda: batcher.stats.cancelled == 1 and batcher.queued == 0)
        waiting = threading.Thread(target=send, args=("waiting", "the dog"))
        waiting.start()
        until(lambda: batcher.queued == 1)
        gate.set()
        held.join(10)
        waiting.join(10)
        after = post(url, {"sentences": ["a woman sits"], **body})
    assert answers["held"].status_code == answers["waiting"].status_code == after.status_code == 200
    assert seen == [["a man runs"], ["the dog"], ["a woman sits"]]  # "gone away" was never decoded
    for name, text in (("held", "a man runs"), ("waiting", "the dog")):
        assert (
            answers[name].json()["translations"][0]["text"]
            == translate_lines(loaded.model, loaded.src_vocab, loaded.tgt_vocab, [text], beam=2, max_len_offset=3)[0]
        )


def _open_request(url, body) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def test_health_says_loading_until_the_model_is_loaded(loaded):
    from starlette.testclient import TestClient

    ready = threading.Event()

    def load():
        ready.wait(10)
        return torch_engine(loaded)

    with TestClient(create_app(load)) as c:
        assert c.get("/health").status_code == 503 and c.get("/health").json() == {"status": "loading"}
        r = c.post("/translate", json={"sentences": ["a"]})
        assert r.status_code == 503 and r.json()["error"] == "loading" and "retry-after" in r.headers
        assert c.get("/info").json()["loaded"] is False
        ready.set()
        deadline = time.time() + 10
        while c.get("/health").status_code != 200 and time.time() < deadline:
            time.sleep(0.02)
        assert c.get("/health").json() == {"status": "ok"}
        info = c.get("/info").json()
        assert (
            info["loaded"] and info["engine"] == "torch" and info["limits"]["max_sentences"] == Limits().max_sentences
        )
        assert info["vocab"]["src_size"] == len(loaded.src_vocab) and info["config"]["d_model"] == 32
        assert c.post("/translate", json={"sentences": ["a"], "beam": 1, "max_len_offset": 2}).status_code == 200


def test_a_model_that_cannot_load_is_reported(tmp_path):
    from starlette.testclient import TestClient

    failures = []

    def load():
        raise FileNotFoundError(f"{tmp_path}: neither a model directory nor a run directory")

    with TestClient(create_app(load, on_load_error=failures.append)) as c:
        deadline = time.time() + 5
        while not failures and time.time() < deadline:
            time.sleep(0.01)
        r = c.get("/health")
    assert r.status_code == 503 and r.json()["status"].startswith("failed: ") and len(failures) == 1


# -- the API against its own OpenAPI document ----------------------------------------------------------


def test_api_conforms_to_its_openapi_document(loaded):
    """schemathesis draws requests from the OpenAPI document (positive: valid by the schema;
    negative: invalid) and checks every response: never a 5xx, a status code and a body the
    document declares, invalid requests refused. Valid-by-the-schema requests may still be
    refused for what a schema cannot say (n_best > beam, subword tokens per sentence)."""
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings

    from schemathesis import GenerationMode

    limits = Limits(max_sentences=3, max_chars=20, max_tokens=8, max_beam=2, max_len_offset=3)
    app = create_app(
        torch_engine(loaded, max_tokens=limits.max_tokens),
        limits=limits,
        defaults=SearchSettings(beam=2, max_len_offset=2),
    )
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    doc = app.fastapi.openapi()
    request = doc["components"]["schemas"]["TranslateRequest"]["properties"]
    assert request["sentences"]["maxItems"] == 3 and request["sentences"]["items"]["maxLength"] == 20
    assert request["beam"]["maximum"] == 2 and request["max_len_offset"]["maximum"] == 3
    statuses = {}
    for result in schema.get_all_operations():
        op = result.ok()
        modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if op.method.upper() == "POST" else [])
        for mode in modes:

            @settings(
                max_examples=20, deadline=None, database=None, suppress_health_check=list(HealthCheck), derandomize=True
            )
            @given(case=op.as_strategy(generation_mode=mode))
            def check(case):
                response = case.call_and_validate(excluded_checks=[schemathesis.checks.positive_data_acceptance])
                statuses.setdefault((op.method.upper(), op.path, mode.value), set()).add(response.status_code)

            check()
    assert 200 in statuses[("POST", "/translate", "positive")]
    assert statuses[("POST", "/translate", "negative")] <= {400, 413, 422}


# -- the command ------------------------------------------------------------------------------------------


def test_transduce_serve_command(model_dir, tmp_path):
    """The command a user runs: up on the port the system chose for --port 0 (the URL it prints
    says which), healthy, translating; SIGTERM ends it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "transduce",
            "serve",
            str(model_dir),
            "--port",
            "0",
            "--log-level",
            "warning",
            "--precision",
            "fp32",
            "--threads",
            "1",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert select.select([proc.stdout], [], [], 60)[0], "no line from transduce serve in 60 s"
        first = proc.stdout.readline()
        assert first.startswith("transduce serve: http://127.0.0.1:") and ":0 " not in first, first
        url = first.split()[2]
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        r = post(url, {"sentences": ["a man runs", ""], "beam": 2, "max_len_offset": 3})
        assert r.status_code == 200 and r.json()["translations"][1]["text"] == ""
        assert httpx.get(url + "/openapi.json").json()["paths"].keys() >= {"/translate", "/health", "/info"}
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert proc.returncode in (0, -signal.SIGTERM), err  # uvicorn shuts down, then re-raises the signal
    assert "loaded" in out


AVX2_ONLY = {
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
    "CT2_FORCE_CPU_ISA": "AVX2",
}
"""The environment that imitates an AVX2-only CPU (no AVX-512, bf16, VNNI or AMX) on a newer one."""


def test_transduce_serve_warns_of_bf16_emulated_on_an_avx2_only_cpu(model_dir):
    """--precision bf16 where the CPU only emulates it (held to AVX2 here) is obeyed, with the
    warning `translate` and `evaluate` give (a product of the model's size N x slower), not silently."""
    proc, _ = start_serve(
        [str(model_dir), "--precision", "bf16", "--threads", "1", "--log-level", "warning"], env=AVX2_ONLY
    )
    proc.terminate()
    out, err = proc.communicate(timeout=30)
    assert "transduce serve: precision: bf16 (as asked;" in out, out
    warnings = [line for line in err.splitlines() if line.startswith("transduce serve: warning: bf16 is emulated")]
    assert len(warnings) == 1 and "slower than fp32; --precision auto would use fp32" in warnings[0], err


@pytest.mark.parametrize("port", ["99999", "-1", "65536"])
def test_transduce_serve_refuses_a_port_out_of_range_before_loading(model_dir, capsys, port):
    assert main(["serve", str(model_dir), "--port", port, "--log-level", "warning"]) == 2
    out, err = capsys.readouterr()
    assert (
        err
        == f"transduce serve: error: --port must be between 0 and 65535 (0: a free port the system chooses), not {port}\n"
    )
    assert out == ""  # no URL announced, no model loaded


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--threads", "-1"], "--threads must be at least 1, not -1"),
        (["--length-penalty", "gnmt:nan"], "--length-penalty gnmt:nan: alpha must be a finite number >= 0"),
        (["--length-penalty", "gnmt:-1"], "--length-penalty gnmt:-1: alpha must be a finite number >= 0"),
        (
            ["--cors-origin", "https://example.org/app"],
            "--cors-origin https://example.org/app: a site is http(s)://HOST[:PORT], without a path (or *: any)",
        ),
    ],
)
def test_transduce_serve_refuses_bad_threads_and_alpha_before_loading(model_dir, capsys, flags, message):
    assert main(["serve", str(model_dir), "--port", "0", "--log-level", "warning", *flags]) == 2
    out, err = capsys.readouterr()
    assert err == f"transduce serve: error: {message}\n" and out == ""


@pytest.mark.parametrize("flag", ["--graceful-timeout", "--max-wait-ms"])
@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e300"])
def test_transduce_serve_refuses_a_wait_that_cannot_end_before_loading(model_dir, capsys, flag, value):
    """An infinite grace period was taken, and failed at shutdown with a traceback (a thread's join
    cannot wait that long); an infinite or NaN --max-wait-ms held every request, or ended the
    decoding thread."""
    assert main(["serve", str(model_dir), "--port", "0", "--log-level", "warning", flag, value]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"transduce serve: error: {flag} must be a finite number >= 0 (at most ")
    assert err.endswith(f", not {float(value)}\n") and err.count("\n") == 1 and out == ""


def test_transduce_serve_on_a_port_in_use_is_one_line_without_an_abort(model_dir):
    """Bound before the server and the model's loading thread start: one line and status 2, not
    uvicorn's traceback and an abort (std::terminate from torch busy on the loading thread)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "transduce", "serve", str(model_dir), "--port", str(port), "--threads", "1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"transduce serve: error: cannot listen on 127.0.0.1:{port}: address already in use\n"
    assert proc.stdout == ""


def test_transduce_serve_stops_in_one_line_when_the_model_cannot_load(tmp_path, capsys):
    broken = tmp_path / "broken"  # a model directory by its files, which cannot be loaded
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["serve", str(broken), "--port", str(port), "--log-level", "warning"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("transduce serve: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert main(["serve", str(broken), "--max-beam", "2", "--beam", "4"]) == 2
    assert "--beam must be between 1 and --max-beam (2)" in capsys.readouterr().err


def test_transduce_serve_refuses_a_directory_that_is_not_a_model_before_listening(tmp_path, capsys):
    """It listened, announced its URL, started uvicorn and its loading thread, and only then said so."""
    (tmp_path / "notes.txt").write_text("not a model")
    assert main(["serve", str(tmp_path), "--port", "0", "--log-level", "warning"]) == 2
    out, err = capsys.readouterr()
    assert err == (
        f"transduce serve: error: {tmp_path}: neither a model directory (model.safetensors + config.json) "
        "nor a run directory with a model/ or checkpoints/\n"
    )
    assert out == ""  # no URL announced, nothing loaded


def test_a_serve_engine_loads_no_python_decompositions(model_dir):
    # initialising a model built on the meta device runs PyTorch's Python decompositions, which
    # import sympy (about 70 MB); the engine's parameter count builds it as the loader does, uninitialised
    code = (
        "import sys; from transduce.decoding.ready import load_for_decoding; from transduce.serve.app import torch_engine; "
        f"e = torch_engine(load_for_decoding({str(model_dir)!r}, precision='fp32', threads=1)); "
        "print(e.info['parameters'], sorted(m for m in sys.modules if m.startswith(('sympy', 'mpmath')))[:3])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    count, modules = out.split(" ", 1)
    assert int(count) == sum(p.numel() for p in load_translation_model(model_dir).model.parameters())
    assert modules.strip() == "[]"
