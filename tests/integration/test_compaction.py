"""Compaction end to end: summarize_action, the automatic compaction of a history that would not
fit, a provider's "too long" answer, and a failed compaction leaving the history as it was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from byok.devtools.cursor_sim import Transcript, user_turn
from byok.pb.agent import v1 as agent
from byok.store import SQLiteStore
from tests.integration.conftest import Daemon, start_daemon
from tests.support.fake_provider import chat_text_script, chat_tool_script, error_script

SMALL = """
[[models]]
id = "byok-small"
provider = "fake"
upstream_model = "gpt-small"
context_tokens = 14000
"""
SUMMARY_SHOWN = [
    "interaction_update.summary_started",
    "interaction_update.summary",
    "interaction_update.summary",
    "interaction_update.token_delta",
    "interaction_update.summary_completed",
]
END = [
    "interaction_update.turn_ended",
    "conversation_checkpoint",
    "conversation_checkpoint",
    "conversation_checkpoint",
]


def visible(tr: Transcript) -> list[str]:
    return [k for k in tr.kinds() if not k.startswith("kv_server_message")]


def summarize(
    state: agent.ConversationStateStructure, conv: str, model: str = "byok-demo"
) -> agent.AgentRunRequest:
    return agent.AgentRunRequest(
        conversation_state=state,
        action=agent.ConversationAction(summarize_action=agent.SummarizeAction()),
        requested_model=agent.RequestedModel(model_id="byok-demo"),
        conversation_id=conv,
    )


def texts(request: Any) -> list[tuple[str, str]]:
    """(role, text) of each message of a recorded Chat request."""
    out = []
    for m in request.json["messages"]:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content)
        out.append((m["role"], content or ""))
    return out


TURNS = [("first question", "answer one"), ("second question", "answer two")]


async def two_turns(
    daemon: Daemon, conv: str, model: str = "byok-demo", last_input: int = 3001
) -> agent.ConversationStateStructure:
    state = None
    for i, (question, answer) in enumerate(TURNS):
        daemon.provider.enqueue(chat_text_script([answer], usage=(last_input if i else 3000, 10)))
        request = user_turn(question, conversation_id=conv, model_id=model, message_id=f"m{i}", state=state)
        tr = await daemon.sim.run(f"{conv}-t{i}", request)
        assert tr.end_stream == {}, tr.end_stream
        state = tr.checkpoints()[-1]
    assert state is not None
    return state


def third(
    conv: str, state: agent.ConversationStateStructure, model: str = "byok-demo"
) -> agent.AgentRunRequest:
    return user_turn("third question", conversation_id=conv, model_id=model, message_id="m3", state=state)


def store_of(daemon: Daemon) -> SQLiteStore:
    return SQLiteStore.open_in(daemon.data_dir)


async def test_summarize_action_compacts_the_history_and_keeps_the_old_revision(daemon: Daemon) -> None:
    state = await two_turns(daemon, "conv-s")
    daemon.provider.enqueue(chat_text_script(["The user asked", " two questions."], usage=(900, 20)))
    tr = await daemon.sim.run("conv-s-sum", summarize(state, "conv-s"))

    assert tr.end_stream == {}
    assert visible(tr) == SUMMARY_SHOWN + END
    shown = [f.message.interaction_update.summary.summary for f in tr.frames if f.kind.endswith(".summary")]
    assert shown == ["The user asked", " two questions."]
    # The compaction call read the whole history, then the instruction.
    request = texts(daemon.provider.requests[-1])
    assert [role for role, _ in request] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert "summary of the conversation so far" in request[-1][1]
    # The compacted checkpoint, three times: the system prompt and the summary as roots.
    checkpoints = tr.checkpoints()
    assert len(checkpoints) == 3 and checkpoints[0] == checkpoints[1] == checkpoints[2]
    compacted = checkpoints[0]
    assert len(compacted.root_prompt_messages_json) == 2
    assert compacted.self_summary_count == 1 and compacted.summary
    assert compacted.turns == state.turns  # Cursor's transcript is untouched
    # ConversationSummary{summary = 1}: the summary as the model wrote it.
    assert daemon.sim.blobs[compacted.summary] == b"\x0a\x1dThe user asked two questions."

    # The next turn continues on the summary alone.
    daemon.provider.enqueue(chat_text_script(["answer three"], usage=(300, 5)))
    tr = await daemon.sim.run(
        "conv-s-t3",
        third("conv-s", compacted),
    )
    assert tr.end_stream == {}
    request = texts(daemon.provider.requests[-1])
    assert [role for role, _ in request] == ["system", "user", "user"]
    assert "<conversation_summary>\nThe user asked two questions.\n</conversation_summary>" in request[1][1]
    assert "third question" in request[2][1] and "first question" not in "".join(t for _, t in request)
    assert tr.checkpoints()[-1].self_summary_count == 1
    # The prefix meter knows the summary starts a new prefix on purpose: not compared, not a miss.
    with store_of(daemon) as store, trio.fail_after(10):
        while (
            len(calls := [c for r in ("conv-s-t1", "conv-s-sum", "conv-s-t3") for c in store.llm_calls(r)])
            < 3
        ):
            await trio.sleep(0.05)  # the call log writes once the runs are quiet
    assert [c.prefix_extends for c in calls] == [True, True, None]

    # History stays append-only: the revision before the compaction still holds every message.
    with store_of(daemon) as store:
        head = store.head("conv-s")
        assert head.messages[0].origin == "summary"
        old = [r for r, m in store.revisions_with_count("conv-s", 4)]
        assert old, "the pre-compaction revision of four messages is gone"
        assert [m.text for m in store.messages_at(old[0])][1] == "answer one"


async def test_a_history_past_the_window_is_compacted_before_the_call(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    async with start_daemon(tmp_path, nursery, extra=SMALL) as daemon:
        state = await two_turns(daemon, "conv-a", model="byok-small", last_input=4500)
        # 4,510 tokens last time: past 14,000 less a tenth and the 8,192 output reserve.
        daemon.provider.enqueue(
            chat_text_script(["Two questions", " so far."], usage=(3100, 30)),
            chat_text_script(["answer three"], usage=(200, 5)),
        )
        tr = await daemon.sim.run(
            "conv-a-t3",
            third("conv-a", state, "byok-small"),
        )
        assert tr.end_stream == {}
        kinds = visible(tr)
        assert kinds[: len(SUMMARY_SHOWN)] == SUMMARY_SHOWN
        assert kinds[len(SUMMARY_SHOWN)] == "interaction_update.text_delta" and kinds[-4:] == END
        assert tr.text() == "answer three"
        compaction, answer = daemon.provider.requests[-2:]
        # The user's new message is not summarized: it follows the summary as it was sent.
        assert "third question" not in "".join(t for _, t in texts(compaction))
        roles = [role for role, _ in texts(answer)]
        assert roles == ["system", "user", "user"] and "third question" in texts(answer)[2][1]
        final = tr.checkpoints()[-1]
        assert final.self_summary_count == 1 and len(final.root_prompt_messages_json) == 4
        ended = next(f for f in tr.frames if f.kind == "interaction_update.turn_ended")
        assert ended.message.interaction_update.turn_ended.input_tokens == 3300  # both calls' prompts


async def test_a_request_the_provider_finds_too_long_is_compacted_and_sent_again(daemon: Daemon) -> None:
    state = await two_turns(daemon, "conv-o")
    daemon.provider.enqueue(
        error_script(400, "This model's maximum context length is 128000 tokens. Please reduce the length."),
        chat_text_script(["Summary."], usage=(100, 5)),
        chat_text_script(["answer three"], usage=(50, 5)),
    )
    tr = await daemon.sim.run(
        "conv-o-t3",
        third("conv-o", state),
    )
    assert tr.end_stream == {}
    assert tr.text() == "answer three"
    assert visible(tr)[0] == "interaction_update.summary_started"
    assert [role for role, _ in texts(daemon.provider.requests[-1])] == ["system", "user", "user"]


async def test_a_failed_compaction_leaves_the_history_as_it_was(daemon: Daemon) -> None:
    state = await two_turns(daemon, "conv-f")
    daemon.provider.enqueue(error_script(400, "bad request"))
    tr = await daemon.sim.run("conv-f-sum", summarize(state, "conv-f"))
    assert tr.end_stream is not None and "compaction failed" in tr.end_stream["error"]["message"]
    assert "the history is unchanged" in tr.end_stream["error"]["message"]
    daemon.provider.enqueue(chat_text_script(["answer three"], usage=(50, 5)))
    tr = await daemon.sim.run(
        "conv-f-t3",
        third("conv-f", state),
    )
    assert tr.end_stream == {}
    roles = [role for role, _ in texts(daemon.provider.requests[-1])]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]


async def test_nothing_to_summarize_is_a_clear_error(daemon: Daemon) -> None:
    tr = await daemon.sim.run("conv-e-sum", summarize(agent.ConversationStateStructure(), "conv-e"))
    assert tr.end_stream is not None
    assert tr.end_stream["error"]["code"] == "failed_precondition"
    assert "no history to summarize" in tr.end_stream["error"]["message"]


async def test_an_unanswered_first_message_alone_is_nothing_to_summarize(daemon: Daemon) -> None:
    daemon.provider.enqueue(error_script(400, "bad request"))
    first = user_turn("first question", conversation_id="conv-u", model_id="byok-demo", message_id="m0")
    tr = await daemon.sim.run("conv-u-t0", first)
    assert tr.end_stream is not None and tr.end_stream["error"]["code"] == "unavailable"
    calls = len(daemon.provider.requests)
    # Its message is committed; the client has no checkpoint. A summary would summarize nothing.
    tr = await daemon.sim.run("conv-u-sum", summarize(agent.ConversationStateStructure(), "conv-u"))
    assert tr.end_stream is not None and tr.end_stream["error"]["code"] == "failed_precondition"
    assert "no history to summarize" in tr.end_stream["error"]["message"]
    assert len(daemon.provider.requests) == calls
    with store_of(daemon) as store:
        assert [m.origin for m in store.head("conv-u").messages] == ["runtime"]


async def test_the_todo_list_survives_a_compaction(daemon: Daemon) -> None:
    todos = [
        {"id": "a", "content": "Read the parser", "status": "completed"},
        {"id": "b", "content": "Fix the bug", "status": "in_progress"},
    ]
    daemon.provider.enqueue(
        chat_tool_script([("c1", "TodoWrite", json.dumps({"todos": todos, "merge": False}))]),
        chat_text_script(["planned"]),
    )
    request = user_turn("plan it", conversation_id="conv-t", model_id="byok-demo", message_id="m0")
    tr = await daemon.sim.run("conv-t-t0", request)
    assert tr.end_stream == {}
    before = tr.checkpoints()[-1]
    assert len(before.todos) == 2
    daemon.provider.enqueue(chat_text_script(["Planning so far."], usage=(500, 10)))
    tr = await daemon.sim.run("conv-t-sum", summarize(before, "conv-t"))
    assert tr.end_stream == {}
    compacted = tr.checkpoints()[-1]
    assert compacted.todos == before.todos  # the same items, the same blobs
    # The model reads the list in the summary; a merge after it updates the carried list.
    daemon.provider.enqueue(
        chat_tool_script(
            [("c2", "TodoWrite", json.dumps({"todos": [{"id": "b", "status": "completed"}], "merge": True}))]
        ),
        chat_text_script(["done"]),
    )
    tr = await daemon.sim.run("conv-t-t1", third("conv-t", compacted))
    assert tr.end_stream == {}
    first_call = daemon.provider.requests[-2]
    assert '"content":"Fix the bug"' in texts(first_call)[1][1]
    items = [agent.TodoItem.parse(daemon.sim.blobs[b]) for b in tr.checkpoints()[-1].todos]
    assert [(t.id, t.status) for t in items] == [
        ("a", agent.TodoStatus.COMPLETED),
        ("b", agent.TodoStatus.COMPLETED),
    ]


async def test_after_a_restart_a_summary_answered_before_is_no_new_prefix(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    async with start_daemon(tmp_path, nursery) as daemon:
        state = await two_turns(daemon, "conv-r")
        daemon.provider.enqueue(chat_text_script(["Summary."], usage=(100, 5)))
        tr = await daemon.sim.run("conv-r-sum", summarize(state, "conv-r"))
        daemon.provider.enqueue(chat_text_script(["answer three"], usage=(50, 5)))
        tr = await daemon.sim.run("conv-r-t3", third("conv-r", tr.checkpoints()[-1]))
        assert tr.end_stream == {}
        state, blobs = tr.checkpoints()[-1], daemon.sim.blobs
    # A new daemon on the same data dir: it has not seen a call on this summary, the history has.
    async with start_daemon(tmp_path, nursery) as daemon:
        daemon.sim.blobs = blobs
        daemon.provider.enqueue(chat_text_script(["answer four"], usage=(60, 5)))
        fourth = user_turn("fourth question", conversation_id="conv-r", model_id="byok-demo", message_id="m4")
        fourth.conversation_state = state
        tr = await daemon.sim.run("conv-r-t4", fourth)
        assert tr.end_stream == {}
        with store_of(daemon) as store, trio.fail_after(10):
            while len(calls := [c for r in ("conv-r-t3", "conv-r-t4") for c in store.llm_calls(r)]) < 2:
                await trio.sleep(0.05)
    # The first call on the summary starts a new prefix; the one after the restart extends it.
    assert [c.prefix_extends for c in calls] == [None, True]


async def test_a_failed_summary_leaves_the_head_where_it_was_when_the_checkpoint_is_behind(
    daemon: Daemon,
) -> None:
    state = await two_turns(daemon, "conv-b")
    # A turn that fails: its message is committed, the client's checkpoint does not hold it.
    daemon.provider.enqueue(error_script(400, "bad request"))
    tr = await daemon.sim.run("conv-b-t3", third("conv-b", state))
    assert tr.end_stream is not None and tr.end_stream["error"]["code"] == "unavailable"
    with store_of(daemon) as store:
        before = store.head("conv-b")
    assert len(before.messages) == 5
    # The summary is taken at the client's checkpoint; it fails, and nothing moved.
    daemon.provider.enqueue(error_script(400, "bad request"))
    tr = await daemon.sim.run("conv-b-sum", summarize(state, "conv-b"))
    assert tr.end_stream is not None and "the history is unchanged" in tr.end_stream["error"]["message"]
    assert [role for role, _ in texts(daemon.provider.requests[-1])][-2:] == ["assistant", "user"]
    with store_of(daemon) as store:
        assert store.head("conv-b") == before
