"""Fault injection: hundreds of randomized runs against ONE real daemon, each checked to end with
exactly one correct terminal frame, with the history invariants checked after every run.

Faults (one per run, drawn from a fixed-seed RNG so a failure replays with the same plan;
BYOK_FAULT_SEED / BYOK_FAULT_RUNS override): provider 5xx/429 (retried) and 400 / repeated 5xx
(final), slow headers, truncated stream, invalid JSON, mid-stream disconnect (before output:
retried; after: final), client dropping RunSSE (mid-run or just before the end frame, reconnecting
in the grace; or past the grace), KV ACK missing or failed, cancel at a random point, preemption
by a second run of the conversation, tool rounds with late and repeated Exec results, and a
store that refuses every write from a random point of the run on (a full or read-only disk), a
graceful restart of the daemon after a run, and its shutdown in the middle of one. On top, any
run may post every BidiAppend twice, post appends out of order (a heartbeat at seqno n+1 before
the message at n), or post its run_request before opening RunSSE.

Checked after every run, from SQLite (a second connection on the daemon's file) and from the
FakeProvider's recorded requests:
  * exactly one terminal frame over all of the request's RunSSE streams, the expected one, and
    the run record agrees with it (status, error code);
  * the conversation head only grows (no run branches here) and holds each committed final answer;
  * runtime event ids are unique, and a run that succeeded or failed committed its runtime
    message exactly once (a cancelled run at most once);
  * every tool result answers an earlier call, at most one result per call;
  * no provider request has a dangling tool call or a duplicated message, and consecutive
    provider requests of a conversation extend each other (prefix property).
And once, at the end, from the daemon's own call records: every provider call of a conversation
extends its previous one byte for byte, across the restarts too (where a turn's request starts
from the history's stored render).

Each client sends the last checkpoint it got with its next run_request, as Cursor does.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import random
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from byok.config import Config
from byok.config_load import load_config
from byok.daemon import run_daemon
from byok.devtools.cursor_sim import RUN_SSE, CursorSim, frame_kind, user_turn
from byok.devtools.exec_client import stream_close
from byok.devtools.workspace_exec import WorkspaceExecutor
from byok.http.connect_envelope import FrameDecoder, encode_frame
from byok.model.messages import Message
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from byok.store import DB_FILENAME, SQLiteStore
from tests.integration.conftest import write_config
from tests.support.fake_provider import (
    FakeProvider,
    Script,
    anthropic_text_script,
    anthropic_tool_script,
    chat_text_script,
    chat_tool_script,
    error_script,
    responses_text_script,
    responses_tool_script,
    sse,
)
from tests.support.store_faults import before_each_write

SEED = int(os.environ.get("BYOK_FAULT_SEED", "6061"))
RUNS = int(os.environ.get("BYOK_FAULT_RUNS", "300"))
CONVERSATIONS = 6
GRACE_S = 0.25  # reconnect_grace_s
KV_TIMEOUT_S = 0.3  # kv_ack_timeout_s
MAX_TRIES = 3  # provider_max_tries
SHUTDOWN_GRACE_S = 0.1  # shutdown_grace_s: a run still going after it is cancelled
RUN_TIMEOUT_S = 10.0  # a run still going after this is a hang
LOOP_BUDGET_S = 120.0 * max(1.0, RUNS / 300)  # the whole loop; 300 runs take ~30-40 s here

MAX_BODY = 128 * 1024  # max_body_bytes: big.txt's Read result (hex) is over it
SERVER = f"""kv_ack_timeout_s = {KV_TIMEOUT_S}
max_body_bytes = {MAX_BODY}
provider_retry_base_s = 0.002
provider_max_tries = {MAX_TRIES}
reconnect_grace_s = {GRACE_S}
shutdown_grace_s = {SHUTDOWN_GRACE_S}
heartbeat_s = 0.5"""

# fault -> weight. Kept small per run: most runs take tens of milliseconds.
FAULTS = {
    "ok": 10,
    "tool_round": 9,
    "http_retried": 5,  # 500/502/503/429 once, then a good stream
    "http_final": 4,  # 400, or 503 on every try
    "slow_headers": 3,
    "truncated": 4,  # clean EOF before finish/usage
    "invalid_json": 3,
    "disconnect_before_output": 3,  # connection cut after the role chunk: retried
    "disconnect_mid_stream": 4,  # cut after text was shown: final
    "duplicate_call_ids": 2,  # two tool calls of one id: a round that could never complete
    "oversized_result": 2,  # a Read result over max_body_bytes: that exec fails, the run goes on
    "drop_reconnect": 6,  # RunSSE dropped, reopened within the grace
    "drop_expire": 2,  # RunSSE dropped past the grace: the run is cancelled
    "kv_missing": 3,
    "kv_failed": 3,
    "cancel": 6,
    "preempt": 4,
    "store_refuses": 3,  # the disk refuses every write after the run's first 0-3: ends ok or internal
    "restart": 2,  # a turn, then a graceful restart: the next turns start from what the store kept
    "shutdown_mid_run": 2,  # the daemon stops while the run streams: it finishes in the grace or is cancelled
}
OK = "ok"  # the expected-outcome name of EndStream {}


def _outcome(end: dict[str, Any]) -> str:
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


def text_script(texts: list[str], *, delay_s: float = 0.0) -> Script:
    return chat_text_script(texts, delay_s=delay_s)


Calls = list[tuple[str, str, str]]


@attrs.frozen
class Kind:
    """One provider kind under test: the model that names it, its scripts, and where in a text
    script the first output and the finish are (for cuts before and after them)."""

    name: str
    model: str
    finish_marker: bytes  # in the chunk that finishes a text stream (finish, usage, stop)

    def text(self, texts: list[str], *, delay_s: float = 0.0, think: str | None = None) -> Script:
        if self.name == "anthropic":
            thinking = [think] if think else []
            return anthropic_text_script(texts, thinking=thinking, signature=_sig(think), delay_s=delay_s)
        if self.name == "openai_responses":
            return responses_text_script(texts, reasoning=[think] if think else [], encrypted=_sig(think),
                                         delay_s=delay_s)  # fmt: skip
        return chat_text_script(texts, reasoning=[think] if think else [], delay_s=delay_s)

    def tools(self, calls: Calls, *, delay_s: float = 0.0, think: str | None = None) -> Script:
        if self.name == "anthropic":
            thinking = [think] if think else []
            return anthropic_tool_script(calls, thinking=thinking, signature=_sig(think), delay_s=delay_s)
        if self.name == "openai_responses":
            return responses_tool_script(calls, reasoning=[think] if think else [], encrypted=_sig(think),
                                         delay_s=delay_s)  # fmt: skip
        return chat_tool_script(calls, delay_s=delay_s)

    def first_output(self, script: Script, texts: list[str]) -> int:
        """The index of the chunk carrying ``texts[0]`` first: what comes before it shows nothing."""
        piece = json.dumps(texts[0])[1:-1].encode()
        return next(i for i, chunk in enumerate(script.chunks) if piece in chunk)

    def finish_at(self, script: Script) -> int:
        return next(i for i, chunk in enumerate(script.chunks) if self.finish_marker in chunk)


def _sig(think: str | None) -> str | None:
    return None if think is None else f"sig-{think}"


# A conversation's kind is fixed: conversation i runs on KINDS[i % 3].
KINDS = (
    Kind("openai_chat", "byok-demo", b'"finish_reason":"stop"'),
    Kind("openai_responses", "byok-responses", b"response.completed"),
    Kind("anthropic", "byok-anthropic", b"message_delta"),
)
MODELS = """
[[providers]]
id = "fake-responses"
kind = "openai_responses"
base_url = "{url}"
api_key = "sk-test"

