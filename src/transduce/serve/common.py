"""What the server's endpoints share: the limits, JSON errors, the token check of sentences, and
waiting for a job of the decoding thread (with the client's disconnect, a decoding failure and the
end of a shutdown's grace period each answered as JSON)."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from .batcher import QueueFull, ShuttingDown
from .backend import DEFAULT_MAX_TOKENS, RequestError, scrub


@dataclass
class Limits:
    """What one request may ask for."""

    max_body_bytes: int = 1 << 20
    max_sentences: int = 64  # Sentences per request
    max_chars: int = 2000  # Characters per sentence
    max_tokens: int = DEFAULT_MAX_TOKENS  # Subword tokens per sentence (EOS not counted)
    max_queue: int = 256  # Requests waiting to be decoded; more are answered 429
    max_beam: int = 16
    max_len_offset: int = 256  # The largest max_len_offset a request may ask for


def error(status: int, code: str, message: str, headers: dict | None = None, **extra):
    """A JSON error response: {"error": CODE, "message": ..., and any `extra` that is not None};
    the message without the server's paths (`engines.scrub`: an exception may name a file)."""
    from fastapi.responses import JSONResponse

    body = {"error": code, "message": scrub(message), **{k: v for k, v in extra.items() if v is not None}}
    return JSONResponse(body, status_code=status, headers=headers)


def is_json(content_type: str | None) -> bool:
    """Whether a Content-Type says JSON, as FastAPI decides it (application/json, application/*+json)."""
    media = (content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def number(x: float | None) -> float | None:
    """A score for JSON: NaN and infinities (greedy's, an empty output's) as null."""
    return None if x is None or not math.isfinite(x) else x


def check_sentences(encode, sentences: list[str], limits: Limits, field: str = "sentences", extra: int = 0):
    """(a JSON error or None, the tokens of the sentences with EOS): each sentence valid Unicode and
    within the token limit, max_tokens (+ `extra`) (`encode`: sentence -> token ids)."""
    tokens = 0
    most = limits.max_tokens + extra
    for i, s in enumerate(sentences):
        where = f"{field}.{i}" if len(sentences) > 1 or field == "sentences" else field
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            return error(422, "invalid_request", f"{where}: not valid Unicode (a lone surrogate)", field=where), 0
        n = len(encode(s))
        if n > most:
            how = " (max_tokens + max_len_offset: the longest output the server gives)" if extra else ""
            return error(422, "limit_exceeded", f"{where}: {n} subword tokens, more than {most}{how}",
                         limit="max_tokens", value=limits.max_tokens, field=where), 0
        tokens += n + 1
    return None, tokens


def note(request, text: str) -> None:
    """Something for the request's log line (`serve.ops.RequestLog`)."""
    request.scope.setdefault("state", {})["log_note"] = text


def shutting_down(state: dict):
    grace = state.get("grace")
    if state["expired"] and state.get("forced"):
        why = "was told to stop at once"
    elif state["expired"] and grace is not None:
        why = f"its grace period ({grace:g} s) is over"
    else:
        why = "it takes no new work"
    return error(503, "shutting_down", f"the server is shutting down and {why}: send the request again (to another "
                 "instance)", headers={"Retry-After": "1", "Connection": "close"})


def unavailable(state: dict):
    """503 while the model loads or the server shuts down; None when requests are taken."""
    if state["engine"] is None:
        return error(503, "loading", "the model is still loading", headers={"Retry-After": "5"})
    return shutting_down(state) if state["draining"] else None


async def run_job(submit, state: dict, limits: Limits, request, poll: float, retry_after: int = 1):
    """(the result of the job `submit()` queues, None) or (None, the JSON error): 429 with a full
    queue, 503 while shutting down or once a shutdown's grace period is over, 499 when the client
    goes away (the job is dropped), 422 for a `RequestError`, 500 decoding_failed naming the
    exception of any other failure (or once the decoding thread has ended)."""
    try:
        job = submit()
    except QueueFull as exc:
        return None, error(429, "queue_full", str(exc), headers={"Retry-After": str(retry_after)},
                           limit="max_queue", value=limits.max_queue)
    except ShuttingDown:
        return None, shutting_down(state)
    except RuntimeError as exc:
        return None, error(500, "decoding_failed", str(exc))
    future = asyncio.wrap_future(job.future)
    while not (await asyncio.wait({future}, timeout=poll))[0]:
        gone = not state["expired"] and await request.is_disconnected()
        if state["expired"] or gone:
            state["batcher"].cancel(job)
            future.cancel()
            if gone:
                note(request, "the client went away")
                return None, error(499, "disconnected", "the client went away")
            return None, shutting_down(state)
    try:
        return future.result(), None
    except ShuttingDown:
        return None, shutting_down(state)
    except RequestError as e:
        return None, error(422, "invalid_request", str(e))
    except Exception as e:  # noqa: BLE001 - the decoding thread's failure, named, as JSON
        message = f"decoding failed: {type(e).__name__}: {' '.join(str(e).split())}".rstrip(": ")
        note(request, message)
        return None, error(500, "decoding_failed", message, exception=type(e).__name__)


def request_model(name: str, limits: Limits, defaults, first: dict, last: dict):
    """A request's pydantic model (strict: "4" is not a beam size; no unknown fields): the fields of
    `first` (`(type, Field)` by name; `str` is a sentence of at most max_chars), the search settings,
    then `last`'s, the limits in them so that the OpenAPI document states them."""
    from typing import Annotated

    from pydantic import ConfigDict, Field, StringConstraints, create_model

    sentence = Annotated[str, StringConstraints(max_length=limits.max_chars)]
    first = {k: (list[sentence] if t == list[str] else sentence if t is str else t, f) for k, (t, f) in first.items()}
    return create_model(
        name, __config__=ConfigDict(extra="forbid", strict=True), **first,
        beam=(int, Field(defaults.beam, ge=1, le=limits.max_beam, description="beam size (6.1: 4)")),
        alpha=(float, Field(defaults.alpha, ge=0.0, le=10.0, allow_inf_nan=False,
                            description="length penalty ((5+|Y|)/6)^alpha (6.1: 0.6)")),
        max_len_offset=(int, Field(defaults.max_len_offset, ge=0, le=limits.max_len_offset,
                                   description="maximum output length = input length + this (6.1: 50)")),
        greedy=(bool, Field(False, description="greedy decoding (beam and alpha ignored)")),
        **last,
    )


# Pydantic errors over a limit, by the field: the limit each names (a string too long: max_chars)
LIMIT_OF_FIELD = {"sentences": "max_sentences", "beam": "max_beam", "max_len_offset": "max_len_offset", "n_best": "max_beam"}
