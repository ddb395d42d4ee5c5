"""Call records: the CallLog writer on a real AsyncStore, the v1 -> v2 migration, raw-stream
capture, and the fields a real daemon records (prefix meter, retries, detailed mode)."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from byok.config_load import load_config
from byok.daemon import run_daemon
from byok.devtools.cursor_sim import CursorSim, user_turn
from byok.loop.turn_values import FailedError
from byok.model.request import ModelRequest, ModelSettings, UserTurn
from byok.model.usage import Usage
from byok.providers import runner as provider_runner
from byok.providers.adapters import adapter_for
from byok.providers.retry import stream_with_retries
from byok.run.call_log import CallLog
from byok.run.provider_call import CallContext, call_model
from byok.store import DB_FILENAME, AsyncStore, LlmCallRecord, SQLiteStore, schema
from tests.integration.conftest import Daemon, write_config
from tests.support.fake_provider import (
    FakeProvider,
    Script,
    chat_text_script,
    error_script,
    invalid_json_script,
)
from tests.support.run_driver import wait_call_records

SYS = {"role": "system", "content": "be brief"}
U1 = {"role": "user", "content": "hi"}
A1 = {"role": "assistant", "content": "hello"}
U2 = {"role": "user", "content": "more"}


def rec(request_id: str, conversation_id: str, messages: list[Any] | None, **kw: Any) -> LlmCallRecord:
    body = None if messages is None else json.dumps({"model": "m", "messages": messages}).encode()
    return LlmCallRecord(
        request_id=request_id,
        conversation_id=conversation_id,
        provider_id="p",
        model="m",
        request_body=body,
        request_sha256="ab" * 32,
        messages_sha256="cd" * 32,
        status=kw.pop("status", "ok"),
        started_at_ms=kw.pop("started_at_ms", 1),
        **kw,
    )


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[AsyncStore]:
    async with await AsyncStore.open(tmp_path / "data") as s:
        yield s


@attrs.define
class WriteSpy:
    """Counts write transactions; can hold the first one so records pile up behind it."""

    sizes: list[int] = attrs.Factory(list)
    hold_first: threading.Event | None = None
    entered: threading.Event = attrs.Factory(threading.Event)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[WriteSpy]:
    spy = WriteSpy()
    original = SQLiteStore.record_llm_calls

    def record_llm_calls(self: SQLiteStore, records: Any) -> list[int]:
        spy.entered.set()
        if spy.hold_first is not None and not spy.sizes:
            spy.hold_first.wait(5)
        spy.sizes.append(len(records))
        return original(self, records)

    monkeypatch.setattr(SQLiteStore, "record_llm_calls", record_llm_calls)
    yield spy


# -- the writer ------------------------------------------------------------------------------------


async def test_many_submits_are_written_in_one_transaction(
    store: AsyncStore, spy: WriteSpy, nursery: trio.Nursery
) -> None:
    log = CallLog(store)
    await nursery.start(log.run)
    records = [rec("r1", "c", [SYS, U1], started_at_ms=i) for i in range(100)]
    for r in records:
        log.submit(r)  # synchronous: the run never waits on SQLite
    await log.flush()
    assert spy.sizes == [100] and log.batches == 1
    calls = await store.llm_calls("r1")
    assert [c.started_at_ms for c in calls] == list(range(100))


async def test_records_queued_during_a_write_go_in_the_next_batch(
    store: AsyncStore, spy: WriteSpy, nursery: trio.Nursery
) -> None:
    spy.hold_first = threading.Event()
    log = CallLog(store)
    await nursery.start(log.run)
    log.submit(rec("r1", "c", [U1]))
    await trio.to_thread.run_sync(spy.entered.wait, 5)  # the first write is in progress
    for i in range(20):
        log.submit(rec("r1", "c", [U1], started_at_ms=i))
        await trio.sleep(0)
    spy.hold_first.set()
    await log.flush()
    assert spy.sizes == [1, 20]
    assert len(await store.llm_calls("r1")) == 21


async def test_the_writer_waits_for_quiet_before_each_batch(
    store: AsyncStore, spy: WriteSpy, nursery: trio.Nursery
) -> None:
    """The daemon's quiet hook holds the writer while runs are active: finalizing a long call
    holds the GIL for tens of milliseconds, which the run's own turn end would wait behind."""
    quiet = trio.Event()
    waits = 0

    async def until_quiet() -> None:
        nonlocal waits
        waits += 1
        await quiet.wait()

    log = CallLog(store, quiet=until_quiet)
    await nursery.start(log.run)
    for i in range(3):
        log.submit(rec("r1", "c", [U1], started_at_ms=i))
    for _ in range(20):
        await trio.sleep(0)
    assert waits == 1 and spy.sizes == []  # taken off the queue, not written
    quiet.set()
    await log.flush()
    assert spy.sizes == [3]
    assert [c.started_at_ms for c in await store.llm_calls("r1")] == [0, 1, 2]


