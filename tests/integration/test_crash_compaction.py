"""kill -9 in the middle of a compaction and right after its summary's commit, then a restart on
the same data dir (the daemon as a subprocess, as in test_crash.py).

Mid-summary nothing of the compaction is kept: the history is the one before it. After the
commit the summary is the history's root, the revision before it is intact, and the next turn
goes on from the summary. Either way the crashed run is recorded as interrupted and the next
turn's call starts a new prefix only when it is the first on the summary.
"""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest
import trio

from byok.devtools.cursor_sim import CursorSim, Recorded, user_turn
from byok.pb.agent import v1 as agent
from byok.run.crash import COMPACTION_POINTS
from byok.store import SQLiteStore
from tests.integration.conftest import write_config
from tests.integration.test_crash import daemon_process, drive_until_death
from tests.support.fake_provider import FakeProvider, chat_text_script

CONV = "conv-crash-summary"
MODEL = "byok-demo"


def summarize(state: agent.ConversationStateStructure) -> agent.AgentRunRequest:
    return agent.AgentRunRequest(
        conversation_state=state,
        action=agent.ConversationAction(summarize_action=agent.SummarizeAction()),
        requested_model=agent.RequestedModel(model_id=MODEL),
        conversation_id=CONV,
    )


async def stop(proc: trio.Process) -> None:
    proc.send_signal(signal.SIGTERM)
    with trio.fail_after(15):
        assert await proc.wait() == 0


@pytest.mark.parametrize("point", ["provider_mid_stream", *COMPACTION_POINTS])
async def test_kill9_during_a_compaction_then_restart(
    point: str, tmp_path: Path, nursery: trio.Nursery
) -> None:
    provider = FakeProvider()
    provider_url = await provider.start(nursery)
    data_dir = tmp_path / "data"
    cfg = tmp_path / "byok.toml"
    write_config(cfg, provider_url=provider_url, data_dir=data_dir)
    log = tmp_path / "daemon.log"
    async with httpx.AsyncClient(timeout=15) as client:
        # --- 1. two turns, on a daemon that does not crash -----------------------------------
        async with daemon_process(cfg, client, log) as d0:
            sim = CursorSim(d0.base_url, client)
            state = None
            for i in range(2):
                provider.enqueue(chat_text_script([f"answer {i}"]))
                request = user_turn(
                    f"question {i}", conversation_id=CONV, model_id=MODEL, message_id=f"m{i}", state=state
                )
                tr = await sim.run(f"req-{i}", request)
                assert tr.end_stream == {}, tr.end_stream
                state = tr.checkpoints()[-1]
            await stop(d0.proc)
        assert state is not None
        with SQLiteStore.open_in(data_dir) as store:
            before = store.head(CONV)

        # --- 2. the compaction, killed ---------------------------------------------------------
        words = [f"summary word {i} " for i in range(25)]
        provider.enqueue(chat_text_script(words, delay_s=0.04))  # ~1 s if nobody kills the daemon
        async with daemon_process(cfg, client, log, crash_at=point) as d1:
            sim1 = CursorSim(d1.base_url, client)
            sim1.blobs = sim.blobs
            seen: list[Recorded] = []
            with trio.fail_after(15):
                tr = await drive_until_death(sim1, "req-sum", summarize(state), seen)
                assert tr is None or tr.end_stream is None, f"the run ended instead: {tr and tr.end_stream}"
                assert await d1.proc.wait() == -signal.SIGKILL, log.read_text()[-2000:]
        with SQLiteStore.open_in(data_dir) as store:
            crashed = store.head(CONV)
            assert store.messages_at(before.revision_id) == before.messages  # type: ignore[arg-type]
        kinds = [f.kind for f in seen]
        assert "interaction_update.summary_completed" not in kinds
        if point == "summary_committed":
            # The summary is the history's new root; nothing of the old history is in it.
            assert [m.origin for m in crashed.messages] == ["summary"]
            assert crashed.messages[0].event_id == "summary:1:req-sum"
            assert "".join(words).strip() in crashed.messages[0].text
        else:
            assert crashed == before  # a summary that did not end is never committed

        # --- 3. restart: the crashed run is interrupted, the next turn goes on -----------------
        async with daemon_process(cfg, client, log) as d2:
            sim2 = CursorSim(d2.base_url, client)
            sim2.blobs = sim.blobs
            provider.enqueue(chat_text_script(["answer after the crash"]), chat_text_script(["and again"]))
            for n, rid in enumerate(("req-next", "req-last")):
                request = user_turn(
                    f"after {n}", conversation_id=CONV, model_id=MODEL, message_id=f"n{n}", state=state
                )
                with trio.fail_after(15):
                    tr = await sim2.run(rid, request)
                assert tr.end_stream == {}, tr.end_stream
                state = tr.checkpoints()[-1]
            sent = [r.json["messages"] for r in provider.requests[-2:]]
            await stop(d2.proc)
    with SQLiteStore.open_in(data_dir) as store:
        run = store.run("req-sum")
        assert run is not None and (run.status, run.error_code) == ("error", "aborted")
        head = store.head(CONV).messages
        calls = [c for rid in ("req-next", "req-last") for c in store.llm_calls(rid)]
    first_user = sent[0][1]["content"]
    if point == "summary_committed":
        assert head[0].origin == "summary" and [m.role for m in head[1:]] == ["user", "assistant"] * 2
        assert "<conversation_summary>" in str(first_user)
        # The first call on the summary starts a new prefix; the next one extends it.
        assert [c.prefix_extends for c in calls] == [None, True]
    else:
        assert head[: len(before.messages)] == before.messages
        assert "question 0" in str(first_user)
        assert [c.prefix_extends for c in calls] == [True, True]
