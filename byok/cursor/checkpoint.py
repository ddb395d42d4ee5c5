"""The checkpoint blob graph: canonical state -> ConversationStateStructure + the blobs it references.

Blob id = SHA-256 of the blob bytes (Cursor's KV store verifies it). Everything here is a
pure function of its inputs, so the same history always yields the same ids.

Graph (seeds 000 §5, §7):
  state.root_prompt_messages_json[] -> JSON model message blobs (cursor/root_json.py)
  state.turns[] -> ConversationTurnStructure blob
      .agent_conversation_turn.user_message -> UserMessage blob
      .agent_conversation_turn.steps[]     -> ConversationStep blobs
A staged checkpoint carries the not-yet-settled assistant message inline in
pending_tool_calls (its root JSON text); the settled one folds it into the roots.
"""

from __future__ import annotations

import functools
import hashlib
import weakref
from collections.abc import Callable, Sequence

import attrs

from byok.cursor import encode, proto_decode
from byok.cursor.plan_state import PlanState
from byok.cursor.root_json import encode_root
from byok.model.messages import Message
from byok.pb.agent import v1 as agent


@attrs.frozen
class Blob:
    id: bytes
    data: bytes

    @classmethod
    def of(cls, data: bytes) -> Blob:
        return cls(hashlib.sha256(data).digest(), data)


@attrs.frozen
class TurnRecord:
    """The turn this run is building: the user's message and its steps so far."""

    request_id: str
    user_message: bytes  # encoded agent.UserMessage, as the client sent it
    steps: tuple[bytes, ...] = ()  # encoded agent.ConversationStep values, in order
    # Step index -> its Blob: every checkpoint of a turn references all its steps so far, and a
    # step can be megabytes (a Read's card); each is hashed once.
    _step_blobs: dict[int, Blob] = attrs.field(factory=dict, init=False, eq=False, repr=False, hash=False)

    def with_step(self, step: bytes, blob: Blob | None = None) -> TurnRecord:
        """``blob``: the step's Blob when it was hashed already (a result's early SET)."""
        turn = attrs.evolve(self, steps=(*self.steps, step))
        turn._step_blobs.update(self._step_blobs)
        if blob is not None:
            turn._step_blobs[len(self.steps)] = blob
        return turn

    def with_steps(self, blobs: Sequence[Blob]) -> TurnRecord:
        """``with_step`` of each already hashed step, in order."""
        turn = self
        for blob in blobs:
            turn = turn.with_step(blob.data, blob)
        return turn

    def step_blobs(self) -> list[Blob]:
        memo = self._step_blobs
        for i, step in enumerate(self.steps):
            if i not in memo:
                memo[i] = Blob.of(step)
        return [memo[i] for i in range(len(self.steps))]

    def structure(self) -> Blob:
        """The turn's own blob: its user message and steps by id (what a checkpoint lists)."""
        return Blob.of(
            bytes(
                agent.ConversationTurnStructure(
                    agent_conversation_turn=agent.AgentConversationTurnStructure(
                        user_message=hashlib.sha256(self.user_message).digest(),
                        steps=[s.id for s in self.step_blobs()],
                        request_id=self.request_id,
                    )
                )
            )
        )


ClientState = agent.ConversationStateStructure  # the checkpoint a client sends back


@attrs.frozen
class TurnStructure:
    """A turn blob's references: what the client's copy of a turn is made of."""

    request_id: str
    user_message: bytes  # blob ids
    steps: tuple[bytes, ...]


def turn_structure(data: bytes) -> TurnStructure | None:
    """The references of a ConversationTurnStructure blob; None unless it is an agent turn."""
    turn = proto_decode.parse(agent.ConversationTurnStructure, data).agent_conversation_turn
    if turn is None:
        return None
    return TurnStructure(turn.request_id or "", turn.user_message, tuple(turn.steps))


