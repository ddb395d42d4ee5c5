"""The byok ASGI app: the two agent RPCs, health, and everything else streamed upstream."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import betterproto2
import trio

from byok.config import Config
from byok.cursor import encode
from byok.cursor.request import RunRequestError, RunStart, parse_run_request, requested_model_id
from byok.http import state_ids
from byok.http.asgi import (
    BodyTooLarge,
    ClientGone,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    replay_receive,
    respond,
    respond_connect_error,
    respond_json,
)
from byok.http.connect_envelope import (
    ConnectError,
    FrameDecoder,
    ProtocolError,
    decode_unary_body,
    encode_frame,
    end_stream_error,
)
from byok.http.model_list import ModelListRoutes
from byok.http.offline import OfflineAnswers, UpstreamHealth
from byok.http.wire_check import well_typed
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from byok.run.bidi_order import OrderBufferFull
from byok.run.conversation import ActiveRun, Supervisors
from byok.run.runner import Run, RunDeps
from byok.run.slot import RunRegistry, RunSlot
from byok.run.upkeep import RunActivity

log = logging.getLogger("byok.http")

RUN_SSE = "/agent.v1.AgentService/RunSSE"
RUN_BIDI = "/agent.v1.AgentService/Run"
BIDI_APPEND = "/aiserver.v1.BidiService/BidiAppend"
HEALTHZ = "/byok/healthz"
# A finished run's slot lingers so late appends (ACKs, heartbeats) are dropped idempotently.
SLOT_LINGER_S = 120.0
# Frames already queued are coalesced into one write up to this size.
MAX_WRITE_BYTES = 256 * 1024
# How long a RunSSE waits for the run_request that decides whether byok runs it.
DECISION_TIMEOUT_S = 300.0


async def _watch_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


def _parse_client_message(raw: bytes) -> agent.AgentClientMessage | None:
    """None for anything that is not exactly one AgentClientMessage variant (betterproto2
    raises on undecodable bytes and on two members of the oneof)."""
    lifted = state_ids.lift(raw)
    try:
        msg = agent.AgentClientMessage.parse(raw if lifted is None else lifted.rest)
        name, _ = betterproto2.which_one_of(msg, "message")
    except Exception:
        return None
    if not name or not well_typed(msg):
        return None
    if lifted is not None:
        # The checkpoint's id lists were scanned, not parsed: put them back in place.
        state = msg.run_request.conversation_state  # type: ignore[union-attr]
        state.root_prompt_messages_json = lifted.roots  # type: ignore[union-attr]
        state.turns = lifted.turns  # type: ignore[union-attr]
    return msg


def decode_agent_message(data: str) -> agent.AgentClientMessage | None:
    """The append's AgentClientMessage, or None when data is not one (CLARIFICATIONS §1)."""
    try:
        raw = bytes.fromhex(data)
    except ValueError:
        return None
    return _parse_client_message(raw)


