"""Tool rounds end to end: the model calls tools, the simulated Cursor runs them in a real
workspace (files, shell), results come back over BidiAppend, and the next provider call sees
the complete round."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import betterproto2
import pytest
import trio

from byok.devtools.cursor_sim import CursorSim, Transcript, user_turn
from byok.devtools.workspace_exec import WorkspaceExecutor
from byok.pb.agent import v1 as agent
from byok.store import SQLiteStore
from tests.integration.conftest import Daemon, start_daemon
from tests.integration.test_spine import assert_checkpoints_reference_only_acked
from tests.support.fake_provider import chat_text_script, chat_tool_script
from tests.support.run_driver import resume_request


@attrs.define
class Env:
    daemon: Daemon
    sim: CursorSim
    root: Path


@pytest.fixture
async def env(daemon: Daemon, tmp_path: Path) -> AsyncIterator[Env]:
    root = tmp_path / "ws"
    root.mkdir()
    executor = WorkspaceExecutor(root, shell_timeout_cap_s=5.0)
    sim = CursorSim(daemon.base_url, daemon.client, executor=executor)
    yield Env(daemon, sim, root)
    await executor.aclose()


def turn(text: str, conv: str = "conv-tools") -> agent.AgentRunRequest:
    return user_turn(text, conversation_id=conv, model_id="byok-demo", message_id="m-" + text[:8])


def provider_messages(d: Daemon) -> list[list[dict]]:
    return [r.json["messages"] for r in d.provider.requests]


def assert_prefix_property(d: Daemon) -> None:
    calls = provider_messages(d)
    for before, after in itertools.pairwise(calls):
        dump = lambda ms: [json.dumps(m, separators=(",", ":"), ensure_ascii=False) for m in ms]  # noqa: E731
        assert dump(after[: len(before)]) == dump(before), "a provider request rewrote history"


def assert_round_order(tr: Transcript, d: Daemon, rounds: int) -> None:
    """Per round: staged checkpoint before its first Exec; settled checkpoint after its last
    tool_call_completed and before the next provider call's first output frame."""
    kinds = tr.kinds()
    checkpoints = [i for i, k in enumerate(kinds) if k == "conversation_checkpoint"]
    assert len(checkpoints) == 2 * rounds + 3
    assert len(d.provider.requests) == rounds + 1
    output = ("interaction_update.text_delta", "interaction_update.partial_tool_call")
    for r in range(rounds):
        staged, settled = checkpoints[2 * r], checkpoints[2 * r + 1]
        prev = checkpoints[2 * r - 1] if r else 0
        # Every Exec of the round goes out after its staged checkpoint...
        assert not any(k.startswith("exec_server_message") for k in kinds[prev:staged])
        # ...every call completes before the settled one, and the next model output follows it.
        assert "interaction_update.tool_call_completed" in kinds[staged:settled]
        nxt = next(i for i in range(settled, len(kinds)) if kinds[i] in output)
        assert "interaction_update.tool_call_completed" not in kinds[settled:nxt]
    for rec in tr.checkpoints()[: 2 * rounds : 2]:
        assert len(rec.pending_tool_calls) == 1  # staged: the assistant with its calls
    for rec in tr.checkpoints()[1 : 2 * rounds : 2]:
        assert rec.pending_tool_calls == []  # settled


def completed(tr: Transcript) -> list[agent.ToolCallCompletedUpdate]:
    return [
        f.message.interaction_update.tool_call_completed
        for f in tr.frames
        if f.kind == "interaction_update.tool_call_completed"
    ]


