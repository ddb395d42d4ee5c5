"""Where a run starts, in values: the first store trip (it writes the run's row and, for a user
turn, branches for an edit and appends the runtime message in the same transaction), then the
import or the resume move, and the turn each action continues. Run keeps what these return.

history.py decides which point a resume continues from and imports histories byok has not seen.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable, Iterator

import attrs

from byok.cursor.background import completion_event_id, completion_message
from byok.cursor.checkpoint import ClientState, TurnRecord, empty_turn
from byok.cursor.interaction_actions import event_message
from byok.cursor.prompting import ModeAssets, build_runtime_message
from byok.cursor.request import RunStart
from byok.cursor.start_plan import may_import, plan_start, planned_turn
from byok.cursor.token_details import TokenDetails
from byok.loop.turn_values import Failed, FailedError
from byok.model.images import ImagePart
from byok.model.messages import Message
from byok.run.conversation import ConversationMemory
from byok.run.history import (
    branch_points,
    covered_count,
    fetch_turn,
    import_history,
    resume_point,
)
from byok.run.kv import KvLink
from byok.store import AsyncStore, SQLiteStore, StaleRevision
from byok.store.records import Head


def iso_utc(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="seconds")


def changed_under_run(e: StaleRevision) -> Failed:
    # The supervisor serializes runs, so only an outside writer can move the head.
    return Failed("aborted", f"conversation changed under this run: {e}")


@contextlib.contextmanager
def _aborted_on_conflict() -> Iterator[None]:
    """Any store write of the start that meets a conversation changed under it ends the run
    ``aborted``, whichever step it is."""
    try:
        yield
    except StaleRevision as e:
        raise FailedError(changed_under_run(e)) from None


def _run_event_id(st: RunStart) -> str:
    return f"run-request:{st.request_id}"


def runtime_message(
    assets: ModeAssets, st: RunStart, now_ms: int, images: tuple[ImagePart, ...] = ()
) -> Message:
    """A user turn's runtime message: the user's message in the mode's template, with its images."""
    assert st.user_message is not None
    return build_runtime_message(
        assets.runtime_template,
        request_id=st.request_id,
        user_message=st.user_message,
        request_context=st.request_context,
        now_iso=iso_utc(now_ms),
        time_zone=None,
        images=images,
    )


@attrs.frozen
class Begun:
    """What the first store trip found and did, in its one hop to the store's thread."""

    head: Head
    turns: tuple[bytes, ...]
    # False: a user turn must import the client's history first, then append (unread otherwise)
    appended: bool


def _load_start(s: SQLiteStore, run: tuple[str, str], conversation_id: str, now_ms: int) -> Begun:
    s.start_run(run[0], conversation_id, run[1], now_ms)
    head = s.head(conversation_id)
    return Begun(head, s.turns_at(head.revision_id), appended=False)


def _begin_user_turn(
    s: SQLiteStore,
    run: tuple[str, str],
    conversation_id: str,
    event_id: str,
    message_id: str,
    runtime: Message,
    now_ms: int,
    *,
    may_import: bool,
) -> Begun:
    """The start of a user turn in one hop to the store's thread and one commit: load the head,
    branch for an edit, append the runtime message exactly once (a retried run_request replays)
    with the run's row in the same transaction.

    Its writes are not fsynced (``durable=False``, ``synchronous=NORMAL``): they survive a kill -9
    of byok, and only an OS crash or power loss can lose them, before the client has seen anything
    of this run (it sends the message again). The run's first commit the client is told about
    (an answer, a tool round) is FULL and fsyncs them with it."""
    head = s.head(conversation_id)
    turns = s.turns_at(head.revision_id)
    if head.version == 0 and may_import:
        s.start_run(run[0], conversation_id, run[1], now_ms, durable=False)
        return Begun(head, turns, appended=False)
    if s.runtime_event_message(conversation_id, event_id) is not None:
        s.start_run(run[0], conversation_id, run[1], now_ms, durable=False)
        return Begun(head, turns, appended=True)
    if message_id:
        seen, anchor = s.input_anchor(conversation_id, message_id)
        if seen and anchor != head.revision_id:
            # An edited (or retried) message: branch from the revision before it.
            head = s.move_head(conversation_id, head.version, anchor, now_ms, durable=False)
            turns = s.turns_at(anchor)
    head = s.append(
        conversation_id,
        head.version,
        [runtime],
        now_ms,
        event_id=event_id,
        input_id=message_id or None,
        start_run=run,
        durable=False,
    )
    return Begun(head, turns, appended=True)