class App:
    def __init__(
        self,
        *,
        config: Config,
        deps: RunDeps,
        nursery: trio.Nursery,
        forward: Any,
        model_list: ModelListRoutes | None = None,
        offline: OfflineAnswers | None = None,
        health: UpstreamHealth | None = None,
    ) -> None:
        self.config = config
        self.model_list = model_list
        self.offline = offline
        self.health = health
        self.deps = deps
        self.nursery = nursery
        self.forward = forward
        self.registry = RunRegistry()
        self.supervisors = Supervisors()
        self.max_body = config.server.max_body_bytes
        self.accepting = True
        self.streams = 0  # RunSSE / Run responses currently writing frames
        self._streams_idle = trio.Event()
        self._streams_idle.set()
        self.active: set[ActiveRun] = set()
        self._idle = trio.Event()
        self._idle.set()
        self.activity = RunActivity()  # what upkeep between runs waits for (run/upkeep.py)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"]
        method = scope["method"]
        try:
            if path == RUN_SSE and method == "POST":
                await self.run_sse(scope, receive, send)
            elif path == RUN_BIDI and method == "POST":
                await self.run_bidi(scope, receive, send)
            elif path == BIDI_APPEND and method == "POST":
                await self.bidi_append(scope, receive, send)
            elif path == HEALTHZ and method == "GET":
                await respond_json(send, 200, {"status": "ok", "models": [m.id for m in self.config.models]})
            elif self.model_list is not None and await self.model_list.handle(scope, receive, send):
                pass
            elif self.offline is not None and self.offline.matches(scope) and not await self._upstream_ok():
                await self.offline.handle(scope, receive, send, upstream_ok=False)
            else:
                await self.forward(scope, receive, send)
        except ClientGone:
            return

    async def _upstream_ok(self) -> bool:
        return self.health is None or await self.health.reachable()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            event = await receive()
            if event["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif event["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    # --- BidiAppend -------------------------------------------------------------------
    async def bidi_append(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = await read_body(receive, self.max_body)
        except BodyTooLarge as e:
            await respond_connect_error(send, ConnectError("resource_exhausted", str(e)))
            return
        try:
            raw = decode_unary_body(
                body, header(scope, "content-type") or "", header(scope, "content-encoding")
            )
            req = aiserver.BidiAppendRequest.parse(raw)
            if not well_typed(req):
                raise ValueError("fields of the wrong wire type")
        except (ProtocolError, Exception) as e:
            await respond_connect_error(
                send, ConnectError("invalid_argument", f"undecodable BidiAppendRequest: {e}")
            )
            return
        rid = req.request_id.request_id if req.request_id is not None else ""
        if not rid:
            await respond_connect_error(
                send, ConnectError("invalid_argument", "BidiAppend has no request_id")
            )
            return
        slot = self.registry.get(rid)
        if slot is not None and slot.kind == "relay":
            await self.forward(scope, replay_receive(body, receive), send)
            return
        msg = decode_agent_message(req.data)
        if msg is None:
            if slot is not None and (slot.kind == "agent" or slot.runsse_open):
                err = ConnectError("invalid_argument", "BidiAppend data is not a hex AgentClientMessage")
                log.warning("request %s: %s (seqno %s)", rid, err.message, req.append_seqno)
                await respond_connect_error(send, err)
                return
            # Another RPC sharing BidiAppend (speech-to-text...): relay it and all its later appends.
            self.registry.get_or_create(rid).decide("relay")
            await self.forward(scope, replay_receive(body, receive), send)
            return
        if req.data_binary:
            await respond_connect_error(
                send, ConnectError("invalid_argument", "data_binary is not supported")
            )
            return
        slot = self.registry.get_or_create(rid)
        if (
            slot.kind == "unknown"
            and msg.run_request is not None
            and req.append_seqno == 0
            and requested_model_id(msg.run_request)  # no model at all is our invalid_argument
            and not self._is_local_model(requested_model_id(msg.run_request))
        ):
            # An official (or unknown) model: the whole run goes to upstream, unchanged.
            log.info(
                "request %s: model %r is not a byok model, relaying the run",
                rid,
                requested_model_id(msg.run_request),
            )
            slot.decide("relay")
            await self.forward(scope, replay_receive(body, receive), send)
            return
        if slot.kind == "unknown":
            slot.decide("agent")
        err = self._append(slot, req.append_seqno, msg, len(req.data))
        try:
            if err is not None:
                log.warning("request %s: append %s rejected: %s", rid, req.append_seqno, err)
                await respond_connect_error(send, err)
                return
            await respond(send, 200, b"", "application/proto")
        finally:
            slot.release()

    def _append(
        self, slot: RunSlot, seqno: int, msg: agent.AgentClientMessage, size: int
    ) -> ConnectError | None:
        if slot.closed or slot.order.is_duplicate(seqno):
            return None  # late or repeated: idempotent
        is_run_request = msg.run_request is not None
        if (seqno == 0) != is_run_request:
            text = (
                "the first BidiAppend (seqno 0) must carry run_request"
                if seqno == 0
                else f"run_request at seqno {seqno}: a run has exactly one, at seqno 0"
            )
            return ConnectError("invalid_argument", text)
        try:
            ready = slot.order.offer(seqno, msg, size)
        except OrderBufferFull as e:
            return ConnectError("resource_exhausted", str(e))
        for item in ready:
            if item.run_request is not None:
                err = self._start_run(slot, item.run_request)
                if err is not None:
                    return err
            else:
                slot.hold(item)  # released once the append is answered
        return None

    def _is_local_model(self, model_id: str) -> bool:
        model = self.config.model(model_id) if model_id else None
        return model is not None and model.enabled

    def _start_run(self, slot: RunSlot, req: agent.AgentRunRequest) -> ConnectError | None:
        try:
            if not self.accepting:
                raise RunRequestError("unavailable", "byok is shutting down")
            start = parse_run_request(slot.request_id, req)
            if self.config.model(start.model_id) is None:
                raise RunRequestError("not_found", f"model {start.model_id!r} is not configured in byok")
        except RunRequestError as e:
            err = ConnectError(e.code, e.message)  # type: ignore[arg-type]
            slot.close(end_stream_error(err))
            self.nursery.start_soon(self._linger, slot)
            return err
        slot.run_started = True
        self.nursery.start_soon(self._run_task, slot, start)
        return None

    async def _run_task(self, slot: RunSlot, start: RunStart) -> None:
        sup = self.supervisors.get(start.conversation_id)
        me = ActiveRun(start.request_id, trio.CancelScope(), trio.Event())
        old, sup.active = sup.active, me
        slot.cancel_run = me.scope.cancel
        self.active.add(me)
        self.activity.started()
        if self._idle.is_set():
            self._idle = trio.Event()
        try:
            if old is not None:
                log.info("run %s preempts run %s", start.request_id, old.request_id)
                old.scope.cancel()
                await old.done.wait()
            await Run(slot, start, self.deps, sup).run(me.scope)
        finally:
            me.done.set()
            slot.finished.set()
            slot.cancel_run = None
            if sup.active is me:
                sup.active = None
            self.active.discard(me)
            self.activity.finished()
            if not self.active:
                self._idle.set()
            self.nursery.start_soon(self._linger, slot)

    async def shutdown(self, grace_s: float) -> None:
        """Stop accepting runs, let active ones finish within ``grace_s``, then cancel the rest."""
        self.accepting = False
        with trio.move_on_after(grace_s):
            await self._idle.wait()
        for run in list(self.active):
            log.info("shutdown: cancelling run %s", run.request_id)
            run.scope.cancel()
        await self._idle.wait()

    async def _grace(self, slot: RunSlot) -> None:
        """A dropped RunSSE: keep the run for a reconnect; cancel it when the grace runs out."""
        grace = self.config.server.reconnect_grace_s
        reattached = slot.attached_event
        with trio.move_on_after(grace):
            await reattached.wait()
            return
        if not slot.closed and slot.cancel_run is not None:
            log.info("request %s: RunSSE gone for %gs, cancelling the run", slot.request_id, grace)
            slot.cancel_run()

    async def _linger(self, slot: RunSlot) -> None:
        await trio.sleep(SLOT_LINGER_S)
        self.registry.remove(slot.request_id, slot)

    # --- RunSSE -----------------------------------------------------------------------
    async def run_sse(self, scope: Scope, receive: Receive, send: Send) -> None:
        err: ConnectError | None = None
        rid = ""
        try:
            body = await read_body(receive, self.max_body)
            raw = decode_unary_body(
                body, header(scope, "content-type") or "", header(scope, "content-encoding")
            )
            ident = aiserver.BidiRequestId.parse(raw)
            if not well_typed(ident):
                raise ValueError("fields of the wrong wire type")
            rid = ident.request_id
            if not rid:
                err = ConnectError("invalid_argument", "RunSSE has no request_id")
        except BodyTooLarge as e:
            err = ConnectError("resource_exhausted", str(e))
        except (ProtocolError, Exception) as e:
            if isinstance(e, ClientGone):
                raise
            err = ConnectError("invalid_argument", f"undecodable BidiRequestId: {e}")
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/connect+proto"),
                    (b"cache-control", b"no-cache"),
                    (b"connect-protocol-version", b"1"),
                ],
            }
        )
        if err is not None:
            log.warning("RunSSE rejected: %s", err)
            await send({"type": "http.response.body", "body": end_stream_error(err), "more_body": False})
            return
        slot = self.registry.get_or_create(rid)
        slot.runsse_open = True
        if slot.kind == "unknown":
            # The first BidiAppend (the run_request) decides local or relayed; wait for it.
            with trio.move_on_after(DECISION_TIMEOUT_S):
                await slot.decided.wait()
            if slot.kind == "unknown":
                err = ConnectError("deadline_exceeded", "no run_request arrived for this RunSSE")
                await send({"type": "http.response.body", "body": end_stream_error(err), "more_body": False})
                return
        if slot.kind == "relay":
            await self.forward.relay_stream_body(scope, body, send)
            return
        await self._stream_frames(slot, receive, send)

    async def _stream_frames(
        self, slot: RunSlot, receive: Receive, send: Send, *, client_messages: bool = False
    ) -> None:
        """The one writer of a run's frames. With ``client_messages`` (the HTTP/2 Run call) the
        request body carries the client's messages and is read alongside, in frame order."""
        heartbeat = encode_frame(encode.heartbeat())
        interval = self.config.server.heartbeat_s
        self.streams += 1
        if self._streams_idle.is_set():
            self._streams_idle = trio.Event()
        try:
            await self._write_frames(slot, receive, send, client_messages, heartbeat, interval)
        finally:
            self.streams -= 1
            if not self.streams:
                self._streams_idle.set()

    async def drain_streams(self, timeout_s: float) -> None:
        """After shutdown: let finished runs' streams write their last frames (turn_ended,
        checkpoints, EndStream) before the server goes away."""
        with trio.move_on_after(timeout_s):
            await self._streams_idle.wait()

    async def _write_frames(
        self,
        slot: RunSlot,
        receive: Receive,
        send: Send,
        client_messages: bool,
        heartbeat: bytes,
        interval: float,
    ) -> None:
        ended = False
        sent_end = False
        with trio.CancelScope() as cs:
            slot.attach(cs)
            async with trio.open_nursery() as nursery:
                if client_messages:
                    nursery.start_soon(self._read_client_frames, slot, receive, cs)
                else:
                    nursery.start_soon(_watch_disconnect, receive, cs)
                try:
                    while not ended:
                        frame = None
                        with trio.move_on_after(interval):
                            try:
                                frame = await slot.frames.receive()
                            except trio.EndOfChannel:
                                ended = True
                                break
                        if frame is None:
                            await send({"type": "http.response.body", "body": heartbeat, "more_body": True})
                            continue
                        # Whatever else is already queued goes out in the same write: one send
                        # per burst, not per frame, and never a wait for more.
                        batch = [frame]
                        size = len(frame)
                        while size < MAX_WRITE_BYTES:
                            try:
                                nxt = slot.frames.receive_nowait()
                            except trio.WouldBlock:
                                break
                            except trio.EndOfChannel:
                                ended = True
                                break
                            batch.append(nxt)
                            size += len(nxt)
                        body = batch[0] if len(batch) == 1 else b"".join(batch)
                        await send({"type": "http.response.body", "body": body, "more_body": True})
                        if batch[-1] is slot.end_frame:
                            sent_end = True
                finally:
                    nursery.cancel_scope.cancel()
        if slot.detach(cs) and not ended and not slot.closed:
            self.nursery.start_soon(self._grace, slot)
        if ended:
            # The end frame went to an earlier stream that died: this one must carry it too.
            tail = slot.end_frame if not sent_end and slot.end_frame is not None else b""
            await send({"type": "http.response.body", "body": tail, "more_body": False})

    # --- HTTP/2 Run -------------------------------------------------------------------
    async def run_bidi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """`agent.v1.AgentService/Run`: one HTTP/2 bidi stream carrying what RunSSE + BidiAppend
        carry. The request id is the x-request-id header; client frames are numbered from 0 in
        order, exactly like BidiAppend seqnos, and feed the same slot."""
        rid = header(scope, "x-request-id") or str(uuid.uuid4())
        slot = self.registry.get_or_create(rid)
        slot.runsse_open = True
        slot.decide("agent")
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/connect+proto"),
                    (b"connect-protocol-version", b"1"),
                ],
            }
        )
        await self._stream_frames(slot, receive, send, client_messages=True)

    async def _read_client_frames(self, slot: RunSlot, receive: Receive, stream: trio.CancelScope) -> None:
        decoder = FrameDecoder(self.max_body)
        seqno = 0
        while True:
            event = await receive()
            if event["type"] == "http.disconnect":
                stream.cancel()
                return
            try:
                frames = decoder.feed(event.get("body", b""))
            except ProtocolError as e:
                self._fail_slot(slot, e.to_connect_error())
                return
            for frame in frames:
                if frame.end_stream:
                    continue
                msg = _parse_client_message(frame.payload)
                if msg is None:
                    err = ConnectError("invalid_argument", f"frame {seqno} is not an AgentClientMessage")
                    self._fail_slot(slot, err)
                    return
                err = self._append(slot, seqno, msg, len(frame.payload))
                slot.release()  # no per-message answer on a bidi stream
                seqno += 1
                if err is not None:
                    self._fail_slot(slot, err)
                    return
            if not event.get("more_body", False):
                # The client half-closed: keep streaming our frames until the run ends.
                await trio.sleep_forever()

    def _fail_slot(self, slot: RunSlot, err: ConnectError) -> None:
        log.warning("request %s: %s", slot.request_id, err)
        if slot.cancel_run is not None:
            slot.cancel_run()
        else:
            slot.close(end_stream_error(err))
