"""Loop emits and run milestones -> encoded agent.v1.AgentServerMessage bytes."""

from __future__ import annotations

from byok.loop import emits as em
from byok.model.usage import Usage
from byok.pb.agent import v1 as agent


def _update(**kw: object) -> bytes:
    return bytes(agent.AgentServerMessage(interaction_update=agent.InteractionUpdate(**kw)))


def _nested_text(outer: int, inner: int, text: str) -> bytes:
    """AgentServerMessage{interaction_update(1){<inner>{text(1)}}} encoded by hand: the hot path
    (one per streamed delta), byte-identical to the betterproto2 encoding (tested)."""
    t = text.encode()
    leaf = b"\x0a" + _varint(len(t)) + t if t else b""  # proto3 omits an empty string
    mid = bytes([inner << 3 | 2]) + _varint(len(leaf)) + leaf
    return bytes([outer << 3 | 2]) + _varint(len(mid)) + mid


def encode_emit(emit: em.Emit) -> bytes:
    match emit:
        case em.TextOut(text=text):
            return _nested_text(1, 1, text)  # interaction_update.text_delta.text
        case em.ThinkingOut(text=text):
            return _nested_text(1, 4, text)  # interaction_update.thinking_delta.text
        case em.ThinkingDone(duration_ms=ms):
            return _update(thinking_completed=agent.ThinkingCompletedUpdate(thinking_duration_ms=ms))
        case em.TokensOut(tokens=tokens):
            return _update(token_delta=agent.TokenDeltaUpdate(tokens=tokens))
    raise TypeError(f"emit {type(emit).__name__} has no Cursor encoding here")


def heartbeat() -> bytes:
    return _update(heartbeat=agent.HeartbeatUpdate())


def turn_ended(usage: Usage) -> bytes:
    return _update(
        turn_ended=agent.TurnEndedUpdate(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_write_tokens,
            reasoning_tokens=usage.reasoning_tokens,
        )
    )


def turn_ended_empty() -> bytes:
    """turn_ended for a turn that made no provider call (a resumed, already answered turn)."""
    return _update(turn_ended=agent.TurnEndedUpdate())


def checkpoint(state: bytes) -> bytes:
    """Wrap an already-encoded ConversationStateStructure without re-encoding it."""
    # AgentServerMessage.conversation_checkpoint_update = 3, length-delimited.
    return b"\x1a" + _varint(len(state)) + state


def set_blob(kv_id: int, blob_id: bytes, data: bytes) -> bytes:
    return bytes(
        agent.AgentServerMessage(
            kv_server_message=agent.KvServerMessage(
                id=kv_id, set_blob_args=agent.SetBlobArgs(blob_id=blob_id, blob_data=data)
            )
        )
    )


def get_blob(kv_id: int, blob_id: bytes) -> bytes:
    return bytes(
        agent.AgentServerMessage(
            kv_server_message=agent.KvServerMessage(
                id=kv_id, get_blob_args=agent.GetBlobArgs(blob_id=blob_id)
            )
        )
    )


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)
