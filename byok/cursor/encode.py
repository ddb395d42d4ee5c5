"""Loop emits and run milestones -> encoded agent.v1.AgentServerMessage bytes."""

from __future__ import annotations

import dataclasses

from byok.loop import emits as em
from byok.model.usage import Usage
from byok.pb.agent import v1 as agent


def _update(**kw: object) -> bytes:
    return bytes(agent.AgentServerMessage(interaction_update=agent.InteractionUpdate(**kw)))


def _nested_text(outer: int, inner: int, text: str) -> bytes:
    """AgentServerMessage{interaction_update(1){<inner>{text(1)}}} encoded by hand: the hot path
    (one per streamed delta), byte-identical to the betterproto2 encoding (tested)."""
    t = text.encode()
    leaf = b"\x0a" + varint(len(t)) + t if t else b""  # proto3 omits an empty string
    mid = bytes([inner << 3 | 2]) + varint(len(leaf)) + leaf
    return bytes([outer << 3 | 2]) + varint(len(mid)) + mid


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
        case em.SummaryStarted():
            return _update(summary_started=agent.SummaryStartedUpdate())
        case em.SummaryOut(text=text):
            return _update(summary=agent.SummaryUpdate(summary=text))
        case em.SummaryDone():
            return _update(summary_completed=agent.SummaryCompletedUpdate())
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
    return b"\x1a" + varint(len(state)) + state


def set_blob(kv_id: int, blob_id: bytes, data: bytes) -> bytes:
    """AgentServerMessage{kv_server_message(4){id(1), set_blob_args(3){blob_id(1), blob_data(2)}}}
    by hand: a blob can be megabytes, copied once here (byte-identical to betterproto2, tested)."""
    args = _field(1, blob_id) + (b"\x12" + varint(len(data)) if data else b"")
    args_len = len(args) + len(data)
    kv = (b"\x08" + varint(kv_id) if kv_id else b"") + b"\x1a" + varint(args_len)
    kv_len = len(kv) + args_len
    return b"".join((b"\x22", varint(kv_len), kv, args, data))


def tool_call_completed(call_id: str, tool_call: bytes, model_call_id: str) -> bytes:
    """interaction_update.tool_call_completed around an already-encoded agent.ToolCall (a Read's
    card can be megabytes: it is encoded once, then wrapped; byte-identical, tested)."""
    # ToolCallCompletedUpdate{call_id(1), tool_call(2), model_call_id(3)}
    head = _field(1, call_id.encode()) + b"\x12" + varint(len(tool_call))
    tail = _field(3, model_call_id.encode())
    inner = len(head) + len(tool_call) + len(tail)
    update = b"\x1a" + varint(inner)  # InteractionUpdate.tool_call_completed = 3
    return b"".join((b"\x0a", varint(len(update) + inner), update, head, tool_call, tail))


def read_card(args: agent.ReadToolArgs, success: agent.ReadToolSuccess) -> bytes:
    """``bytes(ToolCall(read_tool_call=ReadToolCall(args, ReadToolResult(success=success))))`` with the
    content (the whole file) copied once instead of once per nesting level (byte-identical, tested).
    betterproto2 writes fields in declaration order and ``content`` is the last one set (the rest
    of its oneof are None), so it goes after everything else."""
    if success.content is None:
        return bytes(
            agent.ToolCall(
                read_tool_call=agent.ReadToolCall(args=args, result=agent.ReadToolResult(success=success))
            )
        )
    text = success.content.encode()
    rest = bytes(dataclasses.replace(success, content=None))
    content_head = b"\x0a" + varint(len(text))  # ReadToolSuccess.content = 1
    size = len(rest) + len(content_head) + len(text)
    result_head = b"\x0a" + varint(size)  # ReadToolResult.success = 1
    size += len(result_head)
    args_field = b"\x0a" + varint(len(a := bytes(args))) + a  # ReadToolCall.args = 1
    call_head = args_field + b"\x12" + varint(size)  # ReadToolCall.result = 2
    size += len(call_head)
    tool_head = b"\x42" + varint(size)  # ToolCall.read_tool_call = 8
    return b"".join((tool_head, call_head, result_head, rest, content_head, text))


def tool_step(tool_call: bytes) -> bytes:
    """agent.ConversationStep{tool_call(2)} around an already-encoded agent.ToolCall."""
    return b"".join((b"\x12", varint(len(tool_call)), tool_call))


def get_blob(kv_id: int, blob_id: bytes) -> bytes:
    return bytes(
        agent.AgentServerMessage(
            kv_server_message=agent.KvServerMessage(
                id=kv_id, get_blob_args=agent.GetBlobArgs(blob_id=blob_id)
            )
        )
    )


def _field(number: int, value: bytes) -> bytes:
    """A length-delimited field; proto3 leaves an empty string or bytes field out."""
    return bytes([number << 3 | 2]) + varint(len(value)) + value if value else b""


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)
