"""Turn commit, store side: append returns the caller's messages (encodings memoised) instead of
decoding what it stored, and the Head it returns still equals what a reload reads."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from byok.model.messages import Message, ToolCall
from byok.store import SQLiteStore
from tests.unit.test_messages_commit import messages


def reload(path: Path, conversation_id: str) -> tuple[Message, ...]:
    with SQLiteStore(path) as other:  # a second connection: no shared cache
        return other.head(conversation_id).messages


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(messages, min_size=1, max_size=3), min_size=1, max_size=3))
def test_append_head_equals_a_reload(batches: list[list[Message]]) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "byok.sqlite3"
        with SQLiteStore(path) as store:
            version = 0
            for batch in batches:
                head = store.append("c", version, batch, 1)
                version = head.version
                assert head.messages[-len(batch) :] == tuple(batch)
                # Well-typed messages come back as themselves, with their encodings memoised.
                assert all(got is m for got, m in zip(head.messages[-len(batch) :], batch, strict=True))
            assert head.messages == reload(path, "c")
            assert [m.id for m in head.messages] == [
                hashlib.sha256(m.encode()).digest() for m in reload(path, "c")
            ]


def test_append_decodes_a_message_that_would_not_reload_as_itself(tmp_path: Path) -> None:
    path = tmp_path / "byok.sqlite3"
    listed = attrs.evolve(
        Message(role="assistant", origin="assistant"),
        tool_calls=[ToolCall("c1", "Read", "{}", 0)],  # a list, where a reload gives a tuple
    )
    with SQLiteStore(path) as store:
        head = store.append("c", 0, [listed], 1)
    assert head.messages[0] is not listed
    assert head.messages[0].tool_calls == (ToolCall("c1", "Read", "{}", 0),)
    assert head.messages == reload(path, "c")


def test_append_hashes_each_message_once(tmp_path: Path) -> None:
    big = Message(role="tool", origin="tool", text="x\n" * 100_000, tool_call_id="c")
    with SQLiteStore(tmp_path / "byok.sqlite3") as store:
        head = store.append("c", 0, [big], 1)
    # The id the checkpoint needs next is already known: no second canonical JSON + SHA-256.
    assert head.messages[0]._id is not None and head.messages[0].memo_get("encoded") is not None
