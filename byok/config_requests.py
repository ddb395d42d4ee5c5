"""What a provider's requests may carry beyond byok's own: a model's ``extra_body`` fields,
a provider's ``headers``, and the per-kind default of ``prompt_cache_key``.

``extra_body`` reaches what byok has no option for (reasoning effort, a thinking budget,
sampling settings). It may not set a field byok builds itself: the model name, streaming, the
history and tools (every turn must extend the previous request byte for byte), the replay
fields the stateless Responses API needs, or a field that has its own option.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from byok.config_reader import Table
from byok.providers.anthropic_request import DEFAULT_MAX_TOKENS
from byok.providers.kinds import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES

if TYPE_CHECKING:
    from byok.config import ModelConfig

_ALWAYS = {"model": "upstream_model", "stream": "", "tools": ""}
# Per kind: field -> the option that sets it ("" when byok alone decides it).
_OWNED: dict[str, dict[str, str]] = {
    OPENAI_CHAT: {
        **_ALWAYS,
        "messages": "",
        "max_tokens": "max_output_tokens",
        "prompt_cache_key": "prompt_cache_key (on the provider)",
    },
    OPENAI_RESPONSES: {
        **_ALWAYS,
        "prompt_cache_key": "prompt_cache_key (on the provider)",
        "input": "",
        "instructions": "",
        "include": "",
        "store": "",
        "max_output_tokens": "max_output_tokens",
    },
    ANTHROPIC: {
        **_ALWAYS,
        "messages": "",
        "system": "",
        "max_tokens": "max_output_tokens",
        "cache_control": "prompt_cache (on the provider)",
    },
}


def extra_body_problem(kind: str, model: ModelConfig) -> tuple[str, str] | None:
    """(key path below ``extra_body``, problem) for the first field ``model.extra_body`` may not
    set for a provider of ``kind``; None when all may."""
    owned = _OWNED.get(kind, _ALWAYS)
    for key, value in model.extra_body:
        if key in owned:
            option = owned[key]
            instead = f"; set {option} instead" if option else ""
            return f".{key}", f"byok sets {key!r} itself{instead}"
        if kind == ANTHROPIC and key == "thinking":
            problem = _thinking_problem(value, model.max_output_tokens)
            if problem is not None:
                return problem
    return None


def _thinking_problem(value: object, max_output_tokens: int | None) -> tuple[str, str] | None:
    """The Messages API wants the thinking budget below max_tokens; say so before any request."""
    budget = value.get("budget_tokens") if isinstance(value, dict) else None
    if not isinstance(budget, int) or isinstance(budget, bool):
        return None  # another shape ("adaptive" thinking): the API judges it
    limit = DEFAULT_MAX_TOKENS if max_output_tokens is None else max_output_tokens
    if budget < limit:
        return None
    source = "max_output_tokens" if max_output_tokens is not None else "the default max_output_tokens"
    return (
        ".thinking.budget_tokens",
        f"{budget} must be below {source} ({limit}), which includes the thinking; raise max_output_tokens",
    )


# Framing headers httpx and byok set for every request; a provider's own may not change them.
_FRAMING_HEADERS = frozenset(
    {"host", "content-length", "content-type", "transfer-encoding", "connection", "accept", "accept-encoding"}
)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def provider_headers(t: Table, has_key: bool) -> tuple[tuple[str, str], ...]:
    """``t``'s ``headers`` table as (lower-case name, value) pairs; ``has_key``: the provider
    sends an API key (whose header the table may then not set as well)."""
    table = t.table("headers")
    out = []
    for name in table.data:
        where = f"headers.{name}"
        if not _TOKEN.fullmatch(name):
            raise t.error(where, "not a valid HTTP header name")
        value = table.string(name, nonempty=False)
        assert value is not None
        if any(c in value for c in "\r\n\0"):
            raise t.error(where, "a header value cannot hold a line break or NUL")
        lower = name.lower()
        if lower in _FRAMING_HEADERS:
            raise t.error(where, "byok sets this header itself")
        if has_key and lower in ("authorization", "x-api-key"):
            raise t.error(where, "api_key/api_key_env already sends the key in this header; set one of them")
        out.append((lower, value))
    return tuple(out)


def default_prompt_cache_key(kind: str, base_url: str) -> bool:
    """On for the Responses API and for OpenAI's own Chat endpoint; off for other Chat servers,
    some of which refuse fields they do not know."""
    if kind == "openai_responses":
        return True
    return kind == "openai_chat" and urlsplit(base_url).hostname == "api.openai.com"
