"""Fuzzing ``SQLiteStore``: arbitrary append sequences with compare-and-swap, stale versions,
replayed event ids and edit-style head moves never corrupt a history.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from byok.model.messages import Message
from byok.store import Head, SQLiteStore, StaleRevision
from tests.fuzz.support import fuzz, model_messages

_store_ops = st.lists(
    st.tuples(
        st.sampled_from(["c1", "c2"]),
        st.sampled_from([0, 0, 0, -1, 1]),  # expected version = current + this (stale when != 0)
        st.lists(model_messages, min_size=1, max_size=3),
        st.none() | st.sampled_from(["e1", "e2", "e3"]),  # runtime event id (exactly-once key)
        st.none() | st.sampled_from(["back"]),  # move the head back one revision first (an edit)
    ),
    min_size=1,
    max_size=10,
)


@pytest.fixture(scope="module")
def store_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


_store_runs = iter(range(10**9))


@fuzz(60)
@given(_store_ops)
def test_store_cas_appends_never_corrupt_history(store_dir: Path, ops: list[Any]) -> None:
    data_dir = store_dir / f"s{next(_store_runs)}"
    try:
        _check_store_ops(data_dir, ops)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def _check_store_ops(data_dir: Path, ops: list[Any]) -> None:
    model: dict[str, tuple[int, int | None, tuple[Message, ...]]] = {}  # conv -> version, revision, messages
    revisions: dict[int, tuple[Message, ...]] = {}
    parents: dict[int, int | None] = {}
    events: dict[str, set[str]] = {}
    now = 0
    with SQLiteStore.open_in(data_dir) as store:
        for conv, delta, messages, event_id, move in ops:
            now += 1
            version, revision, history = model.get(conv, (0, None, ()))
            if move and revision is not None:
                back = parents[revision]
                head = store.move_head(conv, version, back, now)
                version, revision, history = version + 1, back, revisions[back] if back is not None else ()
                assert (head.version, head.revision_id, head.messages) == (version, revision, history)
                model[conv] = (version, revision, history)
            expected = version + delta if version + delta >= 0 else version + 1  # never negative
            stale = expected != version
            before = store.head(conv)
            try:
                head = store.append(conv, expected, messages, now, event_id=event_id)
            except StaleRevision as e:
                assert stale and event_id not in events.get(conv, set())
                assert (e.expected_version, e.actual_version) == (expected, version)
                assert store.head(conv) == before  # a lost CAS leaves the conversation untouched
                continue
            if event_id is not None and event_id in events.get(conv, set()):
                assert head == before  # already consumed: replayed, nothing appended
                continue
            assert not stale
            assert head.messages == history + tuple(messages)
            assert head.version == version + 1 and head.revision_id is not None
            parents[head.revision_id] = revision
            revisions[head.revision_id] = head.messages
            model[conv] = (head.version, head.revision_id, head.messages)
            if event_id is not None:
                events.setdefault(conv, set()).add(event_id)
        for conv, (version, revision, history) in model.items():
            assert store.head(conv) == Head(conv, revision, version, history)
    # A fresh connection (no cache) reads back every revision exactly.
    with SQLiteStore.open_in(data_dir) as fresh:
        for revision, history in revisions.items():
            assert fresh.messages_at(revision) == history
        for conv, (version, revision, history) in model.items():
            head = fresh.head(conv)
            assert (head.version, head.revision_id, head.messages) == (version, revision, history)
