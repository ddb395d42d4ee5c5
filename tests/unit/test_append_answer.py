"""A BidiAppend is answered before the run sees what it carries: Cursor sends its next append
(a KV ACK, the next exec result) only after the answer, so the answer must not wait behind the
run's work on a multi-megabyte result."""

from __future__ import annotations

from typing import Any

import trio

from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from tests.unit.test_timeouts import make_app


def _append_body(request_id: str, seqno: int, msg: agent.AgentClientMessage) -> bytes:
    return bytes(
        aiserver.BidiAppendRequest(
            data=bytes(msg).hex(),
            request_id=aiserver.BidiRequestId(request_id=request_id),
            append_seqno=seqno,
        )
    )


def _result(exec_id: int) -> agent.AgentClientMessage:
    return agent.AgentClientMessage(
        exec_client_message=agent.ExecClientMessage(
            id=exec_id, read_result=agent.ReadResult(success=agent.ReadSuccess(content="x" * 100_000))
        )
    )


async def test_exec_results_are_delivered_after_their_answer_and_in_order(nursery: trio.Nursery) -> None:
    app = make_app(nursery)
    slot = app.registry.get_or_create("r1")
    slot.decide("agent")
    slot.order.next_seqno = 1  # the run_request (seqno 0) was taken
    inbox_at_answer: list[int] = []

    async def post(seqno: int, exec_id: int) -> list[dict[str, Any]]:
        body = _append_body("r1", seqno, _result(exec_id))
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(event: dict[str, Any]) -> None:
            sent.append(event)
            if event["type"] == "http.response.body" and not event.get("more_body"):
                inbox_at_answer.append(slot.inbox.statistics().current_buffer_used)

        scope = {"type": "http", "headers": [(b"content-type", b"application/proto")]}
        await app.appends.handle(scope, receive, send)
        return sent

    # seqno 2 first: buffered early, answered, not deliverable yet.
    early = await post(2, 12)
    assert early[0]["status"] == 200
    assert slot.inbox.statistics().current_buffer_used == 0
    # seqno 1 makes both deliverable: neither reaches the run before this append is answered.
    late = await post(1, 11)
    assert late[0]["status"] == 200
    assert inbox_at_answer == [0, 0]
    got = [slot.inbox.receive_nowait().exec_client_message.id for _ in range(2)]  # type: ignore[union-attr]
    assert got == [11, 12]
