"""Run lifecycle end to end (issue 5): cancel, preemption, resume, edits, conversation import,
background completions, RunSSE reconnect grace and graceful shutdown.

Real daemon, real SQLite, fake provider, simulated Cursor. Every test asserts the exact
terminal frame and the history invariants: nothing committed is lost, nothing is duplicated,
no provider request carries a dangling tool call, the prefix property holds where history
only grows, and the run's terminal status is written once (the store refuses a second write,
which would crash the run task and so the test).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path

import attrs
import httpx
import pytest
import trio

from byok.cursor.root_json import encode_root
from byok.devtools.cursor_sim import RUN_SSE, CursorSim, Recorded, Transcript, frame_kind, user_turn
from byok.devtools.exec_client import exec_result, stream_close
from byok.devtools.workspace_exec import WorkspaceExecutor
from byok.http.connect_envelope import FrameDecoder, encode_frame
from byok.loop.turn_values import Outcome, Succeeded
from byok.model.messages import Message
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from byok.run.slot import RunSlot
from byok.store import SQLiteStore
from tests.integration.conftest import Daemon, start_daemon
from tests.integration.test_spine import assert_checkpoints_reference_only_acked, referenced_blobs
from tests.support.fake_provider import Script, chat_text_script, chat_tool_script, error_script
from tests.support.run_driver import (
    RunDriver,
    assert_history_invariants,
    assert_store_has_no_duplicate,
    background_request,
    cancel_message,
    heartbeat_message,
    live_daemon,
    provider_histories,
    resume_request,
    wait_run_ended,
)

TAIL = [
    "interaction_update.turn_ended",
    "conversation_checkpoint",
    "conversation_checkpoint",
    "conversation_checkpoint",
]
CANCELED = "canceled"


@attrs.define
class Env:
    daemon: Daemon
    sim: CursorSim
    root: Path


@pytest.fixture
async def env(daemon: Daemon, tmp_path: Path) -> AsyncIterator[Env]:
    root = tmp_path / "ws"
    root.mkdir()
    executor = WorkspaceExecutor(root, shell_timeout_cap_s=10.0)
    sim = CursorSim(daemon.base_url, daemon.client, executor=executor)
    yield Env(daemon, sim, root)
    await executor.aclose()


def turn(text: str, msg: str, conv: str = "conv-life", **kw: object) -> agent.AgentRunRequest:
    return user_turn(text, conversation_id=conv, model_id="byok-demo", message_id=msg, **kw)  # type: ignore[arg-type]


@attrs.define
class CancelAt:
    """on_frame hook: send cancel_action after the first frame ``when`` accepts; ``at`` is the
    number of frames received when the cancel went out."""

    when: Callable[[Recorded], bool]
    at: int | None = None

    def __call__(self, rec: Recorded, tr: Transcript) -> list[agent.AgentClientMessage]:
        if self.at is None and self.when(rec):
            self.at = len(tr.frames)
            return [cancel_message()]
        return []


def kind_is(kind: str) -> Callable[[Recorded], bool]:
    return lambda rec: rec.kind == kind


def assert_canceled(tr: Transcript, cancel: CancelAt) -> None:
    assert tr.error is not None and tr.error["code"] == CANCELED, tr.end_stream
    assert "interaction_update.turn_ended" not in tr.kinds()
    assert cancel.at is not None
    after = [f.kind for f in tr.frames[cancel.at :]]
    assert "conversation_checkpoint" not in after, "a checkpoint was published after the cancel"


def assert_checkpoints_reference_only_held(tr: Transcript, blobs: dict[bytes, bytes]) -> None:
    """Across runs: byok remembers which blobs the client ACKed earlier in the conversation, so
    a later run's checkpoints may reference them without a new SET; the client must hold them."""
    for state in tr.checkpoints():
        missing = referenced_blobs(state, blobs) - set(blobs)
        assert not missing, f"checkpoint references {len(missing)} blob(s) the client does not hold"


def head(d: Daemon, conv: str = "conv-life") -> tuple[Message, ...]:
    with SQLiteStore.open_in(d.data_dir) as store:
        return store.head(conv).messages


def dumps(messages: list[dict]) -> str:
    return json.dumps(messages, ensure_ascii=False)


