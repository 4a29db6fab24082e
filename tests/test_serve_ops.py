"""`transduce serve` as something to run and watch: a decoding failure (injected) answers that
round's callers 500 JSON naming it and the server goes on; the decoding thread's own end fails
its callers instead of leaving them waiting; /metrics in Prometheus's format, counted against what
was sent and decoded; the API key; one log line per request with its id. And shutting down as an
orchestrator does it, through the command a user runs: SIGTERM with a request in flight (it gets
its 200, then the process ends), and with a decode stuck past --graceful-timeout (its callers get
503 JSON and the process ends within a bounded time)."""

import json
import logging
import signal
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from serving import live, start_serve, until  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402
from tiny_models import SRC_WORDS, make_model, sentences  # noqa: E402

from transduce.model import Transformer  # noqa: E402
from transduce.serve.app import Engine, Limits, create_app, torch_engine  # noqa: E402
from transduce.serve.batcher import Batcher  # noqa: E402
from transduce.decoding.ready import load_translation_model  # noqa: E402
from transduce.decoding.translate import translate_lines, translate_stream  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("serve-ops"))


@pytest.fixture(scope="module")
def loaded(model_dir):
    return load_translation_model(model_dir)


class FailingTransformer(Transformer):
    """The model, failing in `encode` while `fail` is set: a fault inside the decoding thread."""

    fail = False

    def encode(self, src, src_mask=None):
        if self.fail:
            raise RuntimeError("injected failure in encode")
        return super().encode(src, src_mask)


@pytest.fixture
def failing(model_dir):
    loaded = load_translation_model(model_dir)
    model = FailingTransformer(loaded.config.model)
    model.load_state_dict(loaded.model.state_dict())
    loaded.model = model.eval()
    return loaded


def post(url, body, **kw):
    return httpx.post(url + "/translate", json=body, timeout=30, **kw)


def metrics(text: str) -> dict:
    """{(name, labels as sorted tuple): value} of a Prometheus exposition."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


# -- failures ------------------------------------------------------------------------------------------


def test_a_decoding_failure_answers_its_round_500_json_and_the_server_goes_on(failing, loaded):
    app = create_app(torch_engine(failing), max_wait=0.3)
    body = {"sentences": ["a man runs", "two dogs"], "beam": 2, "max_len_offset": 3}
    answers = {}
    with live(app) as url:
        failing.model.fail = True
        go = threading.Barrier(2)

        def client(name):
            go.wait()
            answers[name] = post(url, body)

        threads = [threading.Thread(target=client, args=(n,)) for n in ("first", "second")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        failing.model.fail = False
        after = post(url, body)
        exposition = httpx.get(url + "/metrics").text
    for r in answers.values():  # both callers of the failed round: 500, JSON, the failure named
        assert r.status_code == 500 and r.headers["content-type"].startswith("application/json")
        assert r.json() == {
            "error": "decoding_failed",
            "exception": "RuntimeError",
            "message": "decoding failed: RuntimeError: injected failure in encode",
        }
    assert app.state.batcher.stats.failed_rounds == 1  # decoded together: one round failed
    assert after.status_code == 200  # the server goes on
    assert [t["text"] for t in after.json()["translations"]] == translate_lines(
        loaded.model, loaded.src_vocab, loaded.tgt_vocab, body["sentences"], beam=2, max_len_offset=3
    )
    m = metrics(exposition)
    assert m[("transduce_decode_failures_total", ())] == 1
    assert m[("transduce_requests_total", (("endpoint", "/translate"), ("status", "500")))] == 2


def test_the_decoding_threads_end_fails_its_callers_and_refuses_new_work():
    """Not a failure of `translate`: the thread itself ends (here a KeyboardInterrupt outside the
    round). The round's job and the queued one fail at once; new work is refused, saying why."""
    gate = threading.Event()

    def translate(sentences, settings):
        gate.wait(5)
        return sentences

    b = Batcher(translate, max_wait=0.0).start()
    real = b._round

    def round_then_die(jobs):
        real(jobs)
        raise KeyboardInterrupt("injected")

    b._round = round_then_die
    first = b.submit(["a"], "s", 1)
    until(lambda: b.queued == 0)
    queued = b.submit(["b"], "s", 1)
    gate.set()
    assert first.future.result(5) == ["a"]
    with pytest.raises(RuntimeError, match="the decoding thread ended"):
        queued.future.result(5)
    with pytest.raises(RuntimeError, match=r"the decoding thread has ended \(KeyboardInterrupt: injected\)"):
        b.submit(["c"], "s", 1)