async def test_cancelling_the_writer_drains_what_is_queued(store: AsyncStore) -> None:
    log = CallLog(store)
    async with trio.open_nursery() as nursery:
        await nursery.start(log.run)
        for i in range(5):
            log.submit(rec("r1", "c", [U1], started_at_ms=i))
        nursery.cancel_scope.cancel()
    assert len(await store.llm_calls("r1")) == 5
    await log.flush()  # nothing left, and no writer needed to say so


async def test_flush_without_a_running_writer_writes_itself(store: AsyncStore, spy: WriteSpy) -> None:
    log = CallLog(store, max_pending=3)
    for i in range(4):
        log.submit(rec("r1", "c", [U1], started_at_ms=i))
    assert log.dropped == 1  # a full queue drops rather than blocks the run
    await log.flush()
    assert spy.sizes == [3]
    assert [c.started_at_ms for c in await store.llm_calls("r1")] == [0, 1, 2]


async def test_a_failed_batch_is_logged_and_does_not_stop_the_writer(
    store: AsyncStore, nursery: trio.Nursery
) -> None:
    log = CallLog(store)
    await nursery.start(log.run)
    log.submit(rec("r1", "c", [U1], status="bogus"))  # violates the CHECK
    await log.flush()
    assert log.failed == 1
    log.submit(rec("r2", "c", [U1]))
    await log.flush()
    assert len(await store.llm_calls("r2")) == 1


# -- prefix meter ----------------------------------------------------------------------------------


async def test_prefix_meter_in_memory_and_after_a_restart(store: AsyncStore, nursery: trio.Nursery) -> None:
    log = CallLog(store)
    await nursery.start(log.run)
    log.submit(rec("r1", "c", [SYS, U1]))
    log.submit(rec("r2", "c", [SYS, U1, A1, U2]))
    log.submit(rec("r3", "c", [SYS, {"role": "user", "content": "edited"}]))
    log.submit(rec("x1", "other", [U1]))
    await log.flush()
    got = [(await store.llm_calls(r))[0] for r in ("r1", "r2", "r3", "x1")]
    assert [(c.prefix_extends, c.common_prefix_messages) for c in got] == [
        (None, None),
        (True, 2),
        (False, 1),
        (None, None),
    ]

    # A new CallLog has no memory: it compares with the last call recorded in SQLite.
    restarted = CallLog(store)
    restarted.submit(rec("r4", "c", [SYS, {"role": "user", "content": "edited"}, A1]))
    await restarted.flush()
    (r4,) = await store.llm_calls("r4")
    assert (r4.prefix_extends, r4.common_prefix_messages) == (True, 2)
    assert await store.prefix_stats("c") == (3, 2)
    assert await store.prefix_stats("other") == (0, 0)
    assert await store.prefix_stats(None) == (3, 2)


async def test_forgotten_conversations_are_compared_with_sqlite(
    store: AsyncStore, nursery: trio.Nursery
) -> None:
    """Forgetting (as the cache budget's eviction does) empties the writer's memory of last
    calls; the next call of each conversation is metered and stored as a tail exactly as if it
    had been kept."""
    log = CallLog(store)
    await nursery.start(log.run)
    log.submit(rec("r1", "c", [SYS, U1]))
    log.submit(rec("x1", "other", [U1]))
    await log.flush()
    assert await log.forget() == 2
    assert await log.forget() == 0
    log.submit(rec("r2", "c", [SYS, U1, A1, U2]))
    log.submit(rec("x2", "other", [U2]))
    await log.flush()
    r2, x2 = (await store.llm_calls("r2"))[0], (await store.llm_calls("x2"))[0]
    assert (r2.prefix_extends, r2.common_prefix_messages) == (True, 2)
    assert (x2.prefix_extends, x2.common_prefix_messages) == (False, 0)
    # Kept again once written: the third call is compared in memory.
    log.submit(rec("r3", "c", [SYS, U1, A1, U2, A1]))
    await log.flush()
    (r3,) = await store.llm_calls("r3")
    assert (r3.prefix_extends, r3.common_prefix_messages) == (True, 4)
    assert await log.forget() == 2


