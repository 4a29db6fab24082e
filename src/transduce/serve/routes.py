"""The routes a request takes through the models of one server (`serve.models.ModelSet` finds
them): a leg (a model, and a multilingual model's `>>xx<<` target token put before each source
sentence), a route of one leg or of two through a pivot language, with the request's search
settings (`Route`, hashable: the batcher decodes jobs with equal routes together), `RouteError`
where no model serves the pair, and the server's batcher as one route's (`RouteBatcher`).
docs/serve.md, "Many models behind one server".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..decoding.settings import SearchSettings


@dataclass(frozen=True)
class Leg:
    model: str
    token: str | None = None  # put before each source sentence (a multilingual model's target)


@dataclass(frozen=True)
class Route:
    """A request's way through the models (hashable: the batcher decodes jobs with equal routes
    together): one leg, or two through `pivot`, the last with the request's search settings."""

    legs: tuple[Leg, ...]
    search: SearchSettings
    pivot: str | None = None


class RouteError(ValueError):
    """No model translates the request's source into its target: the message says what is served."""


class RouteBatcher:
    """The server's batcher as one route's: each job it submits decodes on that route (its
    settings the route with the job's search settings); everything else is the batcher's."""

    def __init__(self, batcher, route: Route):
        self._batcher, self._route = batcher, route

    def submit(self, sentences: list[str], settings, tokens: int):
        return self._batcher.submit(sentences, replace(self._route, search=settings), tokens)

    def __getattr__(self, name: str):
        return getattr(self._batcher, name)


def _with_token(token: str | None, sentence: str) -> str:
    return f"{token} {sentence}" if token and sentence.strip() else sentence
