"""A run_request over max_body_bytes (a message with very large attachments): the append is
refused, and the run's RunSSE, whether it is open already or comes after, ends at once with an
error that says what to do, instead of waiting minutes for a run_request that never arrives."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from byok.devtools.cursor_sim import BIDI_APPEND, Transcript, user_turn
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from tests.integration.conftest import start_daemon
from tests.support.fake_provider import chat_text_script
from tests.support.run_driver import RunDriver

LIMIT = 65536
MODEL = "byok-demo"


def _huge_turn(conv: str, message_id: str) -> agent.AgentRunRequest:
    # ~80 KB of text, 160 KB hex-encoded in the append: over the 64 KiB limit.
    return user_turn("x" * 80_000, conversation_id=conv, model_id=MODEL, message_id=message_id)


def _assert_refusal(end: dict[str, object] | None) -> None:
    assert end is not None
    error = end["error"]
    assert isinstance(error, dict)
    assert error["code"] == "resource_exhausted"
    message = str(error["message"])
    assert "max_body_bytes = 65,536" in message and "less context" in message


async def test_a_run_request_over_the_limit_ends_an_open_runsse_at_once(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    async with start_daemon(tmp_path, nursery, server_extra=f"max_body_bytes = {LIMIT}") as d:
        run = RunDriver(d.sim, "req-huge")
        tr = Transcript()
        with trio.fail_after(5):
            async with trio.open_nursery() as n:
                await n.start(run.stream, tr)
                resp = await run.start(_huge_turn("conv-huge", "m-huge"))
        assert resp.status_code == 429, resp.text  # Connect's resource_exhausted
        assert json.loads(resp.text)["code"] == "resource_exhausted"
        _assert_refusal(tr.end_stream)
        assert tr.frames == []
        assert d.provider.requests == []

        # Nothing of it was kept: the same conversation goes on with a message that fits.
        d.provider.enqueue(chat_text_script(["fits"]))
        with trio.fail_after(10):
            ok = await d.sim.run(
                "req-small",
                user_turn("small", conversation_id="conv-huge", model_id=MODEL, message_id="m-small"),
            )
        assert ok.end_stream == {}
        users = [m for m in d.provider.requests[0].json["messages"] if m["role"] == "user"]
        assert len(users) == 1 and "<user_query>\nsmall\n</user_query>" in users[0]["content"]


async def test_a_runsse_that_comes_after_the_refused_run_request_gets_its_error(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    async with start_daemon(tmp_path, nursery, server_extra=f"max_body_bytes = {LIMIT}") as d:
        run = RunDriver(d.sim, "req-huge-2")
        resp = await run.start(_huge_turn("conv-huge-2", "m-huge-2"))
        assert resp.status_code == 429
        tr = Transcript()
        with trio.fail_after(5):
            await run.stream(tr)
        _assert_refusal(tr.end_stream)


async def test_an_oversized_append_that_is_not_one_run_request_takes_no_request_id(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Data that is more than one AgentClientMessage (padding after a run_request) is refused as
    before and decides nothing: the request id is still free, and a run_request that fits starts
    its run."""
    async with start_daemon(tmp_path, nursery, server_extra=f"max_body_bytes = {LIMIT}") as d:
        msg = agent.AgentClientMessage(
            run_request=user_turn("hi", conversation_id="c", model_id=MODEL, message_id="m")
        )
        padded = aiserver.BidiAppendRequest(
            data=bytes(msg).hex() + "00" * LIMIT,
            request_id=aiserver.BidiRequestId(request_id="req-odd"),
            append_seqno=0,
        )
        resp = await d.client.post(
            d.sim.base_url + BIDI_APPEND,
            content=bytes(padded),
            headers={"content-type": "application/proto", "connect-protocol-version": "1"},
        )
        assert resp.status_code == 429
        d.provider.enqueue(chat_text_script(["hello"]))
        with trio.fail_after(10):
            tr = await d.sim.run(
                "req-odd", user_turn("hi", conversation_id="c", model_id=MODEL, message_id="m")
            )
        assert tr.end_stream == {} and tr.text() == "hello"
