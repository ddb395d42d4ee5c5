"""Long conversations: bounded history and fragment caches, root ids kept without their bytes,
and the call record's one-parse JSON work. Eviction must never change what a provider gets."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from byok.cursor.checkpoint import root_blob
from byok.model.messages import Message, ToolCall
from byok.model.projection import project
from byok.model.request import ModelRequest, ModelSettings
from byok.providers import openai_chat_request, rendering
from byok.providers.fragment_cache import SizedLru
from byok.run.call_meter import finalize_and_hash, message_hashes, stored_message_hashes
from byok.run.conversation import ConversationMemory
from byok.run.redaction import redact_body
from byok.store import LlmCallRecord, SQLiteStore
from byok.store.history_cache import message_size


def exchange(i: int) -> list[Message]:
    round_id = f"round-{i}"
    calls = (ToolCall(f"c{i}a", "Read", '{"path":"a"}', 0), ToolCall(f"c{i}b", "Grep", '{"q":"\\"x\\""}', 1))
    return [
        Message(role="user", origin="runtime", text=f"question {i} é\n" * 20),
        Message(
            role="assistant", origin="assistant", text="Looking.", tool_calls=calls, tool_round_id=round_id
        ),
        # Results in completion order (b first): projection restores the call order.
        Message(
            role="tool",
            origin="tool",
            text=f"grep {i}\n" * 50,
            tool_call_id=f"c{i}b",
            tool_name="Grep",
            tool_round_id=round_id,
            completion_seq=1,
        ),
        Message(
            role="tool",
            origin="tool",
            text=f'read {i}\t"q"\n' * 80,
            tool_call_id=f"c{i}a",
            tool_name="Read",
            tool_round_id=round_id,
            completion_seq=2,
        ),
        Message(role="assistant", origin="assistant", text=f"answer {i}"),
    ]


def body_of(messages: tuple[Message, ...]) -> bytes:
    settings = ModelSettings(upstream_model="m")
    return openai_chat_request.build_request(ModelRequest("sys", (), project(messages), settings))


def fill(store: SQLiteStore, conversation: str, n: int) -> int:
    version = 0
    for i in range(n):
        version = store.append(conversation, version, exchange(i), 1).version
    return version


def test_evicted_history_reloads_to_identical_request_bytes(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "db", cache_bytes=10**9) as store:
        fill(store, "c", 30)
        warm = store.head("c")
        warm_body = body_of(warm.messages)
        store.forget_cached()
        rendering.forget_rendered()
        cold = store.head("c")
        assert cold.messages == warm.messages
        assert [m.id for m in cold.messages] == [hashlib.sha256(m.encode()).digest() for m in warm.messages]
        assert body_of(cold.messages) == warm_body
    with SQLiteStore(tmp_path / "db") as reopened:  # after a restart too
        assert body_of(reopened.head("c").messages) == warm_body


def test_next_request_extends_the_previous_after_eviction(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "db", cache_bytes=10**9) as store:
        version = fill(store, "c", 10)
        first = body_of(store.head("c").messages)
        store.forget_cached()
        rendering.forget_rendered()
        store.append("c", version, [Message(role="user", origin="runtime", text="next")], 2)
        second = body_of(store.head("c").messages)
    prefix = json.dumps(json.loads(first)["messages"], ensure_ascii=False, separators=(",", ":"))[:-1]
    assert second.decode().find(prefix) == first.decode().find(prefix) > 0


def test_history_cache_is_bounded_by_bytes(tmp_path: Path) -> None:
    one = sum(message_size(m) for m in exchange(0)) * 12
    with SQLiteStore(tmp_path / "db", cache_bytes=3 * one) as store:
        for c in range(8):
            fill(store, f"c{c}", 10)
            assert store.cached_bytes <= 3 * one
        assert store.cached_bytes > 0
        # One entry per conversation: its newest revision (appends share the parent's objects).
        before = store.cached_bytes
        store.head("c7")
        assert store.cached_bytes == before
        # Too big for the budget: read, not cached.
        tiny = SQLiteStore(tmp_path / "db", cache_bytes=100)
        assert len(tiny.head("c0").messages) == 50 and tiny.cached_bytes == 0
        tiny.close()


def test_sized_lru_evicts_least_recent_first() -> None:
    lru: SizedLru[str, str] = SizedLru(10, lambda _key, value: len(value))
    lru.put("a", "AAAA")
    lru.put("b", "BBBB")
    assert lru.get("a") == "AAAA"  # now b is the least recent
    lru.put("c", "CCCC")
    assert lru.get("b") is None and lru.get("a") == "AAAA" and lru.get("c") == "CCCC"
    assert lru.size == 8
    lru.put("huge", "H" * 11)
    assert lru.get("huge") is None and len(lru) == 2
    lru.put("a", "AA")  # a replaced entry counts its new size only
    assert lru.size == 6 and lru.get("a") == "AA"


def test_memory_keeps_root_ids_not_bytes_once_acked() -> None:
    memory = ConversationMemory()
    messages = exchange(0)
    blobs = [memory.root_of(m) for m in messages]
    assert blobs == [root_blob(m) for m in messages]
    assert len(memory.roots) == len(messages)
    memory.acked.update(b.id for b in blobs)
    memory.drop_acked_roots()
    assert memory.roots == {}
    again = [memory.root_of(m) for m in messages]
    assert [b.id for b in again] == [b.id for b in blobs]
    assert all(b.data == b"" for b in again)  # KvLink.put skips acked ids: never sent
    # A pending message travels inline: its data comes back whole.
    assert memory.root_of(messages[-1], with_data=True) == blobs[-1]


def test_finalize_and_hash_matches_the_separate_computations() -> None:
    messages = tuple(m for i in range(3) for m in exchange(i))
    body = body_of(messages)
    rendered = openai_chat_request.render_request(
        ModelRequest("sys", (), project(messages), ModelSettings("m"))
    )
    assert rendered.body == body
    parsed = json.loads(body)
    # messages_sha256: the messages array's bytes as sent.
    array = json.dumps(parsed["messages"], ensure_ascii=False, separators=(",", ":")).encode()
    assert array in body
    # With the render (no parse) and from the bare body (one walk): the same record.
    for rec in (
        LlmCallRecord("r", "c", "p", "", body, "", "", "ok", 0),
        LlmCallRecord("r", "c", "p", rendered.model, rendered.body, "", "", "ok", 0, rendered=rendered),
    ):
        out, hashes = finalize_and_hash(rec)
        assert out.request_body is rec.request_body
        assert out.model == "m"
        assert out.request_sha256 == hashlib.sha256(body).hexdigest()
        assert out.messages_sha256 == hashlib.sha256(array).hexdigest()
        assert hashes == message_hashes(body)
        assert out.rendered is None  # not kept once finalized


def test_finalize_and_hash_redacts_and_hashes_the_stored_body() -> None:
    for key in ("api_key", "X-Api-Key", "Authorization", "api\\u005fkey"):
        body = ('{"model":"m","messages":[{"role":"user","content":"hi"}],"' + key + '":"sk-1"}').encode()
        out, hashes = finalize_and_hash(LlmCallRecord("r", "c", "p", "", body, "", "", "ok", 0))
        assert out.request_body == redact_body(body) != body
        assert b"sk-1" not in (out.request_body or b"")
        # The meter compares what was sent; after a restart a redacted stored body is unknown.
        assert hashes == message_hashes(body)
        assert stored_message_hashes(out.request_body) is None