def empty_turn(request_id: str) -> TurnRecord:
    """A turn with no user message (a resume of a conversation whose checkpoint lists none)."""
    return TurnRecord(request_id, bytes(agent.UserMessage()))


@attrs.frozen
class Checkpoint:
    state: bytes  # encoded agent.ConversationStateStructure
    blobs: tuple[Blob, ...]  # every referenced blob, children before parents
    turn_id: bytes | None


def thinking_step(text: str, duration_ms: int) -> bytes:
    return bytes(
        agent.ConversationStep(thinking_message=agent.ThinkingMessage(text=text, duration_ms=duration_ms))
    )


def assistant_step(text: str) -> bytes:
    return bytes(agent.ConversationStep(assistant_message=agent.AssistantMessage(text=text)))


def root_blob(message: Message) -> Blob:
    return Blob.of(encode_root(message))


@functools.lru_cache(maxsize=16)  # one per mode's prompt; rebuilt for every checkpoint otherwise
def system_root(system_prompt: str) -> Blob:
    return root_blob(Message(role="system", origin="runtime", text=system_prompt))


def build_checkpoint(
    *,
    system_prompt: str,
    stable: Sequence[Message],
    pending: Sequence[Message] = (),
    prior_turns: Sequence[bytes] = (),
    turn: TurnRecord | None,
    token_details: agent.ConversationTokenDetails,
    mode: agent.AgentMode,
    root_of: Callable[[Message], Blob] = root_blob,
    roots: RootList | None = None,
    summary: str | None = None,
    summaries: int = 0,
    todos: Sequence[Blob] = (),
    plan: PlanState | None = None,
    progress: tuple[str, agent.CommunicateUpdateTurnState] | None = None,
    shell_turn: Sequence[Blob] = (),
) -> Checkpoint:
    """``root_of``: a message's root blob, with empty data when the client holds it already (such
    a blob is listed, not sent). ``roots``: the conversation's RootList, so a growing history
    only works out the roots of what is new; without one every root is worked out.
    ``summary``: the text of the summary a compacted history starts with; ``summaries``: how many
    compactions the conversation has had (self_summary_count). ``todos``: the todo list's blobs
    (one encoded TodoItem each, folded from the history: cursor/todos.py). ``plan``: the
    conversation's current plan (cursor/plan_state.py), shown in ``plan`` (the id of its
    ConversationPlan blob) and ``plans``. ``progress``: a subagent's (parent Task call id,
    progress folded from its UpdateCurrentStep calls). ``shell_turn``: the blobs of a user's
    shell command's turn (cursor/user_shell.py), its structure last: listed as the last turn
    (instead of ``turn``)."""
    system = system_root(system_prompt)
    entries, blobs = (roots or RootList()).entries(stable, root_of)
    blobs.insert(0, system)
    turns = list(prior_turns)
    turn_id: bytes | None = None
    if turn is not None:
        structure = turn.structure()
        blobs += [Blob.of(turn.user_message), *turn.step_blobs(), structure]
        turns.append(structure.id)
        turn_id = structure.id
    if shell_turn:
        blobs += shell_turn
        turns.append(shell_turn[-1].id)
        turn_id = shell_turn[-1].id
    rest = agent.ConversationStateStructure(
        pending_tool_calls=[encode_root(m).decode() for m in pending],
        token_details=token_details,
        todos=[t.id for t in todos],
        mode=mode,
        self_summary_count=summaries,
    )
    blobs += todos
    if progress is not None:
        rest.communicate_update_states_by_parent_tool_call_id = {progress[0]: progress[1]}
    if summary is not None:
        summary_blob = Blob.of(conversation_summary(summary))
        blobs.append(summary_blob)
        rest.summary = summary_blob.id
    if plan is not None:
        plan_blob = Blob.of(plan.blob())
        blobs.append(plan_blob)
        rest.plan, rest.plans = plan_blob.id, plan.registry()
    # The two id lists (one entry per message and per turn) hand-encoded: betterproto2 takes
    # ~2 us per entry. They are the schema's first two fields, which betterproto2 writes first.
    state = b"".join(
        (_repeated_bytes(_ROOTS_KEY, [system.id]), entries, _repeated_bytes(_TURNS_KEY, turns), bytes(rest))
    )
    return Checkpoint(state, tuple(_dedupe(blobs)), turn_id)


