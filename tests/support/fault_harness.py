"""The fault injection's harness (tests/integration/test_fault_injection.py): the provider with
its faults, one request id driven by hand (appends, RunSSE streams, KV and Exec answers), the
daemon restartable on its data dir, and what a run is expected to end with."""

from __future__ import annotations

import itertools
import json
import sqlite3
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import attrs
import httpx
import pytest
import trio

from byok.config import Config
from byok.daemon import run_daemon
from byok.devtools.cursor_sim import RUN_SSE, CursorSim, frame_kind, user_turn
from byok.devtools.exec_client import stream_close
from byok.devtools.sim_mcp import SimMcp
from byok.devtools.workspace_exec import WorkspaceExecutor
from byok.http.connect_envelope import FrameDecoder, encode_frame
from byok.model.messages import Message
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from byok.store import SQLiteStore
from tests.support.fake_provider import (
    FakeProvider,
    Script,
    chat_text_script,
)
from tests.support.fault_interactions import Asking
from tests.support.fault_kinds import kind_of
from tests.support.store_faults import before_each_write

OK = "ok"  # the expected-outcome name of EndStream {}
GRACE_S = 0.25  # the loop daemon's reconnect_grace_s
MAX_TRIES = 3  # its provider_max_tries


def outcome(end: dict[str, Any]) -> str:
    return OK if end == {} else str(end.get("error", {}).get("code", end))


# --- the provider ------------------------------------------------------------------------------


@attrs.define
class SlowScript(Script):
    headers_delay_s: float = 0.0


class FaultProvider(FakeProvider):
    """FakeProvider plus slow response headers, and a note of requests that found no script
    (a cancelled run's request that reached the server after the run ended)."""

    def __init__(self) -> None:
        super().__init__()
        self.unscripted: set[int] = set()

    async def _respond(self, conn: Any, stream: trio.SocketStream, script: Script) -> bool:
        if isinstance(script, SlowScript) and script.headers_delay_s:
            await trio.sleep(script.headers_delay_s)
        if script.chunks and b"no script enqueued" in script.chunks[0]:
            self.unscripted.add(len(self.requests) - 1)
        return await super()._respond(conn, stream, script)

    async def requested_since(self, seen: int) -> None:
        """Wait until a request beyond the first ``seen`` has arrived (5 s at most)."""
        with trio.fail_after(5):
            while len(self.requests) == seen:
                await trio.sleep(0.002)


def text_script(texts: list[str], *, delay_s: float = 0.0) -> Script:
    return chat_text_script(texts, delay_s=delay_s)


# --- one request id, driven by hand --------------------------------------------------------------


