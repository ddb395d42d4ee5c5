"""The scanned checkpoint id lists give exactly what the strict betterproto2 parse gives."""

from __future__ import annotations

import betterproto2
from hypothesis import assume, example, given
from hypothesis import strategies as st

from byok.cursor.encode import varint
from byok.http import state_ids
from byok.http.bidi_append import parse_client_message
from byok.http.wire_check import well_typed
from byok.pb.agent import v1 as agent

_ROOTS = 1  # ConversationStateStructure.root_prompt_messages_json
_TURNS = 8  # ConversationStateStructure.turns


def reference(raw: bytes) -> agent.AgentClientMessage | None:
    """The parse before the fast path: betterproto2 on the whole message."""
    try:
        msg = agent.AgentClientMessage.parse(raw)
        name, _ = betterproto2.which_one_of(msg, "message")
    except Exception:
        return None
    return msg if name and well_typed(msg) else None


ids = st.lists(st.binary(min_size=32, max_size=32) | st.binary(min_size=0, max_size=200), max_size=40)


@st.composite
def run_requests(draw: st.DrawFn) -> bytes:
    state = agent.ConversationStateStructure(
        root_prompt_messages_json=draw(ids),
        turns=draw(ids),
        token_details=draw(
            st.none() | st.builds(agent.ConversationTokenDetails, max_tokens=st.integers(0, 2**31))
        ),
    )
    req = agent.AgentRunRequest(
        conversation_state=state,
        model_details=agent.ModelDetails(model_id=draw(st.text(max_size=20))),
        conversation_id=draw(st.text(max_size=20)),
    )
    return bytes(agent.AgentClientMessage(run_request=req))


@given(run_requests())
def test_well_formed_run_requests_parse_identically(raw: bytes) -> None:
    assert state_ids.lift(raw) is not None
    parsed = parse_client_message(raw)
    assert parsed is not None
    assert parsed == reference(raw)
    assert bytes(parsed) == raw  # and nothing moved: the lists keep their order


def _key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def _len_record(number: int, payload: bytes) -> bytes:
    return _key(number, 2) + varint(len(payload)) + payload


def _checkpoint(region: bytes, token_details: agent.ConversationTokenDetails | None = None) -> bytes:
    """A run_request whose conversation_state starts with ``region`` (raw records, as sent),
    every enclosing length correct, so the scan reaches the region and judges it alone."""
    state = region + bytes(agent.ConversationStateStructure(token_details=token_details))
    run = _len_record(1, state) + bytes(
        agent.AgentRunRequest(model_details=agent.ModelDetails(model_id="m"), conversation_id="c")
    )
    return _len_record(1, run)


@st.composite
def id_record(draw: st.DrawFn) -> bytes:
    """A root (field 1) or turn (field 8) id record; the length sometimes padded to more bytes
    than it needs, which the scan's one-byte fast path must hand to the general record reader."""
    # Mostly real blob ids (32 bytes: the strided path for runs of roots), some of any size.
    payload = draw(st.binary(min_size=32, max_size=32) | st.binary(max_size=200))
    size = bytearray(varint(len(payload)))
    pad = draw(st.integers(0, 2))
    if pad:
        size[-1] |= 0x80
        size += b"\x80" * (pad - 1) + b"\x00"
    return _key(draw(st.sampled_from([_ROOTS, _TURNS])), 2) + bytes(size) + payload


@st.composite
def other_record(draw: st.DrawFn) -> bytes:
    """A record of another field, interleaved with the ids: the scan keeps it for betterproto2."""
    if draw(st.booleans()):
        return _len_record(draw(st.sampled_from([3, 6, 99])), draw(st.binary(max_size=20)))
    return _key(draw(st.sampled_from([17, 99])), 0) + varint(draw(st.integers(0, 2**64 - 1)))