async def test_single_read(env: Env) -> None:
    (env.root / "notes.txt").write_text("alpha\nbeta\n")
    env.daemon.provider.enqueue(
        chat_tool_script([("call_1", "Read", '{"path": "notes.txt"}')]),
        chat_text_script(["The file has two lines."]),
    )
    tr = await env.sim.run("req-read", turn("read notes"))
    assert tr.end_stream == {}
    kinds = tr.kinds()
    assert kinds.index("interaction_update.partial_tool_call") < kinds.index(
        "interaction_update.tool_call_started"
    )
    exec_at = next(i for i, k in enumerate(kinds) if k.startswith("exec_server_message"))
    assert kinds.index("interaction_update.tool_call_started") < exec_at
    assert exec_at < kinds.index("interaction_update.tool_call_completed")
    assert_round_order(tr, env.daemon, rounds=1)
    assert_checkpoints_reference_only_acked(tr, env.sim.blobs)
    assert_prefix_property(env.daemon)
    (done,) = completed(tr)
    assert done.call_id == "call_1"
    assert done.tool_call.read_tool_call.result.success is not None
    second = provider_messages(env.daemon)[1]
    assistant, tool = second[-2], second[-1]
    assert assistant["tool_calls"][0]["id"] == "call_1"
    assert tool["role"] == "tool" and tool["tool_call_id"] == "call_1"
    assert "alpha" in tool["content"] and "beta" in tool["content"]
    # Usage sums over both provider calls.
    ended = next(f for f in tr.frames if f.kind == "interaction_update.turn_ended")
    assert ended.message.interaction_update.turn_ended.input_tokens == 20
    # The settled turn has the tool step between the two model steps' worth of output.
    final = tr.checkpoints()[-1]
    structure = agent.ConversationTurnStructure.parse(env.sim.blobs[final.turns[-1]]).agent_conversation_turn
    steps = [agent.ConversationStep.parse(env.sim.blobs[s]) for s in structure.steps]
    assert [s.tool_call is not None for s in steps] == [True, False]


async def test_parallel_calls_answered_out_of_order(env: Env) -> None:
    (env.root / "a.txt").write_text("A\n")
    (env.root / "b.txt").write_text("B\n")
    env.sim.exec_delay = lambda m: 0.3 if m.exec_id == "call_a" else 0.0
    env.daemon.provider.enqueue(
        chat_tool_script([("call_a", "Read", '{"path":"a.txt"}'), ("call_b", "Read", '{"path":"b.txt"}')]),
        chat_text_script(["done"]),
    )
    tr = await env.sim.run("req-par", turn("read both"))
    assert tr.end_stream == {}
    assert tr.exec_completion_order() == ["call_b", "call_a"]
    assert [c.call_id for c in completed(tr)] == ["call_b", "call_a"]
    second = provider_messages(env.daemon)[1]
    assistant = second[-3]
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_a", "call_b"]  # original order
    assert [m["tool_call_id"] for m in second[-2:]] == ["call_b", "call_a"]  # completion order
    assert_round_order(tr, env.daemon, rounds=1)
    assert_prefix_property(env.daemon)