def test_a_request_to_a_server_whose_decoding_thread_ended_gets_500_json(loaded):
    with TestClient(create_app(torch_engine(loaded))) as c:
        c.app.state.batcher._ended = "MemoryError: "  # as `Batcher._run` records it
        r = c.post("/translate", json={"sentences": ["a man"]})
        a = c.post("/attention", json={"source": "a man"})
    for x in (r, a):
        assert x.status_code == 500 and x.json() == {
            "error": "decoding_failed",
            "message": "the decoding thread has ended (MemoryError: )",
        }


def test_a_keyboard_interrupt_inside_translate_fails_its_round_as_an_ordinary_error():
    def translate(sentences, settings):
        if sentences == ["stop"]:
            raise KeyboardInterrupt
        return sentences

    b = Batcher(translate, max_wait=0.0).start()
    with pytest.raises(RuntimeError, match="KeyboardInterrupt in the decoding thread"):
        b.submit(["stop"], "s", 1).future.result(5)
    assert b.submit(["go"], "s", 1).future.result(5) == ["go"]
    b.stop()


# -- metrics --------------------------------------------------------------------------------------------


def test_metrics_count_what_was_sent_and_decoded(loaded):
    requests = [sentences(SRC_WORDS, n, seed=40 + n) for n in (1, 3, 2)]
    app = create_app(torch_engine(loaded), max_wait=0.0)
    with TestClient(app) as c:
        for r in requests:
            assert c.post("/translate", json={"sentences": r, "beam": 2, "max_len_offset": 4}).status_code == 200
        assert c.post("/translate", json={"sentences": ["a"], "beam": 99}).status_code == 422
        assert c.get("/health").status_code == 200
        r = c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    m = metrics(r.text)
    endpoint = (("endpoint", "/translate"),)
    assert m[("transduce_requests_total", endpoint + (("status", "200"),))] == 3
    assert m[("transduce_requests_total", endpoint + (("status", "422"),))] == 1
    assert m[("transduce_requests_total", (("endpoint", "/health"), ("status", "200")))] == 1
    assert m[("transduce_request_duration_seconds_count", endpoint)] == 4
    assert m[("transduce_request_duration_seconds_bucket", endpoint + (("le", "+Inf"),))] == 4
    assert m[("transduce_batch_sentences_count", ())] == 3 and m[("transduce_batch_sentences_sum", ())] == 6
    assert m[("transduce_batch_requests_count", ())] == 3 and m[("transduce_batch_requests_sum", ())] == 3
    lines = [s for r in requests for s in r]
    assert m[("transduce_source_tokens_total", ())] == sum(len(loaded.src_vocab.encode(s)) + 1 for s in lines)
    best = [
        c[0]
        for c in translate_stream(loaded.model, loaded.src_vocab, loaded.tgt_vocab, lines, beam=2, max_len_offset=4)
    ]
    assert m[("transduce_output_tokens_total", ())] == sum(len(h.tokens) + 1 for h in best)
    assert m[("transduce_output_tokens_per_second", ())] > 0 and m[("transduce_decode_seconds_total", ())] > 0
    assert m[("transduce_queue_depth", ())] == 0 and m[("transduce_requests_in_flight", ())] == 1  # this one


def test_metrics_show_the_queue_while_requests_wait(loaded):
    gate, entered = threading.Event(), threading.Event()

    def translate(lines, search):
        entered.set()
        gate.wait(10)
        return list(translate_stream(loaded.model, loaded.src_vocab, loaded.tgt_vocab, lines, beam=1, max_len_offset=2))

    app = create_app(Engine(translate, loaded.src_vocab.encode, {}), max_wait=0.0)
    with live(app) as url:
        held = [
            threading.Thread(target=post, args=(url, {"sentences": [s], "beam": b})) for s, b in (("a", 1), ("b", 2))
        ]
        held[0].start()
        assert entered.wait(10)
        held[1].start()  # other settings: it waits for the next round
        until(lambda: app.state.batcher.queued == 1)
        m = metrics(httpx.get(url + "/metrics").text)
        gate.set()
        for t in held:
            t.join(10)
    assert m[("transduce_queue_depth", ())] == 1 and m[("transduce_requests_in_flight", ())] == 3


