"""AgentServerMessages for the tool lifecycle: partial -> started -> delta (completed, whose card
is large, is hand-encoded from the card's cached bytes: encode.tool_call_completed)."""

from __future__ import annotations

from byok.pb.agent import v1 as agent


def _update(**kw: object) -> bytes:
    return bytes(agent.AgentServerMessage(interaction_update=agent.InteractionUpdate(**kw)))


def partial(call_id: str, tool_call: agent.ToolCall, model_call_id: str, args_delta: str = "") -> bytes:
    return _update(
        partial_tool_call=agent.PartialToolCallUpdate(
            call_id=call_id, tool_call=tool_call, args_text_delta=args_delta, model_call_id=model_call_id
        )
    )


def started(call_id: str, tool_call: agent.ToolCall, model_call_id: str) -> bytes:
    return _update(
        tool_call_started=agent.ToolCallStartedUpdate(
            call_id=call_id, tool_call=tool_call, model_call_id=model_call_id
        )
    )


def delta(call_id: str, tool_delta: agent.ToolCallDelta, model_call_id: str) -> bytes:
    return _update(
        tool_call_delta=agent.ToolCallDeltaUpdate(
            call_id=call_id, tool_call_delta=tool_delta, model_call_id=model_call_id
        )
    )


def update(u: agent.InteractionUpdate) -> bytes:
    return bytes(agent.AgentServerMessage(interaction_update=u))


def exec_request(message: agent.ExecServerMessage) -> bytes:
    return bytes(agent.AgentServerMessage(exec_server_message=message))


def exec_abort(exec_id: int) -> bytes:
    return bytes(
        agent.AgentServerMessage(
            exec_server_control_message=agent.ExecServerControlMessage(
                abort=agent.ExecServerAbort(id=exec_id)
            )
        )
    )


def interaction_query(query: agent.InteractionQuery) -> bytes:
    return bytes(agent.AgentServerMessage(interaction_query=query))
