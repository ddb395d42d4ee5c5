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
from collections.abc import Callable, Sequence

import attrs

from byok.cursor import encode
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

    def with_step(self, step: bytes) -> TurnRecord:
        turn = attrs.evolve(self, steps=(*self.steps, step))
        turn._step_blobs.update(self._step_blobs)
        return turn

    def step_blobs(self) -> list[Blob]:
        memo = self._step_blobs
        for i, step in enumerate(self.steps):
            if i not in memo:
                memo[i] = Blob.of(step)
        return [memo[i] for i in range(len(self.steps))]


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
) -> Checkpoint:
    blobs: list[Blob] = [system_root(system_prompt)]
    blobs += [root_of(m) for m in stable if m.role != "system"]
    root_ids = [b.id for b in blobs]
    turns = list(prior_turns)
    turn_id: bytes | None = None
    if turn is not None:
        user = Blob.of(turn.user_message)
        steps = turn.step_blobs()
        structure = Blob.of(
            bytes(
                agent.ConversationTurnStructure(
                    agent_conversation_turn=agent.AgentConversationTurnStructure(
                        user_message=user.id,
                        steps=[s.id for s in steps],
                        request_id=turn.request_id,
                    )
                )
            )
        )
        blobs += [user, *steps, structure]
        turns.append(structure.id)
        turn_id = structure.id
    rest = agent.ConversationStateStructure(
        pending_tool_calls=[encode_root(m).decode() for m in pending],
        token_details=token_details,
        mode=mode,
    )
    # The two id lists (one entry per message and per turn) hand-encoded: betterproto2 takes
    # ~2 us per entry. They are the schema's first two fields, which betterproto2 writes first.
    state = _repeated_bytes(_ROOTS_KEY, root_ids) + _repeated_bytes(_TURNS_KEY, turns) + bytes(rest)
    return Checkpoint(state, tuple(_dedupe(blobs)), turn_id)


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
