"""One provider call as the run sees it: request bytes out, UI frames and a ModelCallResult in.

The adapter (byok/providers) owns the endpoint's JSON; the loop's ModelCall folds events
into emits and the assistant message; this module turns emits into Cursor frames (including
the tool-card placeholders and the live edit content) and records the call.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Mapping

import attrs
import httpx
import trio

from byok.cursor import encode, tool_frames
from byok.cursor.tools.base import ArgsStream, ToolDef
from byok.http.connect_envelope import ConnectError, provider_error_details
from byok.loop import emits as em
from byok.loop.model_call import ModelCall, ModelCallResult, ModelProtocolError
from byok.model import events as ev
from byok.model.messages import canonical_json
from byok.model.request import ModelRequest
from byok.providers.adapters import Adapter
from byok.providers.retry import stream_with_retries
from byok.providers.runner import CallStats
from byok.store import AsyncStore, LlmCallRecord

log = logging.getLogger("byok.provider")


class ProviderCallFailed(Exception):
    def __init__(self, error: ConnectError) -> None:
        super().__init__(str(error))
        self.error = error


@attrs.frozen
class CallContext:
    request_id: str
    conversation_id: str
    provider_id: str
    adapter: Adapter
    base_url: str
    api_key: str | None
    http: httpx.AsyncClient
    store: AsyncStore
    registry: Mapping[str, ToolDef]
    send: Callable[[bytes], None]
    wall_ms: Callable[[], int]
    max_tries: int = 4
    retry_base_s: float = 0.5


async def call_model(ctx: CallContext, request: ModelRequest) -> ModelCallResult:
    body = ctx.adapter.build_request(request)
    endpoint = ctx.adapter.endpoint(ctx.base_url, ctx.api_key)
    call = ModelCall(model_call_id=str(uuid.uuid4()))
    streams: dict[str, ArgsStream] = {}

    def show(emit: em.Emit) -> None:
        match emit:
            case em.ToolCallOpened(call_id=cid, name=name, model_call_id=mcid):
                tool = ctx.registry.get(name)
                if tool is None:
                    return  # no card type for an unknown tool; the model gets an error result
                ctx.send(tool_frames.partial(cid, tool.tool_call(tool.placeholder()), mcid))
                if tool.args_stream is not None:
                    streams[cid] = tool.args_stream()
            case em.ToolArgsOut(call_id=cid, name=name, delta=delta, model_call_id=mcid):
                tool = ctx.registry.get(name)
                if tool is None:
                    return
                ctx.send(tool_frames.partial(cid, tool.tool_call(tool.placeholder()), mcid, delta))
                stream = streams.get(cid)
                if stream is not None:
                    for d in stream.feed(delta):
                        ctx.send(tool_frames.delta(cid, d, mcid))
            case _:
                ctx.send(encode.encode_emit(emit))

    async def on_events(events: list[ev.ModelEvent]) -> None:
        now = trio.current_time()
        for event in events:
            for emit in call.handle(event, now):
                show(emit)

    attempts: list[tuple[CallStats, ev.ProviderError | None]] = []

    async def on_attempt(n: int, stats: CallStats, error: ev.ProviderError | None) -> None:
        attempts.append((stats, error))

    started_ms = ctx.wall_ms()
    failure: ConnectError | None = None
    status = "ok"
    try:
        await stream_with_retries(
            ctx.http,
            endpoint,
            body,
            ctx.adapter.new_parser,
            on_events,
            max_tries=ctx.max_tries,
            base_delay_s=ctx.retry_base_s,
            on_attempt=on_attempt,
        )
        result = call.result()
    except ev.ProviderError as e:
        status, failure = "error", ConnectError("unavailable", e.message, provider_error_details(e.message))
    except ModelProtocolError as e:
        text = f"provider stream broke protocol: {e}"
        status, failure = "error", ConnectError("unavailable", text, provider_error_details(text))
    except trio.Cancelled:
        status = "canceled"
        raise
    finally:
        with trio.CancelScope(shield=True):
            stats = attempts[-1][0] if attempts else CallStats()
            usage = call.result().usage if status == "ok" else None
            await _record(ctx, body, started_ms, stats, status, failure, usage)
    if failure is not None:
        raise ProviderCallFailed(failure)
    return result


async def _record(
    ctx: CallContext,
    body: bytes,
    started_ms: int,
    stats: CallStats,
    status: str,
    failure: ConnectError | None,
    usage: object,
) -> None:
    def ms(s: float | None) -> int | None:
        return None if s is None else round(s * 1000)

    parsed = json.loads(body)
    messages = parsed.get("messages", parsed.get("input", []))
    await ctx.store.record_llm_call(
        LlmCallRecord(
            request_id=ctx.request_id,
            conversation_id=ctx.conversation_id,
            provider_id=ctx.provider_id,
            model=str(parsed.get("model", "")),
            request_body=body,
            request_sha256=hashlib.sha256(body).hexdigest(),
            messages_sha256=hashlib.sha256(canonical_json(messages)).hexdigest(),
            status=status,  # type: ignore[arg-type]
            started_at_ms=started_ms,
            duration_ms=ms(stats.duration_s),
            error=failure.message if failure else None,
            http_status=stats.status,
            ttfb_ms=ms(stats.ttfb_s),
            ttft_ms=ms(stats.ttft_s),
            event_count=stats.events,
            byte_count=stats.bytes,
            usage=usage,  # type: ignore[arg-type]
        )
    )
