"""A run's response stream: RunSSE (frames out; the client's messages come as BidiAppends) and
the HTTP/2 Run (the client's messages come in on the same stream). One stream writes a slot's
frames at a time; a dropped RunSSE leaves the run a grace period to reattach."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import trio

from byok.config import Config
from byok.cursor import encode, proto_decode
from byok.cursor.request import requested_model_id
from byok.http.asgi import BodyTooLarge, ClientGone, Receive, Scope, Send, header, read_body
from byok.http.bidi_append import parse_client_message
from byok.http.bidi_relay import relay_bidi
from byok.http.connect_envelope import (
    ConnectError,
    Frame,
    FrameDecoder,
    ProtocolError,
    decode_unary_body,
    encode_frame,
    end_stream_error,
)
from byok.http.outcomes import end_stream_for, failed
from byok.http.wire_check import well_typed
from byok.loop.turn_values import Outcome
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from byok.run.service import RunService
from byok.run.slot import RunRegistry, RunSlot

log = logging.getLogger("byok.http")

# Frames already queued are coalesced into one write up to this size.
MAX_WRITE_BYTES = 256 * 1024
# How long a RunSSE waits for the run_request that decides whether byok runs it. Cursor posts
# the RunSSE and its first BidiAppend together, over loopback (byok binds nothing else): the
# append lands within milliseconds, a run_request at max_body_bytes within a second or two. 30 s
# is ample for a busy machine, and bounds what a stream whose run_request never comes holds (a
# socket, a descriptor); it was 300 s.
DECISION_TIMEOUT_S = 30.0
# At most this many RunSSE streams wait for their run_request at once; past it, a RunSSE is
# refused at once. One Cursor has one or two per turn in flight, a few at most across windows.
MAX_UNDECIDED_STREAMS = 64


def _framed(item: bytes | Outcome) -> bytes:
    return encode_frame(item) if isinstance(item, bytes) else end_stream_for(item)


async def _watch_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


class RunStreams:
    """The RunSSE and Run RPCs. Owns the count of responses writing frames, which shutdown
    drains; ``append`` (BidiAppends') takes the client messages of an HTTP/2 Run."""

    def __init__(
        self,
        *,
        config: Config,
        registry: RunRegistry,
        forward: Any,
        service: RunService,
        append: Callable[[RunSlot, int, agent.AgentClientMessage, int], ConnectError | None],
    ) -> None:
        self.config = config
        self.registry = registry
        self.forward = forward
        self.service = service
        self.max_body = config.server.max_body_bytes
        self._append = append
        self.streams = 0  # RunSSE / Run responses currently writing frames
        self.undecided: Counter[str] = Counter()  # RunSSE streams waiting for their run_request, per id
        self._streams_idle = trio.Event()
        self._streams_idle.set()

    # --- RunSSE -----------------------------------------------------------------------
    async def run_sse(self, scope: Scope, receive: Receive, send: Send) -> None:
        err: ConnectError | None = None
        rid = ""
        try:
            body = await read_body(receive, self.max_body)
            raw = decode_unary_body(
                body,
                header(scope, "content-type") or "",
                header(scope, "content-encoding"),
                max_bytes=self.max_body,
            )
            ident = proto_decode.parse(aiserver.BidiRequestId, raw)
            if not well_typed(ident):
                raise ValueError("fields of the wrong wire type")
            rid = ident.request_id
            if not rid:
                err = ConnectError("invalid_argument", "RunSSE has no request_id")
        except BodyTooLarge as e:
            err = ConnectError("resource_exhausted", str(e))
        except Exception as e:
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
            err = await self.await_decision(slot, receive)
            if err is not None:
                log.warning("request %s: RunSSE ended: %s", rid, err)
                await send({"type": "http.response.body", "body": end_stream_error(err), "more_body": False})
                return
        if slot.kind == "relay":
            await self.forward.relay_stream_body(scope, body, send)
            return
        await self._stream_frames(slot, receive, send)

    async def await_decision(self, slot: RunSlot, receive: Receive) -> ConnectError | None:
        """Until the first BidiAppend (the run_request) decides local or relayed. A client that
        leaves first is let go at once (ClientGone): it held a socket, and its descriptor, for
        the whole timeout. Past MAX_UNDECIDED_STREAMS waiting, refused without a wait."""
        rid = slot.request_id
        if self.undecided.total() >= MAX_UNDECIDED_STREAMS:
            self._forget_undecided(slot)
            return ConnectError(
                "resource_exhausted",
                f"{MAX_UNDECIDED_STREAMS} RunSSE streams are already waiting for their run_request",
            )
        gone = False

        async def watch(nursery: trio.Nursery) -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            nursery.cancel_scope.cancel()

        self.undecided[rid] += 1
        try:
            with trio.move_on_after(DECISION_TIMEOUT_S):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(watch, nursery)
                    await slot.decided.wait()
                    nursery.cancel_scope.cancel()
        finally:
            self.undecided[rid] -= 1
            if not self.undecided[rid]:
                del self.undecided[rid]
        if gone:
            # Its disconnect is consumed: no later stage could see the client go. A run the
            # same moment decided is left to the reconnect grace, as a dropped stream's is.
            if slot.kind == "agent" and not slot.closed:
                self.service.stream_dropped(slot)
            self._forget_undecided(slot)
            raise ClientGone
        if slot.kind == "unknown":
            self._forget_undecided(slot)
            return ConnectError("deadline_exceeded", "no run_request arrived for this RunSSE")
        return None

    def _forget_undecided(self, slot: RunSlot) -> None:
        """An undecided slot no RunSSE waits on any more is dropped (it held no run)."""
        if slot.kind == "unknown" and not self.undecided[slot.request_id]:
            self.registry.remove(slot.request_id, slot)

    async def _stream_frames(
        self, slot: RunSlot, receive: Receive, send: Send, *, opening: Opening | None = None
    ) -> None:
        """The one writer of a run's frames. With an ``opening`` (the HTTP/2 Run call) the
        request body carries the client's messages and is read alongside, in frame order."""
        heartbeat = encode_frame(encode.heartbeat())
        interval = self.config.server.heartbeat_s
        with self.counted():
            await self._write_frames(slot, receive, send, opening, heartbeat, interval)

    @contextmanager
    def counted(self) -> Iterator[None]:
        """Around a response writing a run's frames (a RunSSE, a Run, a poll): shutdown waits
        for them to finish."""
        self.streams += 1
        if self._streams_idle.is_set():
            self._streams_idle = trio.Event()
        try:
            yield
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
        opening: Opening | None,
        heartbeat: bytes,
        interval: float,
    ) -> None:
        ended = False
        sent_end = False
        with trio.CancelScope() as cs:
            slot.attach(cs)
            async with trio.open_nursery() as nursery:
                if opening is not None:
                    nursery.start_soon(self._read_client_frames, slot, receive, cs, opening)
                else:
                    nursery.start_soon(_watch_disconnect, receive, cs)
                try:
                    while not ended:
                        item: bytes | Outcome | None = None
                        with trio.move_on_after(interval):
                            try:
                                item = await slot.frames.receive()
                            except trio.EndOfChannel:
                                ended = True
                                break
                        if item is None:
                            await send({"type": "http.response.body", "body": heartbeat, "more_body": True})
                            continue
                        # Whatever else is already queued goes out in the same write: one send
                        # per burst, not per frame, and never a wait for more.
                        batch = [_framed(item)]
                        has_end = not isinstance(item, bytes)
                        size = len(batch[0])
                        while size < MAX_WRITE_BYTES:
                            try:
                                nxt = slot.frames.receive_nowait()
                            except trio.WouldBlock:
                                break
                            except trio.EndOfChannel:
                                ended = True
                                break
                            frame = _framed(nxt)
                            has_end = has_end or not isinstance(nxt, bytes)
                            batch.append(frame)
                            size += len(frame)
                        body = batch[0] if len(batch) == 1 else b"".join(batch)
                        with slot.writing(len(batch)):
                            await send({"type": "http.response.body", "body": body, "more_body": True})
                        sent_end = sent_end or has_end
                finally:
                    nursery.cancel_scope.cancel()
        if slot.detach(cs) and not ended and not slot.closed:
            self.service.stream_dropped(slot)
        if ended:
            # The end frame went to an earlier stream that died: this one must carry it too.
            tail = end_stream_for(slot.outcome) if not sent_end and slot.outcome is not None else b""
            await send({"type": "http.response.body", "body": tail, "more_body": False})

    # --- HTTP/2 Run -------------------------------------------------------------------
    async def run_bidi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """`agent.v1.AgentService/Run`: one HTTP/2 bidi stream carrying what RunSSE + BidiAppend
        carry. The request id is the x-request-id header; client frames are numbered from 0 in
        order, exactly like BidiAppend seqnos, and feed the same slot. The first one (the
        run_request) decides: a model byok does not serve (an official one, or one with
        ``enabled = false``) has the whole call relayed to upstream (bidi_relay.py)."""
        rid = header(scope, "x-request-id") or str(uuid.uuid4())
        opening = await self._opening(receive)
        model = _requested_model(opening.first)
        if opening.error is None and model and not self.service.deps.catalog.serves(model):
            log.info("request %s: model %r is not a byok model, relaying the Run", rid, model)
            head = b"".join(opening.raw)
            await relay_bidi(scope, head, opening.more, receive, send, upstream=self.config.server.upstream)
            return
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
        if opening.error is not None:
            log.warning("request %s: Run refused: %s", rid, opening.error)
            self.service.refuse(slot, failed(opening.error))
        await self._stream_frames(slot, receive, send, opening=opening)

    async def _opening(self, receive: Receive) -> Opening:
        """The Run's body up to its first message (Cursor sends the run_request with the call),
        at most DECISION_TIMEOUT_S. ClientGone if the client leaves first."""
        op = Opening(FrameDecoder(self.max_body))
        with trio.move_on_after(DECISION_TIMEOUT_S):
            while op.more and op.error is None and all(f.end_stream for f in op.frames):
                event = await receive()
                if event["type"] == "http.disconnect":
                    raise ClientGone
                body = event.get("body", b"")
                op.raw.append(body)
                op.more = bool(event.get("more_body", False))
                try:
                    op.frames += op.decoder.feed(body)
                except ProtocolError as e:
                    op.error = e.to_connect_error()
        first = next((f for f in op.frames if not f.end_stream), None)
        if first is not None:
            op.first = parse_client_message(first.payload)
        elif op.error is None:
            op.error = (
                ConnectError("deadline_exceeded", "no run_request arrived on this Run")
                if op.more
                else ConnectError("invalid_argument", "the Run's body ended before its run_request")
            )
        return op

    async def _read_client_frames(
        self, slot: RunSlot, receive: Receive, stream: trio.CancelScope, opening: Opening
    ) -> None:
        if opening.error is not None:
            return  # the slot is already refused
        decoder, frames, more = opening.decoder, opening.frames, opening.more
        seqno = 0
        while True:
            for frame in frames:
                if frame.end_stream:
                    continue
                msg = opening.first if seqno == 0 else parse_client_message(frame.payload)
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
            if not more:
                # The client half-closed: keep streaming our frames until the run ends.
                await trio.sleep_forever()
            event = await receive()
            if event["type"] == "http.disconnect":
                stream.cancel()
                return
            more = bool(event.get("more_body", False))
            try:
                frames = decoder.feed(event.get("body", b""))
            except ProtocolError as e:
                self._fail_slot(slot, e.to_connect_error())
                return

    def _fail_slot(self, slot: RunSlot, err: ConnectError) -> None:
        self.service.fail(slot, failed(err))


@attrs.define
class Opening:
    """What an HTTP/2 Run's client sent before byok decided where the call goes."""

    decoder: FrameDecoder
    raw: list[bytes] = attrs.Factory(list)  # the body so far, as it came (relayed as is)
    frames: list[Frame] = attrs.Factory(list)  # decoded from it
    first: agent.AgentClientMessage | None = None  # the first message, parsed
    more: bool = True  # the body goes on
    error: ConnectError | None = None


def _requested_model(msg: agent.AgentClientMessage | None) -> str:
    if msg is None or msg.run_request is None:
        return ""
    return requested_model_id(msg.run_request)
