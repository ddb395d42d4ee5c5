"""The scanned checkpoint id lists give exactly what the strict betterproto2 parse gives."""

from __future__ import annotations

import betterproto2
from hypothesis import given
from hypothesis import strategies as st

from byok.http import state_ids
from byok.http.bidi_append import parse_client_message
from byok.http.wire_check import well_typed
from byok.pb.agent import v1 as agent


def reference(raw: bytes) -> agent.AgentClientMessage | None:
    """The parse before the fast path: betterproto2 on the whole message."""
    try:
        msg = agent.AgentClientMessage.parse(raw)
        name, _ = betterproto2.which_one_of(msg, "message")
    except Exception:
        return None
    return msg if name and well_typed(msg) else None


ids = st.lists(st.binary(min_size=0, max_size=200), max_size=40)


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


@given(run_requests(), st.data())
def test_mutated_bytes_parse_identically(raw: bytes, data: st.DataObject) -> None:
    """Flip, cut or splice bytes anywhere: the fast path answers exactly as the strict parse."""
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, max(len(buf) - 1, 0)))
        if op == "flip" and buf:
            buf[at] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del buf[at : at + data.draw(st.integers(1, 8))]
        else:
            buf[at:at] = data.draw(st.binary(min_size=1, max_size=6))
    assert parse_client_message(bytes(buf)) == reference(bytes(buf))


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
