"""The server's plumbing, written once under both APIs (the native one, whose POST /translate is
`serve.native`, and LibreTranslate's, `serve.libre`): the limits, the server's state, the API
key, the token limits, which engine decodes, waiting for the decoding thread (Retry-After, the
client's disconnect, a decoding failure, a shutdown's grace period) and the request's log line; a
request's fields, read once, and its schema are `serve.fields`'. What goes wrong is a `Problem`,
in neither API's shape: each API answers it in its own (`Problem.response` here, `libre.render`
there)."""

from __future__ import annotations

import asyncio
import hmac
import math
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

from ..decoding.settings import SearchSettings
from ..defaults import (
    SERVE_MAX_BEAM,
    SERVE_MAX_BODY_BYTES,
    SERVE_MAX_CHARS,
    SERVE_MAX_LEN_OFFSET,
    SERVE_MAX_QUEUE,
    SERVE_MAX_SENTENCES,
    SERVE_MAX_TOKENS,
)
from .backend import Engine, RequestError, scrub
from .batcher import Batcher, QueueFull, ShuttingDown


@dataclass
class Limits:
    """What one request may ask for; the defaults, and what each field counts: `transduce.defaults` (SERVE_*)."""

    max_body_bytes: int = SERVE_MAX_BODY_BYTES
    max_sentences: int = SERVE_MAX_SENTENCES
    max_chars: int = SERVE_MAX_CHARS
    max_tokens: int = SERVE_MAX_TOKENS
    max_queue: int = SERVE_MAX_QUEUE
    max_beam: int = SERVE_MAX_BEAM
    max_len_offset: int = SERVE_MAX_LEN_OFFSET


@dataclass
class ServerState:
    """What the server holds and how it stands: the engine and its batcher once loaded (by the
    `loader` thread, or `error`: why not), and a shutdown's progress (`draining`: no new work;
    `expired`: the grace period is over, or was cut short: `forced`)."""

    engine: Engine | None = None
    batcher: Batcher | None = None
    loader: threading.Thread | None = None
    error: str | None = None
    draining: bool = False
    expired: bool = False
    forced: bool = False
    grace: float | None = None  # seconds a shutdown gives the requests in flight
    deadline: float | None = None  # when that grace period ends (time.monotonic())


