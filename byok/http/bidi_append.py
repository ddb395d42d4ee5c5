"""BidiAppend: the client's half of a RunSSE run, one AgentClientMessage per unary call, fed to
its run's slot in seqno order, or relayed upstream when the run (or the RPC) is not byok's."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

import betterproto2

from byok.config import Config
from byok.console.catalog import Catalog
from byok.cursor import proto_decode
from byok.cursor.request import requested_model_id
from byok.http import state_ids
from byok.http.append_skim import AppendSkim, exec_id_of, is_whole_run_request
from byok.http.asgi import (
    BodyTooLarge,
    Receive,
    Scope,
    Send,
    body_chunks,
    header,
    read_body,
    replay_receive,
    respond,
    respond_connect_error,
)
from byok.http.connect_envelope import ConnectError, ProtocolError, decode_unary_body
from byok.http.wire_check import well_typed
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from byok.run.bidi_order import OrderBufferFull
from byok.run.service import not_served
from byok.run.slot import RunRegistry, RunSlot

log = logging.getLogger("byok.http")

# An append over max_body_bytes is read through (not kept) up to this many times the limit,
# raw or inflated, to find which exec it answers.
SKIM_LIMIT_FACTOR = 8


def parse_client_message(raw: bytes) -> agent.AgentClientMessage | None:
    """None for anything that is not exactly one AgentClientMessage variant (betterproto2
    raises on undecodable bytes and on two members of the oneof)."""
    lifted = state_ids.lift(raw)
    try:
        msg = proto_decode.parse(agent.AgentClientMessage, raw if lifted is None else lifted.rest)
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
    return parse_client_message(raw)


class BidiAppends:
    """The BidiAppend RPC. ``start_run`` (the App's) starts a run when its run_request is in
    order; the stream side calls ``append`` for the client messages of an HTTP/2 Run."""

    def __init__(
        self,
        *,
        config: Config,
        registry: RunRegistry,
        forward: Any,
        start_run: Callable[[RunSlot, agent.AgentRunRequest], ConnectError | None],
        refuse_run: Callable[[RunSlot, ConnectError], None],
        catalog: Catalog | None = None,
    ) -> None:
        self.config = config
        # Which model ids are byok's: the catalog's (the config file's and the console's).
        self.models: Config | Catalog = catalog if catalog is not None else config
        self.registry = registry
        self.forward = forward
        self.max_body = config.server.max_body_bytes
        self._start_run = start_run
        self._refuse_run = refuse_run

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = await read_body(receive, self.max_body)
        except BodyTooLarge as e:
            await self._oversized(scope, receive, send, e)
            return
        try:
            raw = decode_unary_body(
                body,
                header(scope, "content-type") or "",
                header(scope, "content-encoding"),
                max_bytes=self.max_body,
            )
            req = proto_decode.parse(aiserver.BidiAppendRequest, raw)
            if not well_typed(req):
                raise ValueError("fields of the wrong wire type")
        except Exception as e:
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
            and not self.models.serves(requested_model_id(msg.run_request))
        ):
            # An official (or unknown) model: the whole run goes to upstream, unchanged.
            why = not_served(self.models, requested_model_id(msg.run_request))
            log.info("request %s: %s: relaying the run to Cursor's backend", rid, why)
            slot.decide("relay")
            await self.forward(scope, replay_receive(body, receive), send)
            return
        if slot.kind == "unknown":
            slot.decide("agent")
        parent = (
            header(scope, "x-parent-request-id") or "",
            header(scope, "x-parent-agent-tool-call-id") or "",
        )
        if any(parent) and (conflict := slot.bind_parent(parent)) is not None:
            # A subagent run's parent is fixed by its first append that names it (seeds 000 §33.2).
            log.warning("request %s: append %s rejected: %s", rid, req.append_seqno, conflict)
            await respond_connect_error(send, ConnectError("invalid_argument", conflict))
            return
        err = self.append(slot, req.append_seqno, msg, len(req.data))
        try:
            if err is not None:
                log.warning("request %s: append %s rejected: %s", rid, req.append_seqno, err)
                await respond_connect_error(send, err)
                return
            await respond(send, 200, b"", "application/proto")
        finally:
            slot.release()

    async def _oversized(self, scope: Scope, receive: Receive, send: Send, too_large: BodyTooLarge) -> None:
        """An append over max_body_bytes, read to its end keeping only its routing fields
        (append_skim.py). An exec result becomes that exec's failure, in its seqno's place, so
        the run goes on; anything else is refused as before."""
        refusal = ConnectError("resource_exhausted", str(too_large))
        try:
            skim = AppendSkim(
                header(scope, "content-type") or "",
                header(scope, "content-encoding"),
                inflate_limit=SKIM_LIMIT_FACTOR * self.max_body,
            )
            skim.feed(too_large.head)
            read = len(too_large.head)
            if not too_large.complete:
                async with aclosing(body_chunks(receive)) as rest:
                    async for chunk, _ in rest:
                        read += len(chunk)
                        if read > SKIM_LIMIT_FACTOR * self.max_body:
                            raise ProtocolError("body too large to read through", "resource_exhausted")
                        skim.feed(chunk)
            got = skim.result()
        except ProtocolError as e:
            log.warning("BidiAppend refused: %s (%s)", refusal.message, e.message)
            await respond_connect_error(send, refusal)
            return
        slot = self.registry.get(got.request_id)
        if got.seqno == 0 and is_whole_run_request(got.data_head, got.data_size):
            log.warning("request %s: run_request refused: %s", got.request_id, refusal.message)
            if slot is None or (slot.kind != "relay" and not slot.run_started and not slot.closed):
                # The run's RunSSE, open or still to come, ends with this instead of waiting
                # (DECISION_TIMEOUT_S) for a run_request that will never arrive.
                slot = slot or self.registry.get_or_create(got.request_id)
                slot.decide("agent")
                self._refuse_run(slot, _run_request_too_large(got.data_size, self.max_body))
            await respond_connect_error(send, refusal)
            return
        exec_id = exec_id_of(got.data_head)
        if slot is None or slot.kind != "agent" or exec_id is None or got.has_binary:
            log.warning("request %s: append %s refused: %s", got.request_id, got.seqno, refusal.message)
            await respond_connect_error(send, refusal)
            return
        size = got.data_size // 2
        log.warning(
            "request %s: exec %s's result (%d bytes) is over max_body_bytes; the exec fails",
            got.request_id,
            exec_id,
            size,
        )
        text = (
            f"the tool's result was {size:,} bytes, more than byok accepts in one message "
            f"([server] max_body_bytes = {self.max_body:,}; Cursor sends it hex-encoded, twice "
            "its size), so it was not received. Ask for less output (a narrower search, a line "
            "range), or raise max_body_bytes."
        )
        failed = agent.AgentClientMessage(
            exec_client_control_message=agent.ExecClientControlMessage(
                throw=agent.ExecClientThrow(id=exec_id, error=text)
            )
        )
        err = self.append(slot, got.seqno, failed, 0)
        try:
            if err is not None:
                log.warning("request %s: append %s rejected: %s", got.request_id, got.seqno, err)
                await respond_connect_error(send, err)
                return
            await respond(send, 200, b"", "application/proto")
        finally:
            slot.release()

    def append(
        self, slot: RunSlot, seqno: int, msg: agent.AgentClientMessage, size: int
    ) -> ConnectError | None:
        if seqno < 0:  # seqnos count from 0: a negative one is neither late nor repeated
            return ConnectError("invalid_argument", f"append_seqno {seqno} is negative")
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


def _run_request_too_large(data_size: int, limit: int) -> ConnectError:
    return ConnectError(
        "resource_exhausted",
        f"this message is {data_size / 2**20:.1f} MiB as Cursor sends it (hex-encoded), more than "
        f"byok accepts in one message ([server] max_body_bytes = {limit:,}). Send it with less "
        "context (fewer or smaller files and images), or raise max_body_bytes.",
    )
