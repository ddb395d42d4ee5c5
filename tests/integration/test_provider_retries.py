"""stream_with_retries against FakeProvider over real loopback HTTP.

Waits are measured under MockClock(autojump_threshold=0) where the test has no deadline
while socket I/O is in flight (the client has no timeouts), so a jump can only land on the
retry sleep itself; cancellation tests use real time, as the runner tests explain.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import httpx
import pytest
import trio

from byok.model import body as body_module
from byok.model.body import SplicedBody
from byok.model.events import Done, ModelEvent, ProviderError, Started, TextDelta, ToolCallEnded
from byok.model.request import ModelRequest, ModelSettings, UserTurn
from byok.providers.adapters import adapter_for
from byok.providers.retry import stream_with_retries
from byok.providers.runner import CallStats, Endpoint
from tests.support.fake_provider import (
    FakeProvider,
    Script,
    anthropic_tool_script,
    chat_text_script,
    error_script,
    invalid_json_script,
    named_sse,
    responses_text_script,
)

REQUEST = ModelRequest("", (), (UserTurn("hi"),), ModelSettings("fake-model"))
CHAT = adapter_for("openai_chat")


@pytest.fixture
async def fake(nursery: trio.Nursery) -> AsyncIterator[tuple[FakeProvider, str]]:
    provider = FakeProvider()
    yield provider, await provider.start(nursery)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=None) as c:  # httpx timeouts would jump with the mock clock
        yield c


@attrs.define
class Recorder:
    events: list[ModelEvent] = attrs.Factory(list)
    attempts: list[tuple[int, int | None, str | None]] = attrs.Factory(list)

    async def on_events(self, events: list[ModelEvent]) -> None:
        self.events.extend(events)

    async def on_attempt(self, attempt: int, stats: CallStats, error: ProviderError | None) -> None:
        self.attempts.append((attempt, stats.status, None if error is None else error.message))


async def call(
    client: httpx.AsyncClient, base: str, rec: Recorder, kind: str = "openai_chat", **kw: float
) -> CallStats:
    adapter = adapter_for(kind)
    return await stream_with_retries(
        client,
        adapter.endpoint(base, "sk-test"),
        adapter.build_request(REQUEST),
        adapter.new_parser,
        rec.on_events,
        on_attempt=rec.on_attempt,
        **kw,  # type: ignore[arg-type]
    )


async def test_500_then_success_resends_identical_bytes(fake, client, autojump_clock) -> None:
    provider, base = fake
    provider.enqueue(error_script(500, "boom"), chat_text_script(["ok"]))
    rec = Recorder()
    start = trio.current_time()
    stats = await call(client, base, rec)
    assert trio.current_time() - start == pytest.approx(0.5)  # base_delay_s before the first retry
    assert stats.status == 200
    assert rec.attempts == [(1, 500, "HTTP 500: boom"), (2, 200, None)]
    first, second = provider.requests
    assert first.body == second.body == CHAT.build_request(REQUEST)
    assert rec.events[0] == Started() and rec.events[1] == TextDelta("ok") and rec.events[-1] == Done("stop")


async def test_429_waits_for_retry_after(fake, client, autojump_clock) -> None:
    provider, base = fake
    provider.enqueue(error_script(429, "slow down", retry_after="1"), chat_text_script(["ok"]))
    rec = Recorder()
    start = trio.current_time()
    await call(client, base, rec, base_delay_s=0.01)
    assert trio.current_time() - start >= 1.0  # Retry-After wins over the (shorter) backoff
    assert [a[1] for a in rec.attempts] == [429, 200]


async def test_retry_after_in_real_time(fake, client) -> None:
    provider, base = fake
    provider.enqueue(error_script(503, "busy", retry_after="0.2"), chat_text_script(["ok"]))
    rec = Recorder()
    start = trio.current_time()
    await call(client, base, rec)
    assert trio.current_time() - start >= 0.2
    assert len(provider.requests) == 2


async def test_backoff_doubles_and_gives_up_after_max_tries(fake, client, autojump_clock) -> None:
    provider, base = fake
    provider.enqueue(*(error_script(502, f"bad gateway {i}") for i in range(4)))
    rec = Recorder()
    start = trio.current_time()
    with pytest.raises(ProviderError, match="bad gateway 3") as e:
        await call(client, base, rec, base_delay_s=0.5, max_delay_s=1.5)
    assert e.value.status == 502
    assert trio.current_time() - start == pytest.approx(0.5 + 1.0 + 1.5)  # capped at max_delay_s
    assert [a[0] for a in rec.attempts] == [1, 2, 3, 4] and rec.events == []


async def test_long_retry_after_is_capped(fake, client, autojump_clock) -> None:
    provider, base = fake
    provider.enqueue(error_script(503, "later", retry_after="3600"), chat_text_script(["ok"]))
    start = trio.current_time()
    await call(client, base, Recorder())
    assert trio.current_time() - start == pytest.approx(60.0)


async def test_400_is_not_retried(fake, client) -> None:
    provider, base = fake
    provider.enqueue(error_script(400, "Invalid 'input'"), chat_text_script(["never"]))
    rec = Recorder()
    with pytest.raises(ProviderError, match="HTTP 400"):
        await call(client, base, rec, base_delay_s=0.01)
    assert len(provider.requests) == 1 and rec.attempts == [(1, 400, "HTTP 400: Invalid 'input'")]


async def test_cut_after_output_is_not_retried(fake, client) -> None:
    provider, base = fake
    provider.enqueue(chat_text_script(["a", "b", "c"], close_after=2), chat_text_script(["never"]))
    rec = Recorder()
    with pytest.raises(ProviderError) as e:
        await call(client, base, rec, base_delay_s=0.01)
    assert e.value.retryable  # retryable in itself; the delivered output is what forbids it
    assert rec.events == [Started(), TextDelta("a")]
    assert len(provider.requests) == 1


async def test_cut_before_output_is_retried_and_started_is_sent_once(fake, client) -> None:
    provider, base = fake
    # The first chunk carries only the role (content ""), so the attempt produced just Started.
    provider.enqueue(chat_text_script(["a"], close_after=1), chat_text_script(["ok"]))
    rec = Recorder()
    await call(client, base, rec, base_delay_s=0.01)
    assert len(provider.requests) == 2
    assert rec.events[:2] == [Started(), TextDelta("ok")]
    assert rec.events.count(Started()) == 1


async def test_in_stream_overloaded_before_output_is_retried(fake, client) -> None:
    provider, base = fake
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 1, "output_tokens": 1}}}
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    provider.enqueue(
        Script(chunks=[named_sse(start), named_sse(overloaded)]),
        anthropic_tool_script([("toolu_1", "ls", '{"dir": "."}')], text="Looking."),
    )
    rec = Recorder()
    await call(client, base, rec, "anthropic", base_delay_s=0.01)
    assert [a[2] for a in rec.attempts] == ["provider error in stream: overloaded_error: Overloaded", None]
    assert rec.events.count(Started()) == 1
    assert ToolCallEnded(0, '{"dir": "."}') in rec.events and rec.events[-1].reason == "tool_use"
    req = provider.requests[-1]
    assert req.path == "/v1/messages"
    assert (req.headers["x-api-key"], req.headers["anthropic-version"]) == ("sk-test", "2023-06-01")
    assert req.json["stream"] is True and req.json["max_tokens"] == 8192


async def test_responses_stream_through_retries(fake, client) -> None:
    provider, base = fake
    provider.enqueue(
        error_script(500, "x"), responses_text_script(["Hel", "lo"], reasoning=["hm"], encrypted="E")
    )
    rec = Recorder()
    await call(client, base, rec, "openai_responses", base_delay_s=0.01)
    assert [e for e in rec.events if isinstance(e, TextDelta)] == [TextDelta("Hel"), TextDelta("lo")]
    assert provider.requests[0].body == provider.requests[1].body
    assert provider.requests[1].path == "/v1/responses" and provider.requests[1].json["store"] is False


async def test_invalid_json_is_not_retried(fake, client) -> None:
    provider, base = fake
    provider.enqueue(invalid_json_script(), responses_text_script(["never"]))
    rec = Recorder()
    with pytest.raises(ProviderError, match="invalid JSON") as e:
        await call(client, base, rec, "openai_responses", base_delay_s=0.01)
    assert not e.value.retryable and len(provider.requests) == 1
    assert rec.events == []  # the held-back Started never reached the client


async def test_slow_headers_cancelled_by_the_callers_scope(fake, client) -> None:
    provider, base = fake
    provider.enqueue(Script(hang_before_headers=True))
    rec = Recorder()
    with trio.move_on_after(0.3) as scope:
        await call(client, base, rec, base_delay_s=0.01)
    assert scope.cancelled_caught
    assert len(provider.requests) == 1 and rec.attempts == [] and rec.events == []


async def test_cancel_during_backoff(fake, client) -> None:
    provider, base = fake
    provider.enqueue(error_script(503, "busy", retry_after="30"))
    rec = Recorder()
    with trio.move_on_after(0.3) as scope:
        await call(client, base, rec)
    assert scope.cancelled_caught and len(provider.requests) == 1
    assert rec.attempts == [(1, 503, "HTTP 503: busy")]


async def test_connect_error_is_retried_then_fails(client) -> None:
    port = 9  # nothing listens there (and no client picks it as its own source port)
    rec = Recorder()
    with pytest.raises(ProviderError, match="ConnectError"):
        await stream_with_retries(
            client,
            Endpoint(f"http://127.0.0.1:{port}/v1/chat/completions", ()),
            b"{}",
            CHAT.new_parser,
            rec.on_events,
            max_tries=2,
            base_delay_s=0.01,
            on_attempt=rec.on_attempt,
        )
    assert [a[:2] for a in rec.attempts] == [(1, None), (2, None)]


async def test_a_spliced_body_goes_out_whole_with_its_length_on_every_attempt(
    fake, client, autojump_clock, monkeypatch
) -> None:
    """The render's body is sent as its pieces (model/body.py), in many writes here: the
    provider reads one Content-Length body, byte for byte the joined render, on the retry too."""
    monkeypatch.setattr(body_module, "CHUNK_BYTES", 16)
    provider, base = fake
    provider.enqueue(error_script(500, "boom"), chat_text_script(["ok"]))
    rendered = CHAT.render(REQUEST)
    assert isinstance(rendered.source, SplicedBody) and len(list(rendered.source.chunks())) > 1
    rec = Recorder()
    stats = await stream_with_retries(
        client,
        CHAT.endpoint(base, "sk-test"),
        rendered.source,
        CHAT.new_parser,
        rec.on_events,
        on_attempt=rec.on_attempt,
    )
    assert stats.status == 200
    for sent in provider.requests:
        assert sent.body == rendered.body == CHAT.build_request(REQUEST)
        assert sent.headers["content-length"] == str(len(rendered.body))
        assert "transfer-encoding" not in sent.headers
