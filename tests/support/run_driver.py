"""A lower-level Cursor driver than CursorSim.run, for lifecycle tests.

``RunDriver`` owns one request id's append seqnos and lets a test open and close RunSSE
streams itself (drop + reconnect), post appends in between, and read each stream into its own
Transcript. ``live_daemon`` starts the real daemon with extra [server] keys and hands back
its stop function (graceful shutdown tests). The history checks at the bottom are the
lifecycle invariants asserted on the provider's requests and the store.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import betterproto2
import httpx
import trio

from byok.config_load import load_config
from byok.daemon import run_daemon
from byok.devtools.cursor_sim import RUN_SSE, CursorSim, Recorded, Transcript, frame_kind
from byok.http.connect_envelope import FrameDecoder, encode_frame
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from byok.store import LlmCallRecord, SQLiteStore
from byok.store.records import RunRecord
from tests.support.fake_provider import FakeProvider

# --- messages a client sends -------------------------------------------------------------------


def cancel_message() -> agent.AgentClientMessage:
    return agent.AgentClientMessage(
        conversation_action=agent.ConversationAction(cancel_action=agent.CancelAction())
    )


def heartbeat_message() -> agent.AgentClientMessage:
    return agent.AgentClientMessage(client_heartbeat=agent.ClientHeartbeat())


def resume_request(
    state: agent.ConversationStateStructure, *, conversation_id: str, model_id: str = "byok-demo"
) -> agent.AgentRunRequest:
    """The run_request Cursor sends to resume a conversation from its last checkpoint."""
    return agent.AgentRunRequest(
        conversation_state=state,
        action=agent.ConversationAction(
            resume_action=agent.ResumeAction(request_context=agent.RequestContext())
        ),
        requested_model=agent.RequestedModel(model_id=model_id),
        conversation_id=conversation_id,
    )


def background_request(
    completions: list[agent.BackgroundTaskCompletion], *, conversation_id: str, model_id: str = "byok-demo"
) -> agent.AgentRunRequest:
    return agent.AgentRunRequest(
        conversation_state=agent.ConversationStateStructure(),
        action=agent.ConversationAction(
            background_task_completion_action=agent.BackgroundTaskCompletionAction(completions=completions)
        ),
        requested_model=agent.RequestedModel(model_id=model_id),
        conversation_id=conversation_id,
    )


# --- a hand-driven run -------------------------------------------------------------------------


class RunDriver:
    """One request id driven by hand: appends are posted in seqno order (one at a time, as
    Cursor does) and any number of RunSSE streams may be opened and dropped."""

    def __init__(self, sim: CursorSim, request_id: str) -> None:
        self.sim = sim
        self.request_id = request_id
        self.seq = 0
        self.acked: set[bytes] = set()
        self._lock = trio.Lock()

    async def send(self, msg: agent.AgentClientMessage) -> httpx.Response:
        async with self._lock:
            resp = await self.sim.append(self.request_id, self.seq, msg)
            if resp.status_code == 200:
                self.seq += 1
            return resp

    async def start(self, run_request: agent.AgentRunRequest) -> httpx.Response:
        assert self.seq == 0, "the run_request is the append with seqno 0"
        return await self.send(agent.AgentClientMessage(run_request=run_request))

    async def stream(
        self,
        tr: Transcript,
        *,
        until: Callable[[Recorded, Transcript], bool] | None = None,
        auto_reply: bool = True,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Open a RunSSE for this request id and read it into ``tr`` (``task_status.started()``
        once the response headers arrived). Returns at EndStream, or drops the connection as
        soon as ``until`` returns True for a frame. KV SETs/GETs are answered from the sim's
        blob store when ``auto_reply``."""
        body = encode_frame(bytes(aiserver.BidiRequestId(request_id=self.request_id)))
        async with self.sim.client.stream(
            "POST",
            self.sim.base_url + RUN_SSE,
            content=body,
            headers={"content-type": "application/connect+proto", "connect-protocol-version": "1"},
        ) as resp:
            assert resp.status_code == 200
            task_status.started()
            decoder = FrameDecoder()
            async for chunk in resp.aiter_bytes():
                for frame in decoder.feed(chunk):
                    if frame.end_stream:
                        tr.end_stream = json.loads(frame.payload)
                        return
                    msg = agent.AgentServerMessage.parse(frame.payload)
                    rec = Recorded(msg, frame_kind(msg), frozenset(self.acked))
                    tr.frames.append(rec)
                    if auto_reply:
                        for reply in self.sim.auto_reply(msg, self.acked):
                            name, _ = betterproto2.which_one_of(reply, "message")
                            tr.appends.append((self.seq, name))
                            (await self.send(reply)).raise_for_status()
                    if until is not None and until(rec, tr):
                        return  # leaving the context closes the connection mid-stream


