"""The first call after a restart starts from the history's stored render (run/stored_render.py):
the daemon stores it at shutdown, the next one reads it back instead of decoding, projecting and
rendering the history's first messages, and the request is byte for byte the one a whole render
gives (the prefix meter compares it with the call before the restart)."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest
import trio

from byok.devtools.cursor_sim import Transcript, user_turn
from byok.model.messages import Message
from byok.store import SQLiteStore
from tests.integration.conftest import Daemon, start_daemon
from tests.support.fake_provider import Script, anthropic_text_script, chat_text_script, responses_text_script
from tests.support.run_driver import wait_run_ended

CONV = "conv-stored-render"
MODEL = "byok-demo"
EARLIER = 100  # messages already in the store, past stored_render.MIN_MESSAGES


def _earlier() -> list[Message]:
    out: list[Message] = []
    for i in range(EARLIER // 2):
        out.append(Message(role="user", origin="user", text=f"question {i}\nwith a second line"))
        out.append(Message(role="assistant", origin="assistant", text=f"answer {i}"))
    return out


def _script(kind: str, text: str) -> Script:
    scripts = {"openai_chat": chat_text_script, "openai_responses": responses_text_script}
    return scripts.get(kind, anthropic_text_script)([text])


async def _turn(d: Daemon, kind: str, n: int, state: object = None) -> Transcript:
    d.provider.enqueue(_script(kind, f"reply {n}"))
    request = user_turn(f"turn {n}", conversation_id=CONV, model_id=MODEL, message_id=f"m{n}", state=state)
    tr = await d.sim.run(f"req-{n}", request)
    assert tr.end_stream == {}, tr.end_stream
    await wait_run_ended(d.data_dir, f"req-{n}")
    return tr


def _stored_counts(data_dir: Path) -> list[int]:
    conn = sqlite3.connect(data_dir / "byok.sqlite3")
    try:
        rows = conn.execute("SELECT message_count FROM rendered_prefixes WHERE conversation_id = ?", (CONV,))
        return [row[0] for row in rows]
    finally:
        conn.close()


async def _stored_at_shutdown(data_dir: Path, count: int = EARLIER + 2) -> list[int]:
    """The stored render once the stopped daemon wrote it (its shutdown goes on in the
    background after start_daemon's exit)."""
    with trio.fail_after(10):
        while count not in (counts := await trio.to_thread.run_sync(_stored_counts, data_dir)):
            await trio.sleep(0.01)
    return counts


@pytest.mark.parametrize("kind", ["openai_chat", "openai_responses", "anthropic"])
async def test_the_first_call_after_a_restart_starts_from_the_stored_render(
    tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with SQLiteStore.open_in(data_dir) as store:
        store.append(CONV, 0, _earlier(), 1)
    caplog.set_level(logging.DEBUG, logger="byok.render")

    async with start_daemon(tmp_path, nursery, kind=kind) as d1:
        first = await _turn(d1, kind, 1)
        blobs = d1.sim.blobs
        (before,) = d1.provider.requests
    assert "from their stored render" not in caplog.text  # there was none yet
    assert await _stored_at_shutdown(data_dir) == [EARLIER + 2]

    async with start_daemon(tmp_path, nursery, kind=kind) as d2:
        d2.sim.blobs = blobs  # the client's KV store outlives the daemon
        await _turn(d2, kind, 2, state=first.checkpoints()[-1])
        (after,) = d2.provider.requests
    assert f"its first {EARLIER + 2} messages from their stored render" in caplog.text
    array = "input" if kind == "openai_responses" else "messages"
    old, new = before.json[array], after.json[array]
    assert new[: len(old)] == old and len(new) == len(old) + 2
    assert await _stored_at_shutdown(data_dir, EARLIER + 4) == [EARLIER + 4]
    # The call after the restart extends the one before it byte for byte (the prefix meter's
    # record is written by the call log, last in the shutdown).
    with trio.fail_after(10):
        while (stats := await trio.to_thread.run_sync(_prefix_stats, data_dir)) == (0, 0):
            await trio.sleep(0.01)
    assert stats == (1, 1)


def _prefix_stats(data_dir: Path) -> tuple[int, int]:
    with SQLiteStore.open_in(data_dir) as store:
        return store.prefix_stats(CONV)
