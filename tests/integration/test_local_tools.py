"""The tools byok runs itself, end to end through the Cursor simulator and a real daemon:
TodoWrite (the todo list folded from the messages into the checkpoint), EditNotebook (the edit
path on a real .ipynb) and AwaitShell (a backgrounded shell's terminal file, read by byok)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest

from byok.devtools.cursor_sim import CursorSim, Transcript, user_turn
from byok.devtools.workspace_exec import WorkspaceExecutor
from byok.pb.agent import v1 as agent
from tests.integration.conftest import Daemon
from tests.integration.test_spine import assert_checkpoints_reference_only_acked
from tests.support.fake_provider import chat_text_script, chat_tool_script


@attrs.define
class Env:
    daemon: Daemon
    sim: CursorSim
    root: Path
    executor: WorkspaceExecutor


@pytest.fixture
async def env(daemon: Daemon, tmp_path: Path) -> AsyncIterator[Env]:
    root = tmp_path / "ws"
    root.mkdir()
    executor = WorkspaceExecutor(root, shell_timeout_cap_s=5.0)
    sim = CursorSim(daemon.base_url, daemon.client, executor=executor)
    yield Env(daemon, sim, root, executor)
    await executor.aclose()


def turn(text: str, conv: str, message_id: str, state: agent.ConversationStateStructure | None = None):
    return user_turn(text, conversation_id=conv, model_id="byok-demo", message_id=message_id, state=state)


def cards(tr: Transcript, update: str) -> dict[str, agent.ToolCall]:
    """call id -> its card in the ``update`` frames (tool_call_started, tool_call_completed)."""
    out = {}
    for f in tr.frames:
        if f.kind == f"interaction_update.{update}":
            u = getattr(f.message.interaction_update, update)
            out[u.call_id] = u.tool_call
    return out


def completed(tr: Transcript) -> dict[str, agent.ToolCall]:
    return cards(tr, "tool_call_completed")


def started(tr: Transcript) -> dict[str, agent.ToolCall]:
    return cards(tr, "tool_call_started")


def tool_results(d: Daemon, request: int) -> dict[str, str]:
    return {
        m["tool_call_id"]: m["content"]
        for m in d.provider.requests[request].json["messages"]
        if m["role"] == "tool"
    }


def todo_items(sim: CursorSim, state: agent.ConversationStateStructure) -> list[tuple[str, str, int]]:
    items = [agent.TodoItem().parse(sim.blobs[i]) for i in state.todos]
    return [(t.id, t.content, int(t.status)) for t in items]


PENDING, IN_PROGRESS, COMPLETED = (
    int(s) for s in (agent.TodoStatus.PENDING, agent.TodoStatus.IN_PROGRESS, agent.TodoStatus.COMPLETED)
)


async def test_todo_write_twice_merges_and_the_checkpoint_holds_the_list(env: Env) -> None:
    first = json.dumps(
        {
            "merge": False,
            "todos": [
                {"id": "read", "content": "Read the code", "status": "in_progress"},
                {"id": "test", "content": "Write the tests"},
            ],
        }
    )
    env.daemon.provider.enqueue(
        chat_tool_script([("call_t1", "TodoWrite", first)]), chat_text_script(["planned"])
    )
    tr = await env.sim.run("req-todo-1", turn("plan the work", "conv-todo", "m-todo-1"))
    assert tr.end_stream == {}
    assert tr.execs == []  # server-local: no client round trip
    card = completed(tr)["call_t1"].update_todos_tool_call
    assert card.args.todos == [] and not card.args.merge  # the list before: empty
    assert [(t.id, int(t.status)) for t in card.result.success.todos] == [
        ("read", IN_PROGRESS),
        ("test", PENDING),
    ]
    assert "call_t1" in started(tr)
    settled, final = tr.checkpoints()[1], tr.checkpoints()[-1]
    expected = [("read", "Read the code", IN_PROGRESS), ("test", "Write the tests", PENDING)]
    assert todo_items(env.sim, settled) == expected == todo_items(env.sim, final)
    assert tr.checkpoints()[0].todos == []  # the staged checkpoint: the call has no result yet
    assert_checkpoints_reference_only_acked(tr, env.sim.blobs)
    assert "[in_progress] read: Read the code" in tool_results(env.daemon, 1)["call_t1"]

    # The next turn merges: one item completed, one added; the rest stays as it was.
    update = json.dumps(
        {
            "merge": True,
            "todos": [{"id": "read", "status": "completed"}, {"id": "ship", "content": "Ship it"}],
        }
    )
    env.daemon.provider.enqueue(
        chat_tool_script([("call_t2", "TodoWrite", update)]), chat_text_script(["moved on"])
    )
    held = frozenset(env.sim.blobs)
    tr2 = await env.sim.run("req-todo-2", turn("go on", "conv-todo", "m-todo-2", state=final))
    assert tr2.end_stream == {}
    card = completed(tr2)["call_t2"].update_todos_tool_call
    assert [(t.id, int(t.status)) for t in card.args.todos] == [("read", IN_PROGRESS), ("test", PENDING)]
    assert card.result.success.total_count == 3 and card.result.success.was_merge
    expected = [
        ("read", "Read the code", COMPLETED),
        ("test", "Write the tests", PENDING),
        ("ship", "Ship it", PENDING),
    ]
    assert todo_items(env.sim, tr2.checkpoints()[-1]) == expected
    assert_checkpoints_reference_only_acked(tr2, env.sim.blobs, held)
    result = tool_results(env.daemon, 3)["call_t2"]
    assert "[completed] read" in result and "[pending] ship: Ship it" in result
