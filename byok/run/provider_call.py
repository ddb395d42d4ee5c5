"""One provider call as the run sees it: request bytes out, ModelEvents in, the call recorded.

The adapter (byok/providers) owns the endpoint's JSON; the turn machine (loop/turn.py) folds
the events; this module sends the request with its retries, hands the events on, turns a
failure into the error the client sees (with what the config could change) and records the
call (queued on the CallLog, never awaited).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable

import attrs
import httpx
import trio

from byok.config import ModelConfig, ProviderConfig
from byok.loop.model_call import ModelCall, ModelCallResult, ModelProtocolError
from byok.loop.turn_values import Failed, FailedError
from byok.model import events as ev
from byok.model.request import ModelRequest, ModelSettings, RenderedRequest
from byok.model.usage import Usage
from byok.providers.adapters import Adapter, adapter_for
from byok.providers.anthropic_request import DEFAULT_MAX_TOKENS
from byok.providers.http_errors import exceeds_context, refused_option_hint, setup_hint
from byok.providers.kinds import ANTHROPIC
from byok.providers.render_cache import owned_by
from byok.providers.retry import stream_with_retries
from byok.providers.runner import CallStats, StreamParser
from byok.run.call_log import CallLog
from byok.run.call_meter import cache_hit_share, error_kind
from byok.run.deps import RunDeps
from byok.store import LlmCallRecord

log = logging.getLogger("byok.provider")


def cache_key(conversation_id: str) -> str:
    """The conversation's prompt_cache_key: the same across turns and restarts, and not the
    client's id itself."""
    return "byok-" + hashlib.sha256(conversation_id.encode()).hexdigest()[:32]


def model_settings(model: ModelConfig, provider: ProviderConfig, conversation_id: str) -> ModelSettings:
    """What a call's request takes from the config (and, for its cache key, the conversation)."""
    return ModelSettings(
        upstream_model=model.upstream_model,
        max_output_tokens=model.max_output_tokens,
        replay_reasoning_on_tool_turns=model.replay_reasoning,
        prompt_cache=provider.prompt_cache,
        eager_input_streaming=provider.eager_input_streaming,
        extra_body=model.extra_body,
        cache_key=cache_key(conversation_id) if provider.prompt_cache_key else "",
        vision=model.vision,
    )


def output_limit_hint(model: ModelConfig, kind: str) -> str:
    """What to raise when ``model``'s answer stops at the output token limit ("" when byok sends
    no limit: then it is the provider's own)."""
    if model.max_output_tokens is not None:
        limit = model.max_output_tokens
        return f" (model {model.id!r} has max_output_tokens = {limit}; raise it in the config)"
    if kind == ANTHROPIC:
        return (
            f" (model {model.id!r} has the default max_output_tokens = {DEFAULT_MAX_TOKENS};"
            " set a higher one in the config)"
        )
    return ""


def context_hint(model: ModelConfig) -> str:
    """What to do when a request no longer fits ``model``'s context window."""
    return (
        f" (the conversation no longer fits the context window of model {model.id!r},"
        f" {model.context_tokens:,} tokens in the config; start a new chat, or pick a model"
        " with a larger window)"
    )


@attrs.frozen
class CallContext:
    request_id: str
    conversation_id: str
    provider_id: str
    adapter: Adapter
    base_url: str
    api_key: str | None
    http: httpx.AsyncClient
    wall_ms: Callable[[], int]
    call_log: CallLog
    headers: tuple[tuple[str, str], ...] = ()  # the provider's own (config)
    max_tries: int = 4
    retry_base_s: float = 0.5
    # The configured model: an error it can fix (its output limit, its context window) says how.
    model: ModelConfig | None = None
    new_prefix: bool = False  # the first call after a compaction (LlmCallRecord.new_prefix)
    # The alias Cursor picked, when the model is one of its targets (recorded with the call).
    alias_id: str | None = None


def run_call_context(
    *,
    request_id: str,
    conversation_id: str,
    provider: ProviderConfig,
    model: ModelConfig,
    api_key: str | None,
    deps: RunDeps,
    alias_id: str | None = None,
) -> CallContext:
    """The context of one of a run's calls: its provider and model from the config and the
    daemon's shared pieces."""
    return CallContext(
        request_id=request_id,
        conversation_id=conversation_id,
        provider_id=provider.id,
        adapter=adapter_for(provider.kind),
        base_url=provider.base_url,
        api_key=api_key,
        headers=provider.headers,
        http=deps.http,
        wall_ms=deps.wall_ms,
        call_log=deps.call_log,
        max_tries=deps.config.server.provider_max_tries,
        retry_base_s=deps.config.server.provider_retry_base_s,
        model=model,
        alias_id=alias_id,
    )


async def call_model(ctx: CallContext, request: ModelRequest, model_call_id: str = "mc") -> ModelCallResult:
    """One call folded on its own (no run around it): its assistant message and usage."""
    call = ModelCall(model_call_id)

    async def on_events(events: list[ev.ModelEvent]) -> None:
        now = trio.current_time()
        for event in events:
            call.handle(event, now)

    async def on_end() -> None:
        call.result()  # ModelProtocolError: the stream ended without a complete Done

    await stream_model(ctx, request, on_events, on_end)
    return call.result()


