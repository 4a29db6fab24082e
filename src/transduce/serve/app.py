"""The HTTP API: FastAPI on uvicorn, one model, one decoding thread (`serve.batcher`).

    POST /translate   {"sentences": [...], "beam": 4, "alpha": 0.6, "max_len_offset": 50,
                       "n_best": 1, "greedy": false, "scores": false}
                      -> {"translations": [{"text": ..., "score": ..., "logprob": ...,
                                            "n_best": [{"text", "score", "logprob"}, ...]}]}
    GET  /health      200 {"status": "ok"} once the model is loaded, 503 {"status": "loading"} before
    GET  /info        the model, its vocabulary, the engine, the search defaults and every limit
    GET  /openapi.json, /docs   generated from the request and response schemas

Translations equal `transduce translate`'s for the same sentences and settings: the same
`translate_stream` (or CTranslate2 engine) decodes them, with the same token budget.

Every error is JSON, {"error": CODE, "message": ..., and for a limit "limit": NAME, "value": N}:

    400 invalid_json        the body is not JSON (or not UTF-8)
    413 limit_exceeded      max_body_bytes (checked before the body is parsed)
    422 limit_exceeded      max_sentences, max_chars, max_tokens, max_beam, max_len_offset
    422 invalid_request     anything else the schema refuses (a missing field, a wrong type, ...)
    429 queue_full          max_queue requests are waiting; Retry-After says when to try again
    503 loading             the model is not loaded yet; Retry-After

A client that disconnects before its answer has its job dropped from the queue (or its results
discarded): the other requests and the decoding thread go on.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from dataclasses import asdict, dataclass
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from ..translate import DEFAULT_ALPHA, DEFAULT_BATCH_SIZE, DEFAULT_BATCH_TOKENS, DEFAULT_BEAM, DEFAULT_MAX_LEN_OFFSET
from .batcher import Batcher, QueueFull


@dataclass
class Limits:
    """What one request may ask for."""

    max_body_bytes: int = 1 << 20
    max_sentences: int = 64
    """Sentences per request."""
    max_chars: int = 2000
    """Characters per sentence."""
    max_tokens: int = 256
    """Subword tokens per sentence (EOS not counted)."""
    max_queue: int = 256
    """Requests waiting to be decoded; more are answered 429."""
    max_beam: int = 16
    max_len_offset: int = 256
    """The largest max_len_offset a request may ask for."""


@dataclass(frozen=True)
class Search:
    """A request's search settings (hashable: jobs with equal settings share a round)."""

    beam: int = DEFAULT_BEAM
    alpha: float = DEFAULT_ALPHA
    max_len_offset: int = DEFAULT_MAX_LEN_OFFSET
    n_best: int = 1
    greedy: bool = False


@dataclass
class Engine:
    """What the server decodes with: `translate(sentences, search)` -> candidates per sentence
    (called on the decoding thread only), `encode(sentence)` -> source token ids (for the limits),
    and what /info shows."""

    translate: Callable[[list[str], Search], list]
    encode: Callable[[str], list[int]]
    info: dict


def torch_engine(loaded, *, batch_tokens: int = DEFAULT_BATCH_TOKENS, batch_size: int = DEFAULT_BATCH_SIZE,
                 max_tokens: int = Limits.max_tokens, bf16: bool = False) -> Engine:
    """An engine over a `transduce.translate.LoadedModel`: `translate_stream`, exactly as
    `transduce translate` runs it."""
    from ..translate import translate_stream

    def translate(sentences: list[str], s: Search) -> list:
        return list(translate_stream(
            loaded.model, loaded.src_vocab, loaded.tgt_vocab, sentences, beam=s.beam, alpha=s.alpha,
            max_len_offset=s.max_len_offset, n_best=s.n_best, greedy=s.greedy, batch_tokens=batch_tokens,
            batch_size=batch_size, max_input_tokens=max_tokens, bf16=bf16, chunk_lines=max(1, len(sentences)),
        ))

    mc = loaded.config.model
    precision = getattr(loaded.precision, "precision", None) or ("bf16" if bf16 else str(next(loaded.model.parameters()).dtype).replace("torch.", ""))
    info = {"engine": "torch", "model": loaded.description, "precision": precision,
            "config": asdict(mc), "vocab": {"src": str(loaded.src_vocab.path), "tgt": str(loaded.tgt_vocab.path),
                                            "src_size": len(loaded.src_vocab), "tgt_size": len(loaded.tgt_vocab)}}
    return Engine(translate, loaded.src_vocab.encode, info)


