"""Turn commit, Cursor side: the frames of a large tool result are hand-encoded byte-identically to
betterproto2, line numbering is unchanged, and each step of a turn is hashed once."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from byok.cursor import encode
from byok.cursor.checkpoint import Blob, TurnRecord, build_checkpoint
from byok.cursor.tools.base import Invocation
from byok.cursor.tools.read_tool import READ, numbered, split_lines
from byok.model.messages import Message
from byok.pb.agent import v1 as agent

texts = st.text(max_size=40)
big_or_small = texts | st.builds(lambda s, n: s * n, texts, st.integers(0, 3000))
uint32 = st.integers(0, 2**32 - 1)


def completed_reference(call_id: str, tool_call: agent.ToolCall, model_call_id: str) -> bytes:
    """The frame as betterproto2 encodes it."""
    update = agent.ToolCallCompletedUpdate(call_id=call_id, tool_call=tool_call, model_call_id=model_call_id)
    return bytes(
        agent.AgentServerMessage(interaction_update=agent.InteractionUpdate(tool_call_completed=update))
    )


@given(uint32, st.binary(max_size=40), st.binary(max_size=300) | st.binary(min_size=20_000, max_size=20_100))
def test_set_blob_matches_betterproto(kv_id: int, blob_id: bytes, data: bytes) -> None:
    expected = agent.AgentServerMessage(
        kv_server_message=agent.KvServerMessage(
            id=kv_id, set_blob_args=agent.SetBlobArgs(blob_id=blob_id, blob_data=data)
        )
    )
    assert encode.set_blob(kv_id, blob_id, data) == bytes(expected)


read_args = st.builds(
    agent.ReadToolArgs,
    path=texts,
    offset=st.none() | st.integers(-(2**31), 2**31 - 1),
    limit=st.none() | st.integers(1, 2**31 - 1),
)
read_success = st.builds(
    agent.ReadToolSuccess,
    content=st.none() | big_or_small,
    is_empty=st.booleans(),
    exceeded_limit=st.booleans(),
    total_lines=uint32,
    file_size=uint32,
    path=texts,
    read_range=st.none() | st.builds(agent.ReadRange, start_line=uint32, end_line=uint32),
)


def card_of(args: agent.ReadToolArgs, success: agent.ReadToolSuccess) -> agent.ToolCall:
    return agent.ToolCall(
        read_tool_call=agent.ReadToolCall(args=args, result=agent.ReadToolResult(success=success))
    )


@settings(max_examples=300)
@given(read_args, read_success)
def test_read_card_matches_betterproto(args: agent.ReadToolArgs, success: agent.ReadToolSuccess) -> None:
    assert encode.read_card(args, success) == bytes(card_of(args, success))


@given(texts, read_args, read_success, texts)
def test_completed_and_step_wrap_the_card_like_betterproto(
    call_id: str, args: agent.ReadToolArgs, success: agent.ReadToolSuccess, model_call_id: str
) -> None:
    card = card_of(args, success)
    data = encode.read_card(args, success)
    assert encode.tool_call_completed(call_id, data, model_call_id) == completed_reference(
        call_id, card, model_call_id
    )
    assert encode.tool_step(data) == bytes(agent.ConversationStep(tool_call=card))


def test_completed_of_an_empty_card() -> None:
    empty = agent.ToolCall()
    assert encode.tool_call_completed("", bytes(empty), "") == completed_reference("", empty, "")
    assert encode.tool_step(b"") == bytes(agent.ConversationStep(tool_call=empty))


def read_outcome(content: str, **raw: Any) -> Any:
    execution = READ.execute(Invocation("c1", "Read", "mc", READ.parse({"path": "f.py", **raw})))
    execution.start()
    success = agent.ReadSuccess(path="f.py", content=content, total_lines=0, file_size=len(content))
    result = agent.ExecClientMessage(id=1, exec_id="c1", read_result=agent.ReadResult(success=success))
    (finish,) = execution.on_result(result)
    return finish.outcome


@settings(max_examples=100)
@given(
    st.lists(st.text(alphabet="ab\r\t é", max_size=6), max_size=120).map("\n".join),
    st.none() | st.integers(-150, 150).filter(bool),
    st.none() | st.integers(1, 150),
)
def test_read_outcome_card_bytes_are_its_encoding(
    content: str, offset: int | None, limit: int | None
) -> None:
    outcome = read_outcome(content, offset=offset, limit=limit)
    assert outcome.ui_bytes() == bytes(outcome.ui)
    lines = content.split("\n") if content else []
    if lines and lines[-1] == "":
        lines.pop()
    assert split_lines(content) == [line.removesuffix("\r") for line in lines]  # the per-line version


@settings(max_examples=300)
@given(st.lists(st.text(max_size=5), max_size=200), st.integers(-3, 10**7))
def test_numbered_matches_the_per_line_format(lines: list[str], first: int) -> None:
    assert numbered(lines, first) == "\n".join(f"{n:>6}|{line}" for n, line in enumerate(lines, start=first))


def test_numbered_across_digit_boundaries() -> None:
    lines = [f"l{i}" for i in range(2000)]
    for first in (1, 9, 95, 990, 9_990, 99_000, 999_000, 9_999_000):
        assert numbered(lines, first) == "\n".join(f"{n:>6}|{x}" for n, x in enumerate(lines, start=first))


def test_a_large_read_is_numbered_and_encoded_once() -> None:
    content = "".join(f"line {i}\n" for i in range(30_000))
    outcome = read_outcome(content)
    assert outcome.content.startswith("     1|line 0\n     2|line 1\n")
    assert outcome.content.endswith(" 30000|line 29999")
    assert outcome._ui_bytes == [bytes(outcome.ui)]  # set by the Read tool, not encoded lazily


def test_turn_steps_are_hashed_once_and_carried_forward() -> None:
    turn = TurnRecord("rq", b"user").with_step(b"a" * 100_000).with_step(b"b")
    first = turn.step_blobs()
    assert first == [Blob.of(b"a" * 100_000), Blob.of(b"b")]
    longer = turn.with_step(b"c")
    assert longer.step_blobs()[:2] == first
    assert all(a is b for a, b in zip(longer.step_blobs(), first, strict=False))
    assert longer == TurnRecord("rq", b"user", (*turn.steps, b"c"))  # the memo is not part of equality


def test_checkpoint_of_a_large_result_is_unchanged_by_memos() -> None:
    big = Message(role="tool", origin="tool", text="x\n" * 40_000, tool_call_id="c", tool_name="Read")
    turn = TurnRecord("rq", b"user").with_step(bytes(agent.ConversationStep(tool_call=agent.ToolCall())))
    kw: dict[str, Any] = {
        "system_prompt": "system",
        "turn": turn,
        "token_details": agent.ConversationTokenDetails(max_tokens=10),
        "mode": agent.AgentMode.AGENT,
    }
    warm = build_checkpoint(stable=[big], **kw)
    cold = build_checkpoint(
        stable=[Message.decode(big.encode())], **{**kw, "turn": TurnRecord("rq", b"user", turn.steps)}
    )
    assert warm == cold