# --- 1. cancel ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "trigger"),
    [
        (
            chat_text_script(["partial ", "answer"], reasoning=["thinking ", "more ", "still"], delay_s=0.15),
            "interaction_update.thinking_delta",
        ),
        (chat_text_script(["partial ", "answer ", "more"], delay_s=0.15), "interaction_update.text_delta"),
    ],
    ids=["thinking", "text"],
)
async def test_cancel_while_streaming(daemon: Daemon, script: Script, trigger: str) -> None:
    daemon.provider.enqueue(script, chat_text_script(["fresh answer"]))
    cancel = CancelAt(kind_is(trigger))
    tr = await daemon.sim.run("req-c1", turn("first question", "m1"), on_frame=cancel)
    assert_canceled(tr, cancel)
    assert "conversation_checkpoint" not in tr.kinds()
    assert (await wait_run_ended(daemon.data_dir, "req-c1")).status == CANCELED
    # The runtime user message stays committed; nothing of the cancelled answer is.
    (user,) = head(daemon)
    assert user.role == "user" and user.origin == "runtime" and "first question" in user.text

    tr2 = await daemon.sim.run("req-c2", turn("second question", "m2"))
    assert tr2.end_stream == {}
    assert tr2.kinds()[-4:] == TAIL
    assert tr2.text() == "fresh answer"
    assert (await wait_run_ended(daemon.data_dir, "req-c2")).status == "success"
    _, second = provider_histories(daemon.provider)
    assert "first question" in dumps(second) and "second question" in dumps(second)
    assert "partial" not in dumps(second)
    assert [m.role for m in head(daemon)] == ["user", "user", "assistant"]
    assert_history_invariants(daemon.provider)
    assert_store_has_no_duplicate(daemon.data_dir, "conv-life")