async def test_settled_checkpoint_waits_for_no_set_after_the_last_card(env: Env) -> None:
    """The blobs a round's settled checkpoint needs go out while its tools run: the assistant's
    root once the Execs are out, each result's blobs before its commit, the turn's structure with
    the last. After the last card the checkpoint follows with no SET (no ACK round trip) in
    between, its steps in the model's call order, an unknown tool's error card among them."""
    (env.root / "a.txt").write_text("A\n")
    (env.root / "b.txt").write_text("B\n")
    env.sim.exec_delay = lambda m: 0.3 if m.exec_id == "call_a" else 0.0
    env.daemon.provider.enqueue(
        chat_tool_script(
            [
                ("call_a", "Read", '{"path":"a.txt"}'),
                ("call_x", "Teleport", "{}"),
                ("call_b", "Read", '{"path":"b.txt"}'),
            ]
        ),
        chat_text_script(["done"]),
    )
    tr = await env.sim.run("req-early-sets", turn("read both"))
    assert tr.end_stream == {}
    kinds = tr.kinds()
    settled = [i for i, k in enumerate(kinds) if k == "conversation_checkpoint"][1]
    last_card = max(i for i in range(settled) if kinds[i] == "interaction_update.tool_call_completed")
    assert [c.call_id for c in completed(tr)] == ["call_x", "call_b", "call_a"]
    assert kinds[last_card + 1 : settled] == []
    assert_round_order(tr, env.daemon, rounds=1)
    assert_checkpoints_reference_only_acked(tr, env.sim.blobs)
    state = tr.checkpoints()[1]
    assistant_root = state.root_prompt_messages_json[2]  # after the system prompt and the user's
    assert json.loads(env.sim.blobs[assistant_root])["role"] == "assistant"
    set_at = next(
        i
        for i, f in enumerate(tr.frames)
        if f.kind == "kv_server_message.set_blob_args"
        and f.message.kv_server_message.set_blob_args.blob_id == assistant_root
    )
    first_exec = next(i for i, k in enumerate(kinds) if k.startswith("exec_server_message"))
    assert first_exec < set_at < kinds.index("interaction_update.tool_call_completed")
    structure = agent.ConversationTurnStructure.parse(env.sim.blobs[state.turns[-1]]).agent_conversation_turn
    assert structure is not None
    steps = [agent.ConversationStep.parse(env.sim.blobs[s]) for s in structure.steps]
    # Every call is a step, in the model's order: the unknown tool's error card among them.
    cards = [betterproto2.which_one_of(s.tool_call, "tool") for s in steps]
    assert [field for field, _ in cards] == ["read_tool_call", "mcp_tool_call", "read_tool_call"]
    assert [cards[0][1].args.path, cards[2][1].args.path] == ["a.txt", "b.txt"]
    assert cards[1][1].result.error is not None


async def test_write_new_file_streams_content(env: Env) -> None:
    content = "line one\nline two\n"
    args = json.dumps({"path": "src/new.py", "contents": content})
    env.daemon.provider.enqueue(chat_tool_script([("call_w", "Write", args)]), chat_text_script(["written"]))
    tr = await env.sim.run("req-write", turn("write file"))
    assert tr.end_stream == {}
    assert (env.root / "src" / "new.py").read_text() == content
    streamed = "".join(
        f.message.interaction_update.tool_call_delta.tool_call_delta.edit_tool_call_delta.stream_content_delta
        for f in tr.frames
        if f.kind == "interaction_update.tool_call_delta"
    )
    assert streamed == content
    (done,) = completed(tr)
    success = done.tool_call.edit_tool_call.result.success
    assert success is not None and success.lines_added == 2
    # Two execs: the hidden read (file not found), then the write.
    assert [e.kind for e in tr.execs] == ["read_args", "write_args"]


@pytest.mark.parametrize(
    ("old", "expect_error", "expect_text"),
    [
        ("beta", False, "alpha\nBETA\ngamma\n"),
        ("missing", True, "alpha\r\nbeta\r\ngamma\r\n"),
        ("a", True, "alpha\r\nbeta\r\ngamma\r\n"),  # ambiguous
    ],
)
async def test_str_replace_on_a_crlf_file(env: Env, old: str, expect_error: bool, expect_text: str) -> None:
    path = env.root / "f.txt"
    path.write_bytes(b"alpha\r\nbeta\r\ngamma\r\n")
    args = json.dumps({"path": "f.txt", "old_string": old, "new_string": old.upper()})
    env.daemon.provider.enqueue(chat_tool_script([("call_s", "StrReplace", args)]), chat_text_script(["ok"]))
    tr = await env.sim.run("req-sr-" + old, turn("replace " + old, conv="c-" + old))
    assert tr.end_stream == {}
    assert path.read_bytes().decode() == expect_text
    tool_msg = provider_messages(env.daemon)[1][-1]
    assert tool_msg["content"].startswith("Error") == expect_error