async def begin(store: AsyncStore, st: RunStart, runtime: Message | None, now_ms: int) -> Begun:
    """The first store trip, which writes the run's row; ``runtime`` is a user turn's runtime
    message (None for any other action). Raises RunExists when an earlier run owns the request id."""
    run = (st.request_id, st.model_id)
    if runtime is None:
        return await store.call(_load_start, run, st.conversation_id, now_ms)
    assert st.user_message is not None
    with _aborted_on_conflict():
        # The common path: one store trip, one fsync, before the provider call.
        return await store.call(
            _begin_user_turn,
            run,
            st.conversation_id,
            _run_event_id(st),
            st.user_message.message_id,
            runtime,
            now_ms,
            may_import=may_import(st),
        )


@attrs.frozen
class StartPoint:
    """Where the run continues from: the head it appends to, the turns before this one, the turn
    it builds and any staged round to run again."""

    head: Head
    prior_turns: tuple[bytes, ...]
    turn: TurnRecord
    staged: Message | None
    token_details: TokenDetails | None  # the client's meter, when it sent one
    # An action whose every runtime message an earlier run appended (a retry): background
    # completions, async answers, a plan to build.
    repeated: bool = False


async def start_point(
    store: AsyncStore,
    kv: KvLink,
    memory: ConversationMemory,
    st: RunStart,
    begun: Begun,
    runtime: Message | None,
    *,
    wall_ms: Callable[[], int],
    timeout_s: float,
    runtime_template: str = "",
) -> StartPoint:
    """After the first trip: the steps ``plan_start`` decided (import the history, append the
    runtime message, move the head for a resume, append finished subagents' reports), each
    appended message exactly once."""
    state = st.client_state
    details = state.token_details if state is not None else None
    plan = plan_start(st, begun.head.version, begun.appended)
    head, prior_turns = begun.head, begun.turns
    if plan.imports:
        head, prior_turns = await _import(store, kv, st, wall_ms(), timeout_s)
    _remember_client_blobs(memory.acked, state)
    if plan.append_runtime:
        assert runtime is not None and st.user_message is not None
        input_id = st.user_message.message_id or None
        head = await _append(
            store,
            st,
            head,
            runtime,
            wall_ms(),
            event_id=_run_event_id(st),
            input_id=input_id,
            durable=False,  # as in _begin_user_turn
        )
    staged: Message | None = None
    if plan.resume:
        assert state is not None
        # A summary is taken at the client's checkpoint, but the head moves only with its commit:
        # a compaction that fails or is cancelled leaves the history as it was.
        move = st.action != "summarize_action"
        head, staged = await _resume(
            store, memory, st, head, state, imported=plan.imports, wall_ms=wall_ms, move=move
        )
        prior_turns = tuple(state.turns[:-1])
    appended = 0
    for c in plan.completions:
        before = head.version
        head = await _append(
            store, st, head, completion_message(c), wall_ms(), event_id=completion_event_id(c)
        )
        appended += head.version != before
    if plan.event:
        now, before = wall_ms(), head.version
        message = event_message(st, head.messages, runtime_template, iso_utc(now))
        head = await _append(store, st, head, message, now, event_id=message.event_id)
        appended += head.version != before
    turn = planned_turn(st, plan)
    if turn is None:
        assert state is not None
        turn = await fetch_turn(kv, state.turns[-1], timeout_s)
        if turn is None:  # the last turn was a user's shell command: a new turn follows it
            prior_turns, turn = tuple(state.turns), empty_turn(st.request_id)
    repeated = (bool(plan.completions) or plan.event) and not appended
    return StartPoint(head, prior_turns, turn, staged, details, repeated)


