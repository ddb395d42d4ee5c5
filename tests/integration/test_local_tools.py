"""The tools byok runs itself, end to end through the Cursor simulator and a real daemon:
TodoWrite (the todo list folded from the messages into the checkpoint), EditNotebook (the edit
path on a real .ipynb) and AwaitShell (a backgrounded shell's terminal file, read by byok)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
import trio

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


NOTEBOOK = {
    "cells": [
        {
            "cell_type": "code",
            "execution_count": 1,
            "id": "c0ffee01",
            "metadata": {},
            "outputs": [{"output_type": "stream", "name": "stdout", "text": ["1\n"]}],
            "source": ["x = 1\n", "print(x)"],
        }
    ],
    "metadata": {},
    "nbformat": 4,
    "nbformat_minor": 5,
}


async def test_edit_notebook_edits_a_cell_and_inserts_one_in_a_real_notebook(env: Env) -> None:
    path = env.root / "analysis.ipynb"
    path.write_text(json.dumps(NOTEBOOK, indent=1) + "\n")
    edit = {
        "target_notebook": "analysis.ipynb",
        "cell_idx": 0,
        "is_new_cell": False,
        "cell_language": "python",
        "old_string": "x = 1",
        "new_string": "x = 42",
    }
    insert = {
        "target_notebook": "analysis.ipynb",
        "cell_idx": 1,
        "is_new_cell": True,
        "cell_language": "markdown",
        "old_string": "",
        "new_string": "## Result\nThe answer.",
    }
    env.daemon.provider.enqueue(
        chat_tool_script([("call_e", "EditNotebook", json.dumps(edit))]),
        chat_tool_script([("call_i", "EditNotebook", json.dumps(insert))]),
        chat_text_script(["edited"]),
    )
    tr = await env.sim.run("req-nb", turn("edit the notebook", "conv-nb", "m-nb"))
    assert tr.end_stream == {}
    nb = json.loads(path.read_text())
    assert [c["cell_type"] for c in nb["cells"]] == ["code", "markdown"]
    assert nb["cells"][0]["source"] == ["x = 42\n", "print(x)"]
    assert nb["cells"][0]["outputs"] == NOTEBOOK["cells"][0]["outputs"]
    assert nb["cells"][1]["source"] == ["## Result\n", "The answer."]
    # The edit path: a hidden read, then a write, for each call.
    assert [e.kind for e in tr.execs] == ["read_args", "write_args", "read_args", "write_args"]
    done = completed(tr)
    first = done["call_e"].edit_tool_call
    assert first.args.path == "analysis.ipynb" and first.args.stream_content == "x = 42"
    success = first.result.success
    assert (success.lines_added, success.lines_removed) == (1, 1)
    assert '"x = 42\\n"' in success.diff_string and success.before_full_file_content is not None
    assert done["call_i"].edit_tool_call.result.success.after_full_file_content == path.read_text()
    results = tool_results(env.daemon, 2)
    assert results["call_e"].startswith("Edited cell 0 of analysis.ipynb")
    assert results["call_i"].startswith("Inserted a new cell at index 1 of analysis.ipynb")
    # A cell that is not there: an error card, the file untouched.
    before = path.read_text()
    bad = dict(edit, cell_idx=5)
    env.daemon.provider.enqueue(
        chat_tool_script([("call_bad", "EditNotebook", json.dumps(bad))]), chat_text_script(["oops"])
    )
    state = tr.checkpoints()[-1]
    tr2 = await env.sim.run("req-nb-2", turn("once more", "conv-nb", "m-nb-2", state=state))
    assert tr2.end_stream == {}
    assert path.read_text() == before
    error = completed(tr2)["call_bad"].edit_tool_call.result.error
    assert "has no cell 5" in error.error


def with_terminals(request: agent.AgentRunRequest, folder: Path) -> agent.AgentRunRequest:
    """The run request as Cursor sends it: the request context names the terminals folder."""
    assert request.action is not None and request.action.user_message_action is not None
    env = agent.RequestContextEnv(terminals_folder=str(folder))
    request.action.user_message_action.request_context = agent.RequestContext(env=env)
    return request


@pytest.fixture
async def term_env(daemon: Daemon, tmp_path: Path) -> AsyncIterator[tuple[Env, Path]]:
    root, folder = tmp_path / "ws", tmp_path / "terminals"
    root.mkdir()
    executor = WorkspaceExecutor(root, shell_timeout_cap_s=30.0, terminals_folder=folder)
    sim = CursorSim(daemon.base_url, daemon.client, executor=executor)
    yield Env(daemon, sim, root, executor), folder
    await executor.aclose()


async def test_await_shell_waits_for_a_pattern_in_a_backgrounded_shells_terminal_file(
    term_env: tuple[Env, Path],
) -> None:
    env, folder = term_env
    serve = json.dumps(
        {
            "command": "echo booting; sleep 1; echo 'server ready on 8123'; sleep 20",
            "block_until_ms": 100,
        }
    )
    wait = json.dumps({"shell_id": "1", "pattern": r"ready on \d+", "block_until_ms": 15000})
    env.daemon.provider.enqueue(
        chat_tool_script([("call_s", "Shell", serve)]),
        chat_tool_script([("call_w", "AwaitShell", wait)]),
        chat_text_script(["the server is up"]),
    )
    request = with_terminals(turn("start the server", "conv-await", "m-await"), folder)
    started = time.monotonic()
    with trio.fail_after(15):
        tr = await env.sim.run("req-await", request)
    assert time.monotonic() - started < 10  # the pattern ended the wait, not its 15 s
    assert tr.end_stream == {}
    assert [e.kind for e in tr.execs] == ["shell_stream_args"]  # AwaitShell reads the file itself
    shell = completed(tr)["call_s"].shell_tool_call
    assert shell.result.is_background and shell.result.success.shell_id == 1
    card = completed(tr)["call_w"].await_tool_call
    assert card.args.task_id == "1" and card.args.regex == r"ready on \d+"
    running = card.result.success.still_running
    assert running.regex_match == "ready on 8123" and running.output_file_path == str(folder / "1.txt")
    assert started_card(tr, "call_w").await_tool_call.result is None
    text = tool_results(env.daemon, 2)["call_w"]
    assert "still running" in text and "matched: 'ready on 8123'" in text and "booting" in text


async def test_await_shell_reports_the_exit_code_once_the_command_ends(term_env: tuple[Env, Path]) -> None:
    env, folder = term_env
    job = json.dumps({"command": "echo working; sleep 0.5; echo finished; exit 4", "block_until_ms": 100})
    wait = json.dumps({"shell_id": 1, "block_until_ms": 15000})
    env.daemon.provider.enqueue(
        chat_tool_script([("call_s", "Shell", job)]),
        chat_tool_script([("call_w", "AwaitShell", wait)]),
        chat_text_script(["done"]),
    )
    request = with_terminals(turn("run the job", "conv-await-2", "m-await-2"), folder)
    with trio.fail_after(15):
        tr = await env.sim.run("req-await-2", request)
    assert tr.end_stream == {}
    complete = completed(tr)["call_w"].await_tool_call.result.success.complete
    assert complete.exit_code == 4 and complete.task_id == "1"
    text = tool_results(env.daemon, 2)["call_w"]
    assert "finished with exit code 4" in text and "working\nfinished" in text


def started_card(tr: Transcript, call_id: str) -> agent.ToolCall:
    return started(tr)[call_id]