# -- the API key and the request log ------------------------------------------------------------------


def test_an_api_key_guards_translate_and_attention_only(loaded):
    app = create_app(torch_engine(loaded), api_key="s3cret-key")
    body = {"sentences": ["a man"], "beam": 1, "max_len_offset": 2}
    with TestClient(app) as c:
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"X-API-Key": "s3cret"},
            {"Authorization": "s3cret-key"},
        ):
            for path, b in (("/translate", body), ("/attention", {"source": "a man"})):
                r = c.post(path, json=b, headers=headers)
                assert r.status_code == 401 and r.json()["error"] == "unauthorized", (path, headers)
                assert r.headers["www-authenticate"] == "Bearer" and "API key" in r.json()["message"]
        assert c.post("/translate", json=body, headers={"Authorization": "Bearer s3cret-key"}).status_code == 200
        assert c.post("/translate", json=body, headers={"X-API-Key": "s3cret-key"}).status_code == 200
        assert c.post("/attention", json={"source": "a man"}, headers={"X-API-Key": "s3cret-key"}).status_code == 200
        for path in ("/", "/health", "/info", "/metrics", "/openapi.json"):
            assert c.get(path).status_code == 200, path
        assert c.get("/info").json()["api_key_required"] is True
        doc = c.get("/openapi.json").json()
    assert {"HTTPBearer", "APIKeyHeader"} <= doc["components"]["securitySchemes"].keys()
    for path in ("/translate", "/attention"):
        assert "401" in doc["paths"][path]["post"]["responses"] and doc["paths"][path]["post"]["security"]
    with TestClient(create_app(torch_engine(loaded))) as c:  # none set: none asked for
        assert c.post("/translate", json=body).status_code == 200 and c.get("/info").json()["api_key_required"] is False
        assert "securitySchemes" not in c.get("/openapi.json").json().get("components", {})


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def request_lines():
    handler = Lines()
    logger = logging.getLogger("transduce.serve.requests")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    yield handler.lines
    logger.removeHandler(handler)
    logger.setLevel(old)


def test_one_log_line_per_request_with_its_id(loaded, request_lines):
    with TestClient(create_app(torch_engine(loaded), limits=Limits(max_body_bytes=200))) as c:
        given = c.post(
            "/translate", json={"sentences": ["a man", "the dog"], "beam": 1}, headers={"X-Request-ID": "abc-123.x"}
        )
        made = c.get("/health")
        bad_id = c.get("/health", headers={"X-Request-ID": "no spaces\tor tabs"})
        too_big = c.post("/translate", json={"sentences": ["a " * 200]}, headers={"X-Request-ID": "big"})
    assert given.headers["x-request-id"] == "abc-123.x" and too_big.headers["x-request-id"] == "big"
    for r in (made, bad_id):
        assert len(r.headers["x-request-id"]) == 32 and int(r.headers["x-request-id"], 16) >= 0  # a new one
    assert len(request_lines) == 4  # one per request
    assert request_lines[0].startswith("id=abc-123.x POST /translate 200 ") and "sentences=2" in request_lines[0]
    assert request_lines[1].startswith(f"id={made.headers['x-request-id']} GET /health 200 ")
    assert request_lines[3].startswith("id=big POST /translate 413 ")  # refused before the app: still one line


def test_a_failed_request_s_log_line_names_the_failure(failing, request_lines):
    failing.model.fail = True
    with TestClient(create_app(torch_engine(failing))) as c:
        r = c.post("/translate", json={"sentences": ["a man"]}, headers={"X-Request-ID": "boom-1"})
    assert r.status_code == 500 and r.headers["x-request-id"] == "boom-1"
    assert len(request_lines) == 1 and request_lines[0].startswith("id=boom-1 POST /translate 500 ")
    assert request_lines[0].endswith("decoding failed: RuntimeError: injected failure in encode")