@st.composite
def mistyped_id_record(draw: st.DrawFn) -> bytes:
    """Field 1 or 8 sent as a varint, fixed64 or fixed32: betterproto2 reads an int into a bytes
    list and well_typed refuses it, so the scan must not pass it (nor drop it) either."""
    number = draw(st.sampled_from([_ROOTS, _TURNS]))
    wire = draw(st.sampled_from([0, 1, 5]))
    if wire == 0:
        body = varint(draw(st.integers(0, 2**64 - 1)))
    else:
        body = draw(st.binary(min_size=8 if wire == 1 else 4, max_size=8 if wire == 1 else 4))
    return _key(number, wire) + body


@st.composite
def mutated_checkpoints(draw: st.DrawFn) -> bytes:
    records = draw(st.lists(id_record() | id_record() | other_record(), max_size=30))
    if draw(st.integers(0, 5)) == 0:
        records.insert(draw(st.integers(0, len(records))), draw(mistyped_id_record()))
    region = bytearray(b"".join(records))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        op = draw(st.sampled_from(["flip", "cut", "insert"]))
        at = draw(st.integers(0, max(len(region) - 1, 0)))
        if op == "flip" and region:
            region[at] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del region[at : at + draw(st.integers(1, 8))]
        else:
            region[at:at] = draw(st.binary(min_size=1, max_size=6))
    token_details = draw(
        st.none() | st.builds(agent.ConversationTokenDetails, max_tokens=st.integers(0, 2**31))
    )
    return _checkpoint(bytes(region), token_details)


_ID = _len_record(_ROOTS, b"r" * 32)


@given(mutated_checkpoints())
@example(_checkpoint(b"\x08\x05"))  # a root id sent as a varint
@example(_checkpoint(_ID + b"\x45" + b"tttt" + _ID))  # a turn id sent as a fixed32, between roots
@example(_checkpoint(_ID + b"\x09" + b"r" * 8))  # a root id sent as a fixed64
@example(_checkpoint(_ID * 3 + b"\x0a\x20" + b"r" * 31))  # a run of ids whose last one is cut short
@example(_checkpoint(_ID * 2 + b"\x0a\x20"))  # ... right after its length
@example(_checkpoint(_ID * 2 + _len_record(_ROOTS, b"s" * 33) + _ID))  # a longer id inside a run
def test_mutated_bytes_parse_identically(raw: bytes) -> None:
    """Mutate the checkpoint's id-list region (ConversationStateStructure fields 1 and 8: ids,
    padded lengths, interleaved other fields, mistyped id records, flipped, cut and spliced
    bytes) inside correct enclosing records, so the fast path, not the fallback, answers."""
    lifted = state_ids.lift(raw)
    assert parse_client_message(raw) == reference(raw)
    # Where lift() gives up, parse_client_message runs the reference's own parse, so the
    # comparison above is equal by construction: only the examples the scan answered count,
    # and a scan that never answers leaves hypothesis unable to satisfy this (the test fails).
    assume(lifted is not None)


@given(st.binary(max_size=300))
def test_arbitrary_bytes_parse_identically(raw: bytes) -> None:
    assert parse_client_message(raw) == reference(raw)


def test_a_long_checkpoint_is_scanned_not_parsed() -> None:
    roots = [bytes([i % 256]) * 32 for i in range(5000)]
    raw = bytes(
        agent.AgentClientMessage(
            run_request=agent.AgentRunRequest(
                conversation_state=agent.ConversationStateStructure(
                    root_prompt_messages_json=roots, turns=roots[:9]
                )
            )
        )
    )
    lifted = state_ids.lift(raw)
    assert lifted is not None and lifted.roots == roots and lifted.turns == roots[:9]
    assert len(lifted.rest) < 10  # what betterproto2 still parses: the empty shells


def test_shapes_it_does_not_handle_are_left_to_the_strict_parse() -> None:
    state = agent.ConversationStateStructure(root_prompt_messages_json=[b"a"])
    once = bytes(agent.AgentClientMessage(run_request=agent.AgentRunRequest(conversation_state=state)))
    assert state_ids.lift(once + once) is None  # a repeated singular message merges: not ours to do
    assert state_ids.lift(bytes(agent.AgentClientMessage(run_request=agent.AgentRunRequest()))) is None
    assert parse_client_message(once + once) == reference(once + once)
