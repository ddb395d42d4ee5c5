"""Fuzzing: arbitrary bytes and structures into every parser a peer can reach.

The contract under test: a bad input ends in the module's declared error value (ProtocolError,
ProviderError, RootJsonError, EditError, RunRequestError, StaleRevision...), never in another
exception, a hang or a corrupted store; a good input gives the same answer however it is
chunked. Each ``@fuzz(n)`` target runs ``n`` examples in ``make test`` and
``BYOK_FUZZ_EXAMPLES`` examples in ``make fuzz`` (see tests/fuzz/conftest.py, docs/fuzzing.md).

Known bugs: a generic property that would keep tripping over a bug already reported may let
exactly that failure (exception type + byok file + function, ``KNOWN_BUGS``) through while a
strict xfail test pins the bug with a minimal input. When the bug is fixed the xfail starts
passing, strict mode fails it, and both the xfail and its ``KNOWN_BUGS`` entry go. The bugs
found so far are fixed; their minimal inputs stay below as regression tests.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import betterproto2
import pytest
import trio
from hypothesis import example, given, settings
from hypothesis import strategies as st

import byok
from byok.cursor.checkpoint import Blob, TurnRecord, build_checkpoint, root_blob
from byok.cursor.request import RunRequestError, parse_run_request
from byok.cursor.root_json import RootJsonError, decode_root, encode_root
from byok.cursor.tools.base import Finish, Invocation, SendExec, ToolArgError
from byok.cursor.tools.edit_tools import STR_REPLACE, WRITE
from byok.cursor.tools.json_stream import JsonStringField
from byok.cursor.tools.registry import build_registry
from byok.cursor.tools.text_edit import (
    EditError,
    NewlineNormalizer,
    count_occurrences,
    normalize_newlines,
    replace_unique,
)
from byok.devtools.cursor_sim import user_turn
from byok.http.bidi_append import BidiAppends, decode_agent_message
from byok.http.connect_envelope import (
    FLAG_COMPRESSED,
    FLAG_END_STREAM,
    FrameDecoder,
    ProtocolError,
    decode_unary_body,
    encode_frame,
)
from byok.http.wire_check import well_typed
from byok.model import events as ev
from byok.model.events import ProviderError
from byok.model.messages import Message, ReplayState, ToolCall
from byok.model.usage import Usage
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from byok.providers.anthropic_stream import AnthropicStreamParser
from byok.providers.openai_chat_stream import ChatStreamParser
from byok.providers.openai_responses_stream import ResponsesStreamParser
from byok.providers.sse import SSEDecoder, SSEEvent
from byok.run.bidi_order import AppendOrder, OrderBufferFull
from byok.run.kv import KvLink
from byok.run.slot import RunRegistry
from byok.run.tool_round import ExecRouter
from byok.store import Head, SQLiteStore, StaleRevision

_PROFILE = settings.get_profile("byok-fuzz")  # registered by tests/fuzz/conftest.py
_LONG = bool(os.environ.get("BYOK_FUZZ_EXAMPLES"))


def fuzz(ci_examples: int) -> settings:
    """The profile, with ``ci_examples`` examples unless a long run set its own count."""
    return settings(_PROFILE, max_examples=_PROFILE.max_examples if _LONG else ci_examples)


# --- known bugs ------------------------------------------------------------------------------------

_BYOK_DIR = str(Path(byok.__file__).resolve().parent)

# (exception type, byok file, function) of failures already pinned by a strict xfail.
# Empty: every bug these properties found so far is fixed (see docs/fuzzing.md).
KNOWN_BUGS: frozenset[tuple[str, str, str]] = frozenset()


def _site(e: BaseException) -> tuple[str, str, str]:
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if str(Path(f.filename).resolve()).startswith(_BYOK_DIR)]
    f = (ours or frames)[-1]
    return (type(e).__name__, Path(f.filename).name, f.name)


def _known(e: BaseException) -> bool:
    return isinstance(e, Exception) and _site(e) in KNOWN_BUGS


# --- shared strategies -----------------------------------------------------------------------------

_texts = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=20)
_newline_texts = st.lists(st.sampled_from(["a", "b", "\r", "\n", "\r\n", " ", "é", "\x00"]), max_size=20).map(
    "".join
)


def _split(data: Any, cuts: list[int]) -> list[Any]:
    """``data`` cut at the given offsets (clamped, sorted): the pieces concatenate back to it."""
    points = sorted({min(max(c, 0), len(data)) for c in cuts})
    pieces, last = [], 0
    for p in [*points, len(data)]:
        pieces.append(data[last:p])
        last = p
    return pieces


_cuts = st.lists(st.integers(0, 400), max_size=8)

# JSON of any shape (for "the field is there but has the wrong type").
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4),
    lambda c: st.lists(c, max_size=2) | st.dictionaries(st.text(max_size=3), c, max_size=2),
    max_leaves=6,
)


def _obj(required: dict[str, Any] | None = None, **optional: Any) -> st.SearchStrategy[dict[str, Any]]:
    """A JSON object whose fields each hold a plausible value or, sometimes, any JSON at all."""
    return st.fixed_dictionaries(
        {k: s | _json for k, s in (required or {}).items()},
        optional={k: s | _json for k, s in optional.items()},
    )


_small = st.integers(0, 2)
_word = st.sampled_from(["", "a", "b c", "\n", "é", "😀"])
_args_text = st.sampled_from(["", "{", '{"path"', ':"a"}', "{}", '{"a":1}', "]"])

# --- Connect envelopes -------------------------------------------------------------------------------


def _decode_all(decoder: FrameDecoder, pieces: list[bytes]) -> list[tuple[int, bytes]]:
    frames = []
    for piece in pieces:
        frames += [(f.flags, f.payload) for f in decoder.feed(piece)]
    decoder.end()
    return frames


def _outcome(fn: Callable[[], Any], error: type[BaseException]) -> tuple[str, Any]:
    try:
        return ("ok", fn())
    except error as e:
        return ("error", type(e).__name__)


@fuzz(400)
@given(st.binary(max_size=300), _cuts)
def test_frame_decoder_on_arbitrary_bytes(data: bytes, cuts: list[int]) -> None:
    """Frames or ProtocolError, and the same answer however the bytes are chunked."""
    whole = _outcome(lambda: _decode_all(FrameDecoder(200), [data]), ProtocolError)
    chunked = _outcome(lambda: _decode_all(FrameDecoder(200), _split(data, cuts)), ProtocolError)
    if whole[0] == "ok":
        assert chunked == whole
    else:
        # Chunking may only change *which* violation is seen first (e.g. truncation vs oversize).
        assert chunked[0] == "error"


_frames = st.lists(
    st.tuples(st.binary(max_size=40), st.booleans()),
    max_size=4,
)


@fuzz(200)
@given(_frames, st.booleans(), _cuts)
def test_frame_decoder_round_trips_valid_streams(
    frames: list[tuple[bytes, bool]], end: bool, cuts: list[int]
) -> None:
    wire = b"".join(
        encode_frame(gzip.compress(p), FLAG_COMPRESSED) if z else encode_frame(p) for p, z in frames
    )
    if end:
        wire += encode_frame(b"{}", FLAG_END_STREAM)
    got = _decode_all(FrameDecoder(), _split(wire, cuts))
    want = [(0, p) for p, _ in frames] + ([(FLAG_END_STREAM, b"{}")] if end else [])
    assert got == want


@fuzz(400)
@given(
    st.binary(max_size=200) | st.builds(lambda p: encode_frame(p), st.binary(max_size=60)),
    st.sampled_from(
        ["application/proto", "application/connect+proto", "", "text/plain", "APPLICATION/CONNECT+PROTO; x=1"]
    ),
    st.sampled_from([None, "identity", "gzip", " GZip ", "br", ""]),
    st.booleans(),
)
def test_decode_unary_body_on_arbitrary_bodies(
    body: bytes, content_type: str, encoding: str | None, gzipped: bool
) -> None:
    if gzipped:
        body = gzip.compress(body)
    try:
        out = decode_unary_body(body, content_type, encoding, max_bytes=150)
    except ProtocolError as e:
        assert e.code in ("invalid_argument", "resource_exhausted")
        return
    assert isinstance(out, bytes) and len(out) <= 150


# --- BidiAppend / AgentClientMessage decoding ------------------------------------------------------


def _ill_typed(msg: betterproto2.Message, path: str = "") -> str | None:
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
                inner = _ill_typed(v, f"{path}{name}.")
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


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes | int) -> bytes:
    head = _varint(number << 3 | wire)
    if wire == 0:
        assert isinstance(payload, int)
        return head + _varint(payload)
    assert isinstance(payload, bytes)
    return head + _varint(len(payload)) + payload


def _number(cls: type[betterproto2.Message], name: str) -> int:
    return cls()._betterproto.meta_by_field_name[name].number


_RUN_REQUEST_FIELD = _number(agent.AgentClientMessage, "run_request")


def _client_message(raw: bytes) -> agent.AgentClientMessage | None:
    """The reference decode of an append's data: one variant set and every field well typed
    (by ``_ill_typed``, this file's own check, not byok's wire_check)."""
    try:
        msg = agent.AgentClientMessage.parse(raw)
        name, _ = betterproto2.which_one_of(msg, "message")
    except Exception:
        return None
    return msg if name and _ill_typed(msg) is None else None


def _run_request_message(model_id: str) -> agent.AgentClientMessage:
    return agent.AgentClientMessage(
        run_request=user_turn("hi", conversation_id="c", model_id=model_id, message_id="u")
    )


# Fields with the wrong wire type (a message or string field sent as a varint, an int field sent
# as bytes, any field as a group or an invalid wire type): betterproto2 decodes them by wire type
# (a group or invalid one as None); byok must refuse them at the edge.
def _any_wire_field(number: int, wire: int, n: int, payload: bytes) -> bytes:
    if wire in (0, 2):
        return _field(number, wire, n if wire == 0 else payload)
    fixed = {1: 8, 5: 4}.get(wire, 0)
    return _varint(number << 3 | wire) + (payload * 8)[:fixed].ljust(fixed, b"\0")


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
    st.builds(lambda i: agent.AgentClientMessage(kv_client_message=agent.KvClientMessage(id=i)), _small),
)
_append_data = st.one_of(
    _good_messages.map(lambda m: bytes(m).hex()),
    _good_messages.map(lambda m: bytes(m).hex()),
    st.deferred(lambda: protos(agent.AgentClientMessage, 2)).map(lambda m: bytes(m).hex()),  # defined below
    st.builds(lambda m, x: (bytes(m) + x).hex(), _good_messages, _wire_confusion),
    st.builds(  # the confusion inside the run_request
        lambda m, x: _field(_RUN_REQUEST_FIELD, 2, bytes(m.run_request) + x).hex(),
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


_append_bodies = st.one_of(
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
    st.builds(lambda i: agent.AgentClientMessage(kv_client_message=agent.KvClientMessage(id=i)), _small),
)


@st.composite
def _append_sessions(draw: st.DrawFn) -> list[bytes]:
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
    extra = draw(st.none() | _append_bodies)
    if extra is not None:
        bodies.insert(draw(st.integers(0, len(bodies))), extra)
    return bodies


def _post_appends(bodies: list[bytes]) -> list[dict[str, Any]]:
    """Post each body to one BidiAppends (fresh registry; model "local" is byok's): per post,
    the response status and Connect code, what went upstream, and the runs it started."""
    config: Any = SimpleNamespace(
        server=SimpleNamespace(max_body_bytes=1 << 20),
        model=lambda model_id: SimpleNamespace(enabled=True) if model_id == "local" else None,
    )
    started: list[agent.AgentRunRequest] = []
    forwarded: list[bytes] = []
    sent: list[dict[str, Any]] = []
    outcomes: list[dict[str, Any]] = []

    async def forward(_scope: Any, receive: Any, _send: Any) -> None:
        forwarded.append((await receive())["body"])  # relayed upstream unchanged

    def start_run(_slot: Any, run_request: agent.AgentRunRequest) -> None:
        started.append(run_request)

    appends = BidiAppends(config=config, registry=RunRegistry(), forward=forward, start_run=start_run)

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


def _append_body(model_id: str, seqno: int = 0) -> bytes:
    data = bytes(_run_request_message(model_id)).hex()
    return bytes(
        aiserver.BidiAppendRequest(
            data=data, request_id=aiserver.BidiRequestId(request_id="r1"), append_seqno=seqno
        )
    )


def test_bidi_append_handler_on_arbitrary_bodies() -> None:
    """The BidiAppend handler on any bodies (arbitrary bytes; valid requests carrying valid,
    random or non-hex data, some with bytes inserted or cut), several per request id: it always
    answers (never raises, never a 500): 200, or invalid_argument/resource_exhausted, or the body
    goes upstream unchanged. An undecodable or ill-typed request, or one without a request id, is
    invalid_argument; a 200 carried one well-typed AgentClientMessage; a started run got exactly
    its run_request. The tally makes sure each kind of answer is seen."""
    tally: Counter[str] = Counter()

    @fuzz(300)
    @example([_append_body("local")])
    @example([_append_body("upstream"), _append_body("upstream", 1)])
    @example([_GROUP_WIRE_TYPE_BODY])  # found by this property: HTTP 500 (TypeError)
    @example([_append_body("local", -(2**63))])  # found by this property: 200, the append dropped
    @given(st.lists(_append_bodies, min_size=1, max_size=3) | _append_sessions())
    def prop(bodies: list[bytes]) -> None:
        taken: dict[str, set[int]] = {}  # request id -> seqnos answered 200 so far
        runs: Counter[str] = Counter()  # request id -> runs started
        for body, got in zip(bodies, _post_appends(bodies), strict=True):
            try:
                req = aiserver.BidiAppendRequest.parse(body)
                bad = _ill_typed(req) is not None or req.request_id is None or not req.request_id.request_id
            except Exception:
                req, bad = None, True
            tally[
                "started" if got["started"] else "forwarded" if got["forwarded"] else got.get("code", "200")
            ] += 1
            assert (got["status"] is not None) + bool(got["forwarded"]) == 1, got  # one answer
            assert got["forwarded"] in ([], [body])
            if got["status"] is not None:
                assert got["status"] == 200 or got["code"] in ("invalid_argument", "resource_exhausted"), got
            if bad:
                assert got["code"] == "invalid_argument" and not got["started"], got
                continue
            assert req is not None and req.request_id is not None
            rid, seqno = req.request_id.request_id, req.append_seqno
            try:
                msg = _client_message(bytes.fromhex(req.data))
            except ValueError:
                msg = None  # not hex
            if got["status"] == 200:
                assert msg is not None and not req.data_binary, got
                if seqno not in taken.setdefault(rid, set()):  # not a repeat: the seqno rule holds
                    assert (msg.run_request is not None) == (seqno == 0), got
                taken[rid].add(seqno)
            if got["started"]:
                assert msg is not None and msg.run_request is not None and seqno == 0
                assert got["started"] == [msg.run_request] and got["status"] == 200
                runs[rid] += 1
                assert runs[rid] == 1  # one run per request id

    with _quiet("byok.http"):  # every refused append logs a warning
        prop()
    total = sum(tally.values())
    # Measured: about 1/3 of the answers accept an append (200, a started run), 1/2 refuse one.
    assert tally["200"] + tally["started"] >= total // 8 and tally["invalid_argument"] >= total // 8, tally
    assert tally["started"] >= total // 40 and tally["forwarded"] >= total // 40, tally


# request_id "r", then data (field 1) with wire type 3 (group start), which betterproto2 stores
# as data=None.
_GROUP_WIRE_TYPE_BODY = b"\x12\x03\n\x01r\x0b"


def test_a_scalar_field_sent_with_a_group_wire_type_is_refused_at_the_edge() -> None:
    """Found by the BidiAppend property: betterproto2 stores None for a field sent with wire
    type 3, 4, 6 or 7; well_typed took None for "not set", so BidiAppend called
    bytes.fromhex(None) and answered HTTP 500 (TypeError). Now such a message is ill typed."""
    req = aiserver.BidiAppendRequest.parse(_GROUP_WIRE_TYPE_BODY)
    assert req.data is None and not well_typed(req)
    with _quiet("byok.http"):
        (got,) = _post_appends([_GROUP_WIRE_TYPE_BODY])
    assert (got["status"], got["code"]) == (400, "invalid_argument")
    # The same deeper, in a run_request: UserMessage.text (a plain string field) as a group.
    good = bytes(agent.UserMessage(message_id="u"))
    bad = good + _varint(_number(agent.UserMessage, "text") << 3 | 3)
    assert agent.UserMessage.parse(bad).text is None
    assert decode_agent_message(_run_request_with_user_message(good)) is not None
    assert decode_agent_message(_run_request_with_user_message(bad)) is None


def _run_request_with_user_message(user: bytes) -> str:
    """Hex of AgentClientMessage{run_request{action{user_message_action{user_message: user}}}}."""
    action = _field(_number(agent.UserMessageAction, "user_message"), 2, user)
    conversation_action = _field(_number(agent.ConversationAction, "user_message_action"), 2, action)
    run = _field(_number(agent.AgentRunRequest, "action"), 2, conversation_action)
    return _field(_RUN_REQUEST_FIELD, 2, run).hex()


def test_a_negative_append_seqno_is_refused() -> None:
    """Found by the BidiAppend property: a negative seqno counted as "already delivered", so
    even a first append carrying the run_request was answered 200 and silently dropped."""
    with _quiet("byok.http"):
        (got,) = _post_appends([_append_body("local", -1)])
    assert (got["status"], got["code"], got["started"]) == (400, "invalid_argument", [])


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@fuzz(400)
@given(
    st.binary(max_size=200).map(bytes.hex)
    | st.text(alphabet="0123456789abcdefABCDEF x", max_size=60)
    | st.text(max_size=20)
)
def test_decode_agent_message_on_arbitrary_data(data: str) -> None:
    msg = decode_agent_message(data)
    if msg is not None:
        name, _ = betterproto2.which_one_of(msg, "message")
        assert name


@fuzz(50)
@example(_field(_RUN_REQUEST_FIELD, 0, 5))  # AgentClientMessage{run_request: varint 5}
@given(st.binary(max_size=60))
def test_decoded_client_messages_are_well_typed(raw: bytes) -> None:
    msg = decode_agent_message(raw.hex())
    assert msg is None or _ill_typed(msg) is None, _ill_typed(msg)  # type: ignore[arg-type]
    # The edge check the app applies to every BidiAppendRequest: parse failures and ill-typed
    # results are both rejected before any field is read.
    try:
        req = aiserver.BidiAppendRequest.parse(raw)
    except Exception:
        return
    assert well_typed(req) == (_ill_typed(req) is None)


def test_a_user_message_with_a_varint_message_field_is_refused_at_the_edge() -> None:
    raw = _field(_number(agent.UserMessage, "text"), 2, b"hi") + _field(
        _number(agent.UserMessage, "execute_plan_info"), 0, 10_000_000
    )
    # betterproto2 decodes the varint into the message field, and re-encoding it would allocate
    # bytes(10_000_000); byok never gets that far: the message is refused at the edge.
    wrapped = _field(
        _number(agent.AgentClientMessage, "run_request"),
        2,
        _field(
            _number(agent.AgentRunRequest, "action"),
            2,
            _field(
                _number(agent.ConversationAction, "user_message_action"),
                2,
                _field(_number(agent.UserMessageAction, "user_message"), 2, raw),
            ),
        ),
    )
    assert decode_agent_message(wrapped.hex()) is None


@fuzz(300)
@given(
    st.lists(
        st.tuples(st.integers(0, 12), st.integers(1, 100)),  # (seqno, size)
        max_size=40,
    )
)
def test_append_order_delivers_each_seqno_once_in_order(offers: list[tuple[int, int]]) -> None:
    order: AppendOrder[int] = AppendOrder(max_buffered=4, max_bytes=250)
    delivered: list[int] = []
    for seqno, size in offers:
        duplicate = order.is_duplicate(seqno)
        try:
            out = order.offer(seqno, seqno, size)
        except OrderBufferFull:
            assert seqno > order.next_seqno
            continue
        if duplicate:
            assert out == []
        delivered += out
    assert delivered == list(range(len(delivered)))
    assert order.next_seqno == len(delivered)


# --- AgentClientMessage handling (well-typed messages of any content) --------------------------------

_INT_RANGES = {
    "int32": (-(2**31), 2**31 - 1),
    "sint32": (-(2**31), 2**31 - 1),
    "sfixed32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "fixed32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "sint64": (-(2**63), 2**63 - 1),
    "sfixed64": (-(2**63), 2**63 - 1),
    "uint64": (0, 2**64 - 1),
    "fixed64": (0, 2**64 - 1),
}


def _scalar(proto_type: str, cls: Any) -> st.SearchStrategy[Any]:
    if proto_type == "string":
        return st.text(max_size=12)
    if proto_type == "bytes":
        return st.binary(max_size=12)
    if proto_type == "bool":
        return st.booleans()
    if proto_type in _INT_RANGES:
        lo, hi = _INT_RANGES[proto_type]
        return st.integers(0, 3) | st.integers(lo, hi)
    if proto_type in ("float", "double"):
        return st.floats(allow_nan=False, width=32 if proto_type == "float" else 64)
    if proto_type == "enum":
        return st.sampled_from(list(cls))
    raise NotImplementedError(proto_type)


_PROTO_CACHE: dict[tuple[type, int], st.SearchStrategy[Any]] = {}


def protos(cls: type[betterproto2.Message], depth: int = 3) -> st.SearchStrategy[Any]:
    """Well-typed messages of ``cls`` with any subset of fields set (one variant per oneof)."""
    key = (cls, depth)
    if key in _PROTO_CACHE:
        return _PROTO_CACHE[key]
    info = cls()._betterproto
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for name, meta in info.meta_by_field_name.items():
        if meta.map_meta is not None:
            continue
        fcls = info.cls_by_field[name]
        if meta.proto_type == "message":
            if depth <= 0:
                continue
            s = st.deferred(lambda fcls=fcls: protos(fcls, depth - 1))
        else:
            s = _scalar(meta.proto_type, fcls)
        fields[name] = st.lists(s, max_size=2) if meta.repeated else s
    groups: dict[str, list[str]] = {}
    for name in fields:
        group = info.meta_by_field_name[name].group
        if group:
            groups.setdefault(group, []).append(name)
    plain = {k: v for k, v in fields.items() if not info.meta_by_field_name[k].group}

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        kw = draw(st.fixed_dictionaries({}, optional=plain))
        for names in groups.values():
            pick = draw(st.none() | st.sampled_from(names))
            if pick is not None:
                kw[pick] = draw(fields[pick])
        return cls(**kw)

    _PROTO_CACHE[key] = build()
    return _PROTO_CACHE[key]


_modes = st.sampled_from(list(agent.AgentMode))
_base_run_requests = st.builds(
    user_turn,
    _texts,
    conversation_id=st.sampled_from(["conv-1", "c"]),
    model_id=st.sampled_from(["m", "gpt-x"]),
    message_id=st.sampled_from(["u1", ""]),
    mode=_modes,
    state=st.none() | st.builds(agent.ConversationStateStructure, mode=_modes),
)
_completions = st.lists(
    st.builds(agent.BackgroundTaskCompletion, task_id=st.sampled_from(["", "t1"])), max_size=2
)
# (field, value): each replaces one field of the valid request (None clears it).
_run_request_edits = st.one_of(
    st.tuples(st.just("conversation_id"), st.sampled_from(["", "c2"]) | st.text(max_size=4)),
    st.tuples(
        st.just("requested_model"),
        st.none() | st.builds(agent.RequestedModel, model_id=st.sampled_from(["", "m2"])),
    ),
    st.tuples(
        st.just("model_details"),
        st.none() | st.builds(agent.ModelDetails, model_id=st.sampled_from(["", "m3"])),
    ),
    st.tuples(
        st.just("action"),
        st.none()
        | st.just(agent.ConversationAction())
        | st.sampled_from(
            [
                agent.ConversationAction(cancel_action=agent.CancelAction()),
                agent.ConversationAction(summarize_action=agent.SummarizeAction()),
            ]
        )
        | protos(agent.ConversationAction, 2)
        | st.builds(
            lambda c: agent.ConversationAction(
                background_task_completion_action=agent.BackgroundTaskCompletionAction(completions=c)
            ),
            _completions,
        )
        | st.builds(
            lambda ctx: agent.ConversationAction(resume_action=agent.ResumeAction(request_context=ctx)),
            st.none() | st.just(agent.RequestContext()),
        ),
    ),
    st.tuples(st.just("user_message"), st.none() | st.builds(agent.UserMessage, text=_texts, mode=_modes)),
    st.tuples(
        st.just("conversation_state"), st.none() | st.builds(agent.ConversationStateStructure, mode=_modes)
    ),
)


def _edit_run_request(req: agent.AgentRunRequest, edits: list[tuple[str, Any]]) -> agent.AgentRunRequest:
    for name, value in edits:
        if name != "user_message":
            setattr(req, name, value)
        elif req.action is not None and req.action.user_message_action is not None:
            req.action.user_message_action.user_message = value
    return req


_SUPPORTED_ACTIONS = ("user_message_action", "resume_action", "background_task_completion_action")


def _startable(action: Any) -> bool:
    """An action a run can start from: a user message, a resume, or background completions that
    each name their task."""
    if isinstance(action, agent.UserMessageAction):
        return action.user_message is not None
    if isinstance(action, agent.BackgroundTaskCompletionAction):
        return bool(action.completions) and all(c.task_id for c in action.completions)
    return isinstance(action, agent.ResumeAction)


def test_parse_run_request_on_any_run_request() -> None:
    """A valid run_request with fields cleared or replaced: a RunStart that carries exactly what
    the request asked for, or RunRequestError with the right code; a request with a model, a
    conversation id and a startable action is never refused. The tally makes sure both happen."""
    tally: Counter[str] = Counter()

    @fuzz(300)
    @example(user_turn("hi", conversation_id="c", model_id="m", message_id="u1"), [])
    @example(
        user_turn("hi", conversation_id="c", model_id="m", message_id="u1"),
        [("action", agent.ConversationAction(cancel_action=agent.CancelAction()))],
    )
    @given(_base_run_requests, st.lists(_run_request_edits, max_size=3))
    def prop(req: agent.AgentRunRequest, edits: list[tuple[str, Any]]) -> None:
        req = _edit_run_request(req, edits)
        model_id = (req.requested_model.model_id if req.requested_model is not None else "") or (
            req.model_details.model_id if req.model_details is not None else ""
        )
        action, value = ("", None) if req.action is None else betterproto2.which_one_of(req.action, "action")
        try:
            start = parse_run_request("req-1", req)
        except RunRequestError as e:
            tally[e.code] += 1
            # Model, conversation id and action are checked first; then an action we do not run.
            unsupported = model_id and req.conversation_id and action and action not in _SUPPORTED_ACTIONS
            assert e.code == ("unimplemented" if unsupported else "invalid_argument")
            assert e.message
            assert not (model_id and req.conversation_id and _startable(value)), e.message
            return
        tally["ok"] += 1
        assert (start.request_id, start.conversation_id, start.model_id) == (
            "req-1",
            req.conversation_id,
            model_id,
        )
        assert model_id and req.conversation_id
        assert start.action == action and action in _SUPPORTED_ACTIONS
        assert start.client_state is req.conversation_state
        message = value.user_message if isinstance(value, agent.UserMessageAction) else None
        assert start.user_message is message and (action != "user_message_action" or message is not None)
        assert start.request_context is getattr(value, "request_context", None)
        completions = value.completions if isinstance(value, agent.BackgroundTaskCompletionAction) else []
        assert list(start.completions) == completions and all(c.task_id for c in completions)
        assert (action == "background_task_completion_action") == bool(completions)
        # The message's mode wins, then the restored state's; AGENT when neither says.
        state_mode = req.conversation_state.mode if req.conversation_state is not None else 0
        if message is not None and message.mode != agent.AgentMode.UNSPECIFIED:
            assert start.mode == message.mode
        else:
            assert start.mode == (state_mode or agent.AgentMode.AGENT)

    prop()
    total = sum(tally.values())
    assert tally["ok"] >= total // 10 and tally["invalid_argument"] >= total // 10, tally
    assert tally["unimplemented"] >= 1, tally


_REGISTRY = build_registry()
_VALID_ARGS: dict[str, dict[str, Any]] = {
    "Read": {"path": "a.txt"},
    "Delete": {"path": "a.txt"},
    "ReadLints": {"paths": ["a.txt"]},
    "Grep": {"pattern": "x"},
    "Glob": {"glob_pattern": "*.py"},
    "Write": {"path": "a.txt", "contents": "x\r\ny"},
    "StrReplace": {"path": "a.txt", "old_string": "x", "new_string": "y"},
    "Shell": {"command": "ls"},
}


def test_every_registered_tool_is_fuzzed() -> None:
    assert set(_REGISTRY) == set(_VALID_ARGS)


_client_exec = st.one_of(
    protos(agent.ExecClientMessage, 3).map(lambda m: ("result", m)),
    protos(agent.ExecClientControlMessage, 2).map(lambda m: ("control", m)),
)


@fuzz(400)
@given(st.sampled_from(sorted(_REGISTRY)), st.lists(_client_exec, max_size=5))
def test_tool_executions_survive_any_client_exec_messages(name: str, messages: list[tuple[str, Any]]) -> None:
    """Any well-typed Exec answer (wrong variant, missing result, repeated, unknown id, throw,
    close) is absorbed by the run's ExecRouter and the tool's state machine; each call finishes
    at most once."""
    tool = _REGISTRY[name]
    sent: list[bytes] = []
    router = ExecRouter(sent.append, "req-1")
    router.begin(
        "call-1", "mc-1", tool.execute(Invocation("call-1", name, "mc-1", tool.parse(_VALID_ARGS[name])))
    )
    for kind, msg in messages:
        if kind == "result":
            msg.id = msg.id % 4  # hit the live exec (id 1, 2 after a second phase) often
        try:
            if kind == "result":
                router.on_exec_message(msg)
            else:
                router.on_control(msg)
        except Exception as e:
            if _known(e):
                return
            raise
    finished = []
    while True:
        try:
            finished.append(router.done.receive_nowait())
        except Exception:
            break
    assert len(finished) <= 1


@fuzz(300)
@given(
    st.sampled_from(sorted(_REGISTRY)),
    _json
    | st.dictionaries(
        st.sampled_from(
            [
                "path",
                "paths",
                "contents",
                "old_string",
                "new_string",
                "replace_all",
                "pattern",
                "glob_pattern",
                "command",
                "offset",
                "limit",
                "target_directory",
                "is_background",
                "timeout",
                "-i",
                "output_mode",
            ]
        ),
        _json,
        max_size=5,
    ),
)
def test_tool_argument_validation_on_any_json(name: str, args: Any) -> None:
    tool = _REGISTRY[name]
    if not isinstance(args, dict):
        return  # the round answers "arguments must be a JSON object" itself
    try:
        parsed = tool.parse(args)
    except ToolArgError:
        return
    execution = tool.execute(Invocation("call-1", name, "mc-1", parsed))
    assert execution.start()


def _set_frames(frames: list[bytes]) -> dict[int, bytes]:
    """kv id -> blob id of the SET frames KvLink sent."""
    out = {}
    for frame in frames:
        kv = agent.AgentServerMessage.parse(frame).kv_server_message
        assert kv is not None and kv.set_blob_args is not None
        out[kv.id] = kv.set_blob_args.blob_id
    return out


_kv_answers = st.one_of(
    protos(agent.KvClientMessage, 2),
    st.builds(
        lambda i: agent.KvClientMessage(id=i, set_blob_result=agent.SetBlobResult()), st.integers(0, 5)
    ),
    st.builds(
        lambda i, m: agent.KvClientMessage(
            id=i, set_blob_result=agent.SetBlobResult(error=agent.Error(message=m))
        ),
        st.integers(0, 5),
        st.sampled_from(["", "disk full"]),
    ),
)


@fuzz(300)
@given(
    st.lists(st.binary(max_size=3), min_size=1, max_size=4, unique=True),
    st.sets(st.integers(0, 3)),
    st.lists(_kv_answers, max_size=6),
)
def test_kv_link_absorbs_any_kv_answer(
    datas: list[bytes], held: set[int], answers: list[agent.KvClientMessage]
) -> None:
    """SETs offered, then any answers (right or wrong variant, errors, unknown and repeated ids):
    an answer is taken (True) only for a SET still waiting, once; the client holds (acked) only
    blobs whose SET it answered with success; unanswered SETs are the ones resent; an offer
    after that SETs again exactly the blobs that are neither held nor still waiting."""
    blobs = [Blob.of(d) for d in datas]
    preacked = {b.id for i, b in enumerate(blobs) if i in held}
    sent: list[bytes] = []
    kv = KvLink(sent.append, set(preacked))
    assert kv.offer(blobs) == len(sent)
    waiting = _set_frames(sent)
    assert sorted(waiting.values()) == sorted(b.id for b in blobs if b.id not in preacked)
    assert len(waiting) == len(sent)  # one kv id per SET
    acked = set(preacked)
    for msg in answers:
        msg.id = msg.id % (len(waiting) + 2)  # the SETs' ids, and some that name nothing
        expected = msg.id in waiting
        assert kv.on_client(msg) is expected
        if expected:
            blob_id = waiting.pop(msg.id)
            result = msg.set_blob_result
            if result is not None and result.error is None:
                acked.add(blob_id)
        assert kv.acked == acked
    sent.clear()
    assert kv.resend_unacked() == len(waiting)
    assert _set_frames(sent) == waiting  # the same kv ids, the same blobs
    sent.clear()
    kv.offer(blobs)
    assert sorted(_set_frames(sent).values()) == sorted(
        b.id for b in blobs if b.id not in acked and b.id not in waiting.values()
    )


def test_exec_control_message_without_a_variant() -> None:
    router = ExecRouter(lambda _b: None, "req-1")
    router.on_control(agent.ExecClientControlMessage())


# --- SSE --------------------------------------------------------------------------------------------


def _sse_all(pieces: list[bytes]) -> tuple[list[SSEEvent], bool]:
    d = SSEDecoder()
    out: list[SSEEvent] = []
    for p in pieces:
        out += d.feed(p)
    out += d.end()
    return out, d.has_partial


@fuzz(500)
@given(
    st.binary(max_size=200)
    | st.lists(
        st.sampled_from(
            [
                b"data: x",
                b"data:",
                b"event: e",
                b":c",
                b"\r",
                b"\n",
                b"\r\n",
                b"id: 1",
                b"\xef\xbb\xbf",
                b"\xc3",
                b"\xa9",
            ]
        ),
        max_size=20,
    ).map(b"".join),
    _cuts,
)
def test_sse_decoder_chunking_does_not_change_events(data: bytes, cuts: list[int]) -> None:
    assert _sse_all(_split(data, cuts)) == _sse_all([data])


_sse_events = st.lists(
    st.tuples(
        st.sampled_from(["", "message", "delta", "error"]),
        st.lists(
            st.text(
                alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\r\n"), max_size=8
            ),
            min_size=1,
            max_size=3,
        ),
    ),
    max_size=5,
)


@fuzz(300)
@given(_sse_events, st.sampled_from(["\n", "\r\n", "\r"]), _cuts)
def test_sse_decoder_round_trips_events(
    events: list[tuple[str, list[str]]], eol: str, cuts: list[int]
) -> None:
    wire = ""
    for name, lines in events:
        if name:
            wire += f"event: {name}{eol}"
        wire += "".join(f"data: {line}{eol}" for line in lines) + eol
    got, partial = _sse_all(_split(wire.encode(), cuts))
    assert not partial
    want = [SSEEvent(name or "message", "\n".join(lines)) for name, lines in events]
    assert got == want


# --- provider stream parsers ------------------------------------------------------------------------

Parser = ChatStreamParser | ResponsesStreamParser | AnthropicStreamParser
_PARSERS: dict[str, Callable[[], Parser]] = {
    "openai_chat": ChatStreamParser,
    "openai_responses": ResponsesStreamParser,
    "anthropic": AnthropicStreamParser,
}


def _parse(make: Callable[[], Parser], pieces: list[bytes]) -> list[ev.ModelEvent]:
    p = make()
    out: list[ev.ModelEvent] = []
    for piece in pieces:
        out += p.feed(piece)
    out += p.end()
    return out


def _check_event_contract(events: list[ev.ModelEvent]) -> None:
    """What a parser promises for a stream it accepted (model/events.py)."""
    assert isinstance(events[0], ev.Started)
    assert sum(isinstance(e, ev.Started) for e in events) == 1
    assert isinstance(events[-1], ev.Done)
    assert sum(isinstance(e, ev.Done) for e in events) == 1
    assert sum(isinstance(e, ev.UsageReported) for e in events) == 1
    started = [e.index for e in events if isinstance(e, ev.ToolCallStarted)]
    ended = [e.index for e in events if isinstance(e, ev.ToolCallEnded)]
    assert len(set(started)) == len(started) and len(set(ended)) == len(ended)
    assert sorted(ended) == sorted(started)
    assert {e.index for e in events if isinstance(e, ev.ToolCallArgsDelta)} <= set(started)
    assert events[-1].reason == ("tool_use" if started else "stop")


def _run_parser(kind: str, pieces: list[bytes]) -> tuple[str, Any]:
    try:
        events = _parse(_PARSERS[kind], pieces)
    except ProviderError as e:
        assert isinstance(e.message, str)
        return ("error", None)
    _check_event_contract(events)
    return ("ok", events)


def _parser_property(kind: str, wire: bytes, cuts: list[int]) -> None:
    try:
        whole = _run_parser(kind, [wire])
        chunked = _run_parser(kind, _split(wire, cuts))
    except Exception as e:
        if _known(e):
            return
        raise
    assert chunked == whole


@fuzz(300)
@given(st.sampled_from(sorted(_PARSERS)), st.binary(max_size=300), _cuts)
def test_stream_parsers_on_arbitrary_bytes(kind: str, wire: bytes, cuts: list[int]) -> None:
    _parser_property(kind, wire, cuts)


def _sse_wire(events: list[tuple[str | None, Any]]) -> bytes:
    out = []
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        body = data if isinstance(data, str) and data.startswith(("[DONE]", "{not")) else json.dumps(data)
        out.append(f"{head}data: {body}\n\n")
    return "".join(out).encode()


# Chat Completions chunks.
_chat_usage = _obj(
    prompt_tokens=_small,
    completion_tokens=_small,
    prompt_tokens_details=_obj(cached_tokens=_small),
    completion_tokens_details=_obj(reasoning_tokens=_small),
    prompt_cache_hit_tokens=_small,
)
_chat_tool = _obj(
    index=_small,
    id=st.sampled_from(["c1", "c2", ""]),
    type=st.just("function"),
    function=_obj(name=st.sampled_from(["Read", "f", ""]), arguments=_args_text),
)
_chat_choice = _obj(
    index=_small,
    delta=_obj(
        role=st.just("assistant"),
        content=_word,
        reasoning_content=_word,
        reasoning=_word,
        refusal=_word,
        tool_calls=st.lists(_chat_tool, max_size=2),
    ),
    finish_reason=st.sampled_from(["stop", "tool_calls", "length", "content_filter", "x"]),
)
_chat_chunk = _obj(
    choices=st.lists(_chat_choice, max_size=2),
    usage=_chat_usage,
    error=_obj(message=_word, code=st.sampled_from([429, 500, "x"]), status_code=st.sampled_from([400, 503])),
)
_chat_noise = st.tuples(
    st.sampled_from([None, None, "error"]), _chat_chunk | st.sampled_from(["[DONE]", "{not json"])
)

# Responses events.
_resp_item = _obj(
    type=st.sampled_from(["message", "function_call", "reasoning", "web_search_call"]),
    id=st.sampled_from(["i1", "i2"]),
    call_id=st.sampled_from(["c1", "c2", ""]),
    name=st.sampled_from(["Read", ""]),
    arguments=_args_text,
    content=st.lists(_obj(type=st.just("output_text"), text=_word, refusal=_word), max_size=2),
    summary=st.lists(_obj(type=st.just("summary_text"), text=_word), max_size=2),
    encrypted_content=_word,
    phase=_word,
)
_resp_usage = _obj(
    input_tokens=_small,
    output_tokens=_small,
    input_tokens_details=_obj(cached_tokens=_small, cache_write_tokens=_small),
    output_tokens_details=_obj(reasoning_tokens=_small),
)
_RESP_TYPES = [
    "response.created",
    "response.output_item.added",
    "response.output_item.done",
    "response.output_text.delta",
    "response.refusal.delta",
    "response.reasoning_summary_text.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_part.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.completed",
    "response.failed",
    "response.incomplete",
    "error",
    "response.future_event",
]
_resp_event = _obj(
    {"type": st.sampled_from(_RESP_TYPES)},
    output_index=_small,
    item_id=st.sampled_from(["i1", "i2"]),
    item=_resp_item,
    delta=_word,
    arguments=_args_text,
    summary_index=_small,
    response=_obj(
        usage=_resp_usage,
        error=_obj(code=st.sampled_from(["server_error", "x"]), message=_word),
        incomplete_details=_obj(reason=_word),
    ),
    error=_obj(code=st.sampled_from(["rate_limit_exceeded", "x"]), message=_word),
    code=st.sampled_from(["server_error", "x"]),
    message=_word,
)
_resp_noise = st.tuples(
    st.sampled_from([None, "response.completed"]), _resp_event | st.sampled_from(["[DONE]", "{not json"])
)

# Anthropic Messages events.
_an_usage = _obj(
    input_tokens=_small,
    output_tokens=_small,
    cache_read_input_tokens=_small,
    cache_creation_input_tokens=_small,
    output_tokens_details=_obj(thinking_tokens=_small),
)
_an_event = _obj(
    {
        "type": st.sampled_from(
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
                "ping",
                "error",
                "future_event",
            ]
        )
    },
    index=_small,
    content_block=_obj(
        type=st.sampled_from(["text", "thinking", "redacted_thinking", "tool_use", "server_tool_use", "x"]),
        id=st.sampled_from(["t1", "t2", ""]),
        name=st.sampled_from(["Read", ""]),
        text=_word,
        thinking=_word,
        signature=_word,
        data=_word,
        input=st.just({}),
    ),
    delta=_obj(
        type=st.sampled_from(
            ["text_delta", "thinking_delta", "signature_delta", "input_json_delta", "citations_delta"]
        ),
        text=_word,
        thinking=_word,
        signature=_word,
        partial_json=_args_text,
        stop_reason=st.sampled_from(
            ["end_turn", "tool_use", "max_tokens", "refusal", "pause_turn", "stop_sequence"]
        ),
    ),
    usage=_an_usage,
    message=_obj(usage=_an_usage),
    error=_obj(type=st.sampled_from(["overloaded_error", "invalid_request_error"]), message=_word),
)
_an_noise = st.tuples(st.sampled_from([None, "message_stop"]), _an_event | st.sampled_from(["{not json"]))

_noise = {"openai_chat": _chat_noise, "openai_responses": _resp_noise, "anthropic": _an_noise}


# Valid streams: a turn the model might produce, written out as each provider streams it. The
# property perturbs them (drop, duplicate, reorder, insert a noise event, replace or delete a field
# deep inside an event, cut the bytes), so that accepted streams are common and their event
# contract is actually checked, while a perturbed stream also probes the error paths.
class _Turn(NamedTuple):
    thinking: tuple[str, ...]
    text: tuple[str, ...]
    calls: tuple[tuple[str, str, tuple[str, ...]], ...]  # (call id, name, argument fragments)
    usage: tuple[int, int, int, int]  # input, output, cached, reasoning (Anthropic: cache writes)
    alt: bool  # provider variant: usage on Chat's finish chunk, a Responses reasoning item, a ping
    tail: bool  # provider variant: no Chat [DONE], a Responses [DONE], an Anthropic non-tool stop


_arg_fragments = st.tuples(
    st.dictionaries(st.sampled_from(["path", "x"]), st.text(max_size=4) | st.integers(0, 9), max_size=2),
    st.lists(st.integers(0, 30), max_size=3),
).map(lambda a: tuple(_split(json.dumps(a[0]), a[1])))
_turns = st.builds(
    _Turn,
    thinking=st.lists(_word, max_size=2).map(tuple),
    text=st.lists(_word, max_size=3).map(tuple),
    calls=st.lists(
        st.tuples(st.sampled_from(["c1", "c2", "c3"]), st.sampled_from(["Read", "Grep"]), _arg_fragments),
        max_size=2,
        unique_by=lambda c: c[0],
    ).map(tuple),
    usage=st.tuples(_small, _small, _small, _small),
    alt=st.booleans(),
    tail=st.booleans(),
)


def _chat_skeleton(t: _Turn) -> list[tuple[str | None, Any]]:
    def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, usage: Any = None) -> Any:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
        return (None, {"id": "chatcmpl-1", "choices": choices, "usage": usage})

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"reasoning_content": r}) for r in t.thinking]
    out += [chunk({"content": x}) for x in t.text]
    for i, (call_id, name, frags) in enumerate(t.calls):
        first, *rest = frags
        fn = {"name": name, "arguments": first}
        out.append(chunk({"tool_calls": [{"index": i, "id": call_id, "type": "function", "function": fn}]}))
        out += [chunk({"tool_calls": [{"index": i, "function": {"arguments": f}}]}) for f in rest]
    inp, outp, cached, reasoning = t.usage
    usage = {
        "prompt_tokens": inp,
        "completion_tokens": outp,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }
    finish = "tool_calls" if t.calls else "stop"
    out += [chunk({}, finish, usage)] if t.alt else [chunk({}, finish), chunk(usage=usage)]
    if not t.tail:
        out.append((None, "[DONE]"))
    return out


def _responses_skeleton(t: _Turn) -> list[tuple[str | None, Any]]:
    out: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": "r1", "status": "in_progress", "usage": None}}
    ]

    def item(index: int, added: dict[str, Any], deltas: list[dict[str, Any]], done: dict[str, Any]) -> None:
        out.append({"type": "response.output_item.added", "output_index": index, "item": added})
        out.extend({"output_index": index, "item_id": added["id"], **d} for d in deltas)
        out.append({"type": "response.output_item.done", "output_index": index, "item": {**added, **done}})

    if t.thinking or t.alt:
        thinking = [
            {"type": "response.reasoning_summary_text.delta", "summary_index": 0, "delta": r}
            for r in t.thinking
        ]
        summary = [{"type": "summary_text", "text": "".join(t.thinking)}]
        part = {"type": "response.reasoning_summary_part.added", "summary_index": 0}
        item(
            len(out),
            {"id": "rs", "type": "reasoning", "summary": []},
            [part, *thinking],
            {"summary": summary, "encrypted_content": "enc"},
        )
    if t.text:
        deltas = [{"type": "response.output_text.delta", "content_index": 0, "delta": x} for x in t.text]
        content = [{"type": "output_text", "annotations": [], "text": "".join(t.text)}]
        item(
            len(out),
            {"id": "msg", "type": "message", "role": "assistant", "content": []},
            deltas,
            {"content": content},
        )
    for call_id, name, frags in t.calls:
        args = "".join(frags)
        deltas = [{"type": "response.function_call_arguments.delta", "delta": f} for f in frags]
        deltas.append({"type": "response.function_call_arguments.done", "arguments": args})
        fc = {
            "id": f"fc_{call_id}",
            "type": "function_call",
            "call_id": call_id,
            "name": name,
            "arguments": "",
        }
        item(len(out), fc, deltas, {"arguments": args})
    inp, outp, cached, reasoning = t.usage
    usage = {
        "input_tokens": inp,
        "output_tokens": outp,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens_details": {"reasoning_tokens": reasoning},
    }
    out.append(
        {"type": "response.completed", "response": {"id": "r1", "status": "completed", "usage": usage}}
    )
    events: list[tuple[str | None, Any]] = [(e["type"], e) for e in out]
    return [*events, (None, "[DONE]")] if t.tail else events


def _anthropic_skeleton(t: _Turn) -> list[tuple[str | None, Any]]:
    inp, outp, cached, written = t.usage
    usage = {"input_tokens": inp, "cache_read_input_tokens": cached, "cache_creation_input_tokens": written}
    out: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {"id": "m1", "role": "assistant", "usage": {**usage, "output_tokens": 1}},
        }
    ]

    def block(start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
        index = sum(e["type"] == "content_block_start" for e in out)
        out.append({"type": "content_block_start", "index": index, "content_block": start})
        out.extend({"type": "content_block_delta", "index": index, "delta": d} for d in deltas)
        out.append({"type": "content_block_stop", "index": index})

    if t.thinking:
        deltas = [{"type": "thinking_delta", "thinking": r} for r in t.thinking]
        block(
            {"type": "thinking", "thinking": "", "signature": ""},
            [*deltas, {"type": "signature_delta", "signature": "s="}],
        )
    if t.alt:
        out.append({"type": "ping"})
    if t.text:
        block({"type": "text", "text": ""}, [{"type": "text_delta", "text": x} for x in t.text])
    for call_id, name, frags in t.calls:
        block(
            {"type": "tool_use", "id": call_id, "name": name, "input": {}},
            [{"type": "input_json_delta", "partial_json": f} for f in frags],
        )
    stop = ("end_turn" if t.calls else "stop_sequence") if t.tail else ("tool_use" if t.calls else "end_turn")
    out.append({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": outp}})
    out.append({"type": "message_stop"})
    return [(e["type"], e) for e in out]


_SKELETONS: dict[str, Callable[[_Turn], list[tuple[str | None, Any]]]] = {
    "openai_chat": _chat_skeleton,
    "openai_responses": _responses_skeleton,
    "anthropic": _anthropic_skeleton,
}


def _expected_usage(kind: str, t: _Turn) -> Usage:
    a, b, c, d = t.usage
    if kind == "anthropic":  # input_tokens excludes cache reads and writes; byok reports the total
        return Usage(a + c + d, b, cache_read_tokens=c, cache_write_tokens=d)
    return Usage(a, b, cache_read_tokens=c, reasoning_tokens=d)


def _answer(events: list[ev.ModelEvent]) -> dict[str, Any]:
    """What a turn said, as a consumer sees it in the events."""
    args: dict[int, str] = {}
    for e in events:
        if isinstance(e, ev.ToolCallArgsDelta):
            args[e.index] = args.get(e.index, "") + e.delta
    ended = {e.index: e.arguments for e in events if isinstance(e, ev.ToolCallEnded)}
    return {
        "text": "".join(e.text for e in events if isinstance(e, ev.TextDelta)),
        "thinking": "".join(e.text for e in events if isinstance(e, ev.ThinkingDelta)),
        "calls": [
            (e.index, e.call_id, e.name, ended.get(e.index), args.get(e.index, ""))
            for e in events
            if isinstance(e, ev.ToolCallStarted)
        ],
        "usage": [e.usage for e in events if isinstance(e, ev.UsageReported)],
        "reason": events[-1].reason if isinstance(events[-1], ev.Done) else None,
    }


def _expected_answer(kind: str, t: _Turn) -> dict[str, Any]:
    return {
        "text": "".join(t.text),
        "thinking": "".join(t.thinking),
        "calls": [(i, c, n, "".join(f), "".join(f)) for i, (c, n, f) in enumerate(t.calls)],
        "usage": [_expected_usage(kind, t)],
        "reason": "tool_use" if t.calls else "stop",
    }


_PATH = st.lists(st.integers(0, 7), min_size=1, max_size=4)


def _perturbations(kind: str) -> st.SearchStrategy[tuple[Any, ...]]:
    at = st.integers(0, 40)  # an event index, taken modulo the stream's length
    return st.one_of(
        st.tuples(st.sampled_from(["drop", "dup"]), at),
        st.tuples(st.just("swap"), at, at),
        st.tuples(st.just("insert"), at, _noise[kind]),
        st.tuples(st.just("set"), at, _PATH, _json),  # a field deep in an event gets any JSON
        st.tuples(st.just("del"), at, _PATH),
        st.tuples(st.just("cut"), st.integers(0, 3000)),  # the bytes end early
    )


def _edit_field(event: Any, path: list[int], op: str, value: Any) -> Any:
    """``event`` with the field that ``path`` picks replaced by ``value`` (or deleted)."""
    if not isinstance(event, dict | list) or not event:
        return value if op == "set" else event
    node = event
    for depth, step in enumerate(path):
        keys = sorted(node) if isinstance(node, dict) else list(range(len(node)))
        key = keys[step % len(keys)]
        child = node[key]
        if depth + 1 < len(path) and isinstance(child, dict | list) and child:
            node = child
            continue
        if op == "set":
            node[key] = value
        else:
            del node[key]
        break
    return event


def _perturbed_wire(events: list[tuple[str | None, Any]], ops: tuple[tuple[Any, ...], ...]) -> bytes:
    events = copy.deepcopy(events)
    cut: int | None = None
    for op in ops:
        n = len(events)
        if op[0] == "cut":
            cut = op[1]
        elif op[0] == "insert":
            events.insert(op[1] % (n + 1), op[2])
        elif not events:
            continue
        elif op[0] == "drop":
            del events[op[1] % n]
        elif op[0] == "dup":
            events.insert(op[1] % n, copy.deepcopy(events[op[1] % n]))
        elif op[0] == "swap":
            i, j = op[1] % n, op[2] % n
            events[i], events[j] = events[j], events[i]
        else:
            name, data = events[op[1] % n]
            events[op[1] % n] = (name, _edit_field(data, op[2], op[0], op[3] if op[0] == "set" else None))
    wire = _sse_wire(events)
    return wire if cut is None else wire[: cut % (len(wire) + 1)]


@st.composite
def _stream_cases(draw: st.DrawFn) -> tuple[str, _Turn, tuple[tuple[Any, ...], ...]]:
    kind = draw(st.sampled_from(sorted(_PARSERS)), label="kind")
    turn = draw(_turns, label="turn")
    n = draw(st.sampled_from([0, 1, 1, 2, 3]), label="how many perturbations")  # 1 in 5 unperturbed
    ops = draw(st.lists(_perturbations(kind), min_size=n, max_size=n).map(tuple), label="perturbations")
    return kind, turn, ops


_GOOD_TURN = _Turn(
    thinking=("Let me", " look."),
    text=("Reading ", "a.py"),
    calls=(("c1", "Read", ('{"path": ', '"a.py"}')), ("c2", "Grep", ('{"x": 1}',))),
    usage=(10, 5, 2, 1),
    alt=True,
    tail=False,
)


def test_skeleton_streams_are_accepted_with_their_content() -> None:
    """The skeletons the property perturbs are valid streams for today's parsers (else the
    property would only ever see errors) and say exactly what their turn says."""
    plain = _GOOD_TURN._replace(thinking=(), calls=(), alt=False, tail=True)
    for kind in sorted(_PARSERS):
        for turn in (_GOOD_TURN, plain, _GOOD_TURN._replace(tail=True, alt=False)):
            outcome, events = _run_parser(kind, [_sse_wire(_SKELETONS[kind](turn))])
            assert outcome == "ok", (kind, turn)
            assert _answer(events) == _expected_answer(kind, turn), (kind, turn)


def test_stream_parsers_on_arbitrary_event_structures() -> None:
    """Valid streams of each provider, perturbed: ProviderError, or an accepted stream that keeps
    the event contract (_check_event_contract); chunking never changes the answer; an
    unperturbed stream is accepted and says exactly what its turn says. The tally at the end
    makes sure accepted streams (perturbed ones too) really reach the contract check."""
    tally: Counter[tuple[str, str, bool]] = Counter()

    @fuzz(400)
    @example(("openai_chat", _GOOD_TURN, ()), [7, 90, 91])
    @example(("openai_responses", _GOOD_TURN, ()), [300])
    @example(("anthropic", _GOOD_TURN, ()), [1, 2, 3])
    @example(("anthropic", _GOOD_TURN, (("dup", 3),)), [])  # a repeated thinking delta: still valid
    @given(_stream_cases(), _cuts)
    def prop(case: tuple[str, _Turn, tuple[tuple[Any, ...], ...]], cuts: list[int]) -> None:
        kind, turn, ops = case
        wire = _perturbed_wire(_SKELETONS[kind](turn), ops)
        whole = _run_parser(kind, [wire])
        chunked = _run_parser(kind, _split(wire, cuts))
        assert chunked == whole
        tally[kind, whole[0], bool(ops)] += 1
        if not ops:
            assert whole[0] == "ok"
            assert _answer(whole[1]) == _expected_answer(kind, turn)

    prop()
    total = sum(tally.values())
    for kind in _PARSERS:
        # Measured: 40-60% of each kind's examples are accepted, 5-30% of the perturbed ones.
        assert tally[kind, "ok", False] + tally[kind, "ok", True] >= total // 30, tally
        assert tally[kind, "ok", True] >= 2, tally


def _parser_bug(kind: str, events: list[Any]) -> None:
    """Helper for the pinned parser bugs: the stream must end in ProviderError, nothing else."""
    wire = _sse_wire([(None, e) for e in events])
    with pytest.raises(ProviderError):
        _parse(_PARSERS[kind], [wire])


def test_anthropic_event_type_that_is_not_a_string() -> None:
    _parser_bug("anthropic", [{"type": {}}])


def test_chat_tool_call_function_that_is_not_an_object() -> None:
    _parser_bug("openai_chat", [{"choices": [{"delta": {"tool_calls": [{"index": 0, "function": "x"}]}}]}])


def test_chat_usage_details_that_are_not_objects() -> None:
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "prompt_tokens_details": "x"}
    _parser_bug("openai_chat", [{"usage": usage}])


@pytest.mark.parametrize(
    "event",
    [
        {"type": "response.incomplete", "response": "x"},
        {"type": "response.reasoning_summary_part.added", "summary_index": "x"},
        {"type": "response.output_text.delta", "delta": "a", "item": "x"},
        {"type": "response.output_text.delta", "delta": "a", "item_id": [1]},
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {"type": "message", "content": [{"text": 5}]},
        },
        {
            "type": "response.completed",
            "response": {"usage": {"input_tokens": 1, "output_tokens": 1, "input_tokens_details": "x"}},
        },
    ],
)
def test_responses_fields_of_the_wrong_json_type(event: dict[str, Any]) -> None:
    _parser_bug("openai_responses", [event])


@pytest.mark.parametrize(
    "events",
    [
        [{"type": "message_start", "message": "x"}],
        [
            {"type": "message_start"},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
            {"type": "content_block_delta", "index": 0, "delta": "x"},
        ],
        [{"type": "message_start"}, {"type": "message_delta", "delta": "x"}],
        [
            {
                "type": "message_start",
                "message": {"usage": {"input_tokens": 1, "output_tokens": 1, "output_tokens_details": "x"}},
            },
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}},
            {"type": "message_stop"},
        ],
    ],
)
def test_anthropic_fields_of_the_wrong_json_type(events: list[Any]) -> None:
    _parser_bug("anthropic", events)


# --- edit engine --------------------------------------------------------------------------------------


@fuzz(400)
@given(_newline_texts, _cuts)
def test_newline_normaliser_chunked_equals_whole(text: str, cuts: list[int]) -> None:
    whole = normalize_newlines(text)
    assert "\r" not in whole
    assert normalize_newlines(whole) == whole
    assert normalize_newlines(whole.replace("\n", "\r\n")) == whole  # LF -> CRLF -> LF round trip
    n = NewlineNormalizer()
    assert "".join(n.feed(p) for p in _split(text, cuts)) + n.flush() == whole


@fuzz(400)
@given(_newline_texts, _newline_texts, _newline_texts, st.booleans())
def test_replace_unique_matches_a_reference(text: str, old: str, new: str, replace_all: bool) -> None:
    t, o, n = normalize_newlines(text), normalize_newlines(old), normalize_newlines(new)
    try:
        out = replace_unique(text, old, new, replace_all)
    except EditError as e:
        assert str(e)
        assert not o or o == n or o not in t or (not replace_all and count_occurrences(t, o) > 1)
        return
    assert o and o != n and o in t
    assert out == (t.replace(o, n) if replace_all else t.replace(o, n, 1))
    assert "\r" not in out
    # CRLF and LF spellings of the same file and strings give the same edit.
    crlf = replace_unique(t.replace("\n", "\r\n"), o.replace("\n", "\r\n"), n, replace_all)
    assert crlf == out


def _edit_round(tool: Any, args: dict[str, Any], file: str | None) -> tuple[str, str | None]:
    """Drive Write/StrReplace against a file: ("error", msg) or ("written", text)."""
    try:
        parsed = tool.parse(args)
    except ToolArgError as e:
        return ("error", str(e))
    execution = tool.execute(Invocation("call-1", tool.name, "mc-1", parsed))
    (read,) = execution.start()
    assert isinstance(read, SendExec) and read.message.read_args is not None
    if file is None:
        result = agent.ReadResult(file_not_found=agent.ReadFileNotFound())
    else:
        result = agent.ReadResult(success=agent.ReadSuccess(content=file))
    (action,) = execution.on_result(agent.ExecClientMessage(read_result=result))
    if isinstance(action, Finish):
        assert action.outcome.is_error
        return ("error", action.outcome.content)
    assert isinstance(action, SendExec) and action.message.write_args is not None
    written = action.message.write_args.file_text
    (done,) = execution.on_result(
        agent.ExecClientMessage(write_result=agent.WriteResult(success=agent.WriteSuccess()))
    )
    assert isinstance(done, Finish) and not done.outcome.is_error
    ui = done.outcome.ui.edit_tool_call.result.success
    assert ui.after_full_file_content == written
    assert ui.before_full_file_content == (None if file is None else normalize_newlines(file))
    return ("written", written)


@fuzz(300)
@given(st.none() | _newline_texts, _newline_texts, _newline_texts, st.booleans())
def test_str_replace_engine_writes_what_replace_unique_computes(
    file: str | None, old: str, new: str, replace_all: bool
) -> None:
    args = {"path": "f.txt", "old_string": old, "new_string": new, "replace_all": replace_all}
    kind, value = _edit_round(STR_REPLACE, args, file)
    if file is None:
        assert kind == "error"
        return
    try:
        want = replace_unique(file, old, new, replace_all)
    except EditError:
        assert kind == "error"
        return
    assert (kind, value) == ("written", want)


@fuzz(200)
@given(st.none() | _newline_texts, _newline_texts)
def test_write_engine_writes_lf_normalised_contents(file: str | None, contents: str) -> None:
    assert _edit_round(WRITE, {"path": "f.txt", "contents": contents}, file) == (
        "written",
        normalize_newlines(contents),
    )


# --- json_stream ----------------------------------------------------------------------------------------


@fuzz(400)
@given(
    st.dictionaries(st.sampled_from(["path", "new_string", "x", "new"]), _json, max_size=3),
    st.text(max_size=20),
    st.booleans(),
    _cuts,
)
def test_json_string_field_streams_the_value_however_chunked(
    other: dict[str, Any], value: str, ascii_only: bool, cuts: list[int]
) -> None:
    obj = {k: v for k, v in other.items() if k != "new_string"}
    keys = list(obj)
    position = len(keys) // 2
    items = [
        *[(k, obj[k]) for k in keys[:position]],
        ("new_string", value),
        *[(k, obj[k]) for k in keys[position:]],
    ]
    text = "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v, ensure_ascii=ascii_only)}" for k, v in items) + "}"
    field = JsonStringField("new_string")
    out = "".join(field.feed(p) for p in _split(text, cuts))
    assert field.done
    assert out == json.loads(text)["new_string"]


_json_noise = st.lists(
    st.sampled_from([*'{}[]":,\\u0123abdf nrt', "\\ud83d", "\\ude00", "\\ud83d\\ude00", '\\"']), max_size=30
).map("".join)
# Openings that put the scanner inside the value of "a" (the "a" in the array is not the key).
_VALUE_OPENINGS = ['{"a":"', ' {"b":[1,"a"],"a": "']


def _closing_quote(text: str) -> int | None:
    """Index of the first unescaped quote in ``text``: where a JSON string value ends."""
    i = 0
    while i < len(text):
        if text[i] == '"':
            return i
        i += 2 if text[i] == "\\" else 1
    return None


def test_json_string_field_never_raises_on_arbitrary_text() -> None:
    """Any text: no exception, and chunking never changes a value that ended. Most texts open
    the object and the value first, so the arbitrary characters (escapes, lone surrogates,
    quotes) stream through the value: it ends exactly at its closing quote and equals what
    ``json.loads`` reads there. The tally makes sure values really end."""
    tally: Counter[str] = Counter()

    @fuzz(400)
    # Cuts inside an escape, between the two halves of a surrogate pair, inside the low half.
    @example(_VALUE_OPENINGS[0], 'x\\ud83d\\ude00\\n\\"y"', [9, 13, 15])
    @example(_VALUE_OPENINGS[1], '\\u01"', [21])  # a malformed escape, then the closing quote
    @given(
        st.sampled_from(["", *_VALUE_OPENINGS, *_VALUE_OPENINGS]),
        _json_noise | _json_noise.map(lambda t: t + '"'),  # often a closing quote at the end
        st.lists(st.integers(0, 90), max_size=8),  # cuts that land inside these short texts
    )
    def prop(opening: str, noise: str, cuts: list[int]) -> None:
        text = opening + noise
        field = JsonStringField("a")
        whole = field.feed(text)
        chunked_field = JsonStringField("a")
        chunked = "".join(chunked_field.feed(p) for p in _split(text, cuts))
        assert isinstance(whole, str)
        assert chunked_field.done == field.done
        if field.done:
            # Chunking may only delay a held high surrogate, never change the decoded characters.
            assert chunked == whole
        if not opening:
            return
        end = _closing_quote(noise)
        assert field.done == (end is not None)
        if end is not None:
            try:
                want = json.loads('"' + noise[: end + 1])
            except ValueError:
                tally["ended, lenient"] += 1
                return  # an escape json.loads refuses: the scanner passes it through leniently
            assert whole == want
            tally["ended, checked"] += 1

    prop()
    assert tally["ended, checked"] >= 40, tally  # measured: ~150 of 400


@fuzz(300)
@given(st.text(max_size=30), _cuts)
def test_edit_content_stream_equals_the_normalised_argument(value: str, cuts: list[int]) -> None:
    value = value.replace("\r\n", "\r")  # plenty of CRs, some at chunk edges
    assert STR_REPLACE.args_stream is not None
    stream = STR_REPLACE.args_stream()
    text = json.dumps({"path": "a", "old_string": "x", "new_string": value})
    deltas = [d for p in _split(text, cuts) for d in stream.feed(p)]
    got = "".join(d.edit_tool_call_delta.stream_content_delta for d in deltas)
    assert got == normalize_newlines(value)


# --- blob graph, root JSON -------------------------------------------------------------------------------

_ids = st.text(alphabet="abc-_:01", max_size=6)
_calls = st.lists(
    st.builds(
        ToolCall, call_id=_ids.filter(bool), name=_ids.filter(bool), arguments=_texts, index=st.integers(0, 5)
    ),
    max_size=2,
    unique_by=lambda c: c.call_id,
).map(tuple)
_messages = st.one_of(
    st.builds(
        Message, role=st.just("user"), origin=st.sampled_from(["user", "runtime"]), text=_texts, event_id=_ids
    ),
    st.builds(
        Message,
        role=st.just("assistant"),
        origin=st.just("assistant"),
        text=_texts,
        thinking=_texts,
        replay=st.none()
        | st.builds(ReplayState, provider_kind=st.sampled_from(["anthropic", "x"]), data=_texts),
        tool_calls=_calls,
        tool_round_id=_ids,
        model_call_id=_ids,
    ),
    st.builds(
        Message,
        role=st.just("tool"),
        origin=st.just("tool"),
        text=_texts,
        tool_call_id=_ids.filter(bool),
        tool_name=_ids,
        is_error=st.booleans(),
        tool_round_id=_ids,
        completion_seq=st.integers(0, 3),
    ),
)


def _checkpoint_inputs(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "system_prompt": draw(_texts),
        "stable": draw(st.lists(_messages, max_size=5)),
        "pending": draw(st.lists(_messages, max_size=1)),
        "prior_turns": draw(st.lists(st.binary(min_size=32, max_size=32), max_size=2)),
        "turn": draw(
            st.none()
            | st.builds(
                TurnRecord,
                request_id=_ids,
                user_message=st.builds(lambda t: bytes(agent.UserMessage(text=t)), _texts),
                steps=st.lists(st.binary(max_size=8), max_size=3).map(tuple),
            )
        ),
        "token_details": agent.ConversationTokenDetails(used_tokens=draw(st.integers(0, 10**6))),
        "mode": draw(st.sampled_from([agent.AgentMode.AGENT, agent.AgentMode.ASK])),
    }


@fuzz(200)
@given(st.data())
def test_checkpoint_blob_graph_is_deterministic_and_closed(data: st.DataObject) -> None:
    inputs = data.draw(st.composite(_checkpoint_inputs)())
    cache: dict[bytes, Blob] = {}

    def cached_root(m: Message) -> Blob:
        return cache.setdefault(m.id, root_blob(m))

    a = build_checkpoint(**inputs)
    b = build_checkpoint(**inputs, root_of=cached_root)
    c = build_checkpoint(**inputs, root_of=cached_root)
    assert a == b == c
    ids = [blob.id for blob in a.blobs]
    assert len(ids) == len(set(ids))
    for blob in a.blobs:
        assert blob.id == hashlib.sha256(blob.data).digest()
    state = agent.ConversationStateStructure.parse(a.state)
    position = {blob_id: i for i, blob_id in enumerate(ids)}
    assert all(r in position for r in state.root_prompt_messages_json)
    assert list(state.turns[: len(inputs["prior_turns"])]) == inputs["prior_turns"]
    if inputs["turn"] is not None:
        assert a.turn_id == state.turns[-1]
        turn = agent.ConversationTurnStructure.parse(
            dict(zip(ids, [x.data for x in a.blobs], strict=True))[a.turn_id]
        )
        children = [turn.agent_conversation_turn.user_message, *turn.agent_conversation_turn.steps]
        assert all(position[child] < position[a.turn_id] for child in children)  # children first
    assert [decode_root(p.encode()) for p in state.pending_tool_calls] == list(inputs["pending"])
    by_id = {blob.id: blob.data for blob in a.blobs}
    non_system = [m for m in inputs["stable"] if m.role != "system"]
    assert [decode_root(by_id[r]) for r in state.root_prompt_messages_json[1:]] == non_system


_root_json = _obj(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer"])},
    content=_word
    | st.lists(
        _obj(
            {"type": st.sampled_from(["text", "reasoning", "tool-call", "tool-result", "image"])},
            text=_word,
            toolCallId=st.sampled_from(["c1", "c2"]),
            toolName=st.sampled_from(["Read", "f"]),
            input=_args_text | st.just({"a": 1}),
            output=_obj(type=st.sampled_from(["text", "error-text", "json", "error-json"]), value=_word),
        ),
        max_size=3,
    ),
    providerOptions=_obj(
        byok=_obj(
            origin=st.sampled_from(["user", "runtime", "assistant", "tool"]),
            replay=_obj({"provider_kind": st.sampled_from(["anthropic", "openai_chat"]), "data": _word}),
            call_index=st.lists(_small, max_size=2),
            tool_round_id=_ids,
            event_id=_ids,
            model_call_id=_ids,
            completion_seq=_small,
        )
    ),
)


def _decode_root_outcome(data: bytes) -> Message | None:
    try:
        return decode_root(data)
    except RootJsonError:
        return None


@fuzz(400)
@given(
    st.one_of(
        _root_json.map(lambda o: json.dumps(o).encode()),
        _json.map(lambda o: json.dumps(o).encode()),
        st.binary(max_size=60),
    )
)
def test_decode_root_on_arbitrary_json(data: bytes) -> None:
    """A Message or RootJsonError. Decoding may drop what a Message cannot hold (a user turn's
    reasoning part), but from then on encode/decode is stable: same message, same bytes, same id."""
    m = _decode_root_outcome(data)
    if m is None:
        return
    assert m.role in ("system", "user", "assistant", "tool")
    assert _well_typed_message(m), m  # wrongly typed fields are a RootJsonError
    assert m.role == "assistant" or not m.tool_calls
    encoded = encode_root(m)
    assert encode_root(decode_root(encoded)) == encoded


@pytest.mark.parametrize("role", ["system", "user", "tool"])
def test_tool_calls_in_a_non_assistant_root_are_refused(role: str) -> None:
    """Found by `make fuzz`: such a root decoded to a Message whose calls encode_root could not
    write for that role, so encode(decode(encode(m))) != encode(m) and its blob id changed."""
    data = json.dumps(
        {"role": role, "content": [{"type": "tool-call", "toolCallId": "c1", "toolName": "Read"}]}
    ).encode()
    with pytest.raises(RootJsonError, match=f"tool-call part in a {role} message"):
        decode_root(data)


def _well_typed_message(m: Message) -> bool:
    strs = (
        "origin",
        "text",
        "thinking",
        "tool_call_id",
        "tool_name",
        "tool_round_id",
        "event_id",
        "model_call_id",
    )
    return (
        all(isinstance(getattr(m, k), str) for k in strs)
        and m.origin in ("user", "runtime", "assistant", "tool")
        and type(m.completion_seq) is int
        and isinstance(m.is_error, bool)
        and (m.replay is None or (isinstance(m.replay.provider_kind, str) and isinstance(m.replay.data, str)))
        and all(
            isinstance(c.call_id, str)
            and isinstance(c.name, str)
            and isinstance(c.arguments, str)
            and type(c.index) is int
            for c in m.tool_calls
        )
    )


def _byok_options(**fields: Any) -> dict[str, Any]:
    return {"providerOptions": {"byok": fields}}


_CALL = {"type": "tool-call", "toolCallId": "c", "toolName": "f"}
_RESULT = {
    "type": "tool-result",
    "toolCallId": "c",
    "toolName": "f",
    "output": {"type": "text", "value": "v"},
}


@pytest.mark.parametrize(
    ("root", "why"),
    [
        ({"role": "user", "content": "x", **_byok_options(origin=5)}, "unknown origin 5"),
        ({"role": "user", "content": "x", **_byok_options(origin=None)}, "unknown origin None"),
        ({"role": "user", "content": "x", **_byok_options(completion_seq="s")}, "completion_seq"),
        ({"role": "user", "content": "x", **_byok_options(completion_seq=True)}, "completion_seq"),
        ({"role": "user", "content": "x", **_byok_options(completion_seq=1.0)}, "completion_seq"),
        ({"role": "user", "content": "x", **_byok_options(tool_round_id=1)}, "tool_round_id"),
        ({"role": "user", "content": "x", **_byok_options(event_id=[1])}, "event_id"),
        ({"role": "user", "content": "x", **_byok_options(model_call_id=None)}, "model_call_id"),
        (
            {
                "role": "assistant",
                "content": [],
                **_byok_options(replay={"provider_kind": "openai_chat", "data": 7}),
            },
            "replay.data",
        ),
        (
            {"role": "assistant", "content": [], **_byok_options(replay={"provider_kind": 3, "data": "d"})},
            "replay.provider_kind",
        ),
        ({"role": "assistant", "content": [], **_byok_options(replay="x")}, "malformed"),
        (
            {"role": "assistant", "content": [{**_CALL, "toolCallId": 1, "toolName": None, "input": "{}"}]},
            "toolCallId",
        ),
        ({"role": "assistant", "content": [{**_CALL, "toolName": None}]}, "toolName"),
        ({"role": "assistant", "content": [_CALL], **_byok_options(call_index=["x"])}, "call_index"),
        ({"role": "assistant", "content": [_CALL], **_byok_options(call_index=[True])}, "call_index"),
        ({"role": "assistant", "content": [_CALL], **_byok_options(call_index=5)}, "call_index"),
        ({"role": "assistant", "content": [{"type": "text", "text": 5}]}, "text part"),
        ({"role": "assistant", "content": [{"type": "reasoning", "text": []}]}, "reasoning part"),
        ({"role": "tool", "content": [{**_RESULT, "toolCallId": 3}]}, "toolCallId"),
        ({"role": "tool", "content": [{**_RESULT, "toolName": {}}]}, "toolName"),
        ({"role": "tool", "content": [{**_RESULT, "output": "x"}]}, "malformed"),
        ({"role": "user", "content": 5}, "string or a list of parts"),
        ({"role": "assistant", "content": ["x"]}, "malformed"),
        ({"role": "user", "content": "x", "providerOptions": {"byok": "x"}}, "malformed"),
    ],
)
def test_decode_root_rejects_wrongly_typed_fields(root: dict[str, Any], why: str) -> None:
    """Each wrongly typed field is refused, for its own reason: not coerced, not defaulted."""
    with pytest.raises(RootJsonError, match=re.escape(why)):
        decode_root(json.dumps(root).encode())


def test_decode_root_on_deeply_nested_json() -> None:
    with pytest.raises(RootJsonError):
        decode_root(b"[" * 100_000)


# --- the store: arbitrary append sequences with compare-and-swap ------------------------------------------

_store_ops = st.lists(
    st.tuples(
        st.sampled_from(["c1", "c2"]),
        st.sampled_from([0, 0, 0, -1, 1]),  # expected version = current + this (stale when != 0)
        st.lists(_messages, min_size=1, max_size=3),
        st.none() | st.sampled_from(["e1", "e2", "e3"]),  # runtime event id (exactly-once key)
        st.none() | st.sampled_from(["back"]),  # move the head back one revision first (an edit)
    ),
    min_size=1,
    max_size=10,
)


@pytest.fixture(scope="module")
def store_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


_store_runs = iter(range(10**9))


@fuzz(60)
@given(_store_ops)
def test_store_cas_appends_never_corrupt_history(store_dir: Path, ops: list[Any]) -> None:
    data_dir = store_dir / f"s{next(_store_runs)}"
    try:
        _check_store_ops(data_dir, ops)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def _check_store_ops(data_dir: Path, ops: list[Any]) -> None:
    model: dict[str, tuple[int, int | None, tuple[Message, ...]]] = {}  # conv -> version, revision, messages
    revisions: dict[int, tuple[Message, ...]] = {}
    parents: dict[int, int | None] = {}
    events: dict[str, set[str]] = {}
    now = 0
    with SQLiteStore.open_in(data_dir) as store:
        for conv, delta, messages, event_id, move in ops:
            now += 1
            version, revision, history = model.get(conv, (0, None, ()))
            if move and revision is not None:
                back = parents[revision]
                head = store.move_head(conv, version, back, now)
                version, revision, history = version + 1, back, revisions[back] if back is not None else ()
                assert (head.version, head.revision_id, head.messages) == (version, revision, history)
                model[conv] = (version, revision, history)
            expected = version + delta if version + delta >= 0 else version + 1  # never negative
            stale = expected != version
            before = store.head(conv)
            try:
                head = store.append(conv, expected, messages, now, event_id=event_id)
            except StaleRevision as e:
                assert stale and event_id not in events.get(conv, set())
                assert (e.expected_version, e.actual_version) == (expected, version)
                assert store.head(conv) == before  # a lost CAS leaves the conversation untouched
                continue
            if event_id is not None and event_id in events.get(conv, set()):
                assert head == before  # already consumed: replayed, nothing appended
                continue
            assert not stale
            assert head.messages == history + tuple(messages)
            assert head.version == version + 1 and head.revision_id is not None
            parents[head.revision_id] = revision
            revisions[head.revision_id] = head.messages
            model[conv] = (head.version, head.revision_id, head.messages)
            if event_id is not None:
                events.setdefault(conv, set()).add(event_id)
        for conv, (version, revision, history) in model.items():
            assert store.head(conv) == Head(conv, revision, version, history)
    # A fresh connection (no cache) reads back every revision exactly.
    with SQLiteStore.open_in(data_dir) as fresh:
        for revision, history in revisions.items():
            assert fresh.messages_at(revision) == history
        for conv, (version, revision, history) in model.items():
            head = fresh.head(conv)
            assert (head.version, head.revision_id, head.messages) == (version, revision, history)
