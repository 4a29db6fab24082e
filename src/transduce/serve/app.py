"""The HTTP API: FastAPI on uvicorn, one model, one decoding thread (`serve.batcher`); the routes,
fields and error codes: docs/serve.md. The app (`create_app`) gathers the routes, the native
/translate (`serve.native`), LibreTranslate's (`serve.libre`, `serve.documents`) and the demo's,
beside its own: /health, /info, /metrics; the error handlers and the body limit are its own too.
Translations equal `transduce translate`'s for the same sentences and settings. Every error is
JSON. A shutdown (SIGTERM, Ctrl-C) finishes the requests it has for at most the grace period,
answers the rest 503 and ends. The app on uvicorn, its sockets and its log lines: `serve.listen`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Callable, Sequence

from pydantic import BaseModel, Field

from ..decoding.settings import SearchSettings
from ..defaults import BATCH_TOKENS, SERVE_MAX_WAIT
from .batcher import Batcher, ShuttingDown
from .common import Limits, Problem, Server, ServerState
from .fields import validation_problem
from .backend import Engine, ct2_engine, scrub, torch_engine  # noqa: F401 - the API's names, as before
from .native import add_translate_route
from .splitting import source_language, warm
from ..memory import Trimmer, bound_kernel_caches, memory_info

log = logging.getLogger("transduce.serve")


class ErrorResponse(BaseModel):
    error: str = Field(
        description="invalid_json, unauthorized, unsupported_media_type, invalid_request, "
        "limit_exceeded, queue_full, decoding_failed, not_supported, loading or shutting_down"
    )
    message: str
    limit: str | None = Field(None, description="the limit exceeded (see /info)")
    value: int | None = Field(None, description="the limit's value")
    field: str | None = Field(None, description="where in the request")
    exception: str | None = Field(None, description="decoding_failed: the exception's type")


class Health(BaseModel):
    status: str = Field(description="ok; or, with status 503, loading, shutting down or failed: WHY")


class BodyLimit:
    """ASGI middleware: read a request's body (at most `max_bytes`, else 413 before anything is
    parsed), then hand it on; later receive() calls pass through (disconnects are seen). The one
    place a body is read from the connection, for both APIs."""

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
        content = json.dumps(
            {
                "error": "limit_exceeded",
                "message": f"the body is larger than {self.max_bytes} bytes",
                "limit": "max_body_bytes",
                "value": self.max_bytes,
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(content)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": content})


def _add_error_handlers(app, limits: Limits) -> None:
    """Every error as JSON: a `Problem` as the native API answers it (LibreTranslate's routes
    catch theirs), what FastAPI's own validation refuses as `fields.validation_problem` says, the
    rest as it comes."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(Problem)
    async def problem(request: Request, exc: Problem):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        return validation_problem(exc.errors(), request.headers.get("content-type"), limits).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        code = {400: "invalid_json", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed"}.get(
            exc.status_code, "http_error"
        )
        message = "the body is not valid JSON in UTF-8" if exc.status_code == 400 else str(exc.detail)
        return Problem(exc.status_code, code, message, headers=getattr(exc, "headers", None)).response()


