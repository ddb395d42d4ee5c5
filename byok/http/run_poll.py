"""RunPoll: a run's frames for a client that cannot read a streamed response.

With HTTP/1.1 SSE turned off (``cursor.general.disableHttp1SSE``: a proxy that buffers response
bodies), Cursor sends its messages as BidiAppends, as with RunSSE, and reads the run's frames by
polling: ``POST /agent.v1.AgentService/RunPoll`` with ``BidiPollRequest{request_id,
start_request}``, again and again, each answered as a Connect server stream of
``BidiPollResponse{seqno, data: hex of an AgentServerMessage, eof}``.

Each poll takes what the run has queued since the previous one (waiting up to ``heartbeat_s``
for the first frame, a heartbeat if none comes) and ends its response at once, so a buffering
proxy passes it on. seqnos count the run's frames from 0 across polls. The last poll carries
``eof`` and an ok end-stream; a run that fails ends its poll with the Connect error, as RunSSE's
stream would. Every later poll gets that same end.

A poll whose answer could not be sent whole (the client went, or a newer poll took over) has its
frames sent again, with the same seqnos, by the next poll. Between polls the run has no stream:
one that stays away ``reconnect_grace_s`` is cancelled, as a dropped RunSSE's is. The same
machinery as RunSSE serves the run (the slot, the run service); a relayed run's polls go
upstream unchanged.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

import attrs
import trio

from byok.cursor import encode, proto_decode
from byok.http.asgi import BodyTooLarge, ClientGone, Receive, Scope, Send, header, read_body
from byok.http.connect_envelope import (
    ConnectError,
    decode_unary_body,
    encode_frame,
    end_stream_error,
    end_stream_ok,
)
from byok.http.outcomes import end_stream_for
from byok.http.wire_check import well_typed
from byok.loop.turn_values import Outcome, Succeeded
from byok.pb.aiserver import v1 as aiserver
from byok.run.slot import RunSlot

if TYPE_CHECKING:
    from byok.http.run_stream import RunStreams

log = logging.getLogger("byok.http")

# Frames already queued go into one poll's answer up to this size.
MAX_POLL_BYTES = 256 * 1024


def poll_frame(seqno: int, message: bytes = b"", *, eof: bool = False) -> bytes:
    """One enveloped BidiPollResponse: a frame of the run, or the end (``eof``, no data)."""
    resp = aiserver.BidiPollResponse(seqno=seqno, data=message.hex(), eof=True if eof else None)
    return encode_frame(bytes(resp))


@attrs.define
class PollCursor:
    """What a run's polls have sent: kept on its slot from poll to poll. Sans-IO."""

    seqno: int = 0  # the next frame's
    sent: bytes = b""  # the last poll's frames (enveloped), until a poll's answer went out whole
    delivered: bool = True  # the last poll's answer was sent whole
    end: bytes | None = None  # how the run ended, as every poll from then on answers

    def resend(self) -> bytes | None:
        """The answer when a poll need not wait: the last poll's frames again (its answer did
        not go out whole), or the run's end; else None (wait for frames). Forgets frames a
        delivered poll carried."""
        if self.delivered:
            self.sent = b""
        if self.sent or self.end is not None:
            self.delivered = False
            return self.sent + (self.end if self.end is not None else end_stream_ok())
        return None

    def take(self, items: list[bytes | Outcome]) -> bytes:
        """The answer carrying ``items`` (encoded AgentServerMessages, perhaps the outcome last)."""
        frames = []
        for item in items:
            if isinstance(item, bytes):
                frames.append(poll_frame(self.seqno, item))
                self.seqno += 1
            else:
                self.ended(item)
        self.sent = b"".join(frames)
        self.delivered = False
        return self.sent + (self.end if self.end is not None else end_stream_ok())

    def ended(self, outcome: Outcome) -> None:
        if self.end is None:
            ok = isinstance(outcome, Succeeded)
            self.end = poll_frame(self.seqno, eof=True) + end_stream_ok() if ok else end_stream_for(outcome)


