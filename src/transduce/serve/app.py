"""The HTTP API: FastAPI on uvicorn, one model, one decoding thread (`serve.batcher`).

    POST /translate   {"sentences": [...], "beam": 4, "alpha": 0.6, "max_len_offset": 50,
                       "n_best": 1, "greedy": false, "scores": false}
                      -> {"translations": [{"text": ..., "score": ..., "logprob": ...,
                                            "n_best": [{"text", "score", "logprob"}, ...]}]}
                      (a parsing model: each with its "tree", as `transduce parse` prints it)
    POST /attention   {"source": ..., "target": ... or null, search settings, "weights": true,
                       "page": false} -> the attention weights of that sentence and translation
                      (`transduce attention`'s JSON), the page that draws them, the tree's SVG
    GET  /            the demo page (serve.demo): translate, the n-best, the attention, the tree
    GET  /health      200 {"status": "ok"} once the model is loaded, 503 before and while shutting down
    GET  /info        the model, its vocabulary, the engine, the search defaults and every limit
    GET  /metrics     Prometheus's text format (serve.ops)
    GET  /openapi.json   generated from the request and response schemas

The GET routes answer HEAD too (their status and headers, no body), as monitors and `curl -I` ask.

Translations equal `transduce translate`'s for the same sentences and settings: the same
`translate_stream` (or CTranslate2 engine) decodes them, with the same token budget.

Every error is JSON, {"error": CODE, "message": ..., and for a limit "limit": NAME, "value": N}:

    400 invalid_json        the body is not JSON (or not UTF-8)
    401 unauthorized        an API key is set and the request does not carry it
    413 limit_exceeded      max_body_bytes (checked before the body is parsed)
    415 unsupported_media_type  the body is not sent as JSON: no `Content-Type: application/json`
                            (curl -d without -H sends application/x-www-form-urlencoded)
    422 limit_exceeded      max_sentences, max_chars, max_tokens, max_beam, max_len_offset
    422 invalid_request     anything else the schema refuses (a missing field, a wrong type, ...)
    429 queue_full          max_queue requests are waiting; Retry-After says when to try again
    500 decoding_failed     decoding failed (the exception is named); the server goes on serving
    501 not_supported       attention weights from an engine that has none (CTranslate2)
    503 loading             the model is not loaded yet; Retry-After
    503 shutting_down       SIGTERM came: new work is refused, and work still unfinished when the
                            grace period (--graceful-timeout) ends is answered so

A client that disconnects before its answer has its job dropped from the queue (or its results
discarded): the other requests and the decoding thread go on. Shutting down (SIGTERM, Ctrl-C):
the server stops accepting connections, finishes the requests it has for at most the grace
period, answers the rest 503 and ends; a decode stuck past it is left to its daemon thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from dataclasses import asdict
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, create_model

from ..translate import DEFAULT_BATCH_TOKENS
from .batcher import Batcher, ShuttingDown
from .common import (LIMIT_OF_FIELD, Limits, check_sentences, enqueue, error, number, search_fields,
                     unavailable, wait_for_job)
from .engines import Engine, Search, ct2_engine, scrub, torch_engine  # noqa: F401 - the API's names, as before
from ..memory import Trimmer, memory_info

log = logging.getLogger("transduce.serve")

DEFAULT_GRACEFUL_TIMEOUT = 30.0
"""Seconds a shutdown waits for the requests in flight (Kubernetes' default grace is 30 s too)."""


# -- schemas -------------------------------------------------------------------------------------


class Hypothesis(BaseModel):
    text: str
    score: float | None = Field(None, description="log P(Y|X) / ((5+|Y|)/6)^alpha; null for greedy")
    logprob: float | None = Field(None, description="log P(Y|X), EOS included; null for greedy")
    tree: str | None = Field(None, description="a parsing model: the tree of this output over the sentence's Penn "
                                               "Treebank tokens, repaired as `transduce parse` does")


class Translation(BaseModel):
    text: str = Field(description="the best translation")
    score: float | None = Field(None, description="its score, if `scores` was asked for (null for greedy)")
    logprob: float | None = Field(None, description="its log-probability, if `scores` was asked for")
    tree: str | None = Field(None, description="a parsing model: its tree, bracketed on one line (`transduce parse`)")
    n_best: list[Hypothesis] | None = Field(None, description="the n_best best hypotheses, best first, if n_best > 1")


class TranslateResponse(BaseModel):
    translations: list[Translation] = Field(description="one per sentence, in the order given")


class ErrorResponse(BaseModel):
    error: str = Field(description="invalid_json, unauthorized, unsupported_media_type, invalid_request, "
                                   "limit_exceeded, queue_full, decoding_failed, not_supported, loading or shutting_down")
    message: str
    limit: str | None = Field(None, description="the limit exceeded (see /info)")
    value: int | None = Field(None, description="the limit's value")
    field: str | None = Field(None, description="where in the request")
    exception: str | None = Field(None, description="decoding_failed: the exception's type")


class Health(BaseModel):
    status: str = Field(description="ok; or, with status 503, loading, shutting down or failed: WHY")


def request_schema(limits: Limits, defaults: Search) -> type[BaseModel]:
    """The request's schema, the limits in it (so the OpenAPI document states them)."""
    from typing import Annotated

    from pydantic import StringConstraints

    Sentence = Annotated[str, StringConstraints(max_length=limits.max_chars)]
    return create_model(
        "TranslateRequest", __config__=ConfigDict(extra="forbid", strict=True),  # strict: "4" is not a beam size
        sentences=(list[Sentence], Field(max_length=limits.max_sentences,
                                         description="sentences to translate, one translation each (empty -> empty)")),
        **search_fields(limits, defaults),
        n_best=(int, Field(1, ge=1, le=limits.max_beam, description="hypotheses per sentence (at most beam)")),
        scores=(bool, Field(False, description="return scores and log-probabilities")),
    )


_TOO_BIG = {"too_long", "string_too_long", "less_than_equal"}


class _BodyLimit:
    """ASGI middleware: read a request's body (at most `max_bytes`, else 413 before anything is
    parsed), then hand it on; later receive() calls pass through (disconnects are seen)."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._too_big(send)
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                return await self._too_big(send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_big(self, send):
        content = json.dumps({"error": "limit_exceeded", "message": f"the body is larger than {self.max_bytes} bytes",
                              "limit": "max_body_bytes", "value": self.max_bytes}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": content})



def _is_json(content_type: str | None) -> bool:
    """Whether a Content-Type says JSON, as FastAPI decides it (application/json, application/*+json)."""
    media = (content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _add_error_handlers(app, limits: Limits) -> None:
    """Every error as JSON: a body not sent as JSON is 415, a field over a limit names the limit
    (422), bad JSON is 400, others as they come."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        content_type = request.headers.get("content-type")
        if not _is_json(content_type):  # FastAPI reads no body that is not declared JSON
            given = f"this request's is {content_type}" if content_type else "this request has none"
            return error(415, "unsupported_media_type",
                         f"the body must be JSON, sent with Content-Type: application/json ({given})")
        errors = exc.errors()
        for e in errors:
            loc = [str(x) for x in e.get("loc", ()) if x != "body"]
            if e.get("type") == "json_invalid":
                return error(400, "invalid_json", f"the body is not valid JSON: {e.get('ctx', {}).get('error', e.get('msg'))}")
            if e.get("type") in _TOO_BIG and loc:
                name = "max_chars" if e.get("type") == "string_too_long" else LIMIT_OF_FIELD.get(loc[0])
                if name is not None:
                    return error(422, "limit_exceeded", f"{'.'.join(loc)}: {e.get('msg')}", limit=name,
                                  value=getattr(limits, name), field=".".join(loc))
        first = errors[0] if errors else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        return error(422, "invalid_request", f"{where or 'body'}: {first.get('msg', 'invalid request')}", field=where or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        code = {400: "invalid_json", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        message = "the body is not valid JSON in UTF-8" if exc.status_code == 400 else str(exc.detail)
        return error(exc.status_code, code, message, headers=getattr(exc, "headers", None))


def _response(req, results, sources: list[str], tree=None) -> dict:
    """The JSON answer: per sentence its best text, with scores and the n-best when asked (and a
    parsing model's trees)."""
    out = []
    for source, cands in zip(sources, results):
        best = cands[0]
        t = {"text": best.text}
        if req.scores:
            t["score"], t["logprob"] = number(best.score), number(best.logprob)
        if tree is not None:
            t["tree"] = _tree_text(tree(source, best.text))
        if req.n_best > 1:
            t["n_best"] = [{"text": c.text, "score": number(c.score), "logprob": number(c.logprob),
                            **({"tree": _tree_text(tree(source, c.text))} if tree is not None else {})} for c in cands]
        out.append(t)
    return {"translations": out}


def _tree_text(tree) -> str:
    return "" if tree is None else str(tree)


def _add_status_routes(app, state: dict, defaults: Search, limits: Limits, max_batch_tokens: int, max_wait: float,
                       metrics, api_key: bool) -> None:
    """GET /health (is the model loaded?), GET /info (the model, the defaults, the limits, the
    queue) and GET /metrics (Prometheus)."""
    from fastapi import Response
    from fastapi.responses import JSONResponse

    @app.get("/health", response_model=Health, responses={503: {"model": Health}}, summary="is the model loaded?")
    async def health():
        if state["draining"]:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        if state["engine"] is not None:
            return {"status": "ok"}
        status = "failed: " + scrub(state["error"]) if state["error"] else "loading"
        return JSONResponse({"status": status}, status_code=503)

    @app.get("/info", summary="the model, the engine, the search defaults and the limits")
    async def info() -> dict:
        e, b = state["engine"], state["batcher"]
        return {"loaded": e is not None, **(e.info if e is not None else {}), "defaults": asdict(defaults),
                "limits": asdict(limits), "batching": {"max_batch_tokens": max_batch_tokens, "max_wait_ms": max_wait * 1000},
                "api_key_required": api_key, "queue": b.queued if b is not None else 0, "memory": memory_info(),
                "stats": {k: v for k, v in asdict(b.stats).items() if k != "round_sizes"} if b is not None else {}}

    @app.get("/metrics", response_class=Response, summary="metrics in Prometheus's text format",
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def prometheus():
        content, media_type = metrics.exposition()
        return Response(content, media_type=media_type)


def create_app(engine: Engine | Callable[[], Engine], *, limits: Limits | None = None, defaults: Search | None = None,
               max_batch_tokens: int = DEFAULT_BATCH_TOKENS, max_wait: float = 0.01, poll_disconnect: float = 0.05,
               on_load_error: Callable[[BaseException], None] | None = None, api_key: str | None = None):
    """The ASGI app (the FastAPI app inside the request log and the body-size limit; `.fastapi` is
    the FastAPI app, `.state["batcher"]` the batcher, `.metrics` its metrics, `.begin_drain(grace)`
    what a shutdown calls, `.end_grace(forced=True)` what cuts its grace short). `engine`: an Engine, or a function that loads one (called on a thread at
    startup; /health says `loading` until it returns; if it fails, /health says so and
    `on_load_error(exception)` is called; `.state["loader"]` is that thread, which a process joins
    before it exits). `api_key`: required on /translate and /attention."""
    from fastapi import FastAPI, Request

    from .demo import add_demo_routes
    from .ops import Metrics, RequestLog, api_key_dependency

    limits = limits or Limits()
    defaults = defaults or Search()
    TranslateRequest = request_schema(limits, defaults)
    state: dict[str, Any] = {"engine": None, "batcher": None, "error": None, "draining": False, "expired": False,
                             "forced": False, "grace": None, "deadline": None, "loader": None}
    metrics = Metrics(lambda: state["batcher"].queued if state["batcher"] is not None else 0)

    def install(e: Engine) -> None:
        batcher = Batcher(lambda sentences, s: e.translate(sentences, s), max_batch_tokens=max_batch_tokens,
                          max_wait=max_wait, max_queue=limits.max_queue, on_round=metrics.round,
                          after_round=Trimmer()).start()
        state["batcher"], state["engine"] = batcher, e

    def load() -> None:
        try:
            install(engine())
        except BaseException as e:  # noqa: BLE001 - reported by /health and on_load_error
            state["error"] = " ".join(str(e).split("\n")) or type(e).__name__
            if on_load_error is not None:
                on_load_error(e)

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        if state["engine"] is None and callable(engine) and not isinstance(engine, Engine):
            state["loader"] = threading.Thread(target=load, name="transduce-load", daemon=True)
            state["loader"].start()
        yield
        if state["batcher"] is not None:
            # a drain whose grace is over leaves a stuck round to its daemon thread
            left = 10.0 if state["deadline"] is None else max(0.5, state["deadline"] - time.monotonic())
            state["batcher"].stop(timeout=0.5 if state["expired"] else left)

    app = FastAPI(title="transduce", version="1",
                  description="Translation with a Transformer of 'Attention Is All You Need' (Vaswani et al., 2017): "
                              "beam search with the paper's length penalty, requests batched dynamically.",
                  lifespan=lifespan,
                  # FastAPI's /docs and /redoc pages load their scripts from a CDN: nothing is
                  # loaded from the internet, so they are off; /openapi.json is the document.
                  docs_url=None, redoc_url=None)
    app.state.transduce = state
    if isinstance(engine, Engine):
        install(engine)

    _add_error_handlers(app, limits)
    auth = [api_key_dependency(api_key)] if api_key else []
    statuses = (400, 401, 413, 415, 422, 429, 500, 503) if api_key else (400, 413, 415, 422, 429, 500, 503)
    errors = {s: {"model": ErrorResponse} for s in statuses}

    async def translate(req, request: Request):
        e, batcher = state["engine"], state["batcher"]
        if (problem := unavailable(state)) is not None:
            return problem
        if req.n_best > (1 if req.greedy else req.beam):
            return error(422, "invalid_request", f"n_best ({req.n_best}) must be at most "
                         f"{'1 with greedy' if req.greedy else f'beam ({req.beam})'}", field="n_best")
        problem, tokens = check_sentences(e.encode, req.sentences, limits)
        if problem is not None:
            return problem
        request.scope.setdefault("state", {})["log_sentences"] = f"sentences={len(req.sentences)} tokens={tokens}"
        search = Search(req.beam, req.alpha, req.max_len_offset, req.n_best, req.greedy)
        job, problem = enqueue(lambda: batcher.submit(req.sentences, search, tokens), state, limits,
                               _retry_after(batcher))
        if problem is not None:
            return problem
        results, problem = await wait_for_job(job, batcher, state, request, poll_disconnect)
        if problem is not None:
            return problem
        return _response(req, results, req.sentences, e.tree)

    # classes imported or made here, which the postponed annotations could not name
    translate.__annotations__.update(req=TranslateRequest, request=Request)
    app.post("/translate", response_model=TranslateResponse, responses=errors, dependencies=auth,
             summary="translate sentences (beam search, Section 6.1)")(translate)

    add_demo_routes(app, state, limits, defaults, auth=auth, errors=errors, poll=poll_disconnect)
    _add_status_routes(app, state, defaults, limits, max_batch_tokens, max_wait, metrics, bool(api_key))
    _answer_head(app)

    def begin_drain(grace: float) -> None:
        """A shutdown began (on the event loop): refuse new work, and once `grace` seconds have
        passed answer what is still waiting or decoding 503."""
        if state["draining"]:
            return
        state.update(draining=True, grace=grace, deadline=time.monotonic() + grace)
        b = state["batcher"]
        log.info("shutting down: finishing the requests in flight (%d queued) for at most %g s", b.queued if b else 0, grace)
        asyncio.get_running_loop().call_later(grace, end_grace)

    def end_grace(forced: bool = False) -> None:
        """The grace period is over, or was cut short (`forced`: a second Ctrl-C): what is still
        waiting or decoding is answered 503."""
        if state["expired"]:
            return
        state.update(expired=True, forced=forced)
        b = state["batcher"]
        failed = b.fail_queued(ShuttingDown("the grace period is over")) if b is not None else 0
        why = "was cut short (Ctrl-C again)" if forced else "is over"
        log.warning("the grace period (%g s) %s: unfinished requests are answered 503 (%d were queued)",
                    state["grace"] or 0, why, failed)

    wrapped = RequestLog(_BodyLimit(app, limits.max_body_bytes), metrics)
    wrapped.fastapi, wrapped.state, wrapped.metrics = app, state, metrics
    wrapped.begin_drain, wrapped.end_grace = begin_drain, end_grace
    return wrapped


def _answer_head(app) -> None:
    """HEAD on every GET route (/, /health, /info, /metrics) as its GET, the body left out by the
    server: monitors and `curl -I` ask so. Kept out of the OpenAPI document, which would repeat
    each GET operation under the same id."""
    from fastapi.routing import APIRoute

    for route in [r for r in app.routes if isinstance(r, APIRoute) and r.methods == {"GET"}]:
        app.add_api_route(route.path, route.endpoint, methods=["HEAD"], response_class=route.response_class,
                          include_in_schema=False)


def _retry_after(batcher: Batcher) -> int:
    """Seconds until the queue has likely drained a little: at least 1."""
    return max(1, math.ceil(batcher.queued * batcher.max_wait))


def bind_sockets(host: str, port: int) -> list:
    """Sockets bound to HOST:PORT, one per address the host stands for (as uvicorn's asyncio binds
    them), for `server(...).run(sockets=...)`. Binding first, before the server and the model's
    loading thread start, makes a port in use or not allowed an OSError here, which the caller
    reports in one line (inside uvicorn it is a traceback and an exit with torch busy on the
    loading thread: std::terminate). Port 0: the system chooses a free port, the same one for
    every address (`sockets[0].getsockname()[1]`)."""
    import socket

    sockets: list[socket.socket] = []
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # :: and 0.0.0.0 are two sockets, as asyncio makes them
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def server(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
           graceful_timeout: float = DEFAULT_GRACEFUL_TIMEOUT):
    """A uvicorn server for the app (its own request log instead of uvicorn's access log): `.run()`
    blocks until Ctrl-C / SIGTERM or until `.should_exit` is set. A shutdown stops accepting
    connections, gives the requests in flight `graceful_timeout` seconds (`app.begin_drain`), then
    they are answered 503 and the server ends (uvicorn cancels what is left 5 s later still); Ctrl-C
    again (uvicorn's force quit) answers them 503 at once."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None):
            app.begin_drain(graceful_timeout)
            await super().shutdown(sockets)
            if self.force_exit:  # Ctrl-C again: uvicorn stops waiting, and asyncio would cancel what is left
                await self._answer_the_rest()

        async def _answer_the_rest(self) -> None:
            """Answer the requests still in flight 503 (cancelled, they would get a bare 500 and a
            traceback each), then stop the decoding thread, as the lifespan uvicorn skips does."""
            app.end_grace(forced=True)
            deadline = time.monotonic() + 1.0  # each notices within its poll interval
            while self.server_state.tasks and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            if not self.lifespan.shutdown_event.is_set():
                await self.lifespan.shutdown()

    _log_requests(log_level)
    return Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                                 timeout_graceful_shutdown=graceful_timeout + 5))


def _log_requests(level: str) -> None:
    """The server's own lines (the request log, shutting down, failures) on stderr, timestamped."""
    logger = logging.getLogger("transduce.serve")
    logger.setLevel(level.upper())
    if not any(getattr(h, "transduce", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        handler.transduce = True
        logger.addHandler(handler)
        logger.propagate = False


