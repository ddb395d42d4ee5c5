"""Where a run starts: the committed head, an edit branch, a resume point, or an imported history.

The client's checkpoint decides *which point* a resume continues from; the store decides the
*content*. A conversation byok has never seen is imported from the client's blobs, verified
byte for byte, and fails closed when anything is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs
import trio

from byok.cursor.checkpoint import ClientState, TurnRecord, root_blob, turn_structure
from byok.cursor.root_json import RootJsonError, decode_root
from byok.loop.turn_values import Failed, FailedError
from byok.model.messages import Message
from byok.run.kv import KvFailure, KvLink
from byok.store import AsyncStore
from byok.store.records import Head


def _fail(code: str, message: str) -> FailedError:
    return FailedError(Failed(code, message))


async def _get_all(kv: KvLink, ids: list[bytes], timeout_s: float) -> list[bytes]:
    out: list[bytes | None] = [None] * len(ids)
    errors: list[str] = []

    async def one(i: int, blob_id: bytes) -> None:
        try:
            out[i] = await kv.get(blob_id, timeout_s)
        except KvFailure as e:
            errors.append(str(e))

    async with trio.open_nursery() as nursery:
        for i, blob_id in enumerate(ids):
            nursery.start_soon(one, i, blob_id)
    if errors:
        raise _fail("failed_precondition", f"cannot load the conversation from the client: {errors[0]}")
    return [b for b in out if b is not None]


async def import_history(
    store: AsyncStore,
    kv: KvLink,
    conversation_id: str,
    state: ClientState,
    now_ms: int,
    timeout_s: float,
) -> Head:
    """Commit the client's transcript as the conversation's first revision. The system root is
    dropped: this run's prompt replaces it."""
    datas = await _get_all(kv, list(state.root_prompt_messages_json), timeout_s)
    messages: list[Message] = []
    try:
        for data in datas:
            m = decode_root(data)
            if m.role != "system":
                messages.append(m)
        for text in state.pending_tool_calls:  # a staged assistant travels inline
            messages.append(decode_root(text.encode()))
    except RootJsonError as e:
        raise _fail("failed_precondition", f"cannot import the conversation: {e}") from None
    if not messages:
        return await store.head(conversation_id)
    return await store.append(conversation_id, 0, group_foreign_rounds(messages), now_ms)


def group_foreign_rounds(messages: list[Message]) -> list[Message]:
    """Roots written by another server carry no tool-round identity: give each assistant with
    calls a deterministic round id and attach the tool results that follow it, in order, so
    projection folds them like byok's own rounds."""
    out: list[Message] = []
    round_id = ""
    seq = 0
    for i, m in enumerate(messages):
        if m.role == "assistant" and m.tool_calls and not m.tool_round_id:
            round_id, seq = f"imported:{i}", 0
            m = attrs.evolve(m, tool_round_id=round_id)
        elif m.role == "tool" and not m.tool_round_id and round_id:
            seq += 1
            m = attrs.evolve(m, tool_round_id=round_id, completion_seq=seq)
        elif m.role != "tool":
            round_id = ""
        out.append(m)
    return out


async def fetch_turn(kv: KvLink, turn_id: bytes, timeout_s: float) -> TurnRecord | None:
    """The client's copy of an unfinished turn, so a resumed run keeps adding to it; None when
    the last turn is no agent turn (a shell command the user ran: it is over, nothing to add)."""
    (data,) = await _get_all(kv, [turn_id], timeout_s)
    structure = turn_structure(data)
    if structure is None:
        return None
    parts = await _get_all(kv, [structure.user_message, *structure.steps], timeout_s)
    return TurnRecord(structure.request_id, parts[0], tuple(parts[1:]))


def resume_point(
    head: Head,
    state: ClientState,
    *,
    imported: bool = False,
    root_id_of: Callable[[Message], bytes] = lambda m: root_blob(m).id,
) -> tuple[int, Message | None]:
    """(number of committed messages the client's checkpoint covers, the staged tool-round
    assistant to run again, or None).

    Verifies that the client's roots are byok's own messages, so a resume never continues a
    history the store does not hold (``root_id_of``: the root id byok published for a message).
    A staged *final* answer (the turn-end staged checkpoint) covers that answer: nothing is run
    again."""
    if imported:
        # The history was just imported from exactly these blobs (hash-verified); the staged
        # message, if any, is its last message.
        last = head.messages[-1] if head.messages else None
        if state.pending_tool_calls and last is not None and last.tool_calls:
            return len(head.messages), last
        return len(head.messages), None
    roots = list(state.root_prompt_messages_json)[1:]  # [0] is the system prompt
    staged: Message | None = None
    count = len(roots)
    if state.pending_tool_calls:
        try:
            pending = decode_root(state.pending_tool_calls[0].encode())
        except RootJsonError as e:
            raise _fail("invalid_argument", f"unreadable staged message: {e}") from None
        if pending.tool_round_id:
            for i, m in enumerate(head.messages):
                if m.role == "assistant" and m.tool_round_id == pending.tool_round_id:
                    staged, count = m, i + 1
                    break
            else:
                raise _fail("failed_precondition", "the staged tool round is not in byok's history")
        else:
            at = len(roots)
            if at >= len(head.messages) or root_blob(head.messages[at]).id != root_blob(pending).id:
                raise _fail("failed_precondition", "the staged answer is not in byok's history")
            count = at + 1
    if count > len(head.messages):
        raise _fail("failed_precondition", "the client's checkpoint is ahead of byok's history")
    for root_id, m in zip(roots, head.messages[: len(roots)], strict=False):
        if root_id_of(m) != root_id:
            raise _fail("failed_precondition", "the client's checkpoint does not match byok's history")
    return count, staged


def covered_count(state: ClientState) -> int:
    """How many committed messages the client's checkpoint covers: its roots but the system
    prompt, and its staged message."""
    return max(len(state.root_prompt_messages_json) - 1, 0) + (1 if state.pending_tool_calls else 0)


def branch_points(
    ends: Iterable[tuple[int, Message]],
    state: ClientState,
    root_id_of: Callable[[Message], bytes],
) -> list[int]:
    """Of revisions holding ``covered_count(state)`` messages (any branch, each with its last
    message), those whose last message is the checkpoint's: its last root, or its staged
    message (the same tool round; the same answer). In the given order. A point the head has
    left (an edit branched back before it since) is one of them; ``resume_point`` checks the
    rest of its roots against the revision's whole history."""
    roots = list(state.root_prompt_messages_json)[1:]
    is_last: Callable[[Message], bool]
    if state.pending_tool_calls:
        try:
            pending = decode_root(state.pending_tool_calls[0].encode())
        except RootJsonError:
            return []
        if pending.tool_round_id:
            round_id = pending.tool_round_id

            def is_last(m: Message) -> bool:
                return m.role == "assistant" and m.tool_round_id == round_id
        else:
            pending_id = root_blob(pending).id

            def is_last(m: Message) -> bool:
                return root_blob(m).id == pending_id
    elif roots:
        last_root = roots[-1]

        def is_last(m: Message) -> bool:
            return root_id_of(m) == last_root
    else:
        return []
    return [revision_id for revision_id, last in ends if is_last(last)]
