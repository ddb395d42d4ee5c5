"""Checkpoint root ids kept across a restart (store/root_ids.py): the first checkpoint after one
encodes only the messages that are new, and lists the same ids the client already holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from byok.cursor import checkpoint
from byok.devtools.cursor_sim import user_turn
from byok.model.messages import Message
from byok.run import conversation
from byok.store import SQLiteStore
from tests.integration.conftest import start_daemon
from tests.support.fake_provider import chat_text_script
from tests.support.run_driver import wait_run_ended

CONV = "conv-roots"
MODEL = "byok-demo"
EARLIER = 100  # messages already in the store, past conversation.RECALL_MIN


def earlier_history() -> list[Message]:
    out: list[Message] = []
    for i in range(EARLIER // 2):
        out.append(Message(role="user", origin="user", text=f"question {i}"))
        out.append(Message(role="assistant", origin="assistant", text=f"answer {i}"))
    return out


@pytest.mark.parametrize("keep_saved", [True, False])
async def test_the_first_checkpoint_after_a_restart_encodes_only_new_messages(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, keep_saved: bool
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with SQLiteStore.open_in(data_dir) as store:
        store.append(CONV, 0, earlier_history(), 1)

    encoded: list[Message] = []

    def counting_root_blob(message: Message) -> checkpoint.Blob:
        encoded.append(message)
        return checkpoint.root_blob(message)

    monkeypatch.setattr(conversation, "root_blob", counting_root_blob)

    async with start_daemon(tmp_path, nursery) as d1:
        d1.provider.enqueue(chat_text_script(["first"]))
        first = await d1.sim.run(
            "req-1", user_turn("one", conversation_id=CONV, model_id=MODEL, message_id="m1")
        )
        assert first.end_stream == {}
        await wait_run_ended(d1.data_dir, "req-1")
        blobs = d1.sim.blobs
        live = list(encoded)  # the daemon's; its teardown replays the run, encoding them again
    state = first.checkpoints()[-1]
    assert len(live) == EARLIER + 2  # nothing saved yet: every message encoded once

    with SQLiteStore.open_in(data_dir) as store:
        head = store.head(CONV)
        saved = store.root_ids_at(head.revision_id)
        assert saved == {m.id: checkpoint.root_blob(m).id for m in head.messages}
        if not keep_saved:
            store._conn.execute("DELETE FROM message_roots")

    encoded.clear()
    async with start_daemon(tmp_path, nursery) as d2:
        d2.sim.blobs = blobs  # the client's KV store outlives the daemon
        d2.provider.enqueue(chat_text_script(["second"]))
        second = await d2.sim.run(
            "req-2", user_turn("two", conversation_id=CONV, model_id=MODEL, message_id="m2", state=state)
        )
        assert second.end_stream == {}
        await wait_run_ended(d2.data_dir, "req-2")
        live = list(encoded)
    assert [(m.role, m.origin) for m in live[-2:]] == [("user", "runtime"), ("assistant", "assistant")]
    assert len(live) == (2 if keep_saved else EARLIER + 4)
    settled = second.checkpoints()[-1]
    # The same ids as before the restart, then the two new messages' roots.
    roots = list(settled.root_prompt_messages_json)
    assert roots[: len(state.root_prompt_messages_json)] == list(state.root_prompt_messages_json)
    assert len(roots) == len(state.root_prompt_messages_json) + 2
    assert all(r in d2.sim.blobs for r in roots)  # the client holds every root listed
