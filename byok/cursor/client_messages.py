"""What the client sends during a run, as plain values: the run layer never reads a protobuf
oneof. ``decode`` takes one AgentClientMessage (in seqno order) and says what it is."""

from __future__ import annotations

import attrs
import betterproto2

from byok.cursor import proto_decode
from byok.pb.agent import v1 as agent

# The transport's type: what BidiAppend (or the HTTP/2 Run) delivers to a run, undecoded.
ClientMessage = agent.AgentClientMessage


@attrs.frozen
class Heartbeat:
    pass


@attrs.frozen
class KvAnswer:
    """The client's answer to a blob SET or GET, by KV id."""

    kv_id: int
    get_data: bytes | None = None  # a get_blob_result's bytes
    set_result: bool = False  # it is a set_blob_result
    set_error: str | None = None  # the SET was refused, and why


@attrs.frozen(eq=False)
class ExecAnswer:
    message: agent.ExecClientMessage  # routed by cursor.exec_router


@attrs.frozen(eq=False)
class ExecControl:
    message: agent.ExecClientControlMessage


@attrs.frozen(eq=False)
class InteractionAnswer:
    response: agent.InteractionResponse  # routed by cursor.exec_router, by interaction id


@attrs.frozen
class CancelRequested:
    pass


@attrs.frozen(eq=False)
class ActionArrived:
    """A conversation action other than cancel sent into a live run (a user message mid-run, a
    shell command beside it): the run decides what it means."""

    name: str
    action: agent.ConversationAction


@attrs.frozen
class Unhandled:
    name: str  # the oneof variant (or "" for none)


ClientEvent = (
    Heartbeat
    | KvAnswer
    | ExecAnswer
    | ExecControl
    | InteractionAnswer
    | CancelRequested
    | ActionArrived
    | Unhandled
)


def kv_answer(msg: agent.KvClientMessage) -> KvAnswer:
    got, set_ = msg.get_blob_result, msg.set_blob_result
    error = None
    if set_ is not None and set_.error is not None:
        error = set_.error.message or "unspecified error"
    return KvAnswer(
        kv_id=msg.id,
        get_data=got.blob_data if got is not None else None,
        set_result=set_ is not None,
        set_error=error,
    )


def decode(msg: agent.AgentClientMessage) -> ClientEvent:
    name, value = betterproto2.which_one_of(msg, "message")
    if name == "client_heartbeat":
        return Heartbeat()
    if name == "kv_client_message":
        return kv_answer(value)
    if name == "exec_client_message":
        return ExecAnswer(value)
    if name == "exec_client_control_message":
        return ExecControl(value)
    if name == "interaction_response":
        return InteractionAnswer(value)
    if name == "conversation_action":
        if value.cancel_action is not None:
            return CancelRequested()
        action, _ = betterproto2.which_one_of(value, "action")
        if action:
            return ActionArrived(action, value)
    return Unhandled(name)


def parse(data: bytes) -> ClientMessage:
    """An AgentClientMessage from its bytes (a run's input log holds them)."""
    return proto_decode.parse(agent.AgentClientMessage, data)


def describe_frame(data: bytes) -> str:
    """What one AgentServerMessage is, for a listing: its oneof path."""
    msg = proto_decode.parse(agent.AgentServerMessage, data)
    name, value = betterproto2.which_one_of(msg, "message")
    if value is None or name == "conversation_checkpoint_update":
        return name or "(empty)"
    for group in ("message", "query"):
        try:
            inner, _ = betterproto2.which_one_of(value, group)
        except (KeyError, AttributeError):
            continue
        if inner:
            return f"{name}.{inner}"
    return name
