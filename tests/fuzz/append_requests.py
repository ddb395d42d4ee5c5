"""BidiAppend requests for the fuzz properties: protobuf wire encoders, a reference check that a
decoded message is well typed, strategies for append bodies and sessions, and a driver that
posts bodies to a real ``BidiAppends``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import betterproto2
import trio
from hypothesis import strategies as st

from byok.devtools.cursor_sim import user_turn
from byok.http.bidi_append import BidiAppends
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from byok.run.slot import RunRegistry
from tests.fuzz.support import protos, small_ints


def ill_typed(msg: betterproto2.Message, path: str = "") -> str | None:
    """Where a decoded message holds a value of the wrong Python type for its proto field
    (betterproto2 decodes by the wire type it finds, not by the declared field type)."""
    info = msg._betterproto
    for name, meta in info.meta_by_field_name.items():
        value = getattr(msg, name)
        if value is None and not (
            meta.proto_type == "message" or meta.optional or meta.group or meta.repeated
        ):
            return f"{path}{name}=None"  # a field sent with a group wire type (3, 4) is stored as None
        if value is None or meta.map_meta is not None:
            continue
        values = value if meta.repeated else [value]
        if meta.repeated and not isinstance(value, list):
            return f"{path}{name}"
        want = info.cls_by_field[name]
        for v in values:
            if meta.proto_type == "message":
                if not isinstance(v, want):
                    return f"{path}{name}={type(v).__name__}"
                inner = ill_typed(v, f"{path}{name}.")
                if inner:
                    return inner
            elif meta.proto_type in ("string", "bytes", "bool"):
                if type(v) is not {"string": str, "bytes": bytes, "bool": bool}[meta.proto_type]:
                    return f"{path}{name}={type(v).__name__}"
            elif meta.proto_type in ("float", "double"):
                if not isinstance(v, float):
                    return f"{path}{name}={type(v).__name__}"
            elif not isinstance(v, int):
                return f"{path}{name}={type(v).__name__}"
    return None


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def wire_field(number: int, wire: int, payload: bytes | int) -> bytes:
    head = varint(number << 3 | wire)
    if wire == 0:
        assert isinstance(payload, int)
        return head + varint(payload)
    assert isinstance(payload, bytes)
    return head + varint(len(payload)) + payload


def field_number(cls: type[betterproto2.Message], name: str) -> int:
    return cls()._betterproto.meta_by_field_name[name].number


RUN_REQUEST_FIELD = field_number(agent.AgentClientMessage, "run_request")


def client_message(raw: bytes) -> agent.AgentClientMessage | None:
    """The reference decode of an append's data: one variant set and every field well typed
    (by ``ill_typed``, this file's own check, not byok's wire_check)."""
    try:
        msg = agent.AgentClientMessage.parse(raw)
        name, _ = betterproto2.which_one_of(msg, "message")
    except Exception:
        return None
    return msg if name and ill_typed(msg) is None else None


def _run_request_message(model_id: str) -> agent.AgentClientMessage:
    return agent.AgentClientMessage(
        run_request=user_turn("hi", conversation_id="c", model_id=model_id, message_id="u")
    )


# Fields with the wrong wire type (a message or string field sent as a varint, an int field sent
# as bytes, any field as a group or an invalid wire type): betterproto2 decodes them by wire type
# (a group or invalid one as None); byok must refuse them at the edge.
def _any_wire_field(number: int, wire: int, n: int, payload: bytes) -> bytes:
    if wire in (0, 2):
        return wire_field(number, wire, n if wire == 0 else payload)
    fixed = {1: 8, 5: 4}.get(wire, 0)
    return varint(number << 3 | wire) + (payload * 8)[:fixed].ljust(fixed, b"\0")


_wire_confusion = st.lists(
    st.builds(
        _any_wire_field,
        st.integers(1, 9),
        st.sampled_from([0, 0, 2, 2, 1, 3, 4, 5, 6, 7]),
        st.integers(0, 2**40),
        st.binary(max_size=6),
    ),
    min_size=1,
    max_size=2,
).map(b"".join)
_good_messages = st.one_of(
    st.sampled_from(["local", "local", "upstream", ""]).map(_run_request_message),
    st.just(agent.AgentClientMessage(client_heartbeat=agent.ClientHeartbeat())),
    st.builds(lambda i: agent.AgentClientMessage(kv_client_message=agent.KvClientMessage(id=i)), small_ints),
)
_append_data = st.one_of(
    _good_messages.map(lambda m: bytes(m).hex()),
    _good_messages.map(lambda m: bytes(m).hex()),
    st.deferred(lambda: protos(agent.AgentClientMessage, 2)).map(lambda m: bytes(m).hex()),
    st.builds(lambda m, x: (bytes(m) + x).hex(), _good_messages, _wire_confusion),
    st.builds(  # the confusion inside the run_request
        lambda m, x: wire_field(RUN_REQUEST_FIELD, 2, bytes(m.run_request) + x).hex(),
        st.sampled_from(["local", "upstream"]).map(_run_request_message),
        _wire_confusion,
    ),
    st.sampled_from(["", "zz", "0"]),
    st.binary(max_size=20).map(bytes.hex),
)
_request_ids = st.builds(aiserver.BidiRequestId, request_id=st.sampled_from(["r1", "r1", "r2", ""]))
_seqnos = st.sampled_from([0, 0, 1, 2])
_append_requests = st.builds(
    aiserver.BidiAppendRequest,
    data=_append_data,
    request_id=st.one_of(_request_ids, _request_ids, _request_ids, st.none()),
    append_seqno=st.one_of(_seqnos, _seqnos, _seqnos, st.integers(-(2**63), 2**63 - 1)),
    data_binary=st.sampled_from([b"", b"", b"", b"", b"", b"x"]),
).map(bytes)


def _mutate(body: bytes, changes: list[tuple[int, int]]) -> bytes:
    """``body`` with bytes inserted, or cut short (a change whose byte is < 16)."""
    out = bytearray(body)
    for at, byte in changes:
        at %= len(out) + 1
        if byte < 16:
            del out[at:]
        else:
            out[at:at] = bytes([byte])
    return bytes(out)


append_bodies = st.one_of(
    st.binary(max_size=200),
    _append_requests,
    _append_requests,
    st.builds(
        _mutate, _append_requests, st.lists(st.tuples(st.integers(0, 300), st.integers(0, 255)), max_size=2)
    ),
    st.builds(bytes.__add__, _append_requests, _wire_confusion),
)
_later_messages = st.one_of(
    st.just(agent.AgentClientMessage(client_heartbeat=agent.ClientHeartbeat())),
    st.builds(lambda i: agent.AgentClientMessage(kv_client_message=agent.KvClientMessage(id=i)), small_ints),
)


@st.composite
def append_sessions(draw: st.DrawFn) -> list[bytes]:
    """A run's appends as Cursor sends them (run_request at seqno 0, then later messages), in any
    order, maybe one repeated, maybe with one arbitrary body among them."""
    first = _run_request_message(draw(st.sampled_from(["local", "local", "upstream"])))
    messages = [first, *draw(st.lists(_later_messages, max_size=2))]
    rid = aiserver.BidiRequestId(request_id="r1")
    bodies = [
        bytes(aiserver.BidiAppendRequest(data=bytes(m).hex(), request_id=rid, append_seqno=i))
        for i, m in enumerate(messages)
    ]
    bodies = list(draw(st.permutations(bodies)))
    if draw(st.booleans()):
        bodies.insert(draw(st.integers(0, len(bodies))), draw(st.sampled_from(bodies)))
    extra = draw(st.none() | append_bodies)
    if extra is not None:
        bodies.insert(draw(st.integers(0, len(bodies))), extra)
    return bodies


def post_appends(bodies: list[bytes]) -> list[dict[str, Any]]:
    """Post each body to one BidiAppends (fresh registry; model "local" is byok's): per post,
    the response status and Connect code, what went upstream, and the runs it started."""
    config: Any = SimpleNamespace(
        server=SimpleNamespace(max_body_bytes=1 << 20),
        model=lambda model_id: SimpleNamespace(enabled=True) if model_id == "local" else None,
        serves=lambda model_id: model_id == "local",
        enabled_models=lambda: (),
    )
    started: list[agent.AgentRunRequest] = []
    forwarded: list[bytes] = []
    sent: list[dict[str, Any]] = []
    outcomes: list[dict[str, Any]] = []

    async def forward(_scope: Any, receive: Any, _send: Any) -> None:
        forwarded.append((await receive())["body"])  # relayed upstream unchanged

    def start_run(_slot: Any, run_request: agent.AgentRunRequest) -> None:
        started.append(run_request)

    def refuse_run(slot: Any, err: Any) -> None:
        slot.close(b"")

    appends = BidiAppends(
        config=config, registry=RunRegistry(), forward=forward, start_run=start_run, refuse_run=refuse_run
    )

    async def post(body: bytes) -> dict[str, Any]:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        sent.clear()
        forwarded.clear()
        started.clear()
        await appends.handle(
            {"type": "http", "headers": [(b"content-type", b"application/proto")]}, receive, send
        )
        out: dict[str, Any] = {"forwarded": list(forwarded), "started": list(started), "status": None}
        if sent:
            assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
            out["status"] = sent[0]["status"]
            if out["status"] != 200:
                out["code"] = json.loads(sent[1]["body"])["code"]
        return out

    async def main() -> None:
        for body in bodies:
            outcomes.append(await post(body))

    trio.run(main)
    return outcomes


def append_body(model_id: str, seqno: int = 0) -> bytes:
    data = bytes(_run_request_message(model_id)).hex()
    return bytes(
        aiserver.BidiAppendRequest(
            data=data, request_id=aiserver.BidiRequestId(request_id="r1"), append_seqno=seqno
        )
    )
