"""The HTTP API: FastAPI on uvicorn, one model, one decoding thread (`serve.batcher`); the routes,
fields and error codes: docs/serve.md. Translations equal `transduce translate`'s for the same
sentences and settings. Every error is JSON. A shutdown (SIGTERM, Ctrl-C) finishes the requests it
has for at most the grace period, answers the rest 503 and ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any, Callable

from pydantic import BaseModel, Field

from ..decoding.streaming import DEFAULT_BATCH_TOKENS
from .batcher import Batcher, ShuttingDown
from .common import (LIMIT_OF_FIELD, Limits, check_sentences, error, is_json, number, request_model, run_job,
                     unavailable)
from .backend import Engine, Search, ct2_engine, scrub, torch_engine  # noqa: F401 - the API's names, as before
from ..memory import Trimmer, bound_kernel_caches, memory_info

log = logging.getLogger("transduce.serve")

DEFAULT_GRACEFUL_TIMEOUT = 30.0  # seconds a shutdown waits for the requests in flight (as Kubernetes)


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
    return request_model("TranslateRequest", limits, defaults, {
        "sentences": (list[str], Field(max_length=limits.max_sentences,
                                       description="sentences to translate, one translation each (empty -> empty)"))}, {
        "n_best": (int, Field(1, ge=1, le=limits.max_beam, description="hypotheses per sentence (at most beam)")),
        "scores": (bool, Field(False, description="return scores and log-probabilities"))})


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


def _add_error_handlers(app, limits: Limits) -> None:
    """Every error as JSON: a body not sent as JSON is 415, a field over a limit names the limit
    (422), bad JSON is 400, others as they come."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        content_type = request.headers.get("content-type")
        if not is_json(content_type):  # FastAPI reads no body that is not declared JSON
            given = f"this request's is {content_type}" if content_type else "this request has none"
            return error(415, "unsupported_media_type",
                         f"the body must be JSON, sent with Content-Type: application/json ({given})")
        errors = exc.errors() or [{}]
        where = [".".join(str(x) for x in e.get("loc", ()) if x != "body") for e in errors]
        for e, loc in zip(errors, where):
            if e.get("type") == "json_invalid":
                return error(400, "invalid_json", f"the body is not valid JSON: {e.get('ctx', {}).get('error', e.get('msg'))}")
            if e.get("type") in _TOO_BIG and loc:
                name = "max_chars" if e.get("type") == "string_too_long" else LIMIT_OF_FIELD.get(loc.split(".")[0])
                if name is not None:
                    return error(422, "limit_exceeded", f"{loc}: {e.get('msg')}", limit=name,
                                 value=getattr(limits, name), field=loc)
        return error(422, "invalid_request", f"{where[0] or 'body'}: {errors[0].get('msg', 'invalid request')}",
                     field=where[0] or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        code = {400: "invalid_json", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        message = "the body is not valid JSON in UTF-8" if exc.status_code == 400 else str(exc.detail)
        return error(exc.status_code, code, message, headers=getattr(exc, "headers", None))


def _response(req, results, sources: list[str], tree=None) -> dict:
    """The JSON answer: per sentence its best text, with scores, the n-best and trees as asked."""
    def hypothesis(source: str, c, scores: bool) -> dict:
        h = {"text": c.text}
        if scores:
            h["score"], h["logprob"] = number(c.score), number(c.logprob)
        if tree is not None:
            parsed = tree(source, c.text)
            h["tree"] = "" if parsed is None else str(parsed)
        return h

    out = []
    for source, cands in zip(sources, results):
        out.append(hypothesis(source, cands[0], req.scores))
        if req.n_best > 1:
            out[-1]["n_best"] = [hypothesis(source, c, True) for c in cands]
    return {"translations": out}


def _add_status_routes(app, state: dict, defaults: Search, limits: Limits, max_batch_tokens: int, max_wait: float,
                       metrics, api_key: bool) -> None:
    """GET /health, GET /info (the model, defaults, limits, queue) and GET /metrics (Prometheus)."""
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
                "stats": asdict(b.stats) if b is not None else {}}

    @app.get("/metrics", response_class=Response, summary="metrics in Prometheus's text format",
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def prometheus():
        content, media_type = metrics.exposition()
        return Response(content, media_type=media_type)


def create_app(engine: Engine | Callable[[], Engine], *, limits: Limits | None = None, defaults: Search | None = None,
               max_batch_tokens: int = DEFAULT_BATCH_TOKENS, max_wait: float = 0.01, poll_disconnect: float = 0.05,
               on_load_error: Callable[[BaseException], None] | None = None, api_key: str | None = None):
    """The ASGI app: the FastAPI app (`.fastapi`) inside the request log and the body-size limit;
    `.state` (its "batcher", its "loader" thread), `.metrics`, `.begin_drain(grace)` (what a
    shutdown calls) and `.end_grace(forced=True)`. `engine`: an Engine, or a function that loads
    one on a thread at startup (/health says `loading` until then, and a failure, which
    `on_load_error(exception)` is told of). `api_key`: required on /translate and /attention.
    oneDNN's kernel caches are bounded first (`memory.bound_kernel_caches`), before the first product."""
    from fastapi import FastAPI, Request

    from .demo import add_demo_routes
    from .libre import Dispatch, add_libre_routes
    from .ops import Metrics, RequestLog, api_key_dependency

    bound_kernel_caches()
    limits = limits or Limits()
    defaults = defaults or Search()
    TranslateRequest = request_schema(limits, defaults)
    state: dict[str, Any] = {"engine": None, "batcher": None, "error": None, "draining": False, "expired": False,
                             "forced": False, "grace": None, "deadline": None, "loader": None}
    metrics = Metrics(lambda: state["batcher"].queued if state["batcher"] is not None else 0)

    def install(e: Engine) -> None:
        batcher = Batcher(e.translate, max_batch_tokens=max_batch_tokens,
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

    @asynccontextmanager
    async def lifespan(app):
        if not isinstance(engine, Engine):  # an Engine is installed below
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
                  docs_url=None, redoc_url=None)  # their pages load scripts from a CDN
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
        retry_after = max(1, math.ceil(batcher.queued * batcher.max_wait))  # the queue drained a little
        results, problem = await run_job(lambda: batcher.submit(req.sentences, search, tokens), state, limits,
                                         request, poll_disconnect, retry_after)
        if problem is not None:
            return problem
        return _response(req, results, req.sentences, e.tree)

    # classes imported or made here, which the postponed annotations could not name
    translate.__annotations__.update(req=TranslateRequest, request=Request)
    app.post("/translate", response_model=TranslateResponse, responses=errors, dependencies=auth,
             summary="translate sentences (beam search, Section 6.1)")(translate)

    add_demo_routes(app, state, limits, defaults, auth=auth, errors=errors, poll=poll_disconnect)
    add_libre_routes(app, state, limits, defaults, api_key, poll_disconnect)  # LibreTranslate's API
    _add_status_routes(app, state, defaults, limits, max_batch_tokens, max_wait, metrics, bool(api_key))
    _answer_head(app)

    def begin_drain(grace: float) -> None:
        """A shutdown began: refuse new work, and after `grace` seconds answer what is left 503."""
        if state["draining"]:
            return
        state.update(draining=True, grace=grace, deadline=time.monotonic() + grace)
        b = state["batcher"]
        log.info("shutting down: finishing the requests in flight (%d queued) for at most %g s", b.queued if b else 0, grace)
        asyncio.get_running_loop().call_later(grace, end_grace)

    def end_grace(forced: bool = False) -> None:
        """The grace period is over, or cut short (`forced`: Ctrl-C again): what is left gets 503."""
        if state["expired"]:
            return
        state.update(expired=True, forced=forced)
        b = state["batcher"]
        failed = b.fail_queued(ShuttingDown("the grace period is over")) if b is not None else 0
        why = "was cut short (Ctrl-C again)" if forced else "is over"
        log.warning("the grace period (%g s) %s: unfinished requests are answered 503 (%d were queued)",
                    state["grace"] or 0, why, failed)

    wrapped = RequestLog(_BodyLimit(Dispatch(app), limits.max_body_bytes), metrics)
    wrapped.fastapi, wrapped.state, wrapped.metrics = app, state, metrics
    wrapped.begin_drain, wrapped.end_grace = begin_drain, end_grace
    return wrapped


def _answer_head(app) -> None:
    """HEAD on every GET route as its GET, the body left out (monitors, `curl -I`); kept out of
    the OpenAPI document, which would repeat each GET operation under the same id."""
    from fastapi.routing import APIRoute

    for route in [r for r in app.routes if isinstance(r, APIRoute) and r.methods == {"GET"}]:
        app.add_api_route(route.path, route.endpoint, methods=["HEAD"], response_class=route.response_class,
                          include_in_schema=False)


def bind_sockets(host: str, port: int) -> list:
    """Sockets bound to HOST:PORT, one per address of the host (as uvicorn binds them), for
    `server(...).run(sockets=...)`: bound before the model loads, a port in use is an OSError the
    caller reports in one line (inside uvicorn: a traceback, std::terminate with torch busy loading).
    Port 0: one free port for every address (`sockets[0].getsockname()[1]`)."""
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
    """A uvicorn server for the app (its own request log, not uvicorn's): `.run()` blocks until
    Ctrl-C / SIGTERM or `.should_exit`. A shutdown gives the requests in flight `graceful_timeout`
    seconds (`app.begin_drain`), then answers them 503; Ctrl-C again answers them 503 at once."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None):
            app.begin_drain(graceful_timeout)
            await super().shutdown(sockets)
            if not self.force_exit:
                return
            # Ctrl-C again: uvicorn stops waiting, and asyncio would cancel what is left. Answer the
            # requests still in flight 503 (cancelled, they would get a bare 500 and a traceback
            # each), then stop the decoding thread, as the lifespan uvicorn skips does.
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
    log.setLevel(level.upper())
    if not any(getattr(h, "transduce", False) for h in log.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        handler.transduce = True
        log.addHandler(handler)
        log.propagate = False