class Problem(Exception):
    """Why a request is refused or failed: the native API's status, error code and message (no
    path of the server's in it: `backend.scrub`), the limit it exceeds, where in the request, the
    decoding failure's exception, the headers to send (Retry-After)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict | None = None,
        limit: str | None = None,
        value: int | None = None,
        field: str | None = None,
        exception: str | None = None,
    ):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, scrub(message), headers
        self.extra = {"limit": limit, "value": value, "field": field, "exception": exception}

    def response(self):
        """The native API's answer: {"error": CODE, "message": ..., and the extras that are set}."""
        from fastapi.responses import JSONResponse

        body = {"error": self.code, "message": self.message, **{k: v for k, v in self.extra.items() if v is not None}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def number(x: float | None) -> float | None:
    """A score for JSON: NaN and infinities (greedy's, an empty output's) as null."""
    return None if x is None or not math.isfinite(x) else x


def note(request, text: str) -> None:
    """Something for the request's log line (`serve.ops.RequestLog`)."""
    request.scope.setdefault("state", {})["log_note"] = text


@dataclass
class Server:
    """What every route shares: the state, the limits, the search defaults, the API key, how often
    a waiting request looks for its client's disconnect."""

    state: ServerState
    limits: Limits
    defaults: SearchSettings
    api_key: str | None = None
    poll: float = 0.05

    def key_problem(self, given: list) -> str | None:
        """None when the server wants no key or one of the keys `given` is its own (compared in
        constant time); else "missing" (none given) or "wrong". Each API answers in its way."""
        if self.api_key is None:
            return None
        given = [k for k in given if k]
        expected = self.api_key.encode()
        if any(isinstance(k, str) and hmac.compare_digest(k.encode("utf-8", "surrogatepass"), expected) for k in given):
            return None
        return "wrong" if given else "missing"

    def require_key(self, given: list) -> None:
        """The native API's check: 401 (with WWW-Authenticate) unless the server's key is among `given`."""
        if self.key_problem(given) is not None:
            raise Problem(
                401,
                "unauthorized",
                "an API key is required: send Authorization: Bearer KEY or X-API-Key: KEY",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def lookup(
        self, source: str | None = None, target: str | None = None, texts: Sequence[str] = ()
    ) -> tuple[Engine, Batcher]:
        """The engine that translates `source` into `target` (None: whatever it serves), and its
        batcher: the one place a request's languages choose what decodes it. 503 while the model
        loads or the server shuts down; `unsupported_language` for a pair the model does not serve
        (a model whose data.json names no languages takes any). Several models: their set chooses
        (`serve.models.ModelSet.lookup`; `source` "auto" is detected over `texts`)."""
        state = self.state
        if state.engine is None:
            raise Problem(503, "loading", "the model is still loading", headers={"Retry-After": "5"})
        if state.draining:
            raise shutting_down(state)
        if state.engine.models is not None and (source, target) != (None, None):
            return state.engine.models.lookup(source, target, list(texts), state.batcher)
        pair = languages(state.engine)
        if pair is not None and (source, target) != (None, None):
            src, tgt = pair
            serves = f"this server translates {name(src)} ({src}) into {name(tgt)} ({tgt})"
            if str(source).lower() not in ("auto", src.lower()):
                raise Problem(422, "unsupported_language", f"{source} is not supported: {serves}", field="source")
            if str(target).lower() != tgt.lower():
                raise Problem(
                    422,
                    "unsupported_language",
                    f"{name(target)} ({target}) is not available as a target "
                    f"language from {name(src)} ({src}): {serves}",
                    field="target",
                )
        return state.engine, state.batcher

    def count_tokens(
        self,
        encode: Callable[[str], list[int]],
        sentences: list[str],
        where: Callable[[int], str] = lambda i: f"sentences.{i}",
        extra: int = 0,
    ) -> int:
        """The source tokens of the sentences with EOS (what a job costs the batcher's budget):
        at most max_sentences sentences, each valid Unicode and within max_tokens (+ `extra`)
        subword tokens (`encode`: sentence -> ids; `where(i)`: how to name sentence i)."""
        limits = self.limits
        if len(sentences) > limits.max_sentences:
            raise Problem(
                422,
                "limit_exceeded",
                f"{len(sentences)} sentences, more than the {limits.max_sentences} a request may have",
                limit="max_sentences",
                value=limits.max_sentences,
            )
        tokens, most = 0, limits.max_tokens + extra
        for i, s in enumerate(sentences):
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:
                raise Problem(
                    422, "invalid_request", f"{where(i)}: not valid Unicode (a lone surrogate)", field=where(i)
                ) from None
            n = len(encode(s))
            if n > most:
                how = " (max_tokens + max_len_offset: the longest output the server gives)" if extra else ""
                raise Problem(
                    422,
                    "limit_exceeded",
                    f"{where(i)}: {n} subword tokens, more than {most}{how}",
                    limit="max_tokens",
                    value=limits.max_tokens,
                    field=where(i),
                )
            tokens += n + 1
        return tokens

    async def decode(self, batcher: Batcher, sentences: list[str], settings: SearchSettings, tokens: int, request):
        """The candidates of every sentence, decoded as one job of the batcher (with the sentences
        of other requests with the same settings); the request's log line says how much."""
        request.scope.setdefault("state", {})["log_sentences"] = f"sentences={len(sentences)} tokens={tokens}"
        if not sentences:
            return []
        return await self.wait(batcher, lambda: batcher.submit(sentences, settings, tokens), request)

    async def wait(self, batcher: Batcher, submit: Callable, request):
        """What the job `submit()` queues gives: 429 with a full queue (Retry-After: the time the
        queue takes to drain a little), 503 while shutting down or once a shutdown's grace period
        is over, 499 when the client goes away (the job is dropped), 422 for a `RequestError`,
        500 decoding_failed naming the exception of any other failure (or once the decoding
        thread has ended)."""
        state, limits = self.state, self.limits
        try:
            job = submit()
        except QueueFull as exc:
            retry_after = max(1, math.ceil(batcher.queued * batcher.max_wait))
            raise Problem(
                429,
                "queue_full",
                str(exc),
                headers={"Retry-After": str(retry_after)},
                limit="max_queue",
                value=limits.max_queue,
            ) from None
        except ShuttingDown:
            raise shutting_down(state) from None
        except RuntimeError as exc:
            raise Problem(500, "decoding_failed", str(exc)) from None
        future = asyncio.wrap_future(job.future)
        while not (await asyncio.wait({future}, timeout=self.poll))[0]:
            gone = not state.expired and await request.is_disconnected()
            if state.expired or gone:
                batcher.cancel(job)
                future.cancel()
                if gone:
                    note(request, "the client went away")
                    raise Problem(499, "disconnected", "the client went away")
                raise shutting_down(state)
        try:
            return future.result()
        except ShuttingDown:
            raise shutting_down(state) from None
        except RequestError as e:
            raise Problem(422, "invalid_request", str(e)) from None
        except Exception as e:  # noqa: BLE001 - the decoding thread's failure, named, as JSON
            message = f"decoding failed: {type(e).__name__}: {' '.join(str(e).split())}".rstrip(": ")
            note(request, message)
            raise Problem(500, "decoding_failed", message, exception=type(e).__name__) from None


def shutting_down(state: ServerState) -> Problem:
    if state.expired and state.forced:
        why = "was told to stop at once"
    elif state.expired and state.grace is not None:
        why = f"its grace period ({state.grace:g} s) is over"
    else:
        why = "it takes no new work"
    return Problem(
        503,
        "shutting_down",
        f"the server is shutting down and {why}: send the request again (to another instance)",
        headers={"Retry-After": "1", "Connection": "close"},
    )


# -- languages ---------------------------------------------------------------------------------------

# English names of ISO 639-1 codes (a code not here is named by itself)
NAMES = {
    "af": "Afrikaans",
    "ar": "Arabic",
    "az": "Azerbaijani",
    "bg": "Bulgarian",
    "bn": "Bengali",
    "ca": "Catalan",
    "cs": "Czech",
    "da": "Danish",
    "de": "German",
    "el": "Greek",
    "en": "English",
    "eo": "Esperanto",
    "es": "Spanish",
    "et": "Estonian",
    "eu": "Basque",
    "fa": "Persian",
    "fi": "Finnish",
    "fr": "French",
    "ga": "Irish",
    "gl": "Galician",
    "gu": "Gujarati",
    "he": "Hebrew",
    "hi": "Hindi",
    "hr": "Croatian",
    "hu": "Hungarian",
    "id": "Indonesian",
    "is": "Icelandic",
    "it": "Italian",
    "ja": "Japanese",
    "kk": "Kazakh",
    "ko": "Korean",
    "lt": "Lithuanian",
    "lv": "Latvian",
    "ms": "Malay",
    "nb": "Norwegian",
    "nl": "Dutch",
    "pl": "Polish",
    "ps": "Pashto",
    "pt": "Portuguese",
    "ro": "Romanian",
    "ru": "Russian",
    "sk": "Slovak",
    "sl": "Slovenian",
    "sq": "Albanian",
    "sr": "Serbian",
    "sv": "Swedish",
    "ta": "Tamil",
    "th": "Thai",
    "tl": "Tagalog",
    "tr": "Turkish",
    "uk": "Ukrainian",
    "ur": "Urdu",
    "vi": "Vietnamese",
    "zh": "Chinese",
}


def name(code: str) -> str:
    return NAMES.get(str(code).lower(), str(code))


def languages(engine: Engine) -> tuple[str, str] | None:
    """(source, target) language codes the engine's model serves, from its data.json (None: not named)."""
    pair = engine.info.get("languages") or {}
    src, tgt = pair.get("src"), pair.get("tgt")
    return (str(src), str(tgt)) if src and tgt else None