@pytest.mark.parametrize("flush_between", [True, False])
async def test_prefix_meter_lru_eviction(
    store: AsyncStore, nursery: trio.Nursery, flush_between: bool
) -> None:
    log = CallLog(store, max_conversations=1)
    await nursery.start(log.run)
    log.submit(rec("a1", "a", [U1]))
    log.submit(rec("b1", "b", [SYS]))
    if flush_between:
        await log.flush()
    # "a" was evicted by "b": its last call is read back from SQLite, or found in the same batch.
    log.submit(rec("a2", "a", [U1, A1]))
    log.submit(rec("b2", "b", [U1]))
    await log.flush()
    a2 = (await store.llm_calls("a2"))[0]
    b2 = (await store.llm_calls("b2"))[0]
    assert (a2.prefix_extends, a2.common_prefix_messages) == (True, 1)
    assert (b2.prefix_extends, b2.common_prefix_messages) == (False, 0)


async def test_a_call_without_a_body_is_not_compared(store: AsyncStore) -> None:
    log = CallLog(store)
    log.submit(rec("r1", "c", [U1]))
    log.submit(rec("r2", "c", None))
    log.submit(rec("r3", "c", [U1, A1]))
    await log.flush()
    r2, r3 = (await store.llm_calls("r2"))[0], (await store.llm_calls("r3"))[0]
    assert r2.prefix_extends is None and r3.prefix_extends is None


# -- store -----------------------------------------------------------------------------------------


async def test_new_fields_round_trip(store: AsyncStore) -> None:
    full = rec(
        "r1",
        "c",
        [U1],
        usage=Usage(100, 5, 60, 10, 2),
        queue_ms=7,
        attempts=3,
        error_kind="http_5xx",
        prefix_extends=False,
        common_prefix_messages=4,
        cache_hit_share=0.6,
        response_capture=b"data: x\n\n",
    )
    (rid,) = await store.record_llm_calls([full])
    assert await store.llm_calls("r1") == [attrs.evolve(full, id=rid)]
    assert await store.last_llm_call("c") == attrs.evolve(full, id=rid)
    assert await store.last_llm_call("nobody") is None


def test_version_1_database_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / DB_FILENAME
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in schema._V1:
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.execute(
        "INSERT INTO llm_calls (request_id, conversation_id, provider_id, model, request_body,"
        " request_sha256, messages_sha256, status, event_count, byte_count, input_tokens, output_tokens,"
        " started_at_ms) VALUES ('old', 'c', 'p', 'm', ?, 'aa', 'bb', 'ok', 3, 40, 10, 2, 5)",
        (json.dumps({"model": "m", "messages": [SYS, U1]}).encode(),),
    )
    conn.execute(
        "INSERT INTO conversations (conversation_id, head_revision, version, created_at_ms, updated_at_ms)"
        " VALUES ('c', NULL, 0, 1, 1)"
    )
    conn.close()

    with SQLiteStore(path) as s:
        assert s._conn is not None
        # Migrated through version 2 (the call-record columns) up to the current version.
        assert s._conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION >= 2
        columns = {row[1] for row in s._conn.execute("PRAGMA table_info(llm_calls)")}
        assert {
            "queue_ms",
            "attempts",
            "error_kind",
            "prefix_extends",
            "common_prefix_messages",
            "cache_hit_share",
            "response_capture",
            "body_base_id",
            "body_shared_bytes",
            "body_depth",
        } <= columns
        (old,) = s.llm_calls("old")
        assert (old.event_count, old.byte_count, old.usage) == (3, 40, Usage(10, 2))
        assert old.attempts is None and old.prefix_extends is None and old.response_capture is None
        assert s.head("c").version == 0
        assert s.prefix_stats() == (0, 0)  # version-1 rows were never compared

    # The first version-2 call of the conversation compares with the version-1 row.
    async def later_call() -> None:
        async with AsyncStore(SQLiteStore(path)) as store:
            log = CallLog(store)
            log.submit(rec("new", "c", [SYS, U1, A1]))
            await log.flush()
            (new,) = await store.llm_calls("new")
            assert (new.prefix_extends, new.common_prefix_messages) == (True, 2)

    trio.run(later_call)


# -- raw stream capture ----------------------------------------------------------------------------


