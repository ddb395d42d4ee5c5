"""The BidiAppend handler on an append over max_body_bytes, fed ASGI events directly."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import trio

from byok.devtools.cursor_sim import user_turn
from byok.http.bidi_append import BidiAppends
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from byok.run.slot import RunRegistry

LIMIT = 4096


def _body(seqno: int, msg: agent.AgentClientMessage) -> bytes:
    return bytes(
        aiserver.BidiAppendRequest(
            data=bytes(msg).hex(), request_id=aiserver.BidiRequestId(request_id="r1"), append_seqno=seqno
        )
    )


async def _post(appends: BidiAppends, chunks: list[bytes]) -> dict[str, Any]:
    """One append whose body arrives in ``chunks``; like hypercorn, a receive after the last
    chunk waits until the client goes away (here: forever)."""
    events = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if not events:
            await trio.sleep_forever()
        return events.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    with trio.fail_after(5):
        await appends.handle(
            {"type": "http", "headers": [(b"content-type", b"application/proto")]}, receive, send
        )
    return sent[0]


async def test_an_exec_result_over_the_limit_in_one_chunk_or_many_fails_that_exec() -> None:
    config: Any = SimpleNamespace(
        server=SimpleNamespace(max_body_bytes=LIMIT),
        model=lambda _id: SimpleNamespace(enabled=True),
        serves=lambda _id: True,
    )
    started: list[agent.AgentRunRequest] = []
    registry = RunRegistry()
    appends = BidiAppends(
        config=config,
        registry=registry,
        forward=None,
        start_run=lambda _slot, req: started.append(req),  # type: ignore[func-returns-value]
        refuse_run=lambda _slot, err: None,
    )
    run = agent.AgentClientMessage(
        run_request=user_turn("hi", conversation_id="c", model_id="m", message_id="m1")
    )
    assert (await _post(appends, [_body(0, run)]))["status"] == 200 and started
    slot = registry.get("r1")
    assert slot is not None
    for seqno, exec_id in ((1, 7), (2, 8)):
        result = agent.AgentClientMessage(
            exec_client_message=agent.ExecClientMessage(
                id=exec_id, exec_id=f"call-{exec_id}", read_result=agent.ReadResult()
            )
        )
        padded = bytes(
            aiserver.BidiAppendRequest(
                data=bytes(result).hex() + "00" * LIMIT,
                request_id=aiserver.BidiRequestId(request_id="r1"),
                append_seqno=seqno,
            )
        )
        assert len(padded) > LIMIT
        # seqno 1: the whole body in one event (the limit is crossed by its last chunk);
        # seqno 2: in pieces, crossed before the end.
        chunks = [padded] if seqno == 1 else [padded[i : i + 1000] for i in range(0, len(padded), 1000)]
        answer = await _post(appends, chunks)
        assert answer["status"] == 200
        got = slot.inbox.receive_nowait()
        throw = got.exec_client_control_message.throw  # type: ignore[union-attr]
        assert throw.id == exec_id and "max_body_bytes = 4,096" in throw.error