async def test_shell_output_exit_code_and_background(env: Env) -> None:
    env.daemon.provider.enqueue(
        chat_tool_script(
            [
                ("call_ok", "Shell", json.dumps({"command": "echo hello; echo oops >&2"})),
                ("call_fail", "Shell", json.dumps({"command": "exit 3"})),
                ("call_bg", "Shell", json.dumps({"command": "sleep 5", "block_until_ms": 200})),
            ]
        ),
        chat_text_script(["ran"]),
    )
    tr = await env.sim.run("req-sh", turn("run things"))
    assert tr.end_stream == {}
    results = {
        m["tool_call_id"]: m["content"] for m in provider_messages(env.daemon)[1] if m["role"] == "tool"
    }
    assert "hello" in results["call_ok"] and "oops" in results["call_ok"]
    assert "Exit code: 0" in results["call_ok"]
    assert "Exit code: 3" in results["call_fail"]
    assert "background" in results["call_bg"]
    kinds = tr.kinds()
    assert "interaction_update.shell_output_delta" in kinds
    assert "interaction_update.tool_call_delta" in kinds


async def test_glob(env: Env) -> None:
    (env.root / "pkg").mkdir()
    (env.root / "pkg" / "one.py").write_text("x")
    (env.root / "pkg" / "two.txt").write_text("y")
    env.daemon.provider.enqueue(
        chat_tool_script([("call_g", "Glob", '{"glob_pattern": "**/*.py"}')]), chat_text_script(["found"])
    )
    tr = await env.sim.run("req-glob", turn("find py"))
    assert tr.end_stream == {}
    (grep_exec,) = [e for e in tr.execs]
    assert grep_exec.kind == "grep_args"
    content = provider_messages(env.daemon)[1][-1]["content"]
    assert "one.py" in content and "two.txt" not in content


async def test_invalid_arguments_and_unknown_tool_become_tool_errors(env: Env) -> None:
    env.daemon.provider.enqueue(
        chat_tool_script(
            [
                ("call_bad", "Read", '{"path": '),
                ("call_missing", "Read", '{"offset": 3}'),
                ("call_unknown", "Teleport", "{}"),
            ]
        ),
        chat_text_script(["sorry"]),
    )
    tr = await env.sim.run("req-bad", turn("break things"))
    assert tr.end_stream == {}
    assert tr.execs == []
    results = {
        m["tool_call_id"]: m["content"] for m in provider_messages(env.daemon)[1] if m["role"] == "tool"
    }
    assert "invalid JSON" in results["call_bad"]
    assert "path" in results["call_missing"]
    assert "unknown tool" in results["call_unknown"]
    assert_prefix_property(env.daemon)
    # Each still gets its cards: started, then completed with a typed error result.
    ids = {"call_bad", "call_missing", "call_unknown"}
    assert call_ids(tr, "tool_call_started") == ids
    cards = {c.call_id: c.tool_call for c in completed(tr)}
    assert set(cards) == ids
    assert cards["call_bad"].read_tool_call.result.error.error_message == results["call_bad"]
    unknown = cards["call_unknown"].mcp_tool_call
    assert unknown.args.name == "Teleport" and unknown.result.error.error == results["call_unknown"]
    kinds = tr.kinds()
    lifecycle = [
        (f.kind.rsplit(".", 1)[1], getattr(f.message.interaction_update, f.kind.rsplit(".", 1)[1]).call_id)
        for f in tr.frames
        if f.kind in ("interaction_update.tool_call_started", "interaction_update.tool_call_completed")
    ]
    for call_id in ids:  # started before completed, each once
        assert [k for k, c in lifecycle if c == call_id] == ["tool_call_started", "tool_call_completed"]
    assert kinds.count("interaction_update.tool_call_completed") == 3