def conversation_summary(text: str) -> bytes:
    """A ConversationSummary{summary = 1} (not in byok's proto subset: one string field)."""
    data = text.encode()
    return b"\x0a" + encode.varint(len(data)) + data


class RootList:
    """The root entries of a conversation's checkpoints, extended as its history grows.

    Every checkpoint lists the root id of every message, two to three times per turn and twice
    per tool round. At 5,000 messages, asking ``root_of`` for each one cost 9-18 ms per
    checkpoint in the daemon. Once a root comes back without data (the client holds the blob),
    its entry can never change: the client's acknowledged blobs only grow, and a message's id
    names its content. So the encoded entries of the longest such prefix are kept, and the next
    checkpoint of a history that extends it starts after it.

    A history extends the kept prefix when it holds the very same first and last message
    objects at those positions, as in projection: the store's history cache shares a parent's
    Message objects with every revision appended to it. The two are held weakly, so an evicted
    history's messages are not kept alive by this.
    """

    __slots__ = ("_count", "_entries", "_first", "_last")

    def __init__(self) -> None:
        self._count = 0  # messages covered, system messages included
        self._first: weakref.ref[Message] | None = None
        self._last: weakref.ref[Message] | None = None
        self._entries = b""

    @property
    def size(self) -> int:
        """Bytes of the kept entries."""
        return len(self._entries)

    def entries(
        self, stable: Sequence[Message], root_of: Callable[[Message], Blob]
    ) -> tuple[bytes, list[Blob]]:
        """The encoded ``root_prompt_messages_json`` entries of ``stable``'s non-system messages,
        and their root blobs that carry data (the ones the client may not hold yet)."""
        start, kept = 0, b""
        count = self._count
        if (
            0 < count <= len(stable)
            and self._first is not None
            and self._last is not None
            and self._first() is stable[0]
            and self._last() is stable[count - 1]
        ):
            start, kept = count, self._entries
        ids: list[bytes] = []
        blobs: list[Blob] = []
        clean, clean_ids = start, 0  # stable[:clean] (clean_ids of ids) can no longer change
        for i in range(start, len(stable)):
            m = stable[i]
            if m.role != "system":
                blob = root_of(m)
                ids.append(blob.id)
                if blob.data:
                    blobs.append(blob)
                    continue
            if clean == i:
                clean, clean_ids = i + 1, len(ids)
        settled = _repeated_bytes(_ROOTS_KEY, ids[:clean_ids])
        if clean > start:
            self._count, self._entries = clean, kept + settled
            self._first, self._last = weakref.ref(stable[0]), weakref.ref(stable[clean - 1])
        return b"".join((kept, settled, _repeated_bytes(_ROOTS_KEY, ids[clean_ids:]))), blobs


# ConversationStateStructure.root_prompt_messages_json = 1 and .turns = 8, length-delimited.
_ROOTS_KEY = bytes([1 << 3 | 2])
_TURNS_KEY = bytes([8 << 3 | 2])


def _repeated_bytes(key: bytes, items: Sequence[bytes]) -> bytes:
    sha256_entry = key + b"\x20"  # the usual entry: a 32-byte id
    return b"".join(
        sha256_entry + item if len(item) == 32 else key + encode.varint(len(item)) + item for item in items
    )


def _dedupe(blobs: list[Blob]) -> list[Blob]:
    seen: set[bytes] = set()
    out: list[Blob] = []
    for b in blobs:
        if b.id not in seen:
            seen.add(b.id)
            out.append(b)
    return out