async def _resume(
    store: AsyncStore,
    memory: ConversationMemory,
    st: RunStart,
    head: Head,
    state: ClientState,
    *,
    imported: bool,
    wall_ms: Callable[[], int],
    move: bool = True,
) -> tuple[Head, Message | None]:
    """The head moved to the client's checkpoint, and the staged round to run again, if any.
    Without ``move`` the store's head stays where it is: the Head returned holds the checkpoint's
    revision and messages with the store head's version, which the run's next commit (a
    compaction's new root) must still match."""
    if memory.needs_recall(head.messages):
        memory.recall(await store.root_ids_at(head.revision_id))
    try:
        count, staged = resume_point(head, state, imported=imported, root_id_of=memory.root_id_of)
    except FailedError:
        # Not on the head's branch: an edit may have branched back before the client's point
        # since (a failed retry of the same message). byok's revision holding exactly that
        # point, if it has one, becomes the head.
        branch = None if imported else await _branch_point(store, memory, head, state)
        if branch is None:
            raise
        at, count, staged = branch
        if not move:
            messages = (await store.messages_at(at))[:count]
            target = at if count == len(messages) else await store.ancestor_with_count(at, count)
            return Head(head.conversation_id, target, head.version, messages), staged
        with _aborted_on_conflict():
            head = await store.move_head(st.conversation_id, head.version, at, wall_ms())
    if not move:
        if count == len(head.messages):
            return head, staged
        target = await store.ancestor_with_count(head.revision_id, count)
        return Head(head.conversation_id, target, head.version, head.messages[:count]), staged
    return await _move_to(store, st.conversation_id, head, count, wall_ms), staged


def _remember_client_blobs(acked: set[bytes], state: ClientState | None) -> None:
    if state is None:
        return
    # The client holds every blob its checkpoint references (a checkpoint only ever names
    # ACKed blobs): after a restart nothing it already has is SET again.
    _learn_tail(acked, state.root_prompt_messages_json)
    _learn_tail(acked, state.turns)


def _learn_tail(acked: set[bytes], ids: list[bytes]) -> None:
    """Add ``ids`` from the end back to the first one already known. A checkpoint's lists grow
    at their end, so a long conversation's turn costs what is new, not the whole list (0.18 ms
    at 5,000 roots in isolation). An id missed this way is at worst SET again."""
    for blob_id in reversed(ids):
        if blob_id in acked:
            return
        acked.add(blob_id)


async def _import(
    store: AsyncStore, kv: KvLink, st: RunStart, now_ms: int, timeout_s: float
) -> tuple[Head, tuple[bytes, ...]]:
    assert st.client_state is not None
    with _aborted_on_conflict():
        head = await import_history(store, kv, st.conversation_id, st.client_state, now_ms, timeout_s)
    return head, tuple(st.client_state.turns)


async def _append(
    store: AsyncStore,
    st: RunStart,
    head: Head,
    message: Message,
    now_ms: int,
    *,
    event_id: str,
    input_id: str | None = None,
    durable: bool = True,
) -> Head:
    with _aborted_on_conflict():
        return await store.append(
            st.conversation_id,
            head.version,
            [message],
            now_ms,
            event_id=event_id,
            input_id=input_id,
            durable=durable,
        )


async def _branch_point(
    store: AsyncStore, memory: ConversationMemory, head: Head, state: ClientState
) -> tuple[int, int, Message | None] | None:
    """(revision, resume_point's count and staged message) of the newest revision off the head's
    branch whose history is exactly the client's checkpoint, or None."""
    ends = await store.revisions_with_count(head.conversation_id, covered_count(state))
    for revision_id in branch_points(ends, state, memory.root_id_of):
        if revision_id == head.revision_id:
            continue  # resume_point refused it already
        messages = await store.messages_at(revision_id)
        if memory.needs_recall(messages):
            memory.recall(await store.root_ids_at(revision_id))
        at = Head(head.conversation_id, revision_id, head.version, messages)
        try:
            count, staged = resume_point(at, state, root_id_of=memory.root_id_of)
        except FailedError:
            continue
        return revision_id, count, staged
    return None


async def _move_to(
    store: AsyncStore, conversation_id: str, head: Head, count: int, wall_ms: Callable[[], int]
) -> Head:
    """The head moved back to the revision holding the first ``count`` messages."""
    if count == len(head.messages):
        return head
    target = await store.ancestor_with_count(head.revision_id, count)
    with _aborted_on_conflict():
        return await store.move_head(conversation_id, head.version, target, wall_ms())