# --- a daemon with custom [server] settings ----------------------------------------------------


@attrs.define
class LiveDaemon:
    base_url: str
    provider: FakeProvider
    sim: CursorSim
    client: httpx.AsyncClient
    data_dir: Path
    stop: Callable[[], None]
    stopped: trio.Event


@asynccontextmanager
async def live_daemon(tmp_path: Path, nursery: trio.Nursery, server: str = "") -> AsyncIterator[LiveDaemon]:
    """The real daemon with extra ``[server]`` lines (e.g. ``reconnect_grace_s = 0.3``)."""
    from tests.integration.conftest import write_config

    provider = FakeProvider()
    url = await provider.start(nursery)
    data_dir = tmp_path / "data"
    cfg = tmp_path / "byok.toml"
    write_config(cfg, provider_url=url, data_dir=data_dir)
    marker = "kv_ack_timeout_s = 5.0"
    cfg.write_text(cfg.read_text().replace(marker, f"{marker}\n{server}"))
    stopped = trio.Event()

    async def serve(task_status: trio.TaskStatus[tuple[str, Callable[[], None]]]) -> None:
        try:
            await run_daemon(load_config(cfg, overrides={}), task_status=task_status)
        finally:
            stopped.set()

    base_url, stop = await nursery.start(serve)
    async with httpx.AsyncClient(timeout=30) as client:
        yield LiveDaemon(base_url, provider, CursorSim(base_url, client), client, data_dir, stop, stopped)
    stop()


# --- history invariants ------------------------------------------------------------------------


def provider_histories(provider: FakeProvider) -> list[list[dict[str, Any]]]:
    return [r.json["messages"] for r in provider.requests]


def _dump(m: dict[str, Any]) -> str:
    return json.dumps(m, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def assert_no_dangling_call(messages: list[dict[str, Any]]) -> None:
    """Every assistant tool call is answered right after it, and every tool result answers one."""
    i = 0
    while i < len(messages):
        m = messages[i]
        if m["role"] == "tool":
            raise AssertionError(f"orphan tool result {m.get('tool_call_id')!r} at {i}")
        if m["role"] == "assistant" and m.get("tool_calls"):
            want = {c["id"] for c in m["tool_calls"]}
            got: set[str] = set()
            i += 1
            while i < len(messages) and messages[i]["role"] == "tool":
                got.add(messages[i]["tool_call_id"])
                i += 1
            assert got == want, f"tool calls {sorted(want)} answered by {sorted(got)}"
            continue
        i += 1


def assert_no_duplicate(messages: list[dict[str, Any]]) -> None:
    dumps = [_dump(m) for m in messages]
    dup = [d for d in set(dumps) if dumps.count(d) > 1]
    assert not dup, f"duplicated message(s) in a provider request: {dup}"


def assert_history_invariants(provider: FakeProvider, *, prefix: bool = True) -> None:
    """No dangling call and no duplicate in any provider request; with ``prefix``, every request
    starts with the whole previous one."""
    histories = provider_histories(provider)
    for h in histories:
        assert_no_dangling_call(h)
        assert_no_duplicate(h)
    if prefix:
        for before, after in itertools.pairwise(histories):
            assert [_dump(m) for m in after[: len(before)]] == [_dump(m) for m in before], (
                "a provider request rewrote history"
            )


def assert_store_has_no_duplicate(data_dir: Path, conversation_id: str) -> None:
    with SQLiteStore.open_in(data_dir) as store:
        encoded = [m.encode() for m in store.head(conversation_id).messages]
    assert len(encoded) == len(set(encoded)), "the committed history holds a message twice"


async def wait_call_records(
    data_dir: Path, request_id: str, count: int = 1, timeout_s: float = 10.0
) -> list[LlmCallRecord]:
    """The run's provider-call records once ``count`` are written: the call log writes them
    after the runs go quiet, so just after the run's end they may not be there yet."""
    with trio.fail_after(timeout_s):
        while True:
            with SQLiteStore.open_in(data_dir) as store:
                calls = store.llm_calls(request_id)
            if len(calls) >= count:
                return calls
            await trio.sleep(0.01)


async def wait_run_ended(data_dir: Path, request_id: str, timeout_s: float = 5.0) -> RunRecord:
    """The run's terminal record (it is written just after EndStream, so poll briefly)."""
    with trio.fail_after(timeout_s):
        while True:
            with SQLiteStore.open_in(data_dir) as store:
                run = store.run(request_id)
            if run is not None and run.status != "running":
                return run
            await trio.sleep(0.01)