def ct2_engine(model, *, batch_tokens: int = DEFAULT_BATCH_TOKENS, batch_size: int = DEFAULT_BATCH_SIZE,
               max_tokens: int = Limits.max_tokens, length_penalty: str = "paper") -> Engine:
    """An engine over a `transduce.export.ct2.CT2Model`."""

    def translate(sentences: list[str], s: Search) -> list:
        return list(model.translate_stream(
            sentences, beam=s.beam, alpha=s.alpha, max_len_offset=s.max_len_offset, n_best=s.n_best, greedy=s.greedy,
            batch_tokens=batch_tokens, batch_size=batch_size, max_input_tokens=max_tokens,
            chunk_lines=max(1, len(sentences)), length_penalty=length_penalty,
        ))

    info = {"engine": "ct2", "model": model.description, "precision": model.compute_type, "length_penalty": length_penalty,
            "config": asdict(model.config.model), "vocab": {"src": str(model.src_vocab.path), "tgt": str(model.tgt_vocab.path),
                                                           "src_size": len(model.src_vocab), "tgt_size": len(model.tgt_vocab)}}
    return Engine(translate, model.src_vocab.encode, info)


# -- schemas -------------------------------------------------------------------------------------


class Hypothesis(BaseModel):
    text: str
    score: float | None = Field(None, description="log P(Y|X) / ((5+|Y|)/6)^alpha; null for greedy")
    logprob: float | None = Field(None, description="log P(Y|X), EOS included; null for greedy")


class Translation(BaseModel):
    text: str = Field(description="the best translation")
    score: float | None = Field(None, description="its score, if `scores` was asked for (null for greedy)")
    logprob: float | None = Field(None, description="its log-probability, if `scores` was asked for")
    n_best: list[Hypothesis] | None = Field(None, description="the n_best best hypotheses, best first, if n_best > 1")


class TranslateResponse(BaseModel):
    translations: list[Translation] = Field(description="one per sentence, in the order given")


class ErrorResponse(BaseModel):
    error: str = Field(description="invalid_json, invalid_request, limit_exceeded, queue_full or loading")
    message: str
    limit: str | None = Field(None, description="the limit exceeded (see /info)")
    value: int | None = Field(None, description="the limit's value")
    field: str | None = Field(None, description="where in the request")


class Health(BaseModel):
    status: str = Field(description="ok, or loading (with status 503)")


def request_schema(limits: Limits, defaults: Search) -> type[BaseModel]:
    """The request's schema, the limits in it (so the OpenAPI document states them)."""
    from typing import Annotated

    from pydantic import StringConstraints

    Sentence = Annotated[str, StringConstraints(max_length=limits.max_chars)]

    class TranslateRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)  # "4" is not a beam size
        sentences: list[Sentence] = Field(max_length=limits.max_sentences,
                                          description="sentences to translate, one translation each (empty -> empty)")
        beam: int = Field(defaults.beam, ge=1, le=limits.max_beam, description="beam size (6.1: 4)")
        alpha: float = Field(defaults.alpha, ge=0.0, le=10.0, allow_inf_nan=False,
                             description="length penalty ((5+|Y|)/6)^alpha (6.1: 0.6)")
        max_len_offset: int = Field(defaults.max_len_offset, ge=0, le=limits.max_len_offset,
                                    description="maximum output length = input length + this (6.1: 50)")
        n_best: int = Field(1, ge=1, le=limits.max_beam, description="hypotheses per sentence (at most beam)")
        greedy: bool = Field(False, description="greedy decoding (beam and alpha ignored)")
        scores: bool = Field(False, description="return scores and log-probabilities")

    return TranslateRequest


