"""A resume from a point on a branch the head has left (history.branch_points, the store's
revisions_with_count and start_point._branch_point): the revision holding exactly the client's
checkpoint is found by its last message and checked root by root."""

from __future__ import annotations

from pathlib import Path

import pytest

from byok.cursor.checkpoint import root_blob
from byok.cursor.root_json import encode_root
from byok.loop.turn_values import FailedError
from byok.model.messages import Message, ToolCall
from byok.pb.agent import v1 as agent
from byok.run import start_point
from byok.run.conversation import ConversationMemory
from byok.run.history import branch_points, covered_count, resume_point
from byok.store import AsyncStore, SQLiteStore
from byok.store.records import Head

CONV = "conv-branch"
SYSTEM = b"s" * 32  # the client's system root: never byok's message

R1 = Message(role="user", origin="runtime", text="hi", event_id="run-request:r1")
A1 = Message(role="assistant", origin="assistant", text="Hello.")
R2 = Message(role="user", origin="runtime", text="read notes", event_id="run-request:r2")
A2 = Message(
    role="assistant",
    origin="assistant",
    tool_calls=(ToolCall("toolu_1", "Read", '{"path": "notes.txt"}', 0),),
    tool_round_id="round-1",
)
T2 = Message(
    role="tool",
    origin="tool",
    text="alpha",
    tool_call_id="toolu_1",
    tool_name="Read",
    tool_round_id="round-1",
    completion_seq=1,
)
RETRY = Message(role="user", origin="runtime", text="read notes", event_id="run-request:r2-retry")


def settled(messages: list[Message]) -> agent.ConversationStateStructure:
    return agent.ConversationStateStructure(
        root_prompt_messages_json=[SYSTEM, *(root_blob(m).id for m in messages)]
    )


def staged(before: list[Message], pending: Message) -> agent.ConversationStateStructure:
    return agent.ConversationStateStructure(
        root_prompt_messages_json=[SYSTEM, *(root_blob(m).id for m in before)],
        pending_tool_calls=[encode_root(pending).decode()],
    )


def own_root(m: Message) -> bytes:
    return root_blob(m).id


def test_the_count_a_checkpoint_covers() -> None:
    assert covered_count(settled([R1, A1, R2, A2, T2])) == 5
    assert covered_count(staged([R1, A1, R2], A2)) == 4
    assert covered_count(agent.ConversationStateStructure()) == 0


def test_branch_points_pick_the_revisions_ending_at_the_checkpoint() -> None:
    ends = [(9, RETRY), (4, T2), (3, A2), (2, R2)]
    assert branch_points(ends, settled([R1, A1, R2, A2, T2]), own_root) == [4]
    assert branch_points(ends, staged([R1, A1, R2], A2), own_root) == [3]  # its tool round
    answer = Message(role="assistant", origin="assistant", text="The file says alpha.")
    assert branch_points([(5, answer), *ends], staged([R1, A1, R2, A2, T2], answer), own_root) == [5]
    # A point byok never had, and a checkpoint of no messages, have none.
    foreign = Message(role="user", origin="user", text="from elsewhere")
    assert branch_points(ends, settled([R1, A1, foreign]), own_root) == []
    assert (
        branch_points(ends, agent.ConversationStateStructure(root_prompt_messages_json=[SYSTEM]), own_root)
        == []
    )
    # An unreadable staged message: no branch (resume_point's own refusal stands).
    bad = agent.ConversationStateStructure(root_prompt_messages_json=[SYSTEM], pending_tool_calls=["{"])
    assert branch_points(ends, bad, own_root) == []


async def grown(tmp_path: Path) -> tuple[AsyncStore, Head, dict[str, int]]:
    """Turn 1, turn 2's Read round, then the same message again after the edit's branch."""
    store = AsyncStore(SQLiteStore.open_in(tmp_path))
    head = Head(CONV, None, 0, ())
    at: dict[str, int] = {}
    for name, m in (("r1", R1), ("a1", A1), ("r2", R2), ("a2", A2), ("t2", T2)):
        head = await store.append(CONV, head.version, [m], 1)
        assert head.revision_id is not None
        at[name] = head.revision_id
    head = await store.move_head(CONV, head.version, at["a1"], 2)  # the edit's branch
    head = await store.append(CONV, head.version, [RETRY], 2)
    assert head.revision_id is not None
    at["retry"] = head.revision_id
    return store, head, at


async def test_revisions_of_any_branch_by_count(tmp_path: Path) -> None:
    store, _, at = await grown(tmp_path)
    assert [(r, m.text) for r, m in await store.revisions_with_count(CONV, 3)] == [
        (at["retry"], "read notes"),  # newest first
        (at["r2"], "read notes"),
    ]
    assert [(r, m) for r, m in await store.revisions_with_count(CONV, 5)] == [(at["t2"], T2)]
    assert await store.revisions_with_count(CONV, 6) == []
    assert await store.revisions_with_count("other", 3) == []
    await store.aclose()


async def test_a_settled_point_off_the_head_is_found_and_checked(tmp_path: Path) -> None:
    store, head, at = await grown(tmp_path)
    state = settled([R1, A1, R2, A2, T2])
    with pytest.raises(FailedError, match="ahead of byok's history"):
        resume_point(head, state)
    memory = ConversationMemory()
    assert await start_point._branch_point(store, memory, head, state) == (at["t2"], 5, None)
    # The staged round of the same branch: its assistant's revision, with the round to run again.
    found = await start_point._branch_point(store, memory, head, staged([R1, A1, R2], A2))
    assert found == (at["a2"], 4, A2)
    await store.aclose()


async def test_a_checkpoint_whose_other_roots_differ_is_not_resumed(tmp_path: Path) -> None:
    store, head, _ = await grown(tmp_path)
    # The same last message after a first root byok never published: not byok's history.
    forged = settled([R1, A1, R2, A2, T2])
    forged.root_prompt_messages_json[1] = b"x" * 32
    assert await start_point._branch_point(store, ConversationMemory(), head, forged) is None
    await store.aclose()
