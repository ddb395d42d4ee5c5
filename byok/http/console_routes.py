"""The control API's route table: a handler registers with ``@route(method, pattern)`` and
takes the request, returning (status, JSON or bytes). ``{id}`` in a pattern is one path segment.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import attrs

from byok.console.entries import ID_PATTERN
from byok.http import console_http as ch
from byok.http.asgi import Scope

if TYPE_CHECKING:
    from byok.http.console_api import ControlApi


@attrs.frozen
class ApiRequest:
    method: str
    params: dict[str, str]
    query: dict[str, str]
    body: Any
    scope: Scope


Handler = Callable[["ControlApi", ApiRequest], Awaitable[tuple[int, Any]]]

@attrs.frozen
class Route:
    method: str
    pattern: str  # as written, "/providers/{id}" (the OpenAPI document's path)
    regex: re.Pattern[str]
    handler: Handler


ROUTES: list[Route] = []
_ID = r"(?P<id>[^/]+)"


def route(method: str, pattern: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        ROUTES.append(Route(method, pattern, re.compile(pattern.replace("{id}", _ID) + "$"), fn))
        return fn

    return register


def path_id(req: ApiRequest, field: str = "id") -> str:
    value = req.params["id"]
    if not ID_PATTERN.fullmatch(value):
        raise ch.ApiError(400, field, f"{value[:100]!r} is not an id")
    return value


def int_param(req: ApiRequest, name: str, default: int | None = None, minimum: int = 0) -> int | None:
    raw = req.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ch.ApiError(400, name, f"expected an integer, got {raw[:50]!r}") from None
    if value < minimum:
        raise ch.ApiError(400, name, f"must be >= {minimum}, got {value}")
    return value
