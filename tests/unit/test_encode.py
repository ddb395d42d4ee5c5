"""cursor/encode: loop emits and run milestones -> AgentServerMessage bytes."""

from __future__ import annotations

import betterproto2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from byok.cursor import encode
from byok.cursor.checkpoint import TurnRecord, assistant_step, build_checkpoint
from byok.loop import emits as em
from byok.model.messages import Message
from byok.model.usage import Usage
from byok.pb.agent import v1 as agent


def parse(data: bytes) -> agent.AgentServerMessage:
    return agent.AgentServerMessage.parse(data)


def update_of(data: bytes) -> tuple[str, object]:
    name, update = betterproto2.which_one_of(parse(data), "message")
    assert name == "interaction_update"
    assert isinstance(update, agent.InteractionUpdate)
    return betterproto2.which_one_of(update, "message")


# -- emits -----------------------------------------------------------------------------------------


def test_text_out() -> None:
    assert update_of(encode.encode_emit(em.TextOut("héllo"))) == (
        "text_delta",
        agent.TextDeltaUpdate(text="héllo"),
    )


def test_thinking_out() -> None:
    name, value = update_of(encode.encode_emit(em.ThinkingOut("hmm")))
    assert name == "thinking_delta"
    assert isinstance(value, agent.ThinkingDeltaUpdate)
    assert value.text == "hmm"


def test_thinking_done() -> None:
    name, value = update_of(encode.encode_emit(em.ThinkingDone(2345)))
    assert name == "thinking_completed"
    assert value == agent.ThinkingCompletedUpdate(thinking_duration_ms=2345)


def test_tokens_out() -> None:
    assert update_of(encode.encode_emit(em.TokensOut(77))) == (
        "token_delta",
        agent.TokenDeltaUpdate(tokens=77),
    )


def test_empty_text_still_selects_the_oneof() -> None:
    # A default-valued sub-message must still say which update it is.
    assert update_of(encode.encode_emit(em.TextOut("")))[0] == "text_delta"
    assert update_of(encode.encode_emit(em.TokensOut(0)))[0] == "token_delta"
    assert update_of(encode.encode_emit(em.ThinkingDone(0)))[0] == "thinking_completed"


@pytest.mark.parametrize(
    "emit", [em.ToolCallOpened("c", "read", "mc"), em.ToolArgsOut("c", "read", "{", "mc")]
)
def test_tool_emits_have_no_encoding_here(emit: em.Emit) -> None:
    with pytest.raises(TypeError):
        encode.encode_emit(emit)


def test_heartbeat() -> None:
    assert update_of(encode.heartbeat())[0] == "heartbeat"


# -- turn ended ------------------------------------------------------------------------------------


def test_turn_ended_carries_every_usage_field() -> None:
    usage = Usage(
        input_tokens=12_000,
        output_tokens=800,
        cache_read_tokens=9_000,
        cache_write_tokens=300,
        reasoning_tokens=250,
    )
    name, value = update_of(encode.turn_ended(usage))
    assert name == "turn_ended"
    assert value == agent.TurnEndedUpdate(
        input_tokens=12_000,
        output_tokens=800,
        cache_read_tokens=9_000,
        cache_write_tokens=300,
        reasoning_tokens=250,
    )


def test_turn_ended_leaves_unknown_fields_unset() -> None:
    name, value = update_of(encode.turn_ended(Usage(input_tokens=5, output_tokens=0)))
    assert name == "turn_ended"
    assert isinstance(value, agent.TurnEndedUpdate)
    assert value.input_tokens == 5
    assert value.output_tokens == 0
    assert value.cache_read_tokens is None
    assert value.cache_write_tokens is None
    assert value.reasoning_tokens is None


def test_turn_ended_distinguishes_zero_from_unknown() -> None:
    _, value = update_of(encode.turn_ended(Usage(1, 2, cache_read_tokens=0, reasoning_tokens=0)))
    assert isinstance(value, agent.TurnEndedUpdate)
    assert value.cache_read_tokens == 0
    assert value.reasoning_tokens == 0
    assert value.cache_write_tokens is None