def _add_status_routes(app, server: Server, max_batch_tokens: int, max_wait: float, metrics) -> None:
    """GET /health (also LibreTranslate's, under its prefix too), GET /info (the model, defaults,
    limits, queue) and GET /metrics (Prometheus)."""
    from fastapi import Response
    from fastapi.responses import JSONResponse

    from .libre import PREFIX

    state = server.state

    async def health():
        if state.draining:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        if state.engine is not None:
            return {"status": "ok"}
        status = "failed: " + scrub(state.error) if state.error else "loading"
        return JSONResponse({"status": status}, status_code=503)

    for path in ("/health", PREFIX + "/health"):
        app.get(
            path,
            response_model=Health,
            responses={503: {"model": Health}},
            summary="is the model loaded?",
            include_in_schema=path == "/health",
        )(health)

    @app.get("/info", summary="the model, the engine, the search defaults and the limits")
    async def info() -> dict:
        e, b = state.engine, state.batcher
        return {
            "loaded": e is not None,
            **(e.info if e is not None else {}),
            "defaults": asdict(server.defaults),
            "limits": asdict(server.limits),
            "batching": {"max_batch_tokens": max_batch_tokens, "max_wait_ms": max_wait * 1000},
            "api_key_required": server.api_key is not None,
            "queue": b.queued if b is not None else 0,
            "memory": memory_info(),
            "stats": asdict(b.stats) if b is not None else {},
        }

    @app.get(
        "/metrics",
        response_class=Response,
        summary="metrics in Prometheus's text format",
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    async def prometheus():
        content, media_type = metrics.exposition()
        return Response(content, media_type=media_type)


def create_app(
    engine: Engine | Callable[[], Engine],
    *,
    limits: Limits | None = None,
    defaults: SearchSettings | None = None,
    max_batch_tokens: int = BATCH_TOKENS,
    max_wait: float = SERVE_MAX_WAIT,
    poll_disconnect: float = 0.05,
    on_load_error: Callable[[BaseException], None] | None = None,
    api_key: str | None = None,
    cors_origins: Sequence[str] = (),
):
    """The ASGI app: the FastAPI app (`.fastapi`) inside the request log and the body-size limit;
    `.state` (a `ServerState`: its batcher, its loader thread), `.metrics`, `.begin_drain(grace)`
    (what a shutdown calls) and `.end_grace(forced=True)`. `engine`: an Engine, or a function that
    loads one on a thread at startup (/health says `loading` until then, and a failure, which
    `on_load_error(exception)` is told of). `api_key`: required on /translate and /attention (and
    LibreTranslate's /detect). `cors_origins`: the sites whose pages may call the API from a
    browser ("*": any, as LibreTranslate allows; none by default). oneDNN's kernel caches are
    bounded first (`memory.bound_kernel_caches`), before the first product."""
    from fastapi import FastAPI

    from .demo import add_demo_routes
    from .documents import add_document_routes
    from .libre import add_libre_routes
    from .ops import Metrics, RequestLog, key_reader, models_collector

    bound_kernel_caches()
    state = ServerState()
    server = Server(state, limits or Limits(), defaults or SearchSettings(), api_key, poll_disconnect)
    limits = server.limits
    metrics = Metrics(lambda: state.batcher.queued if state.batcher is not None else 0)

    def install(e: Engine) -> None:
        batcher = Batcher(
            e.translate,
            max_batch_tokens=max_batch_tokens,
            max_wait=max_wait,
            max_queue=limits.max_queue,
            on_round=metrics.round,
            after_round=Trimmer(),
        ).start()
        state.batcher, state.engine = batcher, e
        warm(source_language(e))  # the sentence splitters loaded before the first request needs them
        if e.models is not None:  # several models: each one's memory, loads and requests
            metrics.registry.register(models_collector(e.models))

    def load() -> None:
        try:
            install(engine())
        except BaseException as e:  # noqa: BLE001 - reported by /health and on_load_error
            state.error = " ".join(str(e).split("\n")) or type(e).__name__
            if on_load_error is not None:
                on_load_error(e)

    @asynccontextmanager
    async def lifespan(app):
        if not isinstance(engine, Engine):  # an Engine is installed below
            state.loader = threading.Thread(target=load, name="transduce-load", daemon=True)
            state.loader.start()
        yield
        if state.batcher is not None:
            # a drain whose grace is over leaves a stuck round to its daemon thread
            left = 10.0 if state.deadline is None else max(0.5, state.deadline - time.monotonic())
            state.batcher.stop(timeout=0.5 if state.expired else left)

    app = FastAPI(
        title="transduce",
        version="1",
        description="Translation with a Transformer of 'Attention Is All You Need' (Vaswani et al., 2017): "
        "beam search with the paper's length penalty, requests batched dynamically.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )  # their pages load scripts from a CDN
    app.state.transduce = state
    if isinstance(engine, Engine):
        install(engine)

    _add_error_handlers(app, limits)
    keys = key_reader(api_key)  # the keys a request's headers carry (both schemes in the OpenAPI document)
    statuses = (400, 401, 413, 415, 422, 429, 500, 503) if api_key else (400, 413, 415, 422, 429, 500, 503)
    errors = {s: {"model": ErrorResponse} for s in statuses}
    add_translate_route(app, server, keys, errors)
    add_demo_routes(app, server, keys=keys, errors=errors)
    add_libre_routes(app, server, keys)
    add_document_routes(app, server, keys)  # LibreTranslate's /translate_file and /download_file
    _add_status_routes(app, server, max_batch_tokens, max_wait, metrics)
    _answer_head(app)

    def begin_drain(grace: float) -> None:
        """A shutdown began: refuse new work, and after `grace` seconds answer what is left 503."""
        if state.draining:
            return
        state.draining, state.grace, state.deadline = True, grace, time.monotonic() + grace
        b = state.batcher
        log.info(
            "shutting down: finishing the requests in flight (%d queued) for at most %g s", b.queued if b else 0, grace
        )
        asyncio.get_running_loop().call_later(grace, end_grace)

    def end_grace(forced: bool = False) -> None:
        """The grace period is over, or cut short (`forced`: Ctrl-C again): what is left gets 503."""
        if state.expired:
            return
        state.expired, state.forced = True, forced
        b = state.batcher
        failed = b.fail_queued(ShuttingDown("the grace period is over")) if b is not None else 0
        why = "was cut short (Ctrl-C again)" if forced else "is over"
        log.warning(
            "the grace period (%g s) %s: unfinished requests are answered 503 (%d were queued)",
            state.grace or 0,
            why,
            failed,
        )

    inner = BodyLimit(app, limits.max_body_bytes)
    if cors_origins:  # a browser's preflight and every answer (a 413 too) say which sites may read it
        from starlette.middleware.cors import CORSMiddleware

        inner = CORSMiddleware(
            inner,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "X-API-Key", "X-Request-ID"],
            expose_headers=["Retry-After", "X-Request-ID"],
            max_age=86400,
        )
    wrapped = RequestLog(inner, metrics)
    wrapped.fastapi, wrapped.state, wrapped.metrics = app, state, metrics
    wrapped.begin_drain, wrapped.end_grace = begin_drain, end_grace
    return wrapped


def _answer_head(app) -> None:
    """HEAD on every GET route as its GET, the body left out (monitors, `curl -I`); kept out of
    the OpenAPI document, which would repeat each GET operation under the same id."""
    from fastapi.routing import APIRoute

    for route in [r for r in app.routes if isinstance(r, APIRoute) and r.methods == {"GET"}]:
        app.add_api_route(
            route.path, route.endpoint, methods=["HEAD"], response_class=route.response_class, include_in_schema=False
        )
