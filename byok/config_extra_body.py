"""What a model's ``extra_body`` may add to its provider requests.

``extra_body`` reaches what byok has no option for (reasoning effort, a thinking budget,
sampling settings). It may not set a field byok builds itself: the model name, streaming, the
history and tools (every turn must extend the previous request byte for byte), the replay
fields the stateless Responses API needs, or a field that has its own option.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
