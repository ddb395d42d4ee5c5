"""A Cursor client simulator that speaks RunSSE + BidiAppend over real HTTP.

It does what Cursor's client does for an agent run: opens RunSSE with the request id,
posts BidiAppends one at a time with seqnos from 0, keeps a blob store (verifying every
SET's SHA-256 and answering GETs), and records every frame. Used by the integration tests
and by `byok simulate`.

With a ``WorkspaceExecutor`` it also runs Execs against a real folder, each in its own task
(so they overlap and may finish out of order, as in Cursor), and honours server aborts.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import attrs
import betterproto2
import httpx
import trio

from byok.cursor import proto_decode
from byok.http.connect_envelope import Frame, FrameDecoder, encode_frame
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
    # CursorSim.run: the blob ids whose SET the client had answered with a successful
    # set_blob_result append (the POST made) by the time this frame was read off RunSSE. The
    # stream is read by its own task, so a frame the server sent before it got those ACKs is
    # stamped without them even while the client is still posting them.
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


# What CursorSim.run's stream reader hands over: a frame with the ACKs posted before it was read,
# the read error, or None when the stream ended without EndStream.
_Received = tuple[Frame, frozenset[bytes]] | Exception | None


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


Reply = Callable[[agent.AgentClientMessage], Awaitable[None]]
# (the run's request id, the exec, its reply) -> whether it handled the exec
AsyncExec = Callable[[str, agent.ExecServerMessage, Reply], Awaitable[bool]]


class CursorSim:
    def __init__(
        self,
        base_url: str,
        client: httpx.AsyncClient,
        *,
        executor: WorkspaceExecutor | None = None,
        exec_delay: Callable[[agent.ExecServerMessage], float] | None = None,
        on_exec: Callable[[agent.ExecServerMessage], list[agent.AgentClientMessage] | None] | None = None,
        on_query: Callable[[agent.InteractionQuery], list[agent.AgentClientMessage] | None] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.client = client
        self.blobs: dict[bytes, bytes] = {}  # the client's blob store, kept across runs
        self.kv_reply: Callable[[agent.KvServerMessage], agent.KvClientMessage | None] | None = None
        # Seconds to take over a KV request before answering it (a slow client store); the
        # frames after it wait, as each is handled in turn.
        self.kv_delay: Callable[[agent.KvServerMessage], float] | None = None
        # Execs are only answered when an executor is set or on_exec returns messages; without
        # either the sim ignores them (as before), leaving tests to answer through on_frame.
        self.executor = executor
        self.exec_delay = exec_delay  # seconds to hold a given exec before running it
        self.on_exec = on_exec  # fault injection: messages to send instead of executing (None: execute)
        # The user's side of an InteractionQuery (approve, answer, reject): the messages to send,
        # or None to leave the query unanswered (as a user who has not clicked yet).
        self.on_query = on_query
        # Seconds the user takes before their answer to a query goes out (a late answer); the
        # run's other frames are handled meanwhile.
        self.query_delay: Callable[[agent.InteractionQuery], float] | None = None
        # Execs the client answers by doing more than one thing (Task runs a child run): the
        # handler answers through ``reply`` and returns True, or returns False to pass.
        self.async_exec: AsyncExec | None = None
        # How a frame's payload is decoded; benchmarks swap in one that skips what they don't read.
        self.parse_frame: Callable[[bytes], agent.AgentServerMessage] = functools.partial(
            proto_decode.parse, agent.AgentServerMessage
        )

    async def append(
        self,
        request_id: str,
        seqno: int,
        msg: agent.AgentClientMessage,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        req = aiserver.BidiAppendRequest(
            data=bytes(msg).hex(),
            request_id=aiserver.BidiRequestId(request_id=request_id),
            append_seqno=seqno,
        )
        return await self.client.post(
            self.base_url + BIDI_APPEND,
            content=bytes(req),
            headers={"content-type": "application/proto", "connect-protocol-version": "1", **(headers or {})},
        )

    async def run(
        self,
        request_id: str,
        run_request: agent.AgentRunRequest,
        *,
        sse_first: bool = True,
        on_frame: Callable[[Recorded, Transcript], list[agent.AgentClientMessage]] | None = None,
        cancel: trio.Event | None = None,
        headers: dict[str, str] | None = None,
    ) -> Transcript:
        """Drive one run to its end-stream. ``on_frame`` may return extra client messages to send;
        once ``cancel`` is set the run is cancelled (the user's stop button) and read to its end.
        ``headers`` go with every append (a subagent's run names its parent's)."""
        tr = Transcript()
        seq = 0
        set_ids: dict[int, bytes] = {}  # kv id -> blob id of each SET the server sent
        acked: set[bytes] = set()  # blob ids whose successful set_blob_result append was posted
        lock = trio.Lock()

        async def send(msg: agent.AgentClientMessage) -> int:
            """Post one append; returns its index in tr.appends."""
            nonlocal seq
            async with lock:  # Cursor awaits each append before the next one
                name, value = betterproto2.which_one_of(msg, "message")
                if name == "kv_client_message":
                    result = value.set_blob_result
                    if result is not None and result.error is None and value.id in set_ids:
                        # Counted from the moment the POST starts, not its answer: the server
                        # may act on an ACK (send the checkpoint) before its HTTP 200 is read.
                        acked.add(set_ids[value.id])
                tr.appends.append((seq, name))
                resp = await self.append(request_id, seq, msg, headers)
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
            elif self.async_exec is not None and await self.async_exec(request_id, msg, reply):
                pass
            elif self.executor is not None:
                await self.executor.run(msg, reply, delay=delay)

        async def answer_later(delay: float, answers: list[agent.AgentClientMessage]) -> None:
            await trio.sleep(delay)
            for answer in answers:
                if tr.end_stream is None:
                    await send(answer)

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

        async def receive(
            resp: httpx.Response,
            out: trio.MemorySendChannel[_Received],
            scope: trio.CancelScope,
            finished: trio.Event,
        ) -> None:
            """Read RunSSE as its bytes arrive, stamping each frame with the ACKs posted by then.

            The frames are handled (and answered) by read_frames, one at a time, each append
            awaited; reading on meanwhile is what lets a frame the server sent before it had an
            ACK be seen as such. A read error is handed over too, to surface after the frames
            read before it, as when one task did both."""
            try:
                with scope:
                    decoder = FrameDecoder()
                    try:
                        async for chunk in resp.aiter_bytes():
                            for frame in decoder.feed(chunk):
                                out.send_nowait((frame, frozenset(acked)))
                                if frame.end_stream:
                                    return
                    except Exception as e:
                        out.send_nowait(e)
                    else:
                        out.send_nowait(None)  # the stream ended without EndStream
            finally:
                finished.set()

        async def read_frames(execs: trio.Nursery) -> None:
            body = encode_frame(bytes(aiserver.BidiRequestId(request_id=request_id)))
            async with self.client.stream(
                "POST",
                self.base_url + RUN_SSE,
                content=body,
                headers={"content-type": "application/connect+proto", "connect-protocol-version": "1"},
            ) as resp:
                opened.set()
                # Unbounded: the reader never waits for the handling (that waits for appends).
                to_handle, received = trio.open_memory_channel[_Received](math.inf)
                reading, read_done = trio.CancelScope(), trio.Event()
                execs.start_soon(receive, resp, to_handle, reading, read_done)
                try:
                    while True:
                        item = await received.receive()
                        if item is None:
                            return
                        if isinstance(item, Exception):
                            raise item
                        frame, acked_then = item
                        if frame.end_stream:
                            tr.end_stream = json.loads(frame.payload)
                            return
                        msg = self.parse_frame(frame.payload)
                        rec = Recorded(msg, frame_kind(msg), acked_then)
                        tr.frames.append(rec)
                        if (kv := msg.kv_server_message) is not None and kv.set_blob_args is not None:
                            set_ids[kv.id] = kv.set_blob_args.blob_id
                        on_exec_frame(msg, execs)
                        if (query := msg.interaction_query) is not None and self.on_query is not None:
                            answers = self.on_query(query) or []
                            delay = self.query_delay(query) if self.query_delay is not None else 0.0
                            if delay > 0:
                                execs.start_soon(answer_later, delay, answers)
                            for answer in [] if delay > 0 else answers:
                                await send(answer)
                        if (kv := msg.kv_server_message) is not None and self.kv_delay is not None:
                            await trio.sleep(self.kv_delay(kv))
                        for reply in self.auto_reply(msg):
                            await send(reply)
                        if on_frame is not None:
                            for extra in on_frame(rec, tr):
                                await send(extra)
                finally:
                    # The reader is done with the response before it is closed.
                    reading.cancel()
                    with trio.CancelScope(shield=True):
                        await read_done.wait()

        watching = trio.CancelScope()

        async def read_all() -> None:
            try:
                await read_stream()
            finally:
                watching.cancel()  # a run that ended needs no cancel

        async def cancel_when_set(event: trio.Event) -> None:
            with watching:
                await event.wait()
                await send(cancel_message())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all)
            if sse_first:
                await opened.wait()
            await send(agent.AgentClientMessage(run_request=run_request))
            if cancel is not None:
                nursery.start_soon(cancel_when_set, cancel)
        return tr

    def auto_reply(
        self, msg: agent.AgentServerMessage, acked: set[bytes] | None = None
    ) -> list[agent.AgentClientMessage]:
        """The answer to a KV SET/GET from the blob store; a verified SET's id is added to
        ``acked`` when given (callers that post the answers themselves track their ACKs there)."""
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
                if acked is not None:
                    acked.add(args.blob_id)
                result = agent.SetBlobResult()
            reply = agent.KvClientMessage(id=kv.id, set_blob_result=result)
        else:
            assert kv.get_blob_args is not None
            data = self.blobs.get(kv.get_blob_args.blob_id)
            reply = agent.KvClientMessage(id=kv.id, get_blob_result=agent.GetBlobResult(blob_data=data))
        return [agent.AgentClientMessage(kv_client_message=reply)]


def cancel_message() -> agent.AgentClientMessage:
    """What Cursor sends when the user stops a run."""
    return agent.AgentClientMessage(
        conversation_action=agent.ConversationAction(cancel_action=agent.CancelAction())
    )


def interaction_answer(query: agent.InteractionQuery, **result: object) -> agent.AgentClientMessage:
    """The client's InteractionResponse to ``query`` (same id), with one result variant set."""
    response = agent.InteractionResponse(id=query.id, **result)  # type: ignore[arg-type]
    return agent.AgentClientMessage(interaction_response=response)


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