# -- checkpoint --------------------------------------------------------------------------------------


def real_state(n_messages: int) -> bytes:
    stable = [Message(role="user", origin="user", text=f"message {i} " + "x" * i) for i in range(n_messages)]
    cp = build_checkpoint(
        system_prompt="system",
        stable=stable,
        pending=[Message(role="assistant", origin="assistant", text="pending")],
        prior_turns=[b"\x02" * 32],
        turn=TurnRecord("rq", bytes(agent.UserMessage(text="hi"))).with_step(assistant_step("a")),
        token_details=agent.ConversationTokenDetails(used_tokens=10, max_tokens=100),
        mode=agent.AgentMode.PLAN,
    )
    return cp.state


@pytest.mark.parametrize("n_messages", [0, 1, 3, 50, 2000])
def test_checkpoint_wraps_state_bytes_verbatim(n_messages: int) -> None:
    state = real_state(n_messages)
    data = encode.checkpoint(state)
    msg = parse(data)
    name, value = betterproto2.which_one_of(msg, "message")
    assert name == "conversation_checkpoint_update"
    assert isinstance(value, agent.ConversationStateStructure)
    assert bytes(value) == state
    assert value == agent.ConversationStateStructure.parse(state)
    assert bytes(msg) == data
    assert data.endswith(state)


def test_checkpoint_of_empty_state() -> None:
    data = encode.checkpoint(b"")
    assert betterproto2.which_one_of(parse(data), "message")[0] == "conversation_checkpoint_update"
    assert data == bytes(
        agent.AgentServerMessage(conversation_checkpoint_update=agent.ConversationStateStructure())
    )


@given(st.binary(max_size=70_000).map(lambda b: bytes(agent.ConversationStateStructure(summary=b))))
def test_checkpoint_equals_the_generated_encoding(state: bytes) -> None:
    # The hand-written length prefix must agree with the protobuf library for any length.
    expected = bytes(
        agent.AgentServerMessage(conversation_checkpoint_update=agent.ConversationStateStructure.parse(state))
    )
    assert encode.checkpoint(state) == expected


# -- kv --------------------------------------------------------------------------------------------


def test_set_blob() -> None:
    blob_id, data = b"\xaa" * 32, b"\x00payload\xff"
    msg = parse(encode.set_blob(7, blob_id, data))
    name, kv = betterproto2.which_one_of(msg, "message")
    assert name == "kv_server_message"
    assert isinstance(kv, agent.KvServerMessage)
    assert kv.id == 7
    assert betterproto2.which_one_of(kv, "message") == (
        "set_blob_args",
        agent.SetBlobArgs(blob_id=blob_id, blob_data=data),
    )


def test_set_blob_with_empty_data() -> None:
    kv = parse(encode.set_blob(1, b"\x01" * 32, b"")).kv_server_message
    assert kv is not None
    assert kv.set_blob_args == agent.SetBlobArgs(blob_id=b"\x01" * 32, blob_data=b"")


def test_get_blob() -> None:
    kv = parse(encode.get_blob(3, b"\xbb" * 32)).kv_server_message
    assert kv is not None
    assert kv.id == 3
    assert betterproto2.which_one_of(kv, "message") == (
        "get_blob_args",
        agent.GetBlobArgs(blob_id=b"\xbb" * 32),
    )


@given(st.text())
def test_hand_encoded_deltas_match_betterproto(text: str) -> None:
    text_frame = bytes(
        agent.AgentServerMessage(
            interaction_update=agent.InteractionUpdate(text_delta=agent.TextDeltaUpdate(text=text))
        )
    )
    thinking_frame = bytes(
        agent.AgentServerMessage(
            interaction_update=agent.InteractionUpdate(thinking_delta=agent.ThinkingDeltaUpdate(text=text))
        )
    )
    assert encode.encode_emit(em.TextOut(text)) == text_frame
    assert encode.encode_emit(em.ThinkingOut(text)) == thinking_frame