# -- shutting down, through the command --------------------------------------------------------------

SLOW_MODEL = """
import threading, time
import transduce.serve.app as app

real = app.torch_engine

def slowed(*args, **kwargs):  # the model as loaded, its decoding held: {how}
    engine = real(*args, **kwargs)
    translate = engine.translate

    def slow(sentences, search):
        {hold}
        return translate(sentences, search)

    engine.translate = slow
    return engine

app.torch_engine = slowed
"""


def serve_slowly(model_dir, hold: str, how: str, *flags: str, first: str = ""):
    prelude = first + "\n" + SLOW_MODEL.format(hold=hold, how=how)
    return start_serve([str(model_dir), "--precision", "fp32", "--threads", "1", *flags], prelude=prelude)


SIGINT_AS = {
    "handled": "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)",
    # what a server started in the background by a script inherits (`transduce serve ... &`): uvicorn
    # catches SIGINT all the same, and the KeyboardInterrupt it raises again at the end never comes
    "ignored": "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)",
}


def decoding(url) -> bool:
    """A request is on the decoding thread: nothing queued, two in flight (it and this one)."""
    m = metrics(httpx.get(url + "/metrics").text)
    return m[("transduce_queue_depth", ())] == 0 and m[("transduce_requests_in_flight", ())] >= 2


def test_sigterm_lets_the_request_in_flight_finish_then_ends(model_dir, loaded):
    proc, url = serve_slowly(model_dir, "time.sleep(3.0)", "3 s per round", "--graceful-timeout", "30")
    body = {"sentences": sentences(SRC_WORDS, 64, seed=9), "beam": 16, "max_len_offset": 3, "n_best": 2}
    answer = {}
    try:
        client = threading.Thread(target=lambda: answer.update(r=post(url, body), at=time.monotonic()))
        client.start()
        until(lambda: decoding(url))
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        until(lambda: _refused(url), timeout=5)  # it stops accepting at once
        client.join(30)
        out, err = proc.communicate(timeout=30)
        ended = time.monotonic()
    finally:
        proc.kill()
    r = answer["r"]
    assert r.status_code == 200  # finished within the grace period
    assert [t["text"] for t in r.json()["translations"]] == translate_lines(
        loaded.model, loaded.src_vocab, loaded.tgt_vocab, body["sentences"], beam=16, max_len_offset=3
    )
    assert answer["at"] > signalled  # answered after the signal
    assert proc.returncode == -signal.SIGTERM, err  # ended by the signal, as a process should
    assert ended - answer["at"] < 5, err
    assert "shutting down: finishing the requests in flight" in err and "is over" not in err


def _refused(url) -> bool:
    try:
        httpx.get(url + "/health", timeout=1)
    except httpx.TransportError:
        return True
    return False


def test_a_stuck_decode_cannot_hold_a_shutdown_past_the_grace_period(model_dir):
    proc, url = serve_slowly(
        model_dir, "threading.Event().wait()", "forever", "--graceful-timeout", "1", "--max-wait-ms", "0"
    )
    answers = {}
    try:
        stuck = threading.Thread(target=lambda: answers.update(stuck=post(url, {"sentences": ["a man"], "beam": 1})))
        stuck.start()
        until(lambda: decoding(url))
        waiting = threading.Thread(
            target=lambda: answers.update(waiting=post(url, {"sentences": ["a dog"], "beam": 2}))
        )
        waiting.start()
        until(lambda: metrics(httpx.get(url + "/metrics").text)[("transduce_queue_depth", ())] == 1)
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        stuck.join(20)
        waiting.join(20)
        answered = time.monotonic() - signalled
        out, err = proc.communicate(timeout=20)
        ended = time.monotonic() - signalled
    finally:
        proc.kill()
    for name in ("stuck", "waiting"):  # the one decoding and the one queued behind it
        r = answers[name]
        assert r.status_code == 503 and r.json()["error"] == "shutting_down", r.text
        assert "grace period (1 s) is over" in r.json()["message"]
    assert answered < 1 + 2.5, answered  # the grace, and a little
    assert proc.returncode == -signal.SIGTERM and ended < 1 + 5, (ended, err)
    assert "the grace period (1 s) is over" in err


