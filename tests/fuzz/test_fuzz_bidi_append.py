"""Fuzzing BidiAppend and AgentClientMessage decoding: the real handler on any bodies and append
sessions, ``decode_agent_message``/``well_typed`` on any bytes, and ``AppendOrder``.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Iterator

import betterproto2
from hypothesis import example, given
from hypothesis import strategies as st

from byok.http.bidi_append import decode_agent_message
from byok.http.wire_check import well_typed
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from byok.run.bidi_order import AppendOrder, OrderBufferFull
from tests.fuzz.append_requests import (
    RUN_REQUEST_FIELD,
    append_bodies,
    append_body,
    append_sessions,
    client_message,
    field_number,
    ill_typed,
    post_appends,
    varint,
    wire_field,
)
from tests.fuzz.support import fuzz


def test_bidi_append_handler_on_arbitrary_bodies() -> None:
    """The BidiAppend handler on any bodies (arbitrary bytes; valid requests carrying valid,
    random or non-hex data, some with bytes inserted or cut), several per request id: it always
    answers (never raises, never a 500): 200, or invalid_argument/resource_exhausted, or the body
    goes upstream unchanged. An undecodable or ill-typed request, or one without a request id, is
    invalid_argument; a 200 carried one well-typed AgentClientMessage; a started run got exactly
    its run_request. The tally makes sure each kind of answer is seen."""
    tally: Counter[str] = Counter()

    @fuzz(300)
    @example([append_body("local")])
    @example([append_body("upstream"), append_body("upstream", 1)])
    @example([_GROUP_WIRE_TYPE_BODY])  # found by this property: HTTP 500 (TypeError)
    @example([append_body("local", -(2**63))])  # found by this property: 200, the append dropped
    @given(st.lists(append_bodies, min_size=1, max_size=3) | append_sessions())
    def prop(bodies: list[bytes]) -> None:
        taken: dict[str, set[int]] = {}  # request id -> seqnos answered 200 so far
        runs: Counter[str] = Counter()  # request id -> runs started
        for body, got in zip(bodies, post_appends(bodies), strict=True):
            try:
                req = aiserver.BidiAppendRequest.parse(body)
                bad = ill_typed(req) is not None or req.request_id is None or not req.request_id.request_id
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
                msg = client_message(bytes.fromhex(req.data))
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
        (got,) = post_appends([_GROUP_WIRE_TYPE_BODY])
    assert (got["status"], got["code"]) == (400, "invalid_argument")
    # The same deeper, in a run_request: UserMessage.text (a plain string field) as a group.
    good = bytes(agent.UserMessage(message_id="u"))
    bad = good + varint(field_number(agent.UserMessage, "text") << 3 | 3)
    assert agent.UserMessage.parse(bad).text is None
    assert decode_agent_message(_run_request_with_user_message(good)) is not None
    assert decode_agent_message(_run_request_with_user_message(bad)) is None


def _run_request_with_user_message(user: bytes) -> str:
    """Hex of AgentClientMessage{run_request{action{user_message_action{user_message: user}}}}."""
    action = wire_field(field_number(agent.UserMessageAction, "user_message"), 2, user)
    conversation_action = wire_field(field_number(agent.ConversationAction, "user_message_action"), 2, action)
    run = wire_field(field_number(agent.AgentRunRequest, "action"), 2, conversation_action)
    return wire_field(RUN_REQUEST_FIELD, 2, run).hex()


def test_a_negative_append_seqno_is_refused() -> None:
    """Found by the BidiAppend property: a negative seqno counted as "already delivered", so
    even a first append carrying the run_request was answered 200 and silently dropped."""
    with _quiet("byok.http"):
        (got,) = post_appends([append_body("local", -1)])
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
@example(wire_field(RUN_REQUEST_FIELD, 0, 5))  # AgentClientMessage{run_request: varint 5}
@given(st.binary(max_size=60))
def test_decoded_client_messages_are_well_typed(raw: bytes) -> None:
    msg = decode_agent_message(raw.hex())
    assert msg is None or ill_typed(msg) is None, ill_typed(msg)  # type: ignore[arg-type]
    # The edge check the app applies to every BidiAppendRequest: parse failures and ill-typed
    # results are both rejected before any field is read.
    try:
        req = aiserver.BidiAppendRequest.parse(raw)
    except Exception:
        return
    assert well_typed(req) == (ill_typed(req) is None)


def test_a_user_message_with_a_varint_message_field_is_refused_at_the_edge() -> None:
    raw = wire_field(field_number(agent.UserMessage, "text"), 2, b"hi") + wire_field(
        field_number(agent.UserMessage, "execute_plan_info"), 0, 10_000_000
    )
    # betterproto2 decodes the varint into the message field, and re-encoding it would allocate
    # bytes(10_000_000); byok never gets that far: the message is refused at the edge.
    wrapped = wire_field(
        field_number(agent.AgentClientMessage, "run_request"),
        2,
        wire_field(
            field_number(agent.AgentRunRequest, "action"),
            2,
            wire_field(
                field_number(agent.ConversationAction, "user_message_action"),
                2,
                wire_field(field_number(agent.UserMessageAction, "user_message"), 2, raw),
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
