"""The native API's POST /translate (docs/serve.md): its request's schema with the server's limits
in it (`request_schema`, stated in the OpenAPI document), its answer's shapes (`TranslateResponse`)
and the route itself, which hands a request in LibreTranslate's fields to `serve.libre`. Its
sentences are decoded as one job of the batcher, or, with `split_sentences`, their sentences.
"""

from __future__ import annotations

from dataclasses import replace

from pydantic import BaseModel, Field, ValidationError

from ..decoding.settings import SearchSettings
from .common import Limits, Problem, Server, number
from .fields import read_fields, request_model, validation_problem
from .splitting import decode_texts, mode_of, source_language


class Hypothesis(BaseModel):
    text: str
    score: float | None = Field(None, description="log P(Y|X) / ((5+|Y|)/6)^alpha; null for greedy")
    logprob: float | None = Field(None, description="log P(Y|X), EOS included; null for greedy")
    tree: str | None = Field(
        None,
        description="a parsing model: the tree of this output over the sentence's Penn "
        "Treebank tokens, repaired as `transduce parse` does",
    )


class Translation(BaseModel):
    text: str = Field(description="the best translation")
    score: float | None = Field(None, description="its score, if `scores` was asked for (null for greedy)")
    logprob: float | None = Field(None, description="its log-probability, if `scores` was asked for")
    tree: str | None = Field(None, description="a parsing model: its tree, bracketed on one line (`transduce parse`)")
    n_best: list[Hypothesis] | None = Field(None, description="the n_best best hypotheses, best first, if n_best > 1")


class TranslateResponse(BaseModel):
    translations: list[Translation] = Field(description="one per sentence, in the order given")


def request_schema(limits: Limits, defaults: SearchSettings) -> type[BaseModel]:
    """The request's schema, the limits in it (so the OpenAPI document states them)."""
    return request_model(
        "TranslateRequest",
        limits,
        defaults,
        {
            "sentences": (
                list[str],
                Field(
                    max_length=limits.max_sentences,
                    description="sentences to translate, one translation each (empty -> empty)",
                ),
            )
        },
        {
            "n_best": (int, Field(1, ge=1, le=limits.max_beam, description="hypotheses per sentence (at most beam)")),
            "scores": (bool, Field(False, description="return scores and log-probabilities")),
            "split_sentences": (
                str | bool,
                Field(
                    "off",
                    description="split each input into sentences, translate them, join them back, its whitespace "
                    "kept: on (or 1, true), nonewlines (not at line breaks), off (or 0, false: each input "
                    "is one sentence, the default), as DeepL spells them; an input's score and logprob are "
                    "then its sentences' sums, its n_best their k-th hypotheses put together",
                    examples=["on", "nonewlines", "off"],
                ),
            ),
        },
    )


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


def add_translate_route(app, server: Server, keys, errors: dict) -> None:
    """POST /translate: its body read once (`fields.read_fields`); a request that carries a field
    of LibreTranslate's is that API's (`libre.translate`), any other the native API's, validated
    by its schema (`request_schema`, stated in the OpenAPI document)."""
    from fastapi import Depends, Request

    from . import libre

    TranslateRequest = request_schema(server.limits, server.defaults)

    async def translate(request, given=Depends(keys)):
        fields = await read_fields(request)
        if libre.is_libretranslate(fields):
            return await libre.translate(server, request, fields, given)
        if fields.json and fields.problem is not None:
            raise fields.problem
        server.require_key(given)
        content_type = request.headers.get("content-type")
        if not fields.json:
            raise validation_problem([], content_type, server.limits)  # 415, saying what to send
        if fields.value is None:
            raise Problem(422, "invalid_request", "body: Field required")
        try:
            req = TranslateRequest.model_validate(fields.value)
        except ValidationError as e:
            raise validation_problem(e.errors(), content_type, server.limits) from None
        engine, batcher = server.lookup()
        if req.n_best > (1 if req.greedy else req.beam):
            raise Problem(
                422,
                "invalid_request",
                f"n_best ({req.n_best}) must be at most {'1 with greedy' if req.greedy else f'beam ({req.beam})'}",
                field="n_best",
            )
        settings = replace(
            server.defaults,
            beam=req.beam,
            alpha=req.alpha,
            max_len_offset=req.max_len_offset,
            n_best=req.n_best,
            greedy=req.greedy,
        )
        try:
            mode = mode_of(req.split_sentences, "off")
        except ValueError as e:
            raise Problem(422, "invalid_request", str(e), field="split_sentences") from None
        if mode != "off":  # each input split into sentences, all of them one job
            if engine.tree is not None:
                raise Problem(
                    422,
                    "invalid_request",
                    "split_sentences: a parsing model parses each input as one sentence (leave split_sentences off)",
                    field="split_sentences",
                )
            results = await decode_texts(
                server,
                engine,
                batcher,
                req.sentences,
                source_language(engine),
                mode,
                settings,
                request,
                where=lambda k, i, j: f"sentences.{i} (its sentence {j + 1})",
            )
            return _response(req, results, req.sentences, engine.tree)
        tokens = server.count_tokens(engine.encode, req.sentences)
        results = await server.decode(batcher, req.sentences, settings, tokens, request)
        return _response(req, results, req.sentences, engine.tree)

    translate.__annotations__.update(request=Request, given=list)  # classes the postponed annotations cannot name
    ref = {"$ref": "#/components/schemas/TranslateRequest"}
    body = {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}
    app.post(
        "/translate",
        response_model=TranslateResponse,
        responses=errors,
        openapi_extra=body,
        summary="translate sentences (beam search, Section 6.1)",
    )(translate)
    document = app.openapi

    def openapi() -> dict:  # the request's schema among the document's, as a body parameter's would be
        if app.openapi_schema is None:
            document()["components"]["schemas"]["TranslateRequest"] = TranslateRequest.model_json_schema()
        return app.openapi_schema

    app.openapi = openapi