class RunPolls:
    """The RunPoll RPC, on RunStreams' slots and decisions (run_stream.py)."""

    def __init__(self, streams: RunStreams) -> None:
        self.streams = streams

    async def run_poll(self, scope: Scope, receive: Receive, send: Send) -> None:
        s = self.streams
        body = b""
        err: ConnectError | None = None
        req = aiserver.BidiPollRequest()
        try:
            body = await read_body(receive, s.max_body)
            raw = decode_unary_body(
                body,
                header(scope, "content-type") or "",
                header(scope, "content-encoding"),
                max_bytes=s.max_body,
            )
            req = proto_decode.parse(aiserver.BidiPollRequest, raw)
            if not well_typed(req):
                raise ValueError("fields of the wrong wire type")
        except BodyTooLarge as e:
            err = ConnectError("resource_exhausted", str(e))
        except Exception as e:
            if isinstance(e, ClientGone):
                raise
            err = ConnectError("invalid_argument", f"undecodable BidiPollRequest: {e}")
        rid = req.request_id.request_id if req.request_id is not None else ""
        if err is None and not rid:
            err = ConnectError("invalid_argument", "RunPoll has no request_id")
        slot = s.registry.get(rid) if err is None else None
        if err is None and slot is None and req.start_request is False:
            err = ConnectError(
                "not_found", f"no run with request id {rid!r} (it ended long ago or never began)"
            )
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
            log.warning("RunPoll rejected: %s", err)
            await send({"type": "http.response.body", "body": end_stream_error(err), "more_body": False})
            return
        slot = s.registry.get_or_create(rid)
        slot.runsse_open = True  # an agent request id: its appends are parsed strictly
        if slot.kind == "unknown":
            err = await s.await_decision(slot, receive)
            if err is not None:
                log.warning("request %s: RunPoll ended: %s", rid, err)
                await send({"type": "http.response.body", "body": end_stream_error(err), "more_body": False})
                return
        if slot.kind == "relay":
            await s.forward.relay_stream_body(scope, body, send)
            return
        with s.counted():
            await self._answer(slot, receive, send)

    async def _answer(self, slot: RunSlot, receive: Receive, send: Send) -> None:
        cursor = slot.poll if isinstance(slot.poll, PollCursor) else None
        if cursor is None:
            cursor = slot.poll = PollCursor()
        with trio.CancelScope() as cs:
            # A newer poll cancels this one. Not a reconnect: what a lost answer held is sent
            # again here (PollCursor), so the run re-sends nothing of its own.
            slot.attach(cs, resume=False)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_when_gone, receive, cs)
                answer, taken = await self._next(slot, cursor)
                # Not watched while it is sent: completing the response is what makes hypercorn
                # report the client gone.
                nursery.cancel_scope.cancel()
            with slot.writing(taken):
                await send({"type": "http.response.body", "body": answer, "more_body": False})
            cursor.delivered = True
        if slot.detach(cs) and not slot.closed:
            # Until the next poll the run has no stream: the reconnect grace runs.
            self.streams.service.stream_dropped(slot)

    async def _next(self, slot: RunSlot, cursor: PollCursor) -> tuple[bytes, int]:
        """This poll's answer and how many of the run's queued items it took."""
        again = cursor.resend()
        if again is not None:
            return again, 0
        items: list[bytes | Outcome] = []
        with trio.move_on_after(self.streams.config.server.heartbeat_s):
            # EndOfChannel: a RunSSE took the end before the client switched to polls.
            with contextlib.suppress(trio.EndOfChannel):
                items.append(await slot.frames.receive())
        if not items:
            if slot.outcome is not None and slot.closed:
                cursor.ended(slot.outcome)
                return cursor.resend() or end_stream_ok(), 0
            return cursor.take([encode.heartbeat()]), 0
        size = len(items[0]) if isinstance(items[0], bytes) else 0
        while size < MAX_POLL_BYTES and isinstance(items[-1], bytes):
            try:
                item = slot.frames.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            items.append(item)
            size += len(item) if isinstance(item, bytes) else 0
        return cursor.take(items), len(items)


async def _cancel_when_gone(receive: Receive, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()