async def test_a_cancel_not_yet_handled_at_the_ok_end_stream_does_not_rewrite_the_outcome(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 7: the terminal state is written once and agrees with the EndStream the client
    got. A cancel append that landed while the turn was ending, but that the run had not handled
    when its ok end-stream was queued (trio ran the run's last step first), is late: the run is
    recorded as the success the client saw, not as canceled. (The fault-injection loop hit this
    about once in 3,000 runs.)"""
    close = RunSlot.close

    delivered: list[bool] = []

    def cancel_pending_at_close(slot: RunSlot, outcome: Outcome) -> None:
        if outcome == Succeeded():
            slot.deliver(cancel_message())  # in the run's inbox, not handled yet
            delivered.append(True)
        close(slot, outcome)

    monkeypatch.setattr(RunSlot, "close", cancel_pending_at_close)
    daemon.provider.enqueue(chat_text_script(["done"]))
    tr = await daemon.sim.run("req-late-cancel", turn("question", "m1"))
    assert delivered == [True]
    assert tr.end_stream == {} and tr.kinds()[-4:] == TAIL
    assert (await wait_run_ended(daemon.data_dir, "req-late-cancel")).status == "success"


async def test_cancel_during_running_shell_aborts_the_exec(env: Env) -> None:
    d = env.daemon
    command = json.dumps({"command": "echo started; sleep 5"})
    d.provider.enqueue(
        chat_tool_script([("call_sh", "Shell", command)]),
        chat_text_script(["after cancel"]),
    )

    def shell_running(rec: Recorded) -> bool:
        delta = rec.message.interaction_update
        return (
            rec.kind == "interaction_update.shell_output_delta"
            and delta.shell_output_delta.stdout is not None
            and "started" in delta.shell_output_delta.stdout.data
        )

    cancel = CancelAt(shell_running)
    with trio.fail_after(3):
        tr = await env.sim.run("req-sh1", turn("run a long command", "m1"), on_frame=cancel)
    assert_canceled(tr, cancel)
    (shell,) = tr.execs
    assert shell.kind == "shell_stream_args" and shell.exec_id == "call_sh"
    aborts = [
        f.message.exec_server_control_message.abort.id
        for f in tr.frames[cancel.at :]
        if f.kind == "exec_server_control_message.abort"
    ]
    assert aborts == [shell.id] and shell.aborted
    # Before the cancel: exactly the staged checkpoint of the round.
    (staged,) = tr.checkpoints()
    assert len(staged.pending_tool_calls) == 1
    assert (await wait_run_ended(d.data_dir, "req-sh1")).status == CANCELED
    # Committed: the runtime message and the assistant's call; no result for it.
    user, assistant = head(d)
    assert user.origin == "runtime" and [c.call_id for c in assistant.tool_calls] == ["call_sh"]

    tr2 = await env.sim.run("req-sh2", turn("never mind", "m2"))
    assert tr2.end_stream == {} and tr2.text() == "after cancel"
    _, second = provider_histories(d.provider)
    assert "call_sh" not in dumps(second), "the cancelled round reached the provider"
    assert "run a long command" in dumps(second)
    assert_history_invariants(d.provider)
    assert_store_has_no_duplicate(d.data_dir, "conv-life")


# --- 2. preemption --------------------------------------------------------------------------


async def test_preemption_during_tool_round_ignores_the_late_result(env: Env) -> None:
    d = env.daemon
    (env.root / "x.txt").write_text("x content\n")
    # Run A's Read is never answered by the simulator itself (the test answers it, too late).
    env.sim.on_exec = lambda m: [] if m.exec_id == "call_a" else None
    d.provider.enqueue(
        chat_tool_script([("call_a", "Read", '{"path": "x.txt"}')]),
        chat_text_script(["B ", "answers"], delay_s=0.1),
    )
    exec_sent, b_streaming = trio.Event(), trio.Event()
    a: dict[str, Transcript] = {}
    late_status: list[int] = []

    def on_a(rec: Recorded, tr: Transcript) -> list[agent.AgentClientMessage]:
        a["live"] = tr
        if rec.kind == "exec_server_message.read_args":
            exec_sent.set()
        return []

    def on_b(rec: Recorded, tr: Transcript) -> list[agent.AgentClientMessage]:
        if rec.kind == "interaction_update.text_delta":
            b_streaming.set()
        return []

    async def run_a() -> None:
        a["done"] = await env.sim.run("req-A", turn("task A", "mA"), on_frame=on_a)

    async def late_result() -> None:
        await b_streaming.wait()
        tr_a = a["live"]
        (rec,) = tr_a.execs
        read = agent.ReadResult(success=agent.ReadSuccess(path="x.txt", content="x content\n", total_lines=1))
        msg = agent.ExecServerMessage(id=rec.id, exec_id=rec.exec_id)
        seq = len(tr_a.appends)
        for i, late in enumerate([exec_result(msg, read_result=read), stream_close(rec.id)]):
            late_status.append((await env.sim.append("req-A", seq + i, late)).status_code)

    with trio.fail_after(3):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_a)
            await exec_sent.wait()
            nursery.start_soon(late_result)
            tr_b = await env.sim.run("req-B", turn("task B", "mB"), on_frame=on_b)

    tr_a = a["done"]
    assert tr_a.error is not None and tr_a.error["code"] == CANCELED
    assert "interaction_update.turn_ended" not in tr_a.kinds()
    (rec,) = tr_a.execs
    assert rec.aborted  # abort for the running exec went out before EndStream
    assert tr_a.kinds()[-1] == "exec_server_control_message.abort"
    assert tr_b.end_stream == {} and tr_b.text() == "B answers"
    assert tr_b.kinds()[-4:] == TAIL
    assert late_status == [200, 200]  # a finished run's appends are dropped idempotently
    assert (await wait_run_ended(d.data_dir, "req-A")).status == CANCELED
    assert (await wait_run_ended(d.data_dir, "req-B")).status == "success"

    _, second = provider_histories(d.provider)
    assert "call_a" not in dumps(second) and "x content" not in dumps(second)
    assert "task A" in dumps(second) and "task B" in dumps(second)
    # B's history = A's committed prefix (runtime message, unfinished call) + B's messages.
    msgs = head(d)
    assert [m.role for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert "task A" in msgs[0].text and msgs[1].tool_calls[0].call_id == "call_a"
    assert "task B" in msgs[2].text and msgs[3].text == "B answers"
    assert not any(m.role == "tool" for m in msgs)
    assert_history_invariants(d.provider)
    assert_store_has_no_duplicate(d.data_dir, "conv-life")


# --- 3. resume ------------------------------------------------------------------------------


async def test_resume_of_a_staged_round_reruns_tools_without_the_provider(env: Env) -> None:
    d = env.daemon
    (env.root / "notes.txt").write_text("resume me\n")
    env.sim.on_exec = lambda m: []  # run 1: the client never answers
    d.provider.enqueue(chat_tool_script([("call_r", "Read", '{"path": "notes.txt"}')]))
    cancel = CancelAt(lambda rec: rec.kind == "conversation_checkpoint"
                      and bool(rec.message.conversation_checkpoint_update.pending_tool_calls))  # fmt: skip
    tr1 = await env.sim.run("req-r1", turn("read the notes", "m1"), on_frame=cancel)
    assert_canceled(tr1, cancel)
    assert tr1.execs[0].aborted
    (staged,) = tr1.checkpoints()
    assert len(staged.pending_tool_calls) == 1
    assert (await wait_run_ended(d.data_dir, "req-r1")).status == CANCELED
    assert len(d.provider.requests) == 1

    env.sim.on_exec = None  # run 2: the workspace answers
    d.provider.enqueue(chat_text_script(["The notes say resume me."]))
    tr2 = await env.sim.run("req-r2", resume_request(staged, conversation_id="conv-life"))
    assert tr2.end_stream == {}, tr2.end_stream
    assert tr2.kinds()[-4:] == TAIL
    assert [e.exec_id for e in tr2.execs] == ["call_r"]  # the tool ran again...
    assert len(d.provider.requests) == 2  # ...without a provider call for it
    settled = tr2.checkpoints()[0]
    assert settled.pending_tool_calls == []
    # The only new call came after the round settled: it already carries the re-run's result.
    _, second = provider_histories(d.provider)
    assert second[-2]["tool_calls"][0]["id"] == "call_r"
    assert second[-1]["tool_call_id"] == "call_r" and "resume me" in second[-1]["content"]
    assert (await wait_run_ended(d.data_dir, "req-r2")).status == "success"
    # No new runtime message: the resumed turn is the client's turn, continued.
    assert [m.role for m in head(d)] == ["user", "assistant", "tool", "assistant"]
    final = tr2.checkpoints()[-1]
    assert len(final.turns) == 1
    structure = agent.ConversationTurnStructure.parse(env.sim.blobs[final.turns[0]]).agent_conversation_turn
    user = agent.UserMessage.parse(env.sim.blobs[structure.user_message])
    assert user.text == "read the notes" and user.message_id == "m1"
    assert_checkpoints_reference_only_held(tr2, env.sim.blobs)
    assert_history_invariants(d.provider)
    assert_store_has_no_duplicate(d.data_dir, "conv-life")


async def test_resume_of_a_partly_answered_round_runs_every_call_once_more(env: Env) -> None:
    d = env.daemon
    (env.root / "a.txt").write_text("A\n")
    (env.root / "b.txt").write_text("B\n")
    env.sim.on_exec = lambda m: [] if m.exec_id == "c2" else None  # run 1: only c1 is answered
    d.provider.enqueue(
        chat_tool_script([("c1", "Read", '{"path": "a.txt"}'), ("c2", "Read", '{"path": "b.txt"}')])
    )
    cancel = CancelAt(kind_is("interaction_update.tool_call_completed"))
    tr1 = await env.sim.run("req-p1", turn("read both", "m1"), on_frame=cancel)
    assert_canceled(tr1, cancel)
    assert [m.role for m in head(d)] == ["user", "assistant", "tool"]  # c1's result is committed
    (staged,) = tr1.checkpoints()

    env.sim.on_exec = None
    d.provider.enqueue(chat_text_script(["both read"]))
    tr2 = await env.sim.run("req-p2", resume_request(staged, conversation_id="conv-life"))
    assert tr2.end_stream == {} and tr2.kinds()[-4:] == TAIL
    assert sorted(e.exec_id for e in tr2.execs) == ["c1", "c2"]
    assert len(d.provider.requests) == 2
    _, second = provider_histories(d.provider)
    assert sorted(m["tool_call_id"] for m in second if m["role"] == "tool") == ["c1", "c2"]
    # The head moved back to the staged point first: one result per call, not two for c1.
    assert [m.role for m in head(d)] == ["user", "assistant", "tool", "tool", "assistant"]
    assert_history_invariants(d.provider)
    assert_store_has_no_duplicate(d.data_dir, "conv-life")


async def test_resume_of_a_settled_checkpoint_calls_the_provider_once(env: Env) -> None:
    d = env.daemon
    (env.root / "notes.txt").write_text("settled\n")
    d.provider.enqueue(
        chat_tool_script([("call_s", "Read", '{"path": "notes.txt"}')]),
        chat_text_script(["never ", "finished ", "answer"], delay_s=0.2),
    )
    cancel = CancelAt(kind_is("interaction_update.text_delta"))
    tr1 = await env.sim.run("req-s1", turn("read then answer", "m1"), on_frame=cancel)
    assert_canceled(tr1, cancel)
    staged, settled = tr1.checkpoints()
    assert staged.pending_tool_calls and not settled.pending_tool_calls
    assert (await wait_run_ended(d.data_dir, "req-s1")).status == CANCELED

    d.provider.enqueue(chat_text_script(["finished after resume"]))
    tr2 = await env.sim.run("req-s2", resume_request(settled, conversation_id="conv-life"))
    assert tr2.end_stream == {} and tr2.text() == "finished after resume"
    assert tr2.kinds()[-4:] == TAIL
    assert tr2.execs == []  # a settled round is not run again
    assert len(d.provider.requests) == 3
    _, cancelled_call, resumed_call = provider_histories(d.provider)
    assert resumed_call == cancelled_call  # the same committed history, nothing of the cancelled answer
    assert (await wait_run_ended(d.data_dir, "req-s2")).status == "success"
    msgs = head(d)
    assert [m.role for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert msgs[-1].text == "finished after resume"
    assert_history_invariants(d.provider)
    assert_store_has_no_duplicate(d.data_dir, "conv-life")


# --- 4. edits -------------------------------------------------------------------------------


async def test_edit_of_the_second_of_three_messages_branches(daemon: Daemon) -> None:
    d = daemon
    trs = []
    for n, (text, mid) in enumerate([("one", "m1"), ("two", "m2"), ("three", "m3")]):
        d.provider.enqueue(chat_text_script([f"answer {text}"]))
        trs.append(await d.sim.run(f"req-{n}", turn(f"question {text}", mid)))
        assert trs[-1].end_stream == {}
    assert_history_invariants(d.provider)

    d.provider.enqueue(chat_text_script(["answer two edited"]))
    tr = await d.sim.run("req-edit", turn("question two edited", "m2"))
    assert tr.end_stream == {} and tr.kinds()[-4:] == TAIL
    histories = provider_histories(d.provider)
    before_m2, edited = histories[1], histories[3]
    # Exactly the prefix before m2 (system, m1, its answer), then the new message.
    assert len(edited) == 4
    assert edited[:3] == before_m2[:3]
    assert edited[3]["role"] == "user" and "question two edited" in edited[3]["content"]
    assert not any("question two" in json.dumps(m) for m in edited[:3])
    assert not any(m["content"] == "answer two" for m in edited) and "three" not in dumps(edited)
    assert_history_invariants(d.provider, prefix=False)

    settled = tr.checkpoints()[-1]
    users = []
    for turn_id in settled.turns:
        structure = agent.ConversationTurnStructure.parse(d.sim.blobs[turn_id]).agent_conversation_turn
        user = agent.UserMessage.parse(d.sim.blobs[structure.user_message])
        users.append((user.message_id, user.text))
    assert users == [("m1", "question one"), ("m2", "question two edited")]
    assert settled.turns[0] == trs[0].checkpoints()[-1].turns[0]
    assert len(settled.root_prompt_messages_json) == 5  # system, m1, answer, m2', answer
    msgs = head(d)
    assert [m.text for m in msgs if m.role == "assistant"] == ["answer one", "answer two edited"]
    assert_store_has_no_duplicate(d.data_dir, "conv-life")
    assert (await wait_run_ended(d.data_dir, "req-edit")).status == "success"


async def test_failed_run_then_same_message_id_is_not_sent_twice(daemon: Daemon) -> None:
    """CLARIFICATIONS §4: the retry of a failed message branches from the revision before it."""
    d = daemon
    d.provider.enqueue(error_script(400, "bad request"), chat_text_script(["second try works"]))
    tr1 = await d.sim.run("req-f1", turn("please answer", "m1"))
    assert tr1.error is not None and tr1.error["code"] == "unavailable"
    assert (await wait_run_ended(d.data_dir, "req-f1")).status == "error"
    assert [m.role for m in head(d)] == ["user"]

    tr2 = await d.sim.run("req-f2", turn("please answer", "m1"))
    assert tr2.end_stream == {} and tr2.text() == "second try works"
    _, retry = provider_histories(d.provider)
    assert [m["role"] for m in retry] == ["system", "user"]
    assert sum("please answer" in json.dumps(m) for m in retry) == 1
    assert [m.role for m in head(d)] == ["user", "assistant"]
    assert_history_invariants(d.provider, prefix=False)
    assert_store_has_no_duplicate(d.data_dir, "conv-life")


async def test_a_reused_request_id_is_refused_and_changes_nothing(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Request ids are single-use: the same id after a restart gets already_exists, writes no
    second runtime message and no run row, and the daemon goes on serving."""
    async with start_daemon(tmp_path, nursery) as d1:
        d1.provider.enqueue(chat_text_script(["first"]))
        assert (await d1.sim.run("req-once", turn("hello", "m1"))).end_stream == {}
        first = await wait_run_ended(d1.data_dir, "req-once")
    async with start_daemon(tmp_path, nursery) as d2:
        again = await d2.sim.run("req-once", turn("hello", "m1"))
        assert again.error is not None and again.error["code"] == "already_exists"
        assert again.frames == []
        d2.provider.enqueue(chat_text_script(["second"]))
        assert (await d2.sim.run("req-two", turn("and now?", "m2"))).text() == "second"
        assert (await wait_run_ended(d2.data_dir, "req-two")).status == "success"
        assert [(m.role, m.event_id) for m in head(d2) if m.role == "user"] == [
            ("user", "run-request:req-once"),
            ("user", "run-request:req-two"),
        ]
        assert_store_has_no_duplicate(d2.data_dir, "conv-life")
        with SQLiteStore.open_in(d2.data_dir) as store:
            assert store.run("req-once") == first


# --- 5. RunSSE drop and reconnect -----------------------------------------------------------


def first_text(rec: Recorded, tr: Transcript) -> bool:
    return rec.kind == "interaction_update.text_delta"


async def test_runsse_reconnect_within_the_grace_continues_the_run(daemon: Daemon) -> None:
    d = daemon
    d.provider.enqueue(chat_text_script(["one ", "two ", "three"], delay_s=0.15))
    driver = RunDriver(d.sim, "req-rc")
    tr1, tr2 = Transcript(), Transcript()
    with trio.fail_after(3):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(driver.stream, tr1, until=first_text))
            (await driver.start(turn("count", "m1"))).raise_for_status()
        # The first RunSSE is gone mid-run. Bidi keeps working: a heartbeat is accepted and
        # answered into the slot.
        assert tr1.end_stream is None and tr1.text() == "one "
        await trio.sleep(0.05)
        assert (await driver.send(heartbeat_message())).status_code == 200
        await driver.stream(tr2)
    assert tr2.end_stream == {}
    assert tr2.text() == "two three"  # from where the new stream starts; no replay
    kinds = tr2.kinds(skip=())
    assert "interaction_update.heartbeat" in kinds[: kinds.index("interaction_update.text_delta")]
    assert kinds[-4:] == TAIL
    assert_checkpoints_reference_only_acked(tr2, d.sim.blobs)
    assert (await wait_run_ended(d.data_dir, "req-rc")).status == "success"
    assert [m.text for m in head(d) if m.role == "assistant"] == ["one two three"]


async def test_runsse_gone_beyond_the_grace_cancels_the_run(tmp_path: Path, nursery: trio.Nursery) -> None:
    async with live_daemon(tmp_path, nursery, server="reconnect_grace_s = 0.3") as d:
        d.provider.enqueue(chat_text_script([f"w{i} " for i in range(10)], delay_s=0.2))
        driver = RunDriver(d.sim, "req-gone")
        tr1 = Transcript()
        with trio.fail_after(3):
            async with trio.open_nursery() as inner:
                await inner.start(partial(driver.stream, tr1, until=first_text))
                (await driver.start(turn("talk slowly", "m1"))).raise_for_status()
            dropped = trio.current_time()
            run = await wait_run_ended(d.data_dir, "req-gone")
            waited = trio.current_time() - dropped
            assert run.status == CANCELED
            assert 0.25 <= waited < 1.5
            # A reconnect after the grace only finds the cancelled end of the stream.
            late = Transcript()
            await driver.stream(late)
        assert late.error is not None and late.error["code"] == CANCELED
        assert "interaction_update.turn_ended" not in late.kinds()
        assert "conversation_checkpoint" not in late.kinds()
        with SQLiteStore.open_in(d.data_dir) as store:
            assert [m.role for m in store.head("conv-life").messages] == ["user"]


# --- 6. background task completion ----------------------------------------------------------


async def test_background_completion_appends_once(daemon: Daemon) -> None:
    d = daemon
    done = agent.BackgroundTaskCompletion(
        task_id="sub-1",
        kind=agent.BackgroundTaskKind.SUBAGENT,
        status=agent.BackgroundTaskStatus.SUCCESS,
        title="Refactor parser",
        detail="Parser refactored.",
        reason=agent.BackgroundTaskCompletionReason.TASK_FINISHED,
    )
    d.provider.enqueue(
        chat_text_script(["started a subagent"]),
        chat_text_script(["the subagent is done"]),
    )
    assert (await d.sim.run("req-u", turn("delegate", "m1"))).end_stream == {}
    tr1 = await d.sim.run("req-bg1", background_request([done], conversation_id="conv-life"))
    assert tr1.end_stream == {} and tr1.kinds()[-4:] == TAIL
    # The client sends the completion again: the answered turn's checkpoints, no second answer.
    tr2 = await d.sim.run("req-bg2", background_request([done], conversation_id="conv-life"))
    assert tr2.end_stream == {} and tr2.kinds()[-4:] == TAIL and tr2.text() == ""

    _, first = provider_histories(d.provider)
    assert first[-1]["role"] == "user"
    assert 'subagent_completion id="sub-1"' in first[-1]["content"]
    assert "Parser refactored." in first[-1]["content"]
    msgs = head(d)
    assert sum(m.event_id == "subagent-completed:sub-1" for m in msgs) == 1
    assert [m.role for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert_history_invariants(d.provider)
    assert_store_has_no_duplicate(d.data_dir, "conv-life")
    for rid in ("req-bg1", "req-bg2"):
        assert (await wait_run_ended(d.data_dir, rid)).status == "success"


# --- 7. import of a conversation byok has never seen ----------------------------------------


def put_roots(sim: CursorSim, *messages: Message) -> list[bytes]:
    ids = []
    for m in messages:
        data = encode_root(m)
        blob_id = hashlib.sha256(data).digest()
        sim.blobs[blob_id] = data
        ids.append(blob_id)
    return ids


IMPORTED = (
    Message(role="system", origin="runtime", text="OLD SYSTEM PROMPT"),
    Message(role="user", origin="user", text="imported question"),
    Message(role="assistant", origin="assistant", text="imported answer"),
)


async def test_import_of_an_unknown_conversation(daemon: Daemon) -> None:
    d = daemon
    ids = put_roots(d.sim, *IMPORTED)
    state = agent.ConversationStateStructure(root_prompt_messages_json=ids)
    d.provider.enqueue(chat_text_script(["continuing"]))
    tr = await d.sim.run("req-imp", turn("follow up", "m-new", conv="conv-imp", state=state))
    assert tr.end_stream == {} and tr.kinds()[-4:] == TAIL
    gets = {f.message.kv_server_message.get_blob_args.blob_id for f in tr.frames
            if f.kind == "kv_server_message.get_blob_args"}  # fmt: skip
    assert gets == set(ids)
    (req,) = provider_histories(d.provider)
    assert [m["role"] for m in req] == ["system", "user", "assistant", "user"]
    assert "OLD SYSTEM PROMPT" not in dumps(req)  # byok's system prompt replaces the client's
    assert req[1]["content"] == "imported question"
    assert req[2]["content"] == "imported answer"
    assert "follow up" in req[3]["content"]
    msgs = head(d, "conv-imp")
    assert [m.text for m in msgs[:2]] == ["imported question", "imported answer"]
    assert [m.role for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert (await wait_run_ended(d.data_dir, "req-imp")).status == "success"


# Roots as another server writes them: AI-SDK JSON without byok's providerOptions.
FOREIGN = (
    {"role": "system", "content": "OLD SYSTEM PROMPT"},
    {"role": "user", "content": [{"type": "text", "text": "foreign question"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "foreign answer"}]},
)


def put_foreign_roots(sim: CursorSim) -> list[bytes]:
    ids = []
    for obj in FOREIGN:
        data = json.dumps(obj).encode()
        blob_id = hashlib.sha256(data).digest()
        sim.blobs[blob_id] = data
        ids.append(blob_id)
    return ids


async def test_import_of_a_conversation_started_on_another_server(daemon: Daemon) -> None:
    d = daemon
    state = agent.ConversationStateStructure(root_prompt_messages_json=put_foreign_roots(d.sim))
    d.provider.enqueue(chat_text_script(["continuing"]))
    tr = await d.sim.run("req-for", turn("follow up", "m-new", conv="conv-imp", state=state))
    assert tr.end_stream == {} and tr.kinds()[-4:] == TAIL
    (req,) = provider_histories(d.provider)
    assert [(m["role"], m["content"]) for m in req[1:3]] == [
        ("user", "foreign question"),
        ("assistant", "foreign answer"),
    ]
    assert "OLD SYSTEM PROMPT" not in dumps(req)


async def test_resume_of_a_conversation_started_on_another_server(daemon: Daemon) -> None:
    d = daemon
    state = agent.ConversationStateStructure(root_prompt_messages_json=put_foreign_roots(d.sim))
    tr = await d.sim.run("req-fres", resume_request(state, conversation_id="conv-imp"))
    assert tr.end_stream == {}, tr.end_stream
    # The imported history already ends with the answer: the resume only republishes the
    # final checkpoints, it does not ask the model again.
    assert provider_histories(d.provider) == []
    final = tr.checkpoints()[-1]
    roles = [json.loads(d.sim.blobs[r])["role"] for r in final.root_prompt_messages_json]
    assert roles == ["system", "user", "assistant"]
    with SQLiteStore.open_in(d.data_dir) as store:
        assert [m.role for m in store.head("conv-imp").messages] == ["user", "assistant"]


@pytest.mark.parametrize("fault", ["missing", "empty"])
async def test_import_fails_closed_on_a_missing_blob(daemon: Daemon, fault: str) -> None:
    d = daemon
    ids = put_roots(d.sim, *IMPORTED)
    gone = hashlib.sha256(b"a blob the client lost").digest()
    if fault == "empty":
        d.sim.blobs[gone] = b""
    state = agent.ConversationStateStructure(root_prompt_messages_json=[*ids[:2], gone, ids[2]])
    tr = await d.sim.run("req-imp", turn("follow up", "m-new", conv="conv-imp", state=state))
    assert tr.error is not None and tr.error["code"] == "failed_precondition", tr.end_stream
    assert "cannot load the conversation" in tr.error["message"]
    assert gone.hex() in tr.error["message"]
    assert "interaction_update.turn_ended" not in tr.kinds()
    assert d.provider.requests == []
    with SQLiteStore.open_in(d.data_dir) as store:
        h = store.head("conv-imp")
        assert h.version == 0 and h.messages == ()
    assert (await wait_run_ended(d.data_dir, "req-imp")).status == "error"


# --- 8. graceful shutdown -------------------------------------------------------------------


async def test_shutdown_cancels_runs_after_the_grace(tmp_path: Path, nursery: trio.Nursery) -> None:
    async with live_daemon(tmp_path, nursery, server="shutdown_grace_s = 0.3") as d:
        d.provider.enqueue(chat_text_script([f"w{i} " for i in range(10)], delay_s=0.2))
        streaming = trio.Event()
        result: dict[str, Transcript] = {}

        def on_frame(rec: Recorded, tr: Transcript) -> list[agent.AgentClientMessage]:
            if rec.kind == "interaction_update.text_delta":
                streaming.set()
            return []

        async def slow_run() -> None:
            result["tr"] = await d.sim.run("req-slow", turn("talk slowly", "m1"), on_frame=on_frame)

        with trio.fail_after(3):
            async with trio.open_nursery() as inner:
                inner.start_soon(slow_run)
                await streaming.wait()
                stopped_at = trio.current_time()
                d.stop()
                await trio.sleep(0.05)
                # New runs are refused while the active one gets its grace.
                late = RunDriver(d.sim, "req-late")
                resp = await late.start(turn("too late", "m2", conv="conv-other"))
                assert resp.status_code == 503 and resp.json()["code"] == "unavailable"
            ended_after = trio.current_time() - stopped_at
            await d.stopped.wait()
        tr = result["tr"]
        assert tr.error is not None and tr.error["code"] == CANCELED
        assert "interaction_update.turn_ended" not in tr.kinds()
        assert 0.25 <= ended_after < 1.5
        with SQLiteStore.open_in(d.data_dir) as store:
            run = store.run("req-slow")
            assert run is not None and run.status == CANCELED
            assert store.run("req-late") is None
            assert [m.role for m in store.head("conv-life").messages] == ["user"]
            assert store.head("conv-other").version == 0


async def test_shutdown_lets_a_run_finish_within_the_grace(tmp_path: Path, nursery: trio.Nursery) -> None:
    """A run that ends within shutdown_grace_s must still reach the client: its tail (turn_ended,
    checkpoints, EndStream {}) is queued for a RunSSE that a slow client has not drained yet.

    Made deterministic with a client that does not read its RunSSE while the run works (the
    reply is several MB, so the daemon's writes block on the socket) and answers the KV SETs
    blind by kv id (they are numbered from 0 per run)."""
    async with live_daemon(tmp_path, nursery, server="shutdown_grace_s = 5") as d:
        piece = "y" * 100_000
        d.provider.enqueue(chat_text_script([piece] * 60))
        driver = RunDriver(d.sim, "req-fin")
        tr = Transcript()
        body = encode_frame(bytes(aiserver.BidiRequestId(request_id="req-fin")))
        with trio.fail_after(10):
            async with d.client.stream(
                "POST", d.base_url + RUN_SSE, content=body,
                headers={"content-type": "application/connect+proto", "connect-protocol-version": "1"},
            ) as resp:  # fmt: skip
                (await driver.start(turn("a long answer please", "m1"))).raise_for_status()
                with SQLiteStore.open_in(d.data_dir) as store:
                    while not [c for c in store.llm_calls("req-fin") if c.status == "ok"]:
                        await trio.sleep(0.02)
                await trio.sleep(0.1)  # the run now waits for the ACKs of its final blobs
                d.stop()
                for kv_id in range(16):  # more than the run's SETs; unknown ids are ignored
                    ack = agent.KvClientMessage(id=kv_id, set_blob_result=agent.SetBlobResult())
                    try:
                        await driver.send(agent.AgentClientMessage(kv_client_message=ack))
                    except httpx.HTTPError:
                        break  # the run ended and the daemon already went away
                run = await wait_run_ended(d.data_dir, "req-fin")
                assert run.status == "success"  # the run finished within the grace
                decoder = FrameDecoder()
                try:
                    async for chunk in resp.aiter_bytes():
                        for frame in decoder.feed(chunk):
                            if frame.end_stream:
                                tr.end_stream = json.loads(frame.payload)
                                break
                            msg = agent.AgentServerMessage.parse(frame.payload)
                            tr.frames.append(Recorded(msg, frame_kind(msg), frozenset()))
                except httpx.HTTPError:
                    pass  # the daemon cut the stream
            await d.stopped.wait()
        assert tr.end_stream == {}, "the finished run's stream was cut before its end"
        assert len(tr.text()) == 60 * len(piece)
        assert tr.kinds()[-4:] == TAIL