@attrs.define(eq=False)
class Client:
    """One request id: posts appends (optionally twice, optionally out of order), opens and drops
    RunSSE streams, answers KV and Execs according to the run's plan."""

    h: Harness
    rid: str
    dup: bool = False
    reorder: bool = False
    kv: str = "ack"  # "ack" | "missing" | "fail"
    exec_delay: float = 0.0
    late_duplicates: bool = False
    asking: Asking | None = None  # how its InteractionQueries are answered (None: never)
    seq: int = 0
    terminals: list[dict[str, Any]] = attrs.Factory(list)
    kinds: list[str] = attrs.Factory(list)
    eof_without_terminal: int = 0
    # What each RunSSE did, for failure messages: "open@0.012 drop(2 frames)@0.040 ...".
    history: list[str] = attrs.Factory(list)
    born: float = attrs.Factory(trio.current_time)
    append_errors: list[str] = attrs.Factory(list)
    lock: trio.Lock = attrs.Factory(trio.Lock)
    acked: set[bytes] = attrs.Factory(set)
    executor: WorkspaceExecutor | None = None  # its own: exec ids are numbered per request
    mcp: SimMcp | None = None  # the MCP server its client hosts, if any
    conv: str = ""  # the conversation, set when the request is driven
    message_id: str = ""  # its user message's, set when the request is driven
    # The daemon may stop during this run: an append it can no longer take is not an error.
    server_may_stop: bool = False
    headers: dict[str, str] = attrs.Factory(dict)  # sent with every append (a child's x-parent-*)
    # Answers the run's subagent_args Execs (tests/support/fault_subagents.py); its abort
    # stops the child (``on_abort``, by exec id).
    subagents: Subagents | None = None
    # The daemon this request runs on, even when the harness restarts it meanwhile.
    sim: CursorSim = attrs.field(init=False)
    base_url: str = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.sim, self.base_url = self.h.sim, self.h.base_url

    def workspace(self) -> WorkspaceExecutor:
        if self.executor is None:
            self.executor = WorkspaceExecutor(self.h.root, shell_timeout_cap_s=2.0, mcp=self.mcp)
        return self.executor

    async def _post(self, seqno: int, msg: agent.AgentClientMessage) -> None:
        try:
            resp = await self.sim.append(self.rid, seqno, msg, self.headers)
        except httpx.TransportError as e:
            if not self.server_may_stop:
                raise
            self._note(f"append {seqno} found the daemon gone ({type(e).__name__})")
            return
        if resp.status_code != 200:
            self.append_errors.append(f"append {seqno} -> HTTP {resp.status_code} {resp.text[:200]}")

    async def start(self, run_request: agent.AgentRunRequest) -> None:
        msg = agent.AgentClientMessage(run_request=run_request)
        async with self.lock:
            assert self.seq == 0
            if self.reorder:
                await self._post(1, _heartbeat())  # seqno 1 before seqno 0: buffered
                await self._post(0, msg)
                self.seq = 2
            else:
                await self._post(0, msg)
                self.seq = 1
            if self.dup:
                await self._post(0, msg)

    async def send(self, msg: agent.AgentClientMessage) -> None:
        async with self.lock:
            s = self.seq
            if self.reorder:
                self.seq += 2
                await self._post(s + 1, _heartbeat())
            else:
                self.seq += 1
            await self._post(s, msg)
            if self.dup:
                await self._post(s, msg)

    async def stream(
        self,
        execs: trio.Nursery,
        *,
        drop_after: int | None = None,
        drop_from: str | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> bool:
        """Read one RunSSE to its end; True when it ended with a terminal frame. With
        ``drop_after`` the connection is closed after that many non-heartbeat frames, counted
        from the first frame of kind ``drop_from`` when given."""
        body = encode_frame(bytes(aiserver.BidiRequestId(request_id=self.rid)))
        seen = 0
        counted = 0
        ended = False
        self._note("open")
        async with self.h.client.stream(
            "POST",
            self.base_url + RUN_SSE,
            content=body,
            headers={"content-type": "application/connect+proto", "connect-protocol-version": "1"},
        ) as resp:
            task_status.started()
            decoder = FrameDecoder()
            async for chunk in resp.aiter_bytes():
                for frame in decoder.feed(chunk):  # ProtocolError on anything after the end frame
                    if frame.end_stream:
                        self.terminals.append(json.loads(frame.payload))
                        ended = True
                        self._note(f"end({seen} frames)")
                        continue
                    msg = agent.AgentServerMessage.parse(frame.payload)
                    kind = frame_kind(msg)
                    if kind == "interaction_update.heartbeat":
                        continue
                    self.kinds.append(kind)
                    seen += 1
                    if counted or drop_from in (None, kind):
                        counted += 1
                    await self._handle(msg, execs)
                    if drop_after is not None and counted >= drop_after and not ended:
                        self._note(f"drop({seen} frames)")
                        return False  # leaving the context closes the connection mid-stream
            decoder.end()
        if not ended:
            self.eof_without_terminal += 1
            self._note(f"eof-without-end({seen} frames)")
        return ended

    def _note(self, what: str) -> None:
        self.history.append(f"{what}@{trio.current_time() - self.born:.3f}")

    async def _handle(self, msg: agent.AgentServerMessage, execs: trio.Nursery) -> None:
        if msg.conversation_checkpoint_update is not None:
            self.h.states[self.conv] = msg.conversation_checkpoint_update
        kv = msg.kv_server_message
        if kv is not None:
            await self._kv(kv)
        if (ex := msg.exec_server_message) is not None:
            execs.start_soon(self._exec, ex)
        if (query := msg.interaction_query) is not None and self.asking is not None:
            execs.start_soon(self.asking.answer, query, self.send)
        control = msg.exec_server_control_message
        if control is not None and control.abort is not None:
            self.workspace().abort(control.abort.id)
            if self.subagents is not None:
                self.subagents.on_abort(control.abort.id)

    async def _kv(self, kv: agent.KvServerMessage) -> None:
        if kv.set_blob_args is not None:
            if self.kv == "missing":
                return
            if self.kv == "fail":
                result = agent.SetBlobResult(error=agent.Error(message="injected: disk full"))
            else:
                self.h.blobs[kv.set_blob_args.blob_id] = kv.set_blob_args.blob_data
                self.acked.add(kv.set_blob_args.blob_id)
                result = agent.SetBlobResult()
            reply = agent.KvClientMessage(id=kv.id, set_blob_result=result)
        else:
            assert kv.get_blob_args is not None
            data = self.h.blobs.get(kv.get_blob_args.blob_id)
            reply = agent.KvClientMessage(id=kv.id, get_blob_result=agent.GetBlobResult(blob_data=data))
        await self.send(agent.AgentClientMessage(kv_client_message=reply))

    async def _exec(self, msg: agent.ExecServerMessage) -> None:
        sent: list[agent.AgentClientMessage] = []

        async def reply(out: agent.AgentClientMessage) -> None:
            sent.append(out)
            await self.send(out)

        if msg.subagent_args is not None and self.subagents is not None:
            await self.subagents.answer(self, msg, reply)
        else:
            await self.workspace().run(msg, reply, delay=self.exec_delay)
        if self.late_duplicates:
            # Late and repeated answers: the same result again, another close, and an id never issued.
            for out in sent:
                await self.send(out)
            await self.send(stream_close(msg.id + 1000))


class Subagents(Protocol):
    """How a client answers a Task's subagent_args Exec: it runs the child and replies."""

    async def answer(
        self,
        parent: Client,
        msg: agent.ExecServerMessage,
        reply: Callable[[agent.AgentClientMessage], Awaitable[None]],
    ) -> None: ...

    def on_abort(self, exec_id: int) -> None: ...


def _heartbeat() -> agent.AgentClientMessage:
    return agent.AgentClientMessage(client_heartbeat=agent.ClientHeartbeat())


def cancel_message() -> agent.AgentClientMessage:
    return agent.AgentClientMessage(
        conversation_action=agent.ConversationAction(cancel_action=agent.CancelAction())
    )


# --- the harness ---------------------------------------------------------------------------------


@attrs.define
class Disk:
    """Refuses every write transaction of the daemon's store past ``refuse_after`` of them.
    ``writes`` is counted on the store's worker thread only and ``refuse_after`` set on the
    test's, so neither thread ever writes what the other does."""

    writes: int = 0
    refuse_after: int | None = None

    def refuse_from_now(self, allowed: int) -> None:
        self.refuse_after = self.writes + allowed

    def patch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Every write transaction of any SQLiteStore in this process asks first; a refused one
        fails as SQLite does on a read-only database, before anything is written."""

        def count(conn: sqlite3.Connection) -> None:
            self.writes += 1
            limit = self.refuse_after
            conn.execute(f"PRAGMA query_only = {int(limit is not None and self.writes > limit)}")

        before_each_write(monkeypatch, count)


@attrs.define(eq=False)
class Harness:
    base_url: str
    client: httpx.AsyncClient
    sim: CursorSim
    provider: FaultProvider
    root: Path  # the workspace the Execs run in
    store: SQLiteStore
    blobs: dict[bytes, bytes] = attrs.Factory(dict)
    heads: dict[str, tuple[Message, ...]] = attrs.Factory(dict)
    checked_requests: int = 0
    prefix_checks: int = 0
    tool_requests: int = 0
    last_request_of: dict[str, list[str]] = attrs.Factory(dict)  # conversation -> dumped messages
    # conversation -> (message_id, request id) of each run that succeeded: what an edit may target
    sent: dict[str, list[tuple[str, str]]] = attrs.Factory(dict)
    arrivals: list[tuple[str, str]] = attrs.Factory(list)  # every provider request: (SHA-256, key)
    edit_texts: set[str] = attrs.Factory(set)  # the user texts of edits: their first requests branch
    final_texts: dict[str, list[str]] = attrs.Factory(dict)  # conversation -> committed answers
    counter: itertools.count[int] = attrs.Factory(itertools.count)
    disk: Disk = attrs.Factory(Disk)
    daemon: Daemon | None = None
    # conversation -> the last checkpoint its client got, sent with its next run_request as Cursor
    # does: after a restart, the daemon learns from it which blobs the client holds.
    states: dict[str, agent.ConversationStateStructure] = attrs.Factory(dict)
    # request id -> the history its user message was appended to: where an edit of it branches
    # from (after a compaction, the history before the summary).
    anchors: dict[str, tuple[Message, ...]] = attrs.Factory(dict)
    # request id -> the checkpoint its run_request carried: an edit of its message carries the
    # same, as Cursor restores the conversation as it was when the message was sent.
    request_states: dict[str, agent.ConversationStateStructure | None] = attrs.Factory(dict)
    # conversation -> its head's revision, to find the revision a compaction left intact.
    head_revisions: dict[str, int | None] = attrs.Factory(dict)
    # How each plan with variants ran ("compaction round http_final", "subagent cancel canceled").
    variants: Counter[str] = attrs.Factory(Counter)

    async def restart(self) -> None:
        """Stop the daemon gracefully and start it again on the same data dir; requests already
        started keep the old address."""
        assert self.daemon is not None
        await self.daemon.halt()
        self.base_url = await self.daemon.start()
        self.sim = CursorSim(self.base_url, self.client)


@attrs.define(eq=False)
class Daemon:
    """The daemon under test, served from the test's nursery, restartable on its data dir."""

    config: Config
    nursery: trio.Nursery
    stop: Callable[[], None] = lambda: None
    done: trio.Event = attrs.Factory(trio.Event)
    starts: int = 0
    started_ms: list[int] = attrs.Factory(list)  # the wall clock at each start

    async def start(self) -> str:
        done = trio.Event()
        self.started_ms.append(int(time.time() * 1000))

        async def serve(task_status: trio.TaskStatus[tuple[str, Callable[[], None]]]) -> None:
            try:
                await run_daemon(self.config, task_status=task_status)
            finally:
                done.set()

        base_url, self.stop = await self.nursery.start(serve)
        self.done, self.starts = done, self.starts + 1
        return base_url

    async def halt(self) -> None:
        self.stop()
        await self.done.wait()


@attrs.define
class Expect:
    client: Client
    outcomes: frozenset[str]
    conv: str
    final_text: str | None = None  # the answer that must be committed when the run succeeded
    got: str | None = None  # the terminal outcome seen
    # (call id, text) of a tool result that, when the run succeeded, must hold the text
    tool_error: tuple[str, str] | None = None
    # The store refused writes during the run: its runtime message may be missing after an
    # error, and its own record may not have been written.
    store_refused: bool = False
    # An edit: the request id whose user message this run's (same message_id) replaces; the
    # history branches from the revision before that message.
    edit_of: str | None = None
    # The run appends a runtime message of its own (run-request:{rid}); a summarize_action or a
    # background completion does not.
    runtime: bool = True
    # Compaction: "must" (when the run succeeded), "may" (a cancel or a shutdown raced it) or
    # "no"; ``summary``: what the model wrote, which the summary message must hold.
    compacts: str = "no"
    summary: str | None = None
    # How many summaries the history it compacts holds, when not the head's (summarize_action
    # at the client's checkpoint: the checkpoint's count).
    summaries_before: int | None = None
    # Text the terminal error's message must hold (a failed compaction says so).
    error_has: str | None = None
    # Problems the plan itself saw (a call it did not expect, a child that hung).
    problems: list[str] = attrs.Factory(list)


def run_request(
    h: Harness,
    conv: str,
    text: str,
    message_id: str | None = None,
    model: str | None = None,
    state: agent.ConversationStateStructure | None = None,
) -> agent.AgentRunRequest:
    message_id = message_id or f"m{next(h.counter)}"
    state = state or h.states.get(conv)
    model = model or kind_of(conv).model
    return user_turn(text, conversation_id=conv, model_id=model, message_id=message_id, state=state)


async def drive(
    h: Harness,
    c: Client,
    conv: str,
    text: str,
    *,
    append_first: bool,
    drop_after: int | None = None,
    drop_from: str | None = None,
    reconnect_after: float | None = None,
    during: Callable[[], Any] | None = None,
    message_id: str | None = None,
    model: str | None = None,
    request: agent.AgentRunRequest | None = None,
    state: agent.ConversationStateStructure | None = None,
) -> None:
    """Run one request: RunSSE and the run_request (in either order), an optional task alongside,
    an optional drop of the stream and a reconnect after ``reconnect_after`` seconds.
    ``message_id``: an earlier user message's, to edit it; ``model``: another than the
    conversation's; ``request``: a run_request of another kind than a user turn; ``state``:
    another checkpoint than the conversation's last."""
    c.conv = conv
    rr = request if request is not None else run_request(h, conv, text, message_id, model, state)
    h.request_states[c.rid] = rr.conversation_state
    if rr.action.user_message_action is not None:
        c.message_id = rr.action.user_message_action.user_message.message_id
    async with trio.open_nursery() as execs:
        async with trio.open_nursery() as n:
            ended = [False]

            async def first_stream(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                ended[0] = await c.stream(
                    execs, drop_after=drop_after, drop_from=drop_from, task_status=task_status
                )

            if append_first:
                await c.start(rr)
                await n.start(first_stream)
            else:
                await n.start(first_stream)
                await c.start(rr)
            if during is not None:
                n.start_soon(during)
        if not ended[0] and not c.server_may_stop:  # a stopped daemon's stream has nowhere to reconnect
            await trio.sleep(reconnect_after if reconnect_after is not None else 0.0)
            await c.stream(execs)
        # Late Exec answers still in flight are allowed to land after the end (the server must
        # ignore them); then stop whatever is left.
        if c.late_duplicates:
            await trio.sleep(0.02)
        execs.cancel_scope.cancel()
    if c.executor is not None:
        await c.executor.aclose()
