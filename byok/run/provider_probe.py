"""What the console asks of a provider outside any run: its model list (discovery), and a
one-token streamed call (the test: reachable, time to first token, tokens per second, or the
provider's error in plain words). Both clean the provider's text of its secrets."""

from __future__ import annotations

import json
from typing import Any, Final

import httpx
import trio

from byok.config import ConfigError, ProviderConfig
from byok.model.events import ProviderError, TextDelta, ThinkingDelta, UsageReported
from byok.model.request import ModelRequest, ModelSettings, UserTurn
from byok.providers.adapters import adapter_for
from byok.providers.http_errors import http_error
from byok.providers.kinds import ANTHROPIC, OPENAI_RESPONSES
from byok.providers.runner import CallStats, stream_call
from byok.providers.secrets import provider_secrets, redact_text

PROBE_TIMEOUT_S: Final = 30.0
MAX_LIST_BYTES: Final = 4 * 2**20
# Names a model list uses for the context window (OpenAI lists none; gateways and local servers do).
_CONTEXT_FIELDS: Final = ("context_window", "context_length", "max_context_length", "max_input_tokens")


class ProbeError(Exception):
    """The provider's answer, or why there was none, in one redacted line."""


def _list_url(provider: ProviderConfig) -> str:
    base = provider.base_url.rstrip("/")
    if provider.kind == ANTHROPIC and not base.endswith("/v1"):
        base += "/v1"
    return base + "/models"


def _headers(provider: ProviderConfig) -> tuple[tuple[str, str], ...]:
    endpoint = adapter_for(provider.kind).endpoint(provider.base_url, provider.api_key(), provider.headers)
    return endpoint.headers


async def discover(http: httpx.AsyncClient, provider: ProviderConfig) -> list[dict[str, Any]]:
    """The provider's models: ``[{"id", "context_window"?, "display_name"?}]``, sorted by id."""
    secrets = provider_secrets(provider.api_key(), provider.headers)
    params = {"limit": "1000"} if provider.kind == ANTHROPIC else None
    try:
        with trio.fail_after(PROBE_TIMEOUT_S):
            resp = await http.get(_list_url(provider), headers=list(_headers(provider)), params=params)
    except trio.TooSlowError:
        raise ProbeError(f"no answer from {_list_url(provider)} within {PROBE_TIMEOUT_S:g}s") from None
    except httpx.HTTPError as e:
        raise ProbeError(redact_text(f"cannot reach {_list_url(provider)}: {e}", secrets)) from None
    body = resp.content[:MAX_LIST_BYTES]
    if not 200 <= resp.status_code < 300:
        raise ProbeError(redact_text(http_error(resp.status_code, body, None).message, secrets))
    try:
        data = json.loads(body)["data"]
        models = [_model(item) for item in data]
    except (ValueError, KeyError, TypeError):
        raise ProbeError("the model list is not the expected JSON ({'data': [{'id': ...}]})") from None
    return sorted(models, key=lambda m: m["id"])


def _model(item: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"id": str(item["id"])}
    for field in _CONTEXT_FIELDS:
        value = item.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            out["context_window"] = value
            break
    if isinstance(item.get("display_name"), str):
        out["display_name"] = item["display_name"]
    return out


async def test_call(http: httpx.AsyncClient, provider: ProviderConfig, upstream_model: str) -> dict[str, Any]:
    """One streamed call asking for a single token. Never raises for the provider's failures:
    ``{"ok": false, "error": ...}`` says what went wrong."""
    adapter = adapter_for(provider.kind)
    try:
        api_key = provider.api_key()
    except ConfigError as e:  # an unset api_key_env
        return {"ok": False, "error": str(e)}
    # The Responses API refuses a limit under 16.
    limit = 16 if provider.kind == OPENAI_RESPONSES else 1
    request = ModelRequest(
        system="Answer with one word.",
        tools=(),
        history=(UserTurn("Say OK."),),
        settings=ModelSettings(upstream_model=upstream_model, max_output_tokens=limit),
    )
    endpoint = adapter.endpoint(provider.base_url, api_key, provider.headers)
    stats = CallStats()
    text: list[str] = []
    output_tokens: int | None = None

    async def on_events(events: list[Any]) -> None:
        nonlocal output_tokens
        for event in events:
            if isinstance(event, TextDelta | ThinkingDelta):
                text.append(event.text)
            elif isinstance(event, UsageReported):
                output_tokens = event.usage.output_tokens

    started = trio.current_time()
    error: str | None = None
    with trio.move_on_after(PROBE_TIMEOUT_S) as timer:
        try:
            await stream_call(
                http, endpoint, adapter.render(request).source, adapter.new_parser(), on_events, stats=stats
            )
        except ProviderError as e:
            error = e.message
    if timer.cancelled_caught:
        error = f"no complete answer within {PROBE_TIMEOUT_S:g}s"

    def ms(s: float | None) -> int | None:
        return None if s is None else round(s * 1000)

    result: dict[str, Any] = {
        "ok": error is None,
        "model": upstream_model,
        "http_status": stats.status,
        "ttfb_ms": ms(stats.ttfb_s),
        "ttft_ms": ms(stats.ttft_s),
        "duration_ms": round((trio.current_time() - started) * 1000),
        "output_tokens": output_tokens,
        "text": "".join(text)[:200],
        "error": error,
    }
    streaming = (stats.duration_s or 0) - (stats.ttft_s or 0)
    rate = output_tokens / streaming if output_tokens and stats.ttft_s is not None and streaming > 0 else None
    result["tokens_per_s"] = None if rate is None else round(rate, 1)
    return result
