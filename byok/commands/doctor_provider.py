"""`byok doctor`'s check of a provider: its model list, then a one-token streamed call per model,
through the same adapters, endpoint and stream parsers as a run's calls (no retries)."""

from __future__ import annotations

import httpx
import trio

from byok.commands.doctor_checks import Check
from byok.config import Config, ConfigError, ModelConfig, ProviderConfig
from byok.model.events import ModelEvent, ProviderError
from byok.model.request import ModelRequest, ModelSettings, UserTurn
from byok.providers.adapters import Adapter, adapter_for
from byok.providers.http_errors import http_error, setup_hint
from byok.providers.runner import CallStats, stream_call

PROBE_PROMPT = "Reply with the word OK."
# The Responses API refuses max_output_tokens under 16.
PROBE_TOKENS = {"openai_responses": 16}


def _key_fix(provider: ProviderConfig, config: Config) -> str:
    if provider.api_key_env:
        return f"check the key in ${provider.api_key_env} (the service reads it from its keys file)"
    return f"check api_key of provider {provider.id!r} in {config.source}"


def _models_url(adapter: Adapter, provider: ProviderConfig) -> str:
    # The messages endpoint's sibling: {base}/models, Anthropic's {base}/v1/models.
    return adapter.endpoint(provider.base_url, None).url.rsplit("/", 1)[0].removesuffix("/chat") + "/models"


async def model_list(
    client: httpx.AsyncClient, provider: ProviderConfig, api_key: str | None, config: Config
) -> tuple[Check, list[str] | None]:
    """The provider's model list: a failed check, or the ids it lists (None: no list there)."""
    adapter = adapter_for(provider.kind)
    url = _models_url(adapter, provider)
    headers = adapter.endpoint(provider.base_url, api_key, provider.headers).headers
    what = f"provider {provider.id!r}"
    try:
        resp = await client.get(url, headers=list(headers))
    except httpx.RequestError as e:
        reason = str(e) or type(e).__name__
        found = f"cannot connect to {url} ({reason[:1].lower() + reason[1:]})"
        return Check(False, what, found, f"is the server running? check base_url in {config.source}"), None
    if resp.status_code in (401, 403):
        err = http_error(resp.status_code, resp.content, None)
        return Check(
            False, what, f"the provider refused the key ({err.message})", _key_fix(provider, config)
        ), None
    if not resp.is_success:
        return Check(True, what, f"no model list at {url} (HTTP {resp.status_code})"), None
    try:
        ids = [str(m["id"]) for m in resp.json()["data"]]
    except (ValueError, KeyError, TypeError):
        return Check(True, what, f"{url} answered, not with a model list"), None
    return Check(True, what, f"reachable, lists {len(ids)} model(s)"), ids


async def one_token(
    client: httpx.AsyncClient,
    provider: ProviderConfig,
    model: ModelConfig,
    api_key: str | None,
    listed: list[str] | None,
    config: Config,
) -> Check:
    """A one-token streamed call: the time to its first token, or the provider's error."""
    adapter = adapter_for(provider.kind)
    what = f"model {model.id!r} ({provider.id}/{model.upstream_model})"
    settings = ModelSettings(
        upstream_model=model.upstream_model, max_output_tokens=PROBE_TOKENS.get(provider.kind, 1)
    )
    body = adapter.render(ModelRequest("", (), (UserTurn(PROBE_PROMPT),), settings)).source
    endpoint = adapter.endpoint(provider.base_url, api_key, provider.headers)
    stats = CallStats()

    async def seen(events: list[ModelEvent]) -> None:
        pass

    try:
        await stream_call(client, endpoint, body, adapter.new_parser(), seen, stats=stats)
    except ProviderError as e:
        if not e.output_limit:  # stopping at the one token asked for is the answer
            hint = setup_hint(provider.id, model.id, endpoint.url, e).strip().strip("()")
            if e.status in (401, 403):
                return Check(False, what, e.message, _key_fix(provider, config))
            fix = hint or f"check provider {provider.id!r} and model {model.id!r} in {config.source}"
            if listed is not None and model.upstream_model not in listed:
                fix += f" ({model.upstream_model!r} is not in the provider's model list)"
            return Check(False, what, e.message, fix)
    if stats.ttft_s is None:
        return Check(True, what, f"answered in {stats.duration_s or 0:.2f}s (no text within its one token)")
    return Check(True, what, f"first token in {stats.ttft_s:.2f}s")


async def provider_checks(config: Config, timeout_s: float) -> list[Check]:
    checks: list[Check] = []
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=True) as client:
        for provider in config.providers:
            try:
                api_key = provider.api_key()
            except ConfigError as e:
                checks.append(
                    Check(False, f"provider {provider.id!r}", str(e.problem), _key_fix(provider, config))
                )
                continue
            with trio.move_on_after(timeout_s) as waited:
                check, listed = await model_list(client, provider, api_key, config)
            if waited.cancelled_caught:
                check, listed = (
                    Check(
                        False, f"provider {provider.id!r}", f"no answer in {timeout_s:g}s", "check base_url"
                    ),
                    None,
                )
            checks.append(check)
            if not check.ok:
                continue
            for model in (m for m in config.models if m.provider == provider.id):
                with trio.move_on_after(timeout_s) as waited:
                    result = await one_token(client, provider, model, api_key, listed, config)
                if waited.cancelled_caught:
                    result = Check(
                        False,
                        f"model {model.id!r}",
                        f"no first token in {timeout_s:g}s",
                        "check the provider",
                    )
                checks.append(result)
    return checks