[[providers]]
id = "fake-anthropic"
kind = "anthropic"
base_url = "{url}"
api_key = "sk-test"

[[models]]
id = "byok-responses"
provider = "fake-responses"
upstream_model = "gpt-test"
context_tokens = 128000

[[models]]
id = "byok-anthropic"
provider = "fake-anthropic"
upstream_model = "claude-test"
context_tokens = 128000
"""


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
    conv: str = ""  # the conversation, set when the request is driven
    # The daemon may stop during this run: an append it can no longer take is not an error.
    server_may_stop: bool = False
    # The daemon this request runs on, even when the harness restarts it meanwhile.
    sim: CursorSim = attrs.field(init=False)
    base_url: str = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.sim, self.base_url = self.h.sim, self.h.base_url

    def workspace(self) -> WorkspaceExecutor:
        if self.executor is None:
            self.executor = WorkspaceExecutor(self.h.root, shell_timeout_cap_s=2.0)
        return self.executor

    async def _post(self, seqno: int, msg: agent.AgentClientMessage) -> None:
        try:
            resp = await self.sim.append(self.rid, seqno, msg)
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
        control = msg.exec_server_control_message
        if control is not None and control.abort is not None:
            self.workspace().abort(control.abort.id)

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

        await self.workspace().run(msg, reply, delay=self.exec_delay)
        if self.late_duplicates:
            # Late and repeated answers: the same result again, another close, and an id never issued.
            for out in sent:
                await self.send(out)
            await self.send(stream_close(msg.id + 1000))


def _heartbeat() -> agent.AgentClientMessage:
    return agent.AgentClientMessage(client_heartbeat=agent.ClientHeartbeat())


def _cancel() -> agent.AgentClientMessage:
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
    merged_requests: set[str] = attrs.Factory(set)  # SHA-256 of Anthropic bodies that merged their last
    final_texts: dict[str, list[str]] = attrs.Factory(dict)  # conversation -> committed answers
    counter: itertools.count[int] = attrs.Factory(itertools.count)
    disk: Disk = attrs.Factory(Disk)
    daemon: Daemon | None = None
    # conversation -> the last checkpoint its client got, sent with its next run_request as Cursor
    # does: after a restart, the daemon learns from it which blobs the client holds.
    states: dict[str, agent.ConversationStateStructure] = attrs.Factory(dict)

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

    async def start(self) -> str:
        done = trio.Event()

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


def _run_request(h: Harness, conv: str, text: str) -> agent.AgentRunRequest:
    message_id = f"m{next(h.counter)}"
    state = h.states.get(conv)
    model = kind_of(conv).model
    return user_turn(text, conversation_id=conv, model_id=model, message_id=message_id, state=state)


def kind_of(conv: str) -> Kind:
    return KINDS[int(conv.rsplit("-", 1)[1]) % len(KINDS)]


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
) -> None:
    """Run one request: RunSSE and the run_request (in either order), an optional task alongside,
    an optional drop of the stream and a reconnect after ``reconnect_after`` seconds."""
    c.conv = conv
    rr = _run_request(h, conv, text)
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


async def run_plan(h: Harness, rng: random.Random, index: int) -> tuple[str, list[Expect]]:
    fault = rng.choices(list(FAULTS), weights=list(FAULTS.values()))[0]
    conv = f"fi-conv-{rng.randrange(CONVERSATIONS)}"
    k = kind_of(conv)
    think = f"{index} thought" if rng.random() < 0.4 else None  # reasoning to replay, when it is kept
    tag = f"r{index}"
    answer = [f"{tag} answer ", f"part {rng.randrange(10**6)}"]
    final_text = "".join(answer)
    client = Client(
        h,
        f"fi-req-{index}",
        dup=rng.random() < 0.25,
        reorder=rng.random() < 0.25,
    )
    append_first = rng.random() < 0.2
    expect = Expect(client, frozenset({OK}), conv, final_text)
    p = h.provider
    text = f"{tag}: {fault}"

    if fault == "ok":
        p.enqueue(k.text(answer, think=think))
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "tool_round":
        calls = [(f"{tag}-c{i}", "Read", json.dumps({"path": "a.txt"})) for i in range(rng.randint(1, 3))]
        if rng.random() < 0.3:
            # Arguments that are not JSON: a model's slip on the OpenAI kinds (the call gets an
            # error result), impossible from Anthropic, whose stream would be rejected.
            broken = rng.random() < 0.5 and k.name != "anthropic"
            calls.append((f"{tag}-bad", rng.choice(["Nope", "Read"]), "{" if broken else "{}"))
        client.exec_delay = rng.choice([0.0, 0.0, 0.01, 0.05])
        client.late_duplicates = rng.random() < 0.4
        # Each call's reasoning is its own (a provider never sends the same encrypted content twice).
        first_think = None if think is None else f"{think} before the tools"
        p.enqueue(k.tools(calls, think=first_think), k.text(answer, think=think))
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "http_retried":
        status = rng.choice([500, 502, 503, 429])
        p.enqueue(
            error_script(status, "injected", retry_after="0" if status == 429 else None), k.text(answer)
        )
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "http_final":
        if rng.random() < 0.5:
            p.enqueue(error_script(400, "injected bad request"))
        else:
            p.enqueue(*[error_script(503, "injected overload") for _ in range(MAX_TRIES)])
        expect.outcomes = frozenset({"unavailable"})
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "slow_headers":
        good = k.text(answer)
        p.enqueue(SlowScript(chunks=good.chunks, headers_delay_s=rng.choice([0.02, 0.08, 0.15])))
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "truncated":
        good = k.text(answer)
        cut = rng.randint(1, k.finish_at(good))  # ends before the finish chunk and usage
        p.enqueue(Script(chunks=good.chunks[:cut]))
        expect.outcomes = frozenset({"unavailable"})
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "invalid_json":
        good = k.text(answer)
        at = rng.randint(1, len(good.chunks) - 1)
        bad = rng.choice([b"data: {not json\n\n", b"data: [1,\n\n", sse({"choices": "x"}) + b"data: }\n\n"])
        p.enqueue(Script(chunks=[*good.chunks[:at], bad, *good.chunks[at:]]))
        expect.outcomes = frozenset({"unavailable"})
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "disconnect_before_output":
        good = k.text(answer)
        p.enqueue(Script(chunks=good.chunks, close_after=k.first_output(good, answer)), k.text(answer))
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "duplicate_call_ids":
        same = f"{tag}-c0"
        p.enqueue(k.tools([(same, "Read", '{"path":"a.txt"}'), (same, "Grep", '{"pattern":"a"}')]))
        expect.outcomes = frozenset({"unavailable"})
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "oversized_result":
        big, small = f"{tag}-big", f"{tag}-c1"
        p.enqueue(
            k.tools([(big, "Read", '{"path":"big.txt"}'), (small, "Read", '{"path":"a.txt"}')]),
            k.text(answer),
        )
        expect.tool_error = (big, "max_body_bytes")
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "store_refuses":
        p.enqueue(k.text(answer))
        expect.outcomes = frozenset({OK, "internal"})
        expect.store_refused = True
        h.disk.refuse_from_now(rng.randint(0, 3))
        try:
            await drive(h, client, conv, text, append_first=append_first)
        finally:
            h.disk.refuse_after = None
    elif fault == "disconnect_mid_stream":
        good = k.text(answer)
        shown = k.first_output(good, answer) + 1
        p.enqueue(Script(chunks=good.chunks, close_after=rng.randint(shown, len(good.chunks) - 1)))
        expect.outcomes = frozenset({"unavailable"})
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "drop_reconnect":
        words = [f"{tag} w{i} " for i in range(6)]
        if rng.random() < 0.4:
            p.enqueue(k.tools([(f"{tag}-c0", "Read", '{"path":"a.txt"}')], delay_s=0.01))
            client.exec_delay = rng.choice([0.0, 0.05])
        p.enqueue(k.text(words, delay_s=0.01))
        expect.final_text = "".join(words)
        # Early: mid-run, the rest of the run goes to the reconnect. Late: at turn_ended or one of
        # the three checkpoints after it, the last of them just before the end frame: the end
        # frame is often written to the dropped stream before the server sees it gone, and the
        # reconnect must carry it again (test_a_reconnect_after_the_run_ended_gets_the_end_frame
        # is the deterministic case). No tolerance: a reconnect without the end frame fails.
        await drive(
            h,
            client,
            conv,
            text,
            append_first=append_first,
            drop_after=rng.randint(1, 4),
            drop_from="interaction_update.turn_ended" if rng.random() < 0.5 else None,
            reconnect_after=rng.choice([0.0, 0.02, 0.08]),
        )
    elif fault == "drop_expire":
        words = [f"{tag} w{i} " for i in range(10)]
        p.enqueue(k.text(words, delay_s=0.06))  # ~0.6 s: outlives the grace
        expect.outcomes = frozenset({"canceled"})
        await drive(
            h, client, conv, text, append_first=append_first, drop_after=1, reconnect_after=GRACE_S + 0.25
        )
    elif fault in ("kv_missing", "kv_failed"):
        client.kv = "missing" if fault == "kv_missing" else "fail"
        if rng.random() < 0.5:  # a tool round publishes its staged checkpoint first
            p.enqueue(k.tools([(f"{tag}-c0", "Read", '{"path":"a.txt"}')]), k.text(answer))
        else:
            p.enqueue(k.text(answer))
        expect.outcomes = frozenset({"internal"})
        expect.final_text = None
        await drive(h, client, conv, text, append_first=append_first)
    elif fault == "cancel":
        words = [f"{tag} w{i} " for i in range(6)]
        if rng.random() < 0.4:
            p.enqueue(k.tools([(f"{tag}-c0", "Read", '{"path":"a.txt"}')], delay_s=0.01))
            client.exec_delay = 0.03
        p.enqueue(k.text(words, delay_s=0.01))
        expect.final_text = "".join(words)
        expect.outcomes = frozenset({"canceled", OK})  # OK: the run ended before the cancel landed
        delay = rng.uniform(0.0, 0.15)

        async def cancel_later() -> None:
            await trio.sleep(delay)
            await client.send(_cancel())

        await drive(h, client, conv, text, append_first=append_first, during=cancel_later)
    elif fault == "preempt":
        first = Client(h, f"fi-req-{index}a", dup=client.dup, reorder=client.reorder)
        words = [f"{tag} slow{i} " for i in range(8)]
        style = rng.choice(["hang", "slow", "tool_round"])
        if style == "hang":
            p.enqueue(Script(hang_before_headers=True))
        elif style == "slow":
            p.enqueue(k.text(words, delay_s=0.04))
        else:  # preempted in the middle of its tool round: calls committed, results maybe not
            calls = [(f"{tag}-p{i}", "Read", '{"path":"a.txt"}') for i in range(2)]
            p.enqueue(k.tools(calls))
            first.exec_delay = 0.3
        p.enqueue(k.text(answer))
        seen = len(p.requests)

        async def second() -> None:
            with trio.fail_after(5):
                while len(p.requests) == seen:  # the first run's provider call is under way
                    await trio.sleep(0.002)
            await trio.sleep(rng.uniform(0.0, 0.05))
            await drive(h, client, conv, f"{text} (second)", append_first=append_first)

        async with trio.open_nursery() as n:
            n.start_soon(lambda: drive(h, first, conv, f"{text} (first)", append_first=False))
            n.start_soon(second)
        return fault, [Expect(first, frozenset({"canceled", OK}), conv, None), expect]
    elif fault == "restart":
        p.enqueue(k.text(answer))
        await drive(h, client, conv, text, append_first=append_first)
        await h.restart()
    elif fault == "shutdown_mid_run":
        words = [f"{tag} w{i} " for i in range(8)]
        if rng.random() < 0.3:
            p.enqueue(k.tools([(f"{tag}-c0", "Read", '{"path":"a.txt"}')], delay_s=0.01))
            client.exec_delay = rng.choice([0.0, 0.05])
        p.enqueue(k.text(words, delay_s=0.02))
        expect.final_text = "".join(words)
        expect.outcomes = frozenset({"canceled", OK})  # OK: it ended within shutdown_grace_s
        client.server_may_stop = True
        seen = len(p.requests)
        delay = rng.uniform(0.0, 0.15)

        async def stop_later() -> None:
            with trio.fail_after(5):
                while len(p.requests) == seen:  # the run's provider call is under way
                    await trio.sleep(0.002)
            await trio.sleep(delay)
            await h.restart()

        await drive(h, client, conv, text, append_first=append_first, during=stop_later)
    else:  # pragma: no cover
        raise AssertionError(fault)
    return fault, [expect]


# --- invariants ------------------------------------------------------------------------------------


def _dump(m: dict[str, Any]) -> str:
    return json.dumps(m, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


async def _run_record(h: Harness, rid: str) -> Any:
    with trio.fail_after(5):
        while True:
            run = h.store.run(rid)
            if run is not None and run.status != "running":
                return run
            await trio.sleep(0.005)


async def check_run(h: Harness, expects: list[Expect]) -> list[str]:
    errors: list[str] = []
    for e in expects:
        c = e.client
        errors += c.append_errors
        if len(c.terminals) != 1:
            errors.append(
                f"{c.rid}: {len(c.terminals)} terminal frames {c.terminals} "
                f"(streams ended without one: {c.eof_without_terminal}; {' '.join(c.history)})"
            )
            continue
        got = _outcome(c.terminals[0])
        if got not in e.outcomes:
            errors.append(
                f"{c.rid}: terminal {c.terminals[0]}, expected one of {sorted(e.outcomes)} "
                f"({' '.join(c.history)})"
            )
        e.got = got
        if e.store_refused:
            message = c.terminals[0].get("error", {}).get("message", "")
            if got == "internal" and not message.startswith("byok's database failed: sqlite: "):
                errors.append(f"{c.rid}: a refused write ended the run with {message!r}")
            continue  # its record was written only if the disk took it
        run = await _run_record(h, c.rid)
        status = {OK: "success", "canceled": "canceled"}.get(got, "error")
        if run.status != status or (status == "error" and run.error_code != got):
            errors.append(f"{c.rid}: run record {run.status}/{run.error_code} but terminal {got}")
    conv = expects[0].conv
    head = h.store.head(conv).messages
    before = h.heads.get(conv, ())
    if head[: len(before)] != before:
        errors.append(f"{conv}: the head lost or rewrote committed messages ({len(before)} -> {len(head)})")
    h.heads[conv] = head
    events = Counter(m.event_id for m in head if m.event_id)
    errors += [f"{conv}: runtime event {k} committed {n} times" for k, n in events.items() if n > 1]
    for e in expects:
        got = e.got
        n = events.get(f"run-request:{e.client.rid}", 0)
        may_lack = got == "canceled" or (e.store_refused and got != OK)
        if got is not None and (n > 1 or (not may_lack and n != 1)):
            errors.append(f"{e.client.rid} ({got}): runtime message committed {n} times")
        if got == OK and e.final_text is not None:
            answers = [m.text for m in head if m.role == "assistant"]
            if e.final_text not in answers:
                errors.append(f"{e.client.rid}: answer {e.final_text!r} not in the committed history")
        if got == OK and e.tool_error is not None:
            call_id, text = e.tool_error
            results = [m.text for m in head if m.role == "tool" and m.tool_call_id == call_id]
            if len(results) != 1 or text not in results[0]:
                errors.append(
                    f"{e.client.rid}: result of {call_id} is {results!r}, expected one with {text!r}"
                )
    calls: set[str] = set()
    answered: Counter[str] = Counter()
    for m in head:
        calls.update(tc.call_id for tc in m.tool_calls)
        if m.role == "tool":
            answered[m.tool_call_id] += 1
            if m.tool_call_id not in calls:
                errors.append(f"{conv}: tool result for {m.tool_call_id} answers no earlier call")
    errors += [f"{conv}: {n} results for call {k}" for k, n in answered.items() if n > 1]
    errors += check_provider_requests(h)
    return errors


def check_provider_requests(h: Harness) -> list[str]:
    errors: list[str] = []
    requests = h.provider.requests
    for i in range(h.checked_requests, len(requests)):
        body = requests[i].json
        shape = _shape(body)
        if shape is None:
            errors.append(f"provider request {i} is neither a Chat, a Responses nor a Messages request")
            continue
        elements, first_user, dangling, has_results = shape
        dumps = [_dump(m) for m in elements]
        if len(set(dumps)) != len(dumps):
            again = next(d for n, d in enumerate(dumps) if d in dumps[:n])
            errors.append(f"provider request {i} repeats a message: {again[:300]}")
        errors += [f"provider request {i}: {p}" for p in dangling]
        # The conversation is named by its first user message (unique per conversation here);
        # on Anthropic by that message's first block: later user turns may join the message.
        first = elements[first_user] if len(elements) > first_user else None
        key = "" if first is None else _dump(_user_blocks(first)[0] if "system" in body else first)
        if i in h.provider.unscripted:
            continue  # a cancelled run's request that arrived late: not part of the sequence
        previous = h.last_request_of.get(key)
        h.tool_requests += has_results
        h.prefix_checks += previous is not None
        if previous is not None and "system" in body and _merges_into_last(previous, dumps):
            # Anthropic's roles alternate: a user turn after one that got no answer (a failed or
            # cancelled run) joins its message, as anthropic_request documents.
            h.merged_requests.add(hashlib.sha256(requests[i].body).hexdigest())
        elif previous is not None and dumps[: len(previous)] != previous:
            at = next(
                (n for n, (a, b) in enumerate(zip(previous, dumps, strict=False)) if a != b), len(dumps)
            )
            was = previous[at][:300] if at < len(previous) else "-"
            now = dumps[at][:300] if at < len(dumps) else "(missing)"
            errors.append(
                f"provider request {i} does not extend the previous request of its conversation: "
                f"element {at} was {was} and is {now}"
            )
        h.last_request_of[key] = dumps
    for i in range(h.checked_requests, len(requests)):
        # Checked: only its place in the list matters now. Kept whole, 3,000 runs' requests
        # (their parsed JSON) grew this process to 1.6 GB, and the cyclic GC's full passes over
        # them paused the daemon sharing the process for up to 0.95 s, past the KV ACK timeout.
        requests[i] = attrs.evolve(requests[i], body=b"")
    h.checked_requests = len(requests)
    return errors


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "from their stored render" in record.getMessage():
            self.records.append(record)


def check_call_records(db: sqlite3.Connection, merged: set[str]) -> list[str]:
    """The daemon's own prefix meter, byte for byte over the whole loop and across restarts:
    every call of a conversation extends its previous one (no run here edits or branches), but
    for the Anthropic requests whose last message took the next user turn (``merged``)."""
    rows = db.execute(
        "SELECT id, request_id, conversation_id, common_prefix_messages, request_sha256 FROM llm_calls "
        "WHERE prefix_extends = 0 ORDER BY id"
    ).fetchall()
    return [
        f"llm_calls {i} ({rid}, {conv}): does not extend its conversation's previous call "
        f"({common} messages shared)"
        for i, rid, conv, common, sha in rows
        if sha not in merged
    ]


Shape = tuple[list[dict[str, Any]], int, list[str], bool]


def _shape(body: Any) -> Shape | None:
    """A request's history elements, the index of its first user message, what dangles in it,
    and whether it carries a tool result."""
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("input"), list):  # Responses: the system prompt is "instructions"
        items = body["input"]
        return (
            items,
            0,
            _dangling_responses(items),
            any(i.get("type") == "function_call_output" for i in items),
        )
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    if "system" in body:  # Anthropic Messages: tool results are blocks of a user message
        results = any(b.get("type") == "tool_result" for m in messages for b in _blocks(m))
        return messages, 0, _dangling_anthropic(messages), results
    return messages, 1, _dangling(messages), any(m["role"] == "tool" for m in messages)


def _blocks(m: dict[str, Any]) -> list[dict[str, Any]]:
    return m["content"] if isinstance(m["content"], list) else []


def _merges_into_last(previous: list[str], dumps: list[str]) -> bool:
    """``dumps`` extends ``previous`` but for its last message, a user message that now has
    more blocks after its own."""
    n = len(previous)
    if len(dumps) < n or dumps[: n - 1] != previous[: n - 1]:
        return False
    was, now = json.loads(previous[-1]), json.loads(dumps[n - 1])
    if was["role"] != "user" or now["role"] != "user":
        return False
    blocks = _user_blocks(was)
    return _user_blocks(now)[: len(blocks)] == blocks and len(_user_blocks(now)) > len(blocks)


def _user_blocks(m: dict[str, Any]) -> list[dict[str, Any]]:
    """A user message's blocks, its plain string form as the one text block it stands for."""
    content = m["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _dangling_anthropic(messages: list[dict[str, Any]]) -> list[str]:
    """Each assistant turn's tool_use blocks are answered by the next message's tool_result
    blocks, exactly; no tool_result answers anything else."""
    out: list[str] = []
    calls: list[str] = []  # the previous message's tool_use ids
    for i, m in enumerate(messages):
        blocks = _blocks(m)
        results = [b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"]
        if sorted(results) != sorted(calls):
            out.append(f"tool_use {sorted(calls)} answered by {sorted(results)} at {i}")
        calls = [b["id"] for b in blocks if b.get("type") == "tool_use"]
    if calls:
        out.append(f"tool_use {sorted(calls)} unanswered at the end")
    return out


def _dangling_responses(items: list[dict[str, Any]]) -> list[str]:
    """Each function_call has exactly one function_call_output after it, and each output a call."""
    out: list[str] = []
    answers: Counter[str] = Counter()
    calls: set[str] = set()
    for i, item in enumerate(items):
        if item.get("type") == "function_call":
            calls.add(item["call_id"])
        elif item.get("type") == "function_call_output":
            if item["call_id"] not in calls:
                out.append(f"orphan function_call_output {item['call_id']!r} at {i}")
            answers[item["call_id"]] += 1
    out += [f"function_call {c!r} answered {answers[c]} times" for c in sorted(calls) if answers[c] != 1]
    return out


def _dangling(messages: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        if m["role"] == "tool":
            out.append(f"orphan tool result {m.get('tool_call_id')!r} at {i}")
        if m["role"] == "assistant" and m.get("tool_calls"):
            want = {c["id"] for c in m["tool_calls"]}
            got: list[str] = []
            i += 1
            while i < len(messages) and messages[i]["role"] == "tool":
                got.append(messages[i]["tool_call_id"])
                i += 1
            if sorted(got) != sorted(want):
                out.append(f"tool calls {sorted(want)} answered by {sorted(got)}")
            continue
        i += 1
    return out


# --- the loop ----------------------------------------------------------------------------------------


async def test_fault_injection_loop(
    tmp_path: Path, nursery: trio.Nursery, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = FaultProvider()
    url = await provider.start(nursery)
    data_dir = tmp_path / "data"
    cfg = tmp_path / "byok.toml"
    write_config(cfg, provider_url=url, data_dir=data_dir, extra=MODELS.format(url=url))
    text = cfg.read_text()
    text = text.replace("kv_ack_timeout_s = 5.0\nprovider_retry_base_s = 0.01", SERVER)
    assert SERVER in text
    cfg.write_text(text)
    used = _Records()  # the turns that started from a stored render
    render_log = logging.getLogger("byok.render")
    monkeypatch.setattr(render_log, "handlers", [*render_log.handlers, used])
    monkeypatch.setattr(render_log, "level", logging.DEBUG)
    daemon = Daemon(load_config(cfg, overrides={}), nursery)
    base_url = await daemon.start()
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("alpha\nbeta\n")
    # Its Read result, hex-encoded in the append, is twice MAX_BODY.
    (root / "big.txt").write_text("".join(f"line {i:07d}\n" for i in range(MAX_BODY // 13)))
    rng = random.Random(SEED)
    failures: list[str] = []
    faults: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    ok_runs = 0
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=30) as client:
        with SQLiteStore.open_in(data_dir) as store:
            h = Harness(base_url, client, CursorSim(base_url, client), provider, root, store, daemon=daemon)
            h.disk.patch(monkeypatch)
            with trio.fail_after(LOOP_BUDGET_S):
                for index in range(RUNS):
                    errors: list[str] = []
                    fault = "?"
                    try:
                        with trio.fail_after(RUN_TIMEOUT_S):
                            fault, expects = await run_plan(h, rng, index)
                        errors = await check_run(h, expects)
                        for e in expects:
                            outcomes[e.got or "none"] += 1
                    except trio.TooSlowError:
                        errors = [f"run {index} ({fault}) did not end within {RUN_TIMEOUT_S}s"]
                    faults[fault] += 1
                    provider.drop_unused()  # scripts a cancelled run never asked for
                    if errors:
                        failures += [f"run {index} [{fault}]: {err}" for err in errors]
                    else:
                        ok_runs += 1
            await daemon.halt()  # its call records are all written now
    with sqlite3.connect(data_dir / DB_FILENAME) as db:
        failures += check_call_records(db, h.merged_requests)
        renders = db.execute("SELECT count(*) FROM rendered_prefixes").fetchone()[0]
        compared = db.execute("SELECT count(*) FROM llm_calls WHERE prefix_extends = 1").fetchone()[0]
    elapsed = time.monotonic() - started
    with capsys.disabled():
        print(
            f"\nfault injection: seed {SEED}, {elapsed:.1f}s; faults {dict(sorted(faults.items()))}; "
            f"terminals {dict(sorted(outcomes.items()))}; provider requests {len(provider.requests)} "
            f"({h.prefix_checks} prefix-checked, {h.tool_requests} carrying tool results); "
            f"{daemon.starts} daemon starts, {renders} stored renders, {len(used.records)} turns started "
            f"from one; {compared} calls extend their previous one byte for byte, "
            f"{len(h.merged_requests)} Anthropic calls merged a user turn into their last message"
        )
        print(f"{RUNS} runs, {ok_runs} ok")
    assert not failures, "\n".join(failures[:40])


# --- bugs the loop found, pinned deterministically ------------------------------------------------------


async def _run_with_a_silent_first_stream(h: Harness, c: Client, conversation_id: str) -> None:
    """Start the run with a first RunSSE nobody reads, then stream it again on a second one."""
    body = encode_frame(bytes(aiserver.BidiRequestId(request_id=c.rid)))
    async with (
        trio.open_nursery() as execs,
        h.client.stream(
            "POST",
            h.base_url + RUN_SSE,
            content=body,
            headers={"content-type": "application/connect+proto"},
        ),
    ):
        await c.start(_run_request(h, conversation_id, "hi"))
        await trio.sleep(0.3)
        with trio.fail_after(5):
            await c.stream(execs)


async def test_frames_written_to_a_dead_runsse_are_not_lost_on_reconnect(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    provider = FaultProvider()
    url = await provider.start(nursery)
    cfg = tmp_path / "byok.toml"
    write_config(cfg, provider_url=url, data_dir=tmp_path / "data")
    cfg.write_text(
        cfg.read_text().replace("kv_ack_timeout_s = 5.0", "kv_ack_timeout_s = 1.0\nreconnect_grace_s = 5")
    )
    base_url, stop = await nursery.start(run_daemon, load_config(cfg, overrides={}))
    provider.enqueue(text_script(["hello"]))
    async with httpx.AsyncClient(timeout=30) as client:
        h = Harness(
            base_url,
            client,
            CursorSim(base_url, client),
            provider,
            tmp_path,
            SQLiteStore.open_in(tmp_path / "data"),
        )
        c = Client(h, "req-dead-stream")
        # The first RunSSE goes silent (a dead network path: nothing is read from it any more)
        # while the run writes its KV SETs into it; then the client reconnects.
        await _run_with_a_silent_first_stream(h, c, "conv-dead")
        h.store.close()
    stop()
    assert c.terminals == [{}]


async def test_an_empty_exec_control_message_does_not_stop_the_daemon(tmp_path: Path) -> None:
    crashed: list[BaseException] = []
    try:
        async with trio.open_nursery() as n:
            provider = FaultProvider()
            url = await provider.start(n)
            cfg = tmp_path / "byok.toml"
            write_config(cfg, provider_url=url, data_dir=tmp_path / "data")
            base_url, stop = await n.start(run_daemon, load_config(cfg, overrides={}))
            provider.enqueue(Script(hang_before_headers=True), text_script(["still here"]))
            async with httpx.AsyncClient(timeout=30) as client:
                h = Harness(base_url, client, CursorSim(base_url, client), provider, tmp_path, None)  # type: ignore[arg-type]
                bad = Client(h, "req-bad-control")
                async with trio.open_nursery() as execs:
                    execs.start_soon(bad.stream, execs)
                    await bad.start(_run_request(h, "conv-bad", "hi"))
                    # The run waits on the hanging provider call: the next script is the good run's.
                    with trio.fail_after(5):
                        while not provider.requests:
                            await trio.sleep(0.01)
                    await bad.send(
                        agent.AgentClientMessage(exec_client_control_message=agent.ExecClientControlMessage())
                    )
                    await trio.sleep(0.2)
                    await bad.send(_cancel())
                    with trio.fail_after(5):
                        while not bad.terminals:
                            await trio.sleep(0.01)
                    execs.cancel_scope.cancel()
                good = Client(h, "req-after")
                with trio.fail_after(10):
                    await drive(h, good, "conv-good", "again", append_first=False)
            stop()
            n.cancel_scope.cancel()
    except BaseException as e:  # the daemon's nursery re-raises the run's AttributeError
        crashed.append(e)
    assert not crashed, repr(crashed[0])[:300]
    assert good.terminals == [{}]


async def test_type_confused_run_request_is_answered_invalid_argument(daemon: Any) -> None:
    data = bytes([0x08, 0x05]).hex()  # AgentClientMessage field 1 (run_request), wire type varint, 5
    body = bytes(
        aiserver.BidiAppendRequest(
            data=data, request_id=aiserver.BidiRequestId(request_id="req-x"), append_seqno=0
        )
    )
    resp = await daemon.client.post(
        daemon.base_url + "/aiserver.v1.BidiService/BidiAppend",
        content=body,
        headers={"content-type": "application/proto"},
    )
    # Not a well-typed AgentClientMessage, for a request id byok does not know: CLARIFICATIONS §1
    # says it belongs to another stream and is relayed (upstream is unreachable in this fixture).
    # What matters: a Connect answer, never an HTTP 500.
    assert resp.status_code == 502 and resp.json()["code"] == "unavailable"
    # On a request id that is an agent run (a RunSSE is open for it) the same data is rejected.
    async with trio.open_nursery() as nursery:
        opened = trio.Event()

        async def runsse() -> None:
            async with daemon.client.stream(
                "POST",
                daemon.base_url + "/agent.v1.AgentService/RunSSE",
                content=bytes(aiserver.BidiRequestId(request_id="req-y")),
                headers={"content-type": "application/proto"},
            ) as r:
                opened.set()
                async for _ in r.aiter_bytes():
                    pass

        nursery.start_soon(runsse)
        await opened.wait()
        agent_body = bytes(
            aiserver.BidiAppendRequest(
                data=data, request_id=aiserver.BidiRequestId(request_id="req-y"), append_seqno=0
            )
        )
        resp = await daemon.client.post(
            daemon.base_url + "/aiserver.v1.BidiService/BidiAppend",
            content=agent_body,
            headers={"content-type": "application/proto"},
        )
        assert resp.status_code == 400 and resp.json()["code"] == "invalid_argument"
        nursery.cancel_scope.cancel()


async def test_a_reconnect_after_the_run_ended_gets_the_end_frame(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    provider = FaultProvider()
    url = await provider.start(nursery)
    cfg = tmp_path / "byok.toml"
    write_config(cfg, provider_url=url, data_dir=tmp_path / "data")
    cfg.write_text(
        cfg.read_text().replace("kv_ack_timeout_s = 5.0", "kv_ack_timeout_s = 5.0\nreconnect_grace_s = 5")
    )
    base_url, stop = await nursery.start(run_daemon, load_config(cfg, overrides={}))
    provider.enqueue(error_script(400, "injected bad request"))  # the run fails at once, before any KV
    async with httpx.AsyncClient(timeout=30) as client:
        h = Harness(base_url, client, CursorSim(base_url, client), provider, tmp_path, None)  # type: ignore[arg-type]
        c = Client(h, "req-end-on-dead-stream")
        # The first RunSSE goes silent while the run fails and writes its end frame into it; then
        # the client reconnects.
        await _run_with_a_silent_first_stream(h, c, "conv-end-dead")
    stop()
    assert c.terminals and _outcome(c.terminals[0]) == "unavailable", (c.terminals, c.eof_without_terminal)
