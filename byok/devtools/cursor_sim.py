"""A Cursor client simulator that speaks RunSSE + BidiAppend over real HTTP.

It does what Cursor's client does for an agent run: opens RunSSE with the request id,
posts BidiAppends one at a time with seqnos from 0, keeps a blob store (verifying every
SET's SHA-256 and answering GETs), and records every frame. Used by the integration tests
and by `byok simulate`.

With a ``WorkspaceExecutor`` it also runs Execs against a real folder, each in its own task
(so they overlap and may finish out of order, as in Cursor), and honours server aborts.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import betterproto2
import httpx
import trio

from byok.http.connect_envelope import FrameDecoder, encode_frame
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver

if TYPE_CHECKING:
    from byok.devtools.workspace_exec import WorkspaceExecutor

RUN_SSE = "/agent.v1.AgentService/RunSSE"
BIDI_APPEND = "/aiserver.v1.BidiService/BidiAppend"


@attrs.define
class Recorded:
    """One server frame, with the blob ids the client had ACKed when it arrived."""

    message: agent.AgentServerMessage
    kind: str  # "interaction_update.text_delta", "kv_server_message.set_blob_args", ...
    acked_before: frozenset[bytes]
    at: float = attrs.field(factory=time.monotonic)  # when the frame arrived


@attrs.define
class ExecRecord:
    """One ExecServerMessage the client handled, and where its answers landed among the appends."""

    id: int
    exec_id: str
    kind: str  # the ExecServerMessage oneof: "read_args", "shell_stream_args", ...
    frame_index: int  # index into Transcript.frames
    appends: list[int] = attrs.Factory(list)  # indexes into Transcript.appends, in order
    aborted: bool = False  # the server sent exec_server_control_message.abort for it

    @property
    def done_at(self) -> int | None:
        """Index into Transcript.appends of its last message (normally the stream_close)."""
        return self.appends[-1] if self.appends else None


@attrs.define
class Transcript:
    frames: list[Recorded] = attrs.Factory(list)
    end_stream: dict[str, Any] | None = None
    appends: list[tuple[int, str]] = attrs.Factory(list)  # (seqno, oneof name) as sent
    execs: list[ExecRecord] = attrs.Factory(list)  # in the order the server sent them

    def exec_completion_order(self) -> list[str]:
        """exec_ids of the answered execs, in the order their last message was sent."""
        done = [e for e in self.execs if e.done_at is not None]
        return [e.exec_id for e in sorted(done, key=lambda e: e.done_at or 0)]

    def kinds(self, *, skip: tuple[str, ...] = ("interaction_update.heartbeat",)) -> list[str]:
        return [f.kind for f in self.frames if f.kind not in skip]

    def text(self) -> str:
        return "".join(
            f.message.interaction_update.text_delta.text
            for f in self.frames
            if f.kind == "interaction_update.text_delta"
        )

    def checkpoints(self) -> list[agent.ConversationStateStructure]:
        return [
            f.message.conversation_checkpoint_update
            for f in self.frames
            if f.kind == "conversation_checkpoint"
        ]

    @property
    def error(self) -> dict[str, Any] | None:
        return None if self.end_stream is None else self.end_stream.get("error")


def frame_kind(msg: agent.AgentServerMessage) -> str:
    name, value = betterproto2.which_one_of(msg, "message")
    if name == "conversation_checkpoint_update":
        return "conversation_checkpoint"
    inner = ""
    if value is not None:
        for group in ("message", "query"):
            try:
                inner, _ = betterproto2.which_one_of(value, group)
            except Exception:
                continue
            if inner:
                break
    return f"{name}.{inner}" if inner else name


class CursorSim:
    def __init__(
        self,
        base_url: str,
        client: httpx.AsyncClient,
        *,
        executor: WorkspaceExecutor | None = None,
        exec_delay: Callable[[agent.ExecServerMessage], float] | None = None,
        on_exec: Callable[[agent.ExecServerMessage], list[agent.AgentClientMessage] | None] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.client = client
        self.blobs: dict[bytes, bytes] = {}  # the client's blob store, kept across runs
        self.kv_reply: Callable[[agent.KvServerMessage], agent.KvClientMessage | None] | None = None
        # Execs are only answered when an executor is set or on_exec returns messages; without
        # either the sim ignores them (as before), leaving tests to answer through on_frame.
        self.executor = executor
        self.exec_delay = exec_delay  # seconds to hold a given exec before running it
        self.on_exec = on_exec  # fault injection: messages to send instead of executing (None: execute)
        # How a frame's payload is decoded; benchmarks swap in one that skips what they don't read.
        self.parse_frame: Callable[[bytes], agent.AgentServerMessage] = agent.AgentServerMessage.parse

    async def append(self, request_id: str, seqno: int, msg: agent.AgentClientMessage) -> httpx.Response:
        req = aiserver.BidiAppendRequest(
            data=bytes(msg).hex(),
            request_id=aiserver.BidiRequestId(request_id=request_id),
            append_seqno=seqno,
        )
        return await self.client.post(
            self.base_url + BIDI_APPEND,
            content=bytes(req),
            headers={"content-type": "application/proto", "connect-protocol-version": "1"},
        )

    async def run(
        self,
        request_id: str,
        run_request: agent.AgentRunRequest,
        *,
        sse_first: bool = True,
        on_frame: Callable[[Recorded, Transcript], list[agent.AgentClientMessage]] | None = None,
    ) -> Transcript:
        """Drive one run to its end-stream. ``on_frame`` may return extra client messages to send."""
        tr = Transcript()
        seq = 0
        acked: set[bytes] = set()
        lock = trio.Lock()

        async def send(msg: agent.AgentClientMessage) -> int:
            """Post one append; returns its index in tr.appends."""
            nonlocal seq
            async with lock:  # Cursor awaits each append before the next one
                name, _ = betterproto2.which_one_of(msg, "message")
                tr.appends.append((seq, name))
                resp = await self.append(request_id, seq, msg)
                resp.raise_for_status()
                seq += 1
                return len(tr.appends) - 1

        opened = trio.Event()
        exec_records: dict[int, ExecRecord] = {}

        async def run_exec(msg: agent.ExecServerMessage, rec: ExecRecord) -> None:
            async def reply(out: agent.AgentClientMessage) -> None:
                if tr.end_stream is not None:
                    return  # the run is over: the server no longer reads this exec's answers
                rec.appends.append(await send(out))

            delay = self.exec_delay(msg) if self.exec_delay is not None else 0.0
            custom = self.on_exec(msg) if self.on_exec is not None else None
            if custom is not None:
                await trio.sleep(delay)
                for out in custom:
                    await reply(out)
            elif self.executor is not None:
                await self.executor.run(msg, reply, delay=delay)

        def on_exec_frame(frame: agent.AgentServerMessage, execs: trio.Nursery) -> None:
            if (msg := frame.exec_server_message) is not None:
                if self.executor is None and self.on_exec is None:
                    return
                kind, _ = betterproto2.which_one_of(msg, "message")
                rec = ExecRecord(msg.id, msg.exec_id, kind, len(tr.frames) - 1)
                tr.execs.append(rec)
                exec_records[msg.id] = rec
                execs.start_soon(run_exec, msg, rec)
            control = frame.exec_server_control_message
            if control is not None and control.abort is not None:
                if (rec := exec_records.get(control.abort.id)) is not None:
                    rec.aborted = True
                if self.executor is not None:
                    self.executor.abort(control.abort.id)

        async def read_stream() -> None:
            # Execs run in their own nursery, cancelled when the stream ends: once the server has
            # finished the run nobody is waiting for their answers.
            async with trio.open_nursery() as execs:
                await read_frames(execs)
                execs.cancel_scope.cancel()

        async def read_frames(execs: trio.Nursery) -> None:
            body = encode_frame(bytes(aiserver.BidiRequestId(request_id=request_id)))
            async with self.client.stream(
                "POST",
                self.base_url + RUN_SSE,
                content=body,
                headers={"content-type": "application/connect+proto", "connect-protocol-version": "1"},
            ) as resp:
                opened.set()
                decoder = FrameDecoder()
                async for chunk in resp.aiter_bytes():
                    for frame in decoder.feed(chunk):
                        if frame.end_stream:
                            tr.end_stream = json.loads(frame.payload)
                            return
                        msg = self.parse_frame(frame.payload)
                        rec = Recorded(msg, frame_kind(msg), frozenset(acked))
                        tr.frames.append(rec)
                        on_exec_frame(msg, execs)
                        for reply in self.auto_reply(msg, acked):
                            await send(reply)
                        if on_frame is not None:
                            for extra in on_frame(rec, tr):
                                await send(extra)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_stream)
            if sse_first:
                await opened.wait()
            await send(agent.AgentClientMessage(run_request=run_request))
        return tr

    def auto_reply(self, msg: agent.AgentServerMessage, acked: set[bytes]) -> list[agent.AgentClientMessage]:
        kv = msg.kv_server_message
        if kv is None:
            return []
        if self.kv_reply is not None:
            custom = self.kv_reply(kv)
            return [] if custom is None else [agent.AgentClientMessage(kv_client_message=custom)]
        if kv.set_blob_args is not None:
            args = kv.set_blob_args
            if hashlib.sha256(args.blob_data).digest() != args.blob_id:
                result = agent.SetBlobResult(error=agent.Error(message="blob id does not match its data"))
            else:
                self.blobs[args.blob_id] = args.blob_data
                acked.add(args.blob_id)
                result = agent.SetBlobResult()
            reply = agent.KvClientMessage(id=kv.id, set_blob_result=result)
        else:
            assert kv.get_blob_args is not None
            data = self.blobs.get(kv.get_blob_args.blob_id)
            reply = agent.KvClientMessage(id=kv.id, get_blob_result=agent.GetBlobResult(blob_data=data))
        return [agent.AgentClientMessage(kv_client_message=reply)]


def user_turn(
    text: str,
    *,
    conversation_id: str,
    model_id: str,
    message_id: str,
    mode: agent.AgentMode = agent.AgentMode.AGENT,
    state: agent.ConversationStateStructure | None = None,
) -> agent.AgentRunRequest:
    """The run_request Cursor sends when the user submits a message."""
    return agent.AgentRunRequest(
        conversation_state=state or agent.ConversationStateStructure(),
        action=agent.ConversationAction(
            user_message_action=agent.UserMessageAction(
                user_message=agent.UserMessage(text=text, message_id=message_id, mode=mode),
                request_context=agent.RequestContext(),
            )
        ),
        requested_model=agent.RequestedModel(model_id=model_id),
        conversation_id=conversation_id,
    )
