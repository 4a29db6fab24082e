"""A request's fields, read once for both APIs (`serve.native`, `serve.libre`): a JSON body's
value, or the query string's and a form body's fields as LibreTranslate reads them (`Fields`,
`read_fields`); a request's pydantic schema with the server's limits in it (`request_model`), and
what the schema refuses as a `common.Problem` (`validation_problem`: 415, 400, or 422 naming the
limit a field exceeds)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import parse_qsl

from ..decoding.settings import SearchSettings
from .common import Limits, Problem

FORM = "application/x-www-form-urlencoded"


def is_json(content_type: str | None) -> bool:
    """Whether a Content-Type says JSON, as FastAPI decides it (application/json, application/*+json)."""
    media = (content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


@dataclass
class Fields:
    """A request's fields, read once: a JSON body's value (`json`: it was sent as JSON; `value`
    any JSON value, None for no body), or the query string's and a form body's fields (the query's
    first, as LibreTranslate reads them). `problem`: a body that could not be read."""

    json: bool
    value: object
    problem: Problem | None = None

    def keys(self) -> set:
        return set(self.value) if isinstance(self.value, dict) else set()


async def read_fields(request) -> Fields:
    """The request's fields (its body, already read and held to max_body_bytes by `app.BodyLimit`)."""
    body = await request.body()
    content_type = request.headers.get("content-type") or ""
    if is_json(content_type):
        if not body:
            return Fields(True, None)
        try:
            return Fields(True, json.loads(body))
        except json.JSONDecodeError as e:
            return Fields(True, None, Problem(400, "invalid_json", f"the body is not valid JSON: {e.msg}"))
        except ValueError:  # not UTF-8 (nor UTF-16, UTF-32)
            return Fields(True, None, Problem(400, "invalid_json", "the body is not valid JSON in UTF-8"))
    media = content_type.split(";")[0].strip().lower()
    fields: dict = {}
    for k, v in parse_qsl(request.url.query, keep_blank_values=True):
        fields.setdefault(k, v)  # the first of a repeated field, as LibreTranslate reads it
    if media == "multipart/form-data":
        return Fields(
            False,
            fields,
            Problem(
                400,
                "invalid_request",
                f"multipart/form-data is not read here: send the fields as JSON, as {FORM} or in the query string",
            ),
        )
    try:
        form = body.decode("utf-8") if media == FORM else ""
    except UnicodeDecodeError:
        return Fields(False, fields, Problem(400, "invalid_request", "the form body is not UTF-8"))
    for k, v in parse_qsl(form, keep_blank_values=True):
        fields.setdefault(k, v)
    return Fields(False, fields)


def validation_problem(errors: list[dict], content_type: str | None, limits: Limits) -> Problem:
    """A request the schema refuses (pydantic's `errors`): a body not sent as JSON is 415, bad JSON
    400, a field over a limit names the limit (422 limit_exceeded; `LIMIT_OF_FIELD`), anything else
    422 invalid_request."""
    if not is_json(content_type):  # FastAPI reads no body that is not declared JSON
        given = f"this request's is {content_type}" if content_type else "this request has none"
        return Problem(
            415, "unsupported_media_type", f"the body must be JSON, sent with Content-Type: application/json ({given})"
        )
    errors = errors or [{}]
    where = [".".join(str(x) for x in e.get("loc", ()) if x != "body") for e in errors]
    for e, loc in zip(errors, where):
        if e.get("type") == "json_invalid":
            return Problem(
                400, "invalid_json", f"the body is not valid JSON: {e.get('ctx', {}).get('error', e.get('msg'))}"
            )
        if e.get("type") in ("too_long", "string_too_long", "less_than_equal") and loc:
            limit = "max_chars" if e.get("type") == "string_too_long" else LIMIT_OF_FIELD.get(loc.split(".")[0])
            if limit is not None:
                return Problem(
                    422,
                    "limit_exceeded",
                    f"{loc}: {e.get('msg')}",
                    limit=limit,
                    value=getattr(limits, limit),
                    field=loc,
                )
    return Problem(
        422,
        "invalid_request",
        f"{where[0] or 'body'}: {errors[0].get('msg', 'invalid request')}",
        field=where[0] or None,
    )


def request_model(name: str, limits: Limits, defaults: SearchSettings, first: dict, last: dict):
    """A request's pydantic model (strict: "4" is not a beam size; no unknown fields): the fields of
    `first` (`(type, Field)` by name; `str` is a sentence of at most max_chars), the search settings,
    then `last`'s, the limits in them so that the OpenAPI document states them."""
    from typing import Annotated

    from pydantic import ConfigDict, Field, StringConstraints, create_model

    sentence = Annotated[str, StringConstraints(max_length=limits.max_chars)]
    first = {k: (list[sentence] if t == list[str] else sentence if t is str else t, f) for k, (t, f) in first.items()}
    return create_model(
        name,
        __config__=ConfigDict(extra="forbid", strict=True),
        **first,
        beam=(int, Field(defaults.beam, ge=1, le=limits.max_beam, description="beam size (6.1: 4)")),
        alpha=(
            float,
            Field(
                defaults.alpha,
                ge=0.0,
                le=10.0,
                allow_inf_nan=False,
                description="length penalty ((5+|Y|)/6)^alpha (6.1: 0.6)",
            ),
        ),
        max_len_offset=(
            int,
            Field(
                defaults.max_len_offset,
                ge=0,
                le=limits.max_len_offset,
                description="maximum output length = input length + this (6.1: 50)",
            ),
        ),
        greedy=(bool, Field(False, description="greedy decoding (beam and alpha ignored)")),
        **last,
    )


# Pydantic errors over a limit, by the field: the limit each names (a string too long: max_chars)
LIMIT_OF_FIELD = {
    "sentences": "max_sentences",
    "beam": "max_beam",
    "max_len_offset": "max_len_offset",
    "n_best": "max_beam",
}