async def test_a_tool_the_mode_does_not_offer_is_refused_never_run(env: Env) -> None:
    """Ask mode offers no Write: a model that calls it anyway gets an error result naming the
    tool and the mode; no Exec goes out, the file is not created, and its card (placeholder,
    started, completed) ends with the edit card's error."""
    args = json.dumps({"path": "made.txt", "contents": "x"})
    env.daemon.provider.enqueue(
        chat_tool_script([("call_w", "Write", args), ("call_r", "Read", json.dumps({"path": "a.txt"}))]),
        chat_text_script(["ok"]),
    )
    (env.root / "a.txt").write_text("hello\n")
    request = user_turn(
        "ask something",
        conversation_id="conv-ask",
        model_id="byok-demo",
        message_id="m-ask",
        mode=agent.AgentMode.ASK,
    )
    tr = await env.sim.run("req-ask-write", request)
    assert tr.end_stream == {}
    assert not (env.root / "made.txt").exists()
    assert [e.kind for e in tr.execs] == ["read_args"]  # only the offered tool ran
    offered = [t["function"]["name"] for t in env.daemon.provider.requests[0].json["tools"]]
    assert "Write" not in offered and "Read" in offered
    results = {
        m["tool_call_id"]: m["content"] for m in provider_messages(env.daemon)[1] if m["role"] == "tool"
    }
    assert "Write" in results["call_w"] and "ask mode" in results["call_w"]
    assert "hello" in results["call_r"]
    cards = {c.call_id: c.tool_call for c in completed(tr)}
    assert set(cards) == {"call_w", "call_r"}
    assert cards["call_w"].edit_tool_call.result.error.error == results["call_w"]
    assert cards["call_w"].edit_tool_call.args.path == "made.txt"
    assert {"call_w", "call_r"} <= call_ids(tr, "partial_tool_call")
    assert {"call_w", "call_r"} == call_ids(tr, "tool_call_started")


def call_ids(tr: Transcript, update: str) -> set[str]:
    return {
        getattr(f.message.interaction_update, update).call_id
        for f in tr.frames
        if f.kind == f"interaction_update.{update}"
    }


async def test_two_calls_with_one_id_end_the_run_with_an_error(env: Env) -> None:
    """Results are matched to calls by id, so such a round could never complete: the run ends
    with the provider's protocol error instead of waiting forever, and nothing of the broken
    answer is committed."""
    (env.root / "a.txt").write_text("A\n")
    env.daemon.provider.enqueue(
        chat_tool_script([("call_same", "Read", '{"path":"a.txt"}'), ("call_same", "Glob", "{}")]),
    )
    with trio.fail_after(10):
        tr = await env.sim.run("req-dup-ids", turn("read twice", conv="conv-dup-ids"))
    error = tr.error
    assert error is not None and error["code"] == "unavailable"
    assert "'call_same' used by two calls" in error["message"]
    assert tr.execs == [] and "interaction_update.turn_ended" not in tr.kinds()
    with SQLiteStore.open_in(env.daemon.data_dir) as store:
        assert [m.role for m in store.head("conv-dup-ids").messages] == ["user"]


async def test_a_replayed_foreign_round_with_two_calls_of_one_id_still_ends(env: Env) -> None:
    """A staged round another server wrote may name two calls alike: resumed, its calls run and
    the round ends with one result per id, instead of waiting for a second result forever."""
    (env.root / "a.txt").write_text("A\n")
    roots = []
    for obj in (
        {"role": "system", "content": "OLD SYSTEM PROMPT"},
        {"role": "user", "content": [{"type": "text", "text": "read it twice"}]},
    ):
        data = json.dumps(obj).encode()
        roots.append(hashlib.sha256(data).digest())
        env.sim.blobs[roots[-1]] = data
    call = {"type": "tool-call", "toolCallId": "dup", "toolName": "Read", "input": {"path": "a.txt"}}
    staged = json.dumps({"role": "assistant", "content": [call, call]})
    state = agent.ConversationStateStructure(root_prompt_messages_json=roots, pending_tool_calls=[staged])
    env.daemon.provider.enqueue(chat_text_script(["read"]))
    with trio.fail_after(10):
        tr = await env.sim.run("req-dup-foreign", resume_request(state, conversation_id="conv-dup-foreign"))
    assert tr.end_stream == {}, tr.end_stream
    assert [c.call_id for c in completed(tr)] == ["dup"]
    with SQLiteStore.open_in(env.daemon.data_dir) as store:
        messages = store.head("conv-dup-foreign").messages
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]


