"""Fuzzing the checkpoint blob graph (``build_checkpoint``) and root JSON (``decode_root``,
``encode_root``).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from byok.cursor.checkpoint import Blob, TurnRecord, build_checkpoint, root_blob
from byok.cursor.root_json import RootJsonError, decode_root, encode_root
from byok.model.messages import Message
from byok.pb.agent import v1 as agent
from tests.fuzz.support import (
    any_json,
    args_texts,
    fuzz,
    json_object,
    model_messages,
    short_ids,
    small_ints,
    texts,
    words,
)


def _checkpoint_inputs(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "system_prompt": draw(texts),
        "stable": draw(st.lists(model_messages, max_size=5)),
        "pending": draw(st.lists(model_messages, max_size=1)),
        "prior_turns": draw(st.lists(st.binary(min_size=32, max_size=32), max_size=2)),
        "turn": draw(
            st.none()
            | st.builds(
                TurnRecord,
                request_id=short_ids,
                user_message=st.builds(lambda t: bytes(agent.UserMessage(text=t)), texts),
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


_root_json = json_object(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer"])},
    content=words
    | st.lists(
        json_object(
            {"type": st.sampled_from(["text", "reasoning", "tool-call", "tool-result", "image"])},
            text=words,
            toolCallId=st.sampled_from(["c1", "c2"]),
            toolName=st.sampled_from(["Read", "f"]),
            input=args_texts | st.just({"a": 1}),
            output=json_object(
                type=st.sampled_from(["text", "error-text", "json", "error-json"]), value=words
            ),
        ),
        max_size=3,
    ),
    providerOptions=json_object(
        byok=json_object(
            origin=st.sampled_from(["user", "runtime", "assistant", "tool"]),
            replay=json_object(
                {"provider_kind": st.sampled_from(["anthropic", "openai_chat"]), "data": words}
            ),
            call_index=st.lists(small_ints, max_size=2),
            tool_round_id=short_ids,
            event_id=short_ids,
            model_call_id=short_ids,
            completion_seq=small_ints,
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
        any_json.map(lambda o: json.dumps(o).encode()),
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
