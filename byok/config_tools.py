"""The optional backends of server-side tools: ``[search]`` (WebSearch) and ``[images]``
(GenerateImage). A tool whose backend is not configured is not offered to the model.

``[search]`` is an HTTP search API answered with JSON: ``kind = "brave"`` (the Brave Search
API: ``GET {url}?q=...&count=N`` with the key in ``X-Subscription-Token``) or ``"searxng"`` (a
SearXNG instance: ``GET {url}?q=...&format=json``, the key, if any, as a bearer token).
``[images]`` is an OpenAI-compatible images endpoint (``POST {base_url}/images/generations``).
Keys are read from the environment when a call needs them, as for providers.
"""

from __future__ import annotations

import os
from typing import Final, Literal, get_args

import attrs

from byok.config import DEFAULTS_SOURCE, ConfigError
from byok.config_reader import Table, check_url, pick

SearchKind = Literal["brave", "searxng"]
SEARCH_KINDS: Final[tuple[str, ...]] = get_args(SearchKind)
BRAVE_URL: Final = "https://api.search.brave.com/res/v1/web/search"
_SEARCH_KEYS = ("kind", "url", "api_key_env", "api_key", "max_results", "timeout_s")
_IMAGES_KEYS = ("base_url", "model", "api_key_env", "api_key", "size", "timeout_s")


@attrs.frozen
class Secret:
    """A key from the file or (read at each use) from the environment; kept out of repr."""

    env: str | None = None
    literal: str | None = attrs.field(default=None, repr=False)
    source: str = attrs.field(default=DEFAULTS_SOURCE, eq=False)
    key_path: str = attrs.field(default="", eq=False)

    def value(self) -> str | None:
        if self.env is None:
            return self.literal
        value = os.environ.get(self.env)
        if not value:
            state = "is empty" if value == "" else "is not set"
            raise ConfigError(
                self.source, f"{self.key_path}.api_key_env", f"environment variable {self.env} {state}"
            )
        return value


@attrs.frozen
class SearchConfig:
    kind: SearchKind
    url: str
    key: Secret = attrs.Factory(Secret)
    max_results: int = 5
    timeout_s: float = 20.0


@attrs.frozen
class ImagesConfig:
    base_url: str
    model: str
    key: Secret = attrs.Factory(Secret)
    size: str = "1024x1024"
    timeout_s: float = 120.0


def _secret(t: Table) -> Secret:
    env, literal = t.string("api_key_env"), t.string("api_key")
    if env is not None and literal is not None:
        raise ConfigError(t.source, t.path, "set at most one of api_key and api_key_env")
    return Secret(env, literal, t.source, t.path)


def load_search(t: Table) -> SearchConfig | None:
    if not t.data:
        return None
    t.check_keys(_SEARCH_KEYS)
    kind = t.string("kind", required=True)
    if kind not in SEARCH_KINDS:
        raise t.error("kind", f"unknown kind {kind!r} (expected one of: {', '.join(SEARCH_KINDS)})")
    url = t.string("url")
    if url is None and kind != "brave":
        raise t.error("url", f"missing required key (the {kind} instance's search URL)")
    key = _secret(t)
    if kind == "brave" and key.env is None and key.literal is None:
        raise ConfigError(t.source, t.path, "the Brave Search API needs a key: set api_key_env (or api_key)")
    max_results = t.integer("max_results")
    if max_results is not None and max_results > 20:
        raise t.error("max_results", f"must be <= 20, got {max_results}")
    return SearchConfig(
        kind=kind,  # type: ignore[arg-type]  # narrowed by the membership test above
        url=check_url(t, "url", url or BRAVE_URL),
        key=key,
        max_results=pick(max_results, 5),
        timeout_s=pick(t.number("timeout_s"), 20.0),
    )


def load_images(t: Table) -> ImagesConfig | None:
    if not t.data:
        return None
    t.check_keys(_IMAGES_KEYS)
    base_url = check_url(t, "base_url", t.string("base_url", required=True) or "")
    model = t.string("model", required=True)
    assert model is not None
    size = pick(t.string("size"), "1024x1024")
    width, _, height = size.partition("x")
    if not (width.isdigit() and height.isdigit()) and size != "auto":
        raise t.error("size", f'expected WIDTHxHEIGHT (such as "1024x1024") or "auto", got {size!r}')
    return ImagesConfig(
        base_url=base_url,
        model=model,
        key=_secret(t),
        size=size,
        timeout_s=pick(t.number("timeout_s"), 120.0),
    )


def tool_backends(search: SearchConfig | None, images: ImagesConfig | None) -> frozenset[str]:
    """The backend names configured (cursor/tools/work.BACKENDS)."""
    return frozenset(name for name, c in (("search", search), ("images", images)) if c is not None)
