"""The demo page, GET / (demo.html beside this module; its Content-Security-Policy lets nothing load
from anywhere but the server), and POST /attention under it (docs/serve.md): the weights of one
source and a target, teacher-forced, or the model's own translation, run on the decoding thread in
its turn (`Batcher.call`) under the same limits, queue and API key as /translate.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from pydantic import BaseModel, Field

from .common import Limits, check_sentences, error, request_model, run_job, unavailable
from .backend import Search

# The page's Content-Security-Policy: nothing from anywhere but the server's own origin
CSP = ("default-src 'none'; connect-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
       "img-src data:; frame-src 'self'; base-uri 'none'; form-action 'none'")


class AttentionResponse(BaseModel):
    attention: dict[str, Any] | None = Field(None, description="the weights (`transduce attention --json`'s format, "
                                             "transduce-attention/1), if `weights`")
    page: str | None = Field(None, description="the self-contained page that draws them, if `page`")
    tree: str | None = Field(None, description="a parsing model: the tree of the target, bracketed")
    svg: str | None = Field(None, description="a parsing model: that tree as an SVG picture")


def attention_schema(limits: Limits, defaults: Search) -> type[BaseModel]:
    return request_model("AttentionRequest", limits, defaults, {
        "source": (str, Field(description="one source sentence")),
        # as long as an output of the server may be: max_tokens + max_len_offset tokens (checked), any characters
        "target": (str | None, Field(None, description="its translation, teacher-forced; null: the model's own"))}, {
        "weights": (bool, Field(True, description="return the weights as JSON")),
        "page": (bool, Field(False, description="return the page that draws them (`transduce attention --html`)"))})


def add_demo_routes(app, state: dict, limits: Limits, defaults: Search, *, auth: list, errors: dict, poll: float) -> None:
    """GET / (the page) and POST /attention."""
    from fastapi import Request
    from fastapi.responses import HTMLResponse

    AttentionRequest = attention_schema(limits, defaults)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def demo():
        page = resources.files(__package__).joinpath("demo.html").read_text(encoding="utf-8")
        return HTMLResponse(page, headers={"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                                                  "Cache-Control": "no-store"})

    async def attention(req, request: Request):
        e, batcher = state["engine"], state["batcher"]
        if (problem := unavailable(state)) is not None:
            return problem
        if e.attention is None:
            return error(501, "not_supported", f"the {e.info.get('engine')} engine gives no attention weights: serve "
                         "the PyTorch model (transduce serve MODEL, without --engine ct2)")
        if not req.source.strip():
            return error(422, "invalid_request", "source: an empty sentence has no attention to show", field="source")
        if not (req.weights or req.page):
            return error(422, "invalid_request", "ask for the weights, the page or both", field="weights")
        problem, tokens = check_sentences(e.encode, [req.source], limits, field="source")
        if problem is None and req.target is not None:
            problem, _ = check_sentences(e.encode_target, [req.target], limits, field="target", extra=limits.max_len_offset)
        if problem is not None:
            return problem
        search = Search(req.beam, req.alpha, req.max_len_offset, 1, req.greedy)
        job = lambda: batcher.call(lambda: e.attention(req.source, req.target, search), tokens)  # noqa: E731
        data, problem = await run_job(job, state, limits, request, poll)
        if problem is not None:
            return problem
        out: dict[str, Any] = {"attention": data if req.weights else None, "page": None, "tree": None, "svg": None}
        if req.page:
            from ..views.page import render_page

            out["page"] = render_page(data, title=req.source[:80])
        if e.tree is not None:
            from ..parsing.svg import tree_svg

            tree = e.tree(req.source, data["sentences"][0]["target_text"])
            if tree is not None:
                out["tree"], out["svg"] = str(tree), tree_svg(tree, title=" ".join(tree.leaves()))
        return out

    attention.__annotations__.update(req=AttentionRequest, request=Request)
    app.post("/attention", response_model=AttentionResponse, dependencies=auth,
             responses={**errors, 501: errors[400]},
             summary="the attention weights of one sentence and its translation (transduce attention)")(attention)