BUSY_IN_TORCH = "a = __import__('torch').ones(300, 300); [a @ a for _ in iter(int, 1)]"
"""A decode that never ends, busy inside torch: what made an interpreter's exit abort (std::terminate)."""


def _one_busy_request(url, answers):
    client = threading.Thread(target=lambda: answers.update(r=post(url, {"sentences": ["a man"], "beam": 1})))
    client.start()
    until(lambda: decoding(url))
    return client


@pytest.mark.parametrize("sigint", SIGINT_AS)
def test_ctrl_c_with_a_decode_busy_past_the_grace_period_ends_130_without_an_abort(model_dir, sigint):
    """Ctrl-C as SIGTERM: the grace period, then 503; the process then ended by an abort (SIGABRT,
    "terminate called without an active exception"), torch busy on the decoding thread."""
    proc, url = serve_slowly(
        model_dir,
        BUSY_IN_TORCH,
        "forever, in torch",
        "--graceful-timeout",
        "1",
        "--max-wait-ms",
        "0",
        first=SIGINT_AS[sigint],
    )
    answers = {}
    try:
        client = _one_busy_request(url, answers)
        proc.send_signal(signal.SIGINT)
        client.join(20)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    r = answers["r"]
    assert r.status_code == 503 and "grace period (1 s) is over" in r.json()["message"], r.text
    assert proc.returncode == 130, err
    assert err.endswith("interrupted\n") and "terminate called" not in err and "Traceback" not in err, err


@pytest.mark.parametrize("sigint", SIGINT_AS)
def test_ctrl_c_twice_answers_the_requests_in_flight_503_at_once(model_dir, sigint):
    """uvicorn's force quit (Ctrl-C again) cancelled the requests in flight: a bare 500 "Internal
    Server Error" each, a traceback each, and an abort. Now they get 503 JSON at once."""
    proc, url = serve_slowly(
        model_dir,
        BUSY_IN_TORCH,
        "forever, in torch",
        "--graceful-timeout",
        "30",
        "--max-wait-ms",
        "0",
        first=SIGINT_AS[sigint],
    )
    answers = {}
    try:
        client = _one_busy_request(url, answers)
        proc.send_signal(signal.SIGINT)
        until(lambda: _refused(url), timeout=5)  # the shutdown began
        proc.send_signal(signal.SIGINT)
        again = time.monotonic()
        client.join(20)
        out, err = proc.communicate(timeout=20)
        ended = time.monotonic() - again
    finally:
        proc.kill()
    r = answers["r"]
    assert r.status_code == 503 and r.json()["error"] == "shutting_down", r.text
    assert "was told to stop at once" in r.json()["message"]
    assert proc.returncode == 130 and ended < 5, (ended, err)
    assert "the grace period (30 s) was cut short (Ctrl-C again)" in err
    assert err.endswith("interrupted\n") and "terminate called" not in err and "Traceback" not in err, err


def test_the_command_takes_its_api_key_from_the_environment(model_dir):
    proc, url = start_serve(
        [str(model_dir), "--precision", "fp32", "--threads", "1", "--log-level", "info"],
        env={"TRANSDUCE_API_KEY": "from-env"},
    )
    try:
        body = {"sentences": ["a man"], "beam": 1}
        denied = post(url, body)
        allowed = post(url, body, headers={"Authorization": "Bearer from-env", "X-Request-ID": "env-1"})
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert denied.status_code == 401 and allowed.status_code == 200
    assert "an API key is required" in out and "from-env" not in out + err  # never printed
    assert [line for line in err.splitlines() if "id=env-1 " in line and "POST /translate 200" in line]
    assert json.loads(denied.text)["error"] == "unauthorized"


def test_the_command_names_the_extra_when_the_metrics_library_is_missing(model_dir, monkeypatch, capsys):
    import sys

    from transduce.cli import main

    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    assert main(["serve", str(model_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "prometheus_client" in err and "pip install 'transduce[serve]'" in err, err
