"""The cache budget on the real daemon: past ``[server] cache_bytes`` the least recently used idle
conversation is evicted whole, and its next turn loses nothing (the provider request extends the
previous one byte for byte, the prefix meter says so); under a large budget nothing is evicted."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import trio

from byok.devtools.cursor_sim import user_turn
from tests.integration.conftest import start_daemon
from tests.support.fake_provider import chat_text_script
from tests.support.run_driver import wait_call_records

# Each conversation's first turn holds ~0.4 MiB in the caches (a 100 KB message: its decoded and
# encoded forms, its rendered text twice): two fit in 1 MiB, three do not.
TEXT = "lorem ipsum dolor sit amet " * 3_800


def evicted(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.args[0] for r in caplog.records if r.name == "byok.caches" and "evicted" in r.msg]  # type: ignore[index]


@pytest.mark.parametrize(("budget", "expected"), [(2**20, ["conv-a"]), (256 * 2**20, [])])
async def test_the_least_recently_used_idle_conversation_goes_and_loses_nothing(
    tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture, budget: int, expected: list[str]
) -> None:
    caplog.set_level(logging.DEBUG, logger="byok.caches")
    async with start_daemon(tmp_path, nursery, server_extra=f"cache_bytes = {budget}") as d:
        for n, conv in enumerate(["conv-a", "conv-b", "conv-c"]):
            d.provider.enqueue(chat_text_script([f"answer {conv}"]))
            req = user_turn(f"{conv} {TEXT}", conversation_id=conv, model_id="byok-demo", message_id=f"m{n}")
            assert (await d.sim.run(f"req-{conv}", req)).end_stream == {}
        with trio.fail_after(5):
            while len(evicted(caplog)) < len(expected):
                await trio.sleep(0.01)
        # Least recently used first; the charges of the call log's digests land when it writes its
        # records (once the runs are quiet), which may push out conv-b too, never conv-c.
        assert evicted(caplog)[: len(expected)] == expected
        assert "conv-c" not in evicted(caplog)
        if not expected:
            assert evicted(caplog) == []
        settled = len(evicted(caplog))
        # conv-a's next turn: read back from SQLite if it was evicted, from the caches if not.
        d.provider.enqueue(chat_text_script(["again"]))
        req = user_turn("and again", conversation_id="conv-a", model_id="byok-demo", message_id="m9")
        assert (await d.sim.run("req-a2", req)).end_stream == {}
        first, again = (r.json["messages"] for r in d.provider.requests if "conv-a" in r.body.decode())
        assert [json.dumps(m) for m in again[: len(first)]] == [json.dumps(m) for m in first]
        assert again[len(first)] == {"role": "assistant", "content": "answer conv-a"}
        (call,) = await wait_call_records(d.data_dir, "req-a2")
        assert (call.prefix_extends, call.common_prefix_messages) == (True, len(first))
        # conv-a's run made it the most recent: whatever its end evicts (conv-b, the least
        # recently used now, under the small budget), it is not conv-a.
        later = evicted(caplog)[settled:]
        assert "conv-a" not in later
        if not expected:
            assert later == []  # under the large budget nothing, ever