# Pydantic error types that mean "over a limit", and the limit each names, by the field.
_LIMIT_OF_FIELD = {"sentences": "max_sentences", "beam": "max_beam", "max_len_offset": "max_len_offset", "n_best": "max_beam"}
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


def _error(status: int, error: str, message: str, headers: dict | None = None, **extra):
    from fastapi.responses import JSONResponse

    body = {"error": error, "message": message, **{k: v for k, v in extra.items() if v is not None}}
    return JSONResponse(body, status_code=status, headers=headers)


def _number(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def _add_error_handlers(app, limits: Limits) -> None:
    """Every error as JSON: a field over a limit names the limit (422), bad JSON is 400, others as they come."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        for e in errors:
            loc = [str(x) for x in e.get("loc", ()) if x != "body"]
            if e.get("type") == "json_invalid":
                return _error(400, "invalid_json", f"the body is not valid JSON: {e.get('ctx', {}).get('error', e.get('msg'))}")
            if e.get("type") in _TOO_BIG and loc:
                name = "max_chars" if e.get("type") == "string_too_long" else _LIMIT_OF_FIELD.get(loc[0])
                if name is not None:
                    return _error(422, "limit_exceeded", f"{'.'.join(loc)}: {e.get('msg')}", limit=name,
                                  value=getattr(limits, name), field=".".join(loc))
        first = errors[0] if errors else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        return _error(422, "invalid_request", f"{where or 'body'}: {first.get('msg', 'invalid request')}", field=where or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        code = "invalid_json" if exc.status_code == 400 else ("not_found" if exc.status_code == 404 else "http_error")
        message = "the body is not valid JSON in UTF-8" if exc.status_code == 400 else str(exc.detail)
        return _error(exc.status_code, code, message, headers=getattr(exc, "headers", None))


def _check_sentences(e: Engine, sentences: list[str], limits: Limits):
    """(a JSON error or None, the request's tokens with EOS): each sentence valid Unicode and
    within the token limit."""
    tokens = 0
    for i, s in enumerate(sentences):
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            return _error(422, "invalid_request", f"sentences.{i}: not valid Unicode (a lone surrogate)",
                          field=f"sentences.{i}"), 0
        n = len(e.encode(s))
        if n > limits.max_tokens:
            return _error(422, "limit_exceeded", f"sentences.{i}: {n} subword tokens, more than {limits.max_tokens}",
                          limit="max_tokens", value=limits.max_tokens, field=f"sentences.{i}"), 0
        tokens += n + 1
    return None, tokens


def _response(req, results) -> dict:
    """The JSON answer: per sentence its best text, with scores and the n-best when asked."""
    out = []
    for cands in results:
        best = cands[0]
        t = {"text": best.text}
        if req.scores:
            t["score"], t["logprob"] = _number(best.score), _number(best.logprob)
        if req.n_best > 1:
            t["n_best"] = [{"text": c.text, "score": _number(c.score), "logprob": _number(c.logprob)} for c in cands]
        out.append(t)
    return {"translations": out}


def _add_status_routes(app, state: dict, defaults: Search, limits: Limits, max_batch_tokens: int, max_wait: float) -> None:
    """GET /health (is the model loaded?) and GET /info (the model, the defaults, the limits, the queue)."""

    @app.get("/health", response_model=Health, responses={503: {"model": Health}}, summary="is the model loaded?")
    async def health():
        from fastapi.responses import JSONResponse

        if state["engine"] is not None:
            return {"status": "ok"}
        status = "failed: " + state["error"] if state["error"] else "loading"
        return JSONResponse({"status": status}, status_code=503)

    @app.get("/info", summary="the model, the engine, the search defaults and the limits")
    async def info() -> dict:
        e, b = state["engine"], state["batcher"]
        return {"loaded": e is not None, **(e.info if e is not None else {}), "defaults": asdict(defaults),
                "limits": asdict(limits), "batching": {"max_batch_tokens": max_batch_tokens, "max_wait_ms": max_wait * 1000},
                "queue": b.queued if b is not None else 0,
                "stats": {k: v for k, v in asdict(b.stats).items() if k != "round_sizes"} if b is not None else {}}


def create_app(engine: Engine | Callable[[], Engine], *, limits: Limits | None = None, defaults: Search | None = None,
               max_batch_tokens: int = DEFAULT_BATCH_TOKENS, max_wait: float = 0.01, poll_disconnect: float = 0.05,
               on_load_error: Callable[[BaseException], None] | None = None):
    """The ASGI app (the FastAPI app inside the body-size limit; `.fastapi` is the FastAPI app,
    `.state["batcher"]` the batcher). `engine`: an Engine, or a function that loads one (called
    on a thread at startup; /health says `loading` until it returns; if it fails, /health says so
    and `on_load_error(exception)` is called)."""
    from fastapi import FastAPI, Request

    limits = limits or Limits()
    defaults = defaults or Search()
    TranslateRequest = request_schema(limits, defaults)
    state: dict[str, Any] = {"engine": None, "batcher": None, "error": None}

    def install(e: Engine) -> None:
        batcher = Batcher(lambda sentences, s: e.translate(sentences, s), max_batch_tokens=max_batch_tokens,
                          max_wait=max_wait, max_queue=limits.max_queue).start()
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
            threading.Thread(target=load, name="transduce-load", daemon=True).start()
        yield
        if state["batcher"] is not None:
            state["batcher"].stop()

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

    errors = {s: {"model": ErrorResponse} for s in (400, 413, 422, 429, 503)}

    async def translate(req, request: Request):
        e, batcher = state["engine"], state["batcher"]
        if e is None:
            return _error(503, "loading", "the model is still loading", headers={"Retry-After": "5"})
        if req.n_best > (1 if req.greedy else req.beam):
            return _error(422, "invalid_request", f"n_best ({req.n_best}) must be at most "
                          f"{'1 with greedy' if req.greedy else f'beam ({req.beam})'}", field="n_best")
        error, tokens = _check_sentences(e, req.sentences, limits)
        if error is not None:
            return error
        search = Search(req.beam, req.alpha, req.max_len_offset, req.n_best, req.greedy)
        try:
            job = batcher.submit(req.sentences, search, tokens)
        except QueueFull as exc:
            return _error(429, "queue_full", str(exc), headers={"Retry-After": str(_retry_after(batcher))},
                          limit="max_queue", value=limits.max_queue)
        future = asyncio.wrap_future(job.future)
        while True:
            done, _ = await asyncio.wait({future}, timeout=poll_disconnect)
            if done:
                break
            if await request.is_disconnected():
                batcher.cancel(job)
                future.cancel()
                return _error(499, "disconnected", "the client went away")
        return _response(req, future.result())

    # classes imported or made here, which the postponed annotations could not name
    translate.__annotations__.update(req=TranslateRequest, request=Request)
    app.post("/translate", response_model=TranslateResponse, responses=errors,
             summary="translate sentences (beam search, Section 6.1)")(translate)

    _add_status_routes(app, state, defaults, limits, max_batch_tokens, max_wait)

    wrapped = _BodyLimit(app, limits.max_body_bytes)
    wrapped.fastapi, wrapped.state = app, state
    return wrapped


def _retry_after(batcher: Batcher) -> int:
    """Seconds until the queue has likely drained a little: at least 1."""
    return max(1, math.ceil(batcher.queued * batcher.max_wait))


def server(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info"):
    """A uvicorn server for the app: `.run()` blocks until Ctrl-C / SIGTERM or until
    `.should_exit` is set."""
    import uvicorn

    return uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=10))