async def test_capture_keeps_the_last_attempt_and_is_capped(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = FakeProvider()
    base = await provider.start(nursery)
    chat = adapter_for("openai_chat")
    ok = chat_text_script(["hello"])
    stream = b"".join(ok.chunks)
    body = json.dumps({"model": "m", "stream": True, "messages": [U1]}).encode()

    async def sink(events: Any) -> None:
        pass

    async with httpx.AsyncClient(timeout=None) as client:
        provider.enqueue(error_script(500, "boom"), ok)
        capture = bytearray()
        await stream_with_retries(
            client, chat.endpoint(base, "k"), body, chat.new_parser, sink, base_delay_s=0, capture=capture
        )
        assert bytes(capture) == stream  # the failed attempt's error body was dropped

        monkeypatch.setattr(provider_runner, "MAX_CAPTURE_BYTES", 10)
        provider.enqueue(chat_text_script(["hello"]))
        stats = await stream_with_retries(
            client, chat.endpoint(base, "k"), body, chat.new_parser, sink, capture=capture
        )
        assert bytes(capture) == stream[:10] and stats.bytes == len(stream)

        provider.enqueue(error_script(400, "bad request"))
        with pytest.raises(Exception, match="bad request"):
            await stream_with_retries(
                client, chat.endpoint(base, "k"), body, chat.new_parser, sink, capture=capture
            )
        assert bytes(capture) == b'{"error": {'[:10]  # error bodies are captured too


# -- call_model ------------------------------------------------------------------------------------

REQUEST = ModelRequest("be brief", (), (UserTurn("hi"),), ModelSettings("fake-model"))


@asynccontextmanager
async def model_caller(
    store: AsyncStore, nursery: trio.Nursery, *, detailed: bool = False
) -> AsyncIterator[tuple[FakeProvider, CallContext]]:
    provider = FakeProvider()
    base = await provider.start(nursery)
    log = CallLog(store, detailed=detailed)
    await nursery.start(log.run)
    async with httpx.AsyncClient(timeout=None) as http:
        yield (
            provider,
            CallContext(
                request_id="r",
                conversation_id="c",
                provider_id="fake",
                adapter=adapter_for("openai_chat"),
                base_url=base,
                api_key="sk-secret",
                http=http,
                wall_ms=lambda: 1000,
                call_log=log,
                retry_base_s=0.05,
            ),
        )
    await log.flush()


async def test_a_cancelled_call_is_recorded_as_canceled(store: AsyncStore, nursery: trio.Nursery) -> None:
    async with model_caller(store, nursery, detailed=True) as (provider, ctx):
        provider.enqueue(Script(hang_before_headers=True))
        with trio.move_on_after(0.2):
            await call_model(ctx, REQUEST)
    (call,) = await store.llm_calls("r")
    assert call.status == "canceled" and call.error_kind == "canceled" and call.error is None
    assert call.attempts == 1 and call.http_status is None and call.usage is None
    assert call.duration_ms is not None and call.duration_ms >= 150
    assert call.response_capture == b""  # detailed, but nothing arrived
    assert call.started_at_ms == 1000


async def test_queue_time_covers_the_retry_wait(store: AsyncStore, nursery: trio.Nursery) -> None:
    async with model_caller(store, nursery) as (provider, ctx):
        provider.enqueue(error_script(503, "busy"), chat_text_script(["ok"]))
        result = await call_model(ctx, REQUEST)
        assert result.message.text == "ok"
    (call,) = await store.llm_calls("r")
    assert call.attempts == 2 and call.status == "ok" and call.http_status == 200
    assert call.queue_ms is not None and call.queue_ms >= 50  # the 0.05 s backoff before attempt 2
    assert call.response_capture is None
    assert json.loads(call.request_body or b"")["messages"][0] == {"role": "system", "content": "be brief"}


async def test_a_broken_stream_is_a_protocol_error(store: AsyncStore, nursery: trio.Nursery) -> None:
    async with model_caller(store, nursery, detailed=True) as (provider, ctx):
        script = invalid_json_script()
        provider.enqueue(script)
        with pytest.raises(FailedError):
            await call_model(ctx, REQUEST)
    (call,) = await store.llm_calls("r")
    assert call.status == "error" and call.error_kind == "protocol" and call.attempts == 1
    assert call.http_status == 200 and call.error is not None and "invalid JSON" in call.error
    assert call.response_capture == b"".join(script.chunks)


# -- through the daemon ----------------------------------------------------------------------------


@asynccontextmanager
async def daemon_with(tmp_path: Path, nursery: trio.Nursery, extra: str) -> AsyncIterator[Daemon]:
    """conftest's start_daemon, with extra config text appended."""
    provider = FakeProvider()
    provider_url = await provider.start(nursery)
    data_dir = tmp_path / "data"
    config_path = tmp_path / "byok.toml"
    write_config(config_path, provider_url=provider_url, data_dir=data_dir, extra=extra)
    config = load_config(config_path, overrides={})
    base_url, shutdown = await nursery.start(run_daemon, config)
    async with httpx.AsyncClient(timeout=30) as client:
        yield Daemon(base_url, provider, CursorSim(base_url, client), client, data_dir, config_path)
    shutdown()


def turn(text: str, msg: str) -> Any:
    return user_turn(text, conversation_id="conv-1", model_id="byok-demo", message_id=msg)


async def test_second_turn_extends_the_first_calls_messages(daemon: Daemon) -> None:
    daemon.provider.enqueue(
        chat_text_script(["First answer"], usage=(10, 5)), chat_text_script(["Second"], usage=(20, 5))
    )
    tr1 = await daemon.sim.run("req-a", turn("first", "m1"))
    tr2 = await daemon.sim.run("req-b", turn("second", "m2"))
    assert tr1.end_stream == {} and tr2.end_stream == {}
    (first,) = await wait_call_records(daemon.data_dir, "req-a")
    (second,) = await wait_call_records(daemon.data_dir, "req-b")
    sent_first, sent_second = daemon.provider.requests

    assert first.prefix_extends is None and first.common_prefix_messages is None
    assert second.prefix_extends is True
    assert second.common_prefix_messages == len(sent_first.json["messages"])
    assert len(sent_second.json["messages"]) == second.common_prefix_messages + 2

    for call, sent in ((first, sent_first), (second, sent_second)):
        assert call.status == "ok" and call.error_kind is None and call.attempts == 1
        assert call.request_body == sent.body  # nothing to redact: stored byte for byte
        assert call.response_capture is None  # detailed capture is off by default
        assert call.cache_hit_share == 0.0  # the fake reports cached_tokens = 0
        assert call.queue_ms is not None and call.queue_ms >= 0
        assert call.ttfb_ms is not None and call.ttft_ms is not None and call.duration_ms is not None
        assert call.ttfb_ms <= call.ttft_ms <= call.duration_ms
        assert call.event_count > 0 and call.byte_count > 0
        assert b"sk-test" not in call.request_body  # headers (the key) are never stored
    with SQLiteStore.open_in(daemon.data_dir) as store:
        assert store.prefix_stats("conv-1") == (1, 1)


async def test_429_then_success_records_two_attempts(daemon: Daemon) -> None:
    daemon.provider.enqueue(error_script(429, "x", retry_after="0"), chat_text_script(["ok"]))
    tr = await daemon.sim.run("req-r", turn("hi", "m1"))
    assert tr.end_stream == {}
    (call,) = await wait_call_records(daemon.data_dir, "req-r")
    assert call.attempts == 2
    assert call.status == "ok" and call.http_status == 200 and call.error_kind is None
    assert call.usage is not None


async def test_a_rejected_call_records_its_error_kind(daemon: Daemon) -> None:
    daemon.provider.enqueue(error_script(400, "bad model"))
    tr = await daemon.sim.run("req-e", turn("hi", "m1"))
    assert tr.end_stream != {}
    (call,) = await wait_call_records(daemon.data_dir, "req-e")
    assert call.status == "error" and call.error_kind == "http_4xx" and call.http_status == 400
    assert call.attempts == 1 and call.error is not None and "bad model" in call.error
    assert call.usage is None and call.cache_hit_share is None


async def test_detailed_logging_captures_the_raw_stream(tmp_path: Path, nursery: trio.Nursery) -> None:
    async with daemon_with(tmp_path, nursery, "\n[logging]\ndetailed = true\n") as d:
        script = chat_text_script(["Hello", " there"])
        d.provider.enqueue(script)
        tr = await d.sim.run("req-d", turn("hi", "m1"))
        assert tr.end_stream == {}
        (call,) = await wait_call_records(d.data_dir, "req-d")
        assert call.response_capture == b"".join(script.chunks)
        assert call.byte_count == len(call.response_capture)
        assert call.request_body == d.provider.requests[0].body
