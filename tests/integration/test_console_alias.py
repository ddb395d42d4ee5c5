"""Aliases made in the console: a run fails over to the next target only while nothing reached
Cursor; the call records name the alias and the model that served; a failed target cools down.
Every run here is also replayed from its log at teardown (the failover's ``target`` line)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import trio

from byok.devtools.cursor_sim import user_turn
from tests.integration.conftest import Daemon
from tests.support.console_client import console_client, wait_calls
from tests.support.fake_provider import FakeProvider, chat_text_script, error_script


@pytest.fixture
async def api(daemon: Daemon) -> AsyncIterator[httpx.AsyncClient]:
    async with console_client(daemon.base_url, daemon.data_dir) as client:
        yield client


async def _alias(api: httpx.AsyncClient, nursery: trio.Nursery, **alias: object) -> FakeProvider:
    other = FakeProvider()
    url = await other.start(nursery)
    made = await api.post("/providers", json={"id": "other", "kind": "openai_chat", "base_url": url})
    assert made.status_code == 201
    model = {"id": "other-m", "provider": "other", "upstream_model": "other-up", "context_tokens": 32000}
    assert (await api.post("/models", json=model)).status_code == 201
    body = {"id": "both", "targets": ["byok-demo", "other-m"], **alias}
    assert (await api.post("/aliases", json=body)).status_code == 201, body
    return other


def _turn(text: str, msg: str) -> object:
    return user_turn(text, conversation_id="conv-alias", model_id="both", message_id=msg)


async def test_fails_over_before_output_and_cools_the_failed_target_down(
    daemon: Daemon, api: httpx.AsyncClient, nursery: trio.Nursery
) -> None:
    other = await _alias(api, nursery, cooldown_s=600)
    picker = (await api.get("/models")).json()["picker"]
    assert "both" in picker and (await api.get("/aliases/both")).json()["served"] is True
    daemon.provider.enqueue(error_script(400, "model overloaded for this account"))
    other.enqueue(chat_text_script(["from the second target"], usage=(50, 4)))
    tr = await daemon.sim.run("req-a1", _turn("hi", "m1"))
    assert tr.end_stream == {} and tr.text() == "from the second target"
    assert len(daemon.provider.requests) == 1 and other.requests[-1].json["model"] == "other-up"
    failed, served = reversed(await wait_calls(api, 2))
    assert (failed["status"], failed["model_id"], failed["alias_id"]) == ("error", "byok-demo", "both")
    assert "overloaded" in failed["error"]
    assert (served["status"], served["model_id"], served["alias_id"]) == ("ok", "other-m", "both")
    assert served["usage"]["output"] == 4

    # The failed target cools down: the next run goes straight to the second one.
    other.enqueue(chat_text_script(["again"]))
    tr = await daemon.sim.run("req-a2", _turn("more", "m2"))
    assert tr.end_stream == {} and tr.text() == "again"
    assert len(daemon.provider.requests) == 1 and len(other.requests) == 2


async def test_no_failover_once_output_reached_cursor(
    daemon: Daemon, api: httpx.AsyncClient, nursery: trio.Nursery
) -> None:
    other = await _alias(api, nursery)
    # Text, then the connection breaks: Cursor has seen "partial" — the run ends with the error.
    daemon.provider.enqueue(chat_text_script(["partial", " answer", " more"], close_after=3))
    tr = await daemon.sim.run("req-b1", _turn("hi", "m1"))
    assert tr.error is not None and "partial" in tr.text()
    assert other.requests == []
    (call,) = await wait_calls(api, 1)
    assert (call["status"], call["model_id"], call["alias_id"]) == ("error", "byok-demo", "both")


async def test_every_target_failing_ends_with_the_last_error(
    daemon: Daemon, api: httpx.AsyncClient, nursery: trio.Nursery
) -> None:
    other = await _alias(api, nursery)
    daemon.provider.enqueue(error_script(400, "first refuses"))
    other.enqueue(error_script(400, "second refuses too"))
    tr = await daemon.sim.run("req-c1", _turn("hi", "m1"))
    assert tr.error is not None and "second refuses too" in str(tr.end_stream)
    calls = await wait_calls(api, 2)
    assert [c["model_id"] for c in calls] == ["other-m", "byok-demo"] and all(
        c["status"] == "error" for c in calls
    )