async def stream_model(
    ctx: CallContext,
    request: ModelRequest,
    on_events: Callable[[list[ev.ModelEvent]], Awaitable[None]],
    on_end: Callable[[], Awaitable[None]],
    on_rendered: Callable[[RenderedRequest], None] | None = None,
) -> None:
    """Send the request (retried while no output was seen), hand its events to ``on_events``
    and, once the stream ended cleanly, call ``on_end``. Either may raise ModelProtocolError:
    the call then fails as the provider's. The call is recorded (queued on the CallLog, never
    awaited) whatever its end; a failure raises FailedError."""
    decided_at = trio.current_time()  # queue time runs from here to the request going out
    decided_ms = ctx.wall_ms()
    with owned_by(ctx.conversation_id):  # its texts are charged to the conversation's caches
        rendered = ctx.adapter.render(request)
    if on_rendered is not None:
        on_rendered(rendered)
    body = rendered.source
    endpoint = ctx.adapter.endpoint(ctx.base_url, ctx.api_key, ctx.headers)
    usage: Usage | None = None

    async def events_in(events: list[ev.ModelEvent]) -> None:
        nonlocal usage
        for event in events:
            if isinstance(event, ev.UsageReported):
                usage = event.usage
        await on_events(events)

    trace = _Attempts()

    def new_parser() -> StreamParser:
        # stream_with_retries asks for a parser immediately before each attempt's request.
        trace.sent_at.append(trio.current_time())
        return ctx.adapter.new_parser()

    async def on_attempt(n: int, stats: CallStats, error: ev.ProviderError | None) -> None:
        trace.reported.append((n, stats))

    capture = bytearray() if ctx.call_log.detailed else None
    failure: Failed | None = None
    exc: BaseException | None = None
    try:
        await stream_with_retries(
            ctx.http,
            endpoint,
            body,
            new_parser,
            events_in,
            max_tries=ctx.max_tries,
            base_delay_s=ctx.retry_base_s,
            on_attempt=on_attempt,
            capture=capture,
        )
        await on_end()
    except ev.ProviderError as e:
        hint = refused_option_hint(ctx.provider_id, ctx.adapter.kind, e)
        if ctx.model is not None:
            hint += setup_hint(ctx.provider_id, ctx.model.id, endpoint.url, e)
        if ctx.model is not None and e.output_limit:
            hint += output_limit_hint(ctx.model, ctx.adapter.kind)
        elif ctx.model is not None and exceeds_context(e):
            hint += context_hint(ctx.model)
        overflow = exceeds_context(e)
        exc, failure = e, Failed("unavailable", e.message + hint, provider=True, overflow=overflow)
    except ModelProtocolError as e:
        exc, failure = e, Failed("unavailable", f"provider stream broke protocol: {e}", provider=True)
    except BaseException as e:  # cancellation, or a bug: recorded, then re-raised
        exc = e
        raise
    finally:
        # Never wait on SQLite here: the record is queued and written by the CallLog's task.
        try:
            ctx.call_log.submit(
                _call_record(
                    ctx,
                    rendered,
                    decided_ms,
                    decided_at,
                    trace,
                    exc,
                    failure,
                    usage if exc is None else None,
                    capture,
                )
            )
        except Exception:
            log.exception("could not record a provider call of request %s", ctx.request_id)
    if failure is not None:
        raise FailedError(failure)


@attrs.define
class _Attempts:
    sent_at: list[float] = attrs.Factory(list)  # trio time each attempt's request started
    reported: list[tuple[int, CallStats]] = attrs.Factory(list)  # from on_attempt


def _call_record(
    ctx: CallContext,
    rendered: RenderedRequest,
    decided_ms: int,
    decided_at: float,
    trace: _Attempts,
    exc: BaseException | None,
    failure: Failed | None,
    usage: Usage | None,
    capture: bytearray | None,
) -> LlmCallRecord:
    def ms(s: float | None) -> int | None:
        return None if s is None else round(s * 1000)

    attempts = max(len(trace.sent_at), trace.reported[-1][0] if trace.reported else 0)
    if trace.reported and len(trace.reported) == len(trace.sent_at):
        stats = trace.reported[-1][1]
    else:
        # The last attempt ended without a report (cancelled, or the stream broke the event
        # contract): its stats stay inside stream_with_retries; only its duration is known here.
        stats = CallStats()
        if trace.sent_at:
            stats.duration_s = trio.current_time() - trace.sent_at[-1]
    if isinstance(exc, trio.Cancelled):
        status, message = "canceled", None
    elif exc is not None:
        status = "error"
        message = failure.message if failure is not None else f"{type(exc).__name__}: {exc}"
    else:
        status, message = "ok", None
    # The hashes and redaction check are left to the call log's writer (off the event loop and
    # off the store's worker); the render's elements spare it parsing the body.
    return LlmCallRecord(
        request_id=ctx.request_id,
        conversation_id=ctx.conversation_id,
        provider_id=ctx.provider_id,
        model=rendered.model,
        request_body=rendered.source,
        request_sha256="",
        messages_sha256="",
        status=status,  # type: ignore[arg-type]
        started_at_ms=decided_ms,
        duration_ms=ms(stats.duration_s),
        error=message,
        http_status=stats.status,
        ttfb_ms=ms(stats.ttfb_s),
        ttft_ms=ms(stats.ttft_s),
        event_count=stats.events,
        byte_count=stats.bytes,
        usage=usage,
        queue_ms=ms(trace.sent_at[-1] - decided_at) if trace.sent_at else None,
        attempts=attempts,
        error_kind=error_kind(exc, stats.status),
        cache_hit_share=cache_hit_share(usage),
        response_capture=None if capture is None else bytes(capture),
        rendered=rendered,
        new_prefix=ctx.new_prefix,
        model_id=None if ctx.model is None else ctx.model.id,
        alias_id=ctx.alias_id,
    )
