"""What every exec the simulated client answers shares: the reply callback, the
ExecClientMessage builders, and the handle an abort finds an exec in flight by."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import attrs
import trio

from byok.pb.agent import v1 as agent

Reply = Callable[[agent.AgentClientMessage], Awaitable[None]]


def exec_result(msg: agent.ExecServerMessage, **result: object) -> agent.AgentClientMessage:
    inner = agent.ExecClientMessage(id=msg.id, exec_id=msg.exec_id, **result)  # type: ignore[arg-type]
    return agent.AgentClientMessage(exec_client_message=inner)


def stream_close(exec_id: int) -> agent.AgentClientMessage:
    control = agent.ExecClientControlMessage(stream_close=agent.ExecClientStreamClose(id=exec_id))
    return agent.AgentClientMessage(exec_client_control_message=control)


def throw(exec_id: int, error: str) -> agent.AgentClientMessage:
    control = agent.ExecClientControlMessage(throw=agent.ExecClientThrow(id=exec_id, error=error))
    return agent.AgentClientMessage(exec_client_control_message=control)


@attrs.define(eq=False)
class PendingExec:
    """One exec in flight, so an abort can find it by id."""

    aborted: bool = False
    scope: trio.CancelScope | None = None

    def abort(self) -> None:
        self.aborted = True
        if self.scope is not None:
            self.scope.cancel()