async def test_late_and_duplicate_results_are_ignored(env: Env) -> None:
    (env.root / "x.txt").write_text("x\n")

    def duplicate(msg: agent.ExecServerMessage) -> list[agent.AgentClientMessage] | None:
        if msg.read_args is None:
            return None
        result = agent.ExecClientMessage(
            id=msg.id,
            exec_id=msg.exec_id,
            read_result=agent.ReadResult(
                success=agent.ReadSuccess(path="x.txt", content="x\n", total_lines=1)
            ),
        )
        close = agent.ExecClientControlMessage(stream_close=agent.ExecClientStreamClose(id=msg.id))
        stale = agent.ExecClientMessage(id=msg.id + 100, exec_id="nope", read_result=result.read_result)
        return [
            agent.AgentClientMessage(exec_client_message=result),
            agent.AgentClientMessage(exec_client_message=result),  # duplicate of a finished id
            agent.AgentClientMessage(exec_client_control_message=close),
            agent.AgentClientMessage(exec_client_message=stale),  # an id never issued
        ]

    env.sim.on_exec = duplicate
    env.daemon.provider.enqueue(
        chat_tool_script([("call_x", "Read", '{"path":"x.txt"}')]), chat_text_script(["fine"])
    )
    tr = await env.sim.run("req-dup", turn("read x"))
    assert tr.end_stream == {}
    assert len(completed(tr)) == 1
    tools = [m for m in provider_messages(env.daemon)[1] if m["role"] == "tool"]
    assert len(tools) == 1


async def test_two_rounds_then_text(env: Env) -> None:
    (env.root / "a.txt").write_text("first\n")
    env.daemon.provider.enqueue(
        chat_tool_script([("c1", "Read", '{"path":"a.txt"}')]),
        chat_tool_script([("c2", "Write", json.dumps({"path": "a.txt", "contents": "second\n"}))]),
        chat_text_script(["all done"]),
    )
    tr = await env.sim.run("req-2r", turn("two rounds"))
    assert tr.end_stream == {}
    assert (env.root / "a.txt").read_text() == "second\n"
    assert len(env.daemon.provider.requests) == 3
    assert_round_order(tr, env.daemon, rounds=2)
    assert_prefix_property(env.daemon)
    assert_checkpoints_reference_only_acked(tr, env.sim.blobs)


async def test_a_result_over_max_body_bytes_fails_its_exec_and_the_run_goes_on(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Cursor's append carrying a result too large to accept: the daemon reads it through without
    keeping it, fails that exec with an error naming max_body_bytes, and takes the round's
    later appends in order; the model gets the error and the run ends normally."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "big.txt").write_text("".join(f"line {i:06d} of a large file\n" for i in range(4000)))
    (root / "small.txt").write_text("tiny\n")
    async with start_daemon(tmp_path, nursery, server_extra="max_body_bytes = 65536") as d:
        executor = WorkspaceExecutor(root)
        sim = CursorSim(d.base_url, d.client, executor=executor)
        d.provider.enqueue(
            chat_tool_script(
                [("call_big", "Read", '{"path": "big.txt"}'), ("call_small", "Read", '{"path": "small.txt"}')]
            ),
            chat_text_script(["One was too large."]),
        )
        with trio.fail_after(10):
            tr = await sim.run("req-big", turn("read both", conv="conv-big"))
        await executor.aclose()
    assert tr.end_stream == {}, tr.end_stream
    assert tr.text() == "One was too large."
    done = {c.call_id: c for c in completed(tr)}
    assert set(done) == {"call_big", "call_small"}
    assert done["call_small"].tool_call.read_tool_call.result.success is not None
    second = {m.get("tool_call_id"): m for m in provider_messages(d)[1] if m["role"] == "tool"}
    big = second["call_big"]["content"]
    assert big.startswith("the tool's result was ") and "max_body_bytes = 65,536" in big
    assert "tiny" in second["call_small"]["content"]
