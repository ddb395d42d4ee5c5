"""A conversation that changes under a run's start (only an outside writer can do that: the
supervisor serialises runs) ends the run ``aborted``, whichever step of the start meets it."""

from __future__ import annotations

from pathlib import Path

import pytest

from byok.cursor.checkpoint import root_blob
from byok.cursor.request import parse_run_request
from byok.cursor.root_json import encode_root
from byok.devtools.cursor_sim import user_turn
from byok.loop.turn_values import FailedError
from byok.model.messages import Message
from byok.pb.agent import v1 as agent
from byok.run import start_point
from byok.store import AsyncStore, SQLiteStore

CONV = "conv-start"


def history() -> list[Message]:
    return [
        Message(role="user", origin="user", text="one"),
        Message(role="assistant", origin="assistant", text="two"),
    ]


async def test_a_resume_move_on_a_changed_conversation_is_aborted(tmp_path: Path) -> None:
    store = AsyncStore(SQLiteStore.open_in(tmp_path))
    first, second = history()
    seen = await store.append(CONV, (await store.append(CONV, 0, [first], 1)).version, [second], 1)
    await store.append(CONV, seen.version, [Message(role="user", origin="user", text="elsewhere")], 2)
    with pytest.raises(FailedError) as e:
        await start_point._move_to(store, CONV, seen, 1, lambda: 3)  # the head it saw is stale
    assert (e.value.failure.code, "changed under this run" in e.value.failure.message) == ("aborted", True)
    await store.aclose()


class Blobs:
    """The client's KV store, as import_history reads it."""

    def __init__(self, messages: list[Message]) -> None:
        self.data = {root_blob(m).id: encode_root(m) for m in messages}

    async def get(self, blob_id: bytes, timeout_s: float) -> bytes:
        return self.data[blob_id]


async def test_an_import_into_a_conversation_written_meanwhile_is_aborted(tmp_path: Path) -> None:
    store = AsyncStore(SQLiteStore.open_in(tmp_path))
    messages = history()
    state = agent.ConversationStateStructure(root_prompt_messages_json=[root_blob(m).id for m in messages])
    request = user_turn("three", conversation_id=CONV, model_id="m", message_id="m3", state=state)
    st = parse_run_request("req-1", request)
    # The run found no conversation, so it imports; another writer created it in between.
    await store.append(CONV, 0, [Message(role="user", origin="user", text="elsewhere")], 1)
    with pytest.raises(FailedError) as e:
        await start_point._import(store, Blobs(messages), st, 2, 1.0)  # type: ignore[arg-type]
    assert e.value.failure.code == "aborted"
    await store.aclose()


def test_the_client_checkpoint_teaches_its_ids_from_the_end_back_to_a_known_one() -> None:
    roots = [bytes([i]) * 32 for i in range(6)]
    turns = [b"t" * 32, b"u" * 32]
    state = agent.ConversationStateStructure(root_prompt_messages_json=roots[:4], turns=turns[:1])
    acked: set[bytes] = set()
    start_point._remember_client_blobs(acked, state)  # after a restart: all of it
    assert acked == {*roots[:4], turns[0]}
    # The next turn's checkpoint has grown at its end: what is new is learned.
    state = agent.ConversationStateStructure(root_prompt_messages_json=roots, turns=turns)
    start_point._remember_client_blobs(acked, state)
    assert acked == {*roots, *turns}
    # The scan stops at the first id already known: one not learned is at worst SET again.
    acked.discard(roots[1])
    start_point._remember_client_blobs(acked, state)
    assert roots[1] not in acked and len(acked) == len(roots) + len(turns) - 1
    start_point._remember_client_blobs(acked, None)  # no checkpoint: nothing to learn
    assert len(acked) == len(roots) + len(turns) - 1
