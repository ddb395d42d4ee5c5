"""project(): canonical messages -> provider-neutral history (tool rounds folded)."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from byok.model.messages import Message, ReplayState, ToolCall
from byok.model.projection import project
from byok.model.request import AssistantTurn, ToolResultTurn, UserTurn


def user(text: str, origin: str = "user") -> Message:
    return Message(role="user", origin=origin, text=text)  # type: ignore[arg-type]


def system(text: str) -> Message:
    return Message(role="system", origin="runtime", text=text)


def assistant(text: str, thinking: str = "", replay: ReplayState | None = None) -> Message:
    return Message(role="assistant", origin="assistant", text=text, thinking=thinking, replay=replay)


def call(call_id: str, index: int, name: str = "read") -> ToolCall:
    return ToolCall(call_id, name, f'{{"id":"{call_id}"}}', index)


def round_head(round_id: str, calls: list[ToolCall], text: str = "", thinking: str = "") -> Message:
    return Message(
        role="assistant",
        origin="assistant",
        text=text,
        thinking=thinking,
        tool_calls=tuple(calls),
        tool_round_id=round_id,
    )


def result(round_id: str, c: ToolCall, seq: int, text: str | None = None, is_error: bool = False) -> Message:
    return Message(
        role="tool",
        origin="tool",
        text=f"out-{c.call_id}" if text is None else text,
        tool_call_id=c.call_id,
        tool_name=c.name,
        is_error=is_error,
        tool_round_id=round_id,
        completion_seq=seq,
    )


def test_empty_history() -> None:
    assert project([]) == ()


def test_user_and_assistant_turns() -> None:
    replay = ReplayState("anthropic", "{}")
    history = project([user("hi"), assistant("hello", "think", replay), user("more", origin="runtime")])
    assert history == (UserTurn("hi"), AssistantTurn("hello", "think", replay), UserTurn("more"))


def test_system_messages_are_skipped_anywhere() -> None:
    assert project([system("s"), user("a"), system("t"), assistant("b"), system("u")]) == (
        UserTurn("a"),
        AssistantTurn("b"),
    )


def test_tool_round_folds_calls_in_index_order_and_results_in_completion_order() -> None:
    c0, c1, c2 = call("c0", 0), call("c1", 1, "grep"), call("c2", 2)
    head = round_head("r", [c2, c0, c1], text="Let me look.", thinking="plan")
    # Completion order: c1 first, then c2, then c0 (stored in that order).
    stored = [user("q"), head, result("r", c1, 1), result("r", c2, 2, is_error=True), result("r", c0, 3)]
    assert project(stored) == (
        UserTurn("q"),
        AssistantTurn("Let me look.", "plan", None, (c0, c1, c2)),
        ToolResultTurn("c1", "grep", "out-c1", False),
        ToolResultTurn("c2", "read", "out-c2", True),
        ToolResultTurn("c0", "read", "out-c0", False),
    )


def test_results_are_ordered_by_completion_seq_not_storage_position() -> None:
    c0, c1 = call("c0", 0), call("c1", 1)
    stored = [round_head("r", [c0, c1]), result("r", c0, 2), result("r", c1, 1)]
    turns = project(stored)
    assert [t.call_id for t in turns[1:]] == ["c1", "c0"]  # type: ignore[union-attr]


def test_round_keeps_head_replay_state() -> None:
    c = call("c", 0)
    replay = ReplayState("openai-responses", '{"enc":"x"}')
    head = Message(
        role="assistant", origin="assistant", tool_calls=(c,), tool_round_id="r", replay=replay, thinking="t"
    )
    assert project([head, result("r", c, 1)])[0] == AssistantTurn("", "t", replay, (c,))


def test_round_stored_as_one_assistant_message_per_call_is_merged() -> None:
    c0, c1 = call("c0", 0), call("c1", 1)
    stored = [
        round_head("r", [c1], text="T"),
        result("r", c1, 1),
        round_head("r", [c0], text="T"),
        result("r", c0, 2),
    ]
    assert project(stored) == (
        AssistantTurn("T", "", None, (c0, c1)),
        ToolResultTurn("c1", "read", "out-c1"),
        ToolResultTurn("c0", "read", "out-c0"),
    )


def test_round_with_a_missing_result_is_not_projected() -> None:
    c0, c1 = call("c0", 0), call("c1", 1)
    stored = [user("q"), round_head("r", [c0, c1], text="partial"), result("r", c1, 1), user("next")]
    assert project(stored) == (UserTurn("q"), UserTurn("next"))


def test_round_with_no_results_at_all_is_not_projected() -> None:
    c0 = call("c0", 0)
    assert project([user("q"), round_head("r", [c0]), assistant("after")]) == (
        UserTurn("q"),
        AssistantTurn("after"),
    )


def test_unfinished_round_does_not_swallow_the_next_round() -> None:
    a, b = call("a", 0), call("b", 0)
    stored = [round_head("r1", [a]), round_head("r2", [b]), result("r2", b, 1)]
    assert project(stored) == (AssistantTurn("", "", None, (b,)), ToolResultTurn("b", "read", "out-b"))


def test_adjacent_rounds_are_projected_separately() -> None:
    a, b = call("a", 0), call("b", 0)
    stored = [round_head("r1", [a]), result("r1", a, 1), round_head("r2", [b], text="2"), result("r2", b, 1)]
    assert project(stored) == (
        AssistantTurn("", "", None, (a,)),
        ToolResultTurn("a", "read", "out-a"),
        AssistantTurn("2", "", None, (b,)),
        ToolResultTurn("b", "read", "out-b"),
    )


def test_system_message_inside_a_round_does_not_break_it() -> None:
    c = call("c", 0)
    assert project([round_head("r", [c]), system("s"), result("r", c, 1)]) == (
        AssistantTurn("", "", None, (c,)),
        ToolResultTurn("c", "read", "out-c"),
    )


def test_tool_message_outside_a_round_raises() -> None:
    stray = Message(role="tool", origin="tool", text="x", tool_call_id="c", tool_name="read")
    with pytest.raises(ValueError):
        project([user("q"), stray])


def test_tool_message_of_a_round_without_its_assistant_raises() -> None:
    c = call("c", 0)
    with pytest.raises(ValueError):
        project([user("q"), result("r", c, 1)])


def test_a_longer_history_starts_from_the_final_prefix_of_the_last_projection() -> None:
    c1, c2 = call("c1", 0), call("c2", 1)
    history = [user("a"), assistant("b"), user("c"), round_head("r", [c1, c2]), result("r", c1, 1)]
    assert project(history) == (UserTurn("a"), AssistantTurn("b"), UserTurn("c"))
    # Only the messages after "c" are projected again: the open round may still complete.
    memo = history[2].memo_get("projected_prefix")
    assert memo[0] == 3 and memo[1] is history[0]
    grown = [*history, result("r", c2, 2), assistant("d")]
    assert project(grown) == project([attrs.evolve(m) for m in grown])
    assert history[2].memo_get("projected_prefix") is None  # one memo per history
    assert grown[-1].memo_get("projected_prefix")[0] == len(grown)


def test_a_branch_with_other_messages_is_projected_from_the_start() -> None:
    first = [user("a"), assistant("b")]
    assert project(first) == (UserTurn("a"), AssistantTurn("b"))
    other = [user("x"), first[1]]  # the same object at the same place after another message
    assert project(other) == (UserTurn("x"), AssistantTurn("b"))


# -- prefix property -------------------------------------------------------------------------------

_text = st.text(alphabet="abcxyz ", max_size=5)


@st.composite
def complete_round(draw: st.DrawFn, round_id: str) -> list[Message]:
    n = draw(st.integers(1, 4))
    indexes = draw(st.permutations(range(n)))
    calls = [call(f"{round_id}-c{i}", i, draw(st.sampled_from(["read", "grep"]))) for i in indexes]
    completion = draw(st.permutations(calls))
    head = round_head(round_id, calls, text=draw(_text), thinking=draw(_text))
    return [head] + [
        result(round_id, c, seq, draw(_text), draw(st.booleans())) for seq, c in enumerate(completion, 1)
    ]


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    out: list[Message] = []
    for n in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["user", "runtime", "assistant", "system", "round"]))
        if kind == "round":
            out += draw(complete_round(f"r{n}"))
        elif kind == "system":
            out.append(system(draw(_text)))
        elif kind == "assistant":
            out.append(assistant(draw(_text), draw(_text)))
        else:
            out.append(user(draw(_text), origin=kind))
    return out


@given(histories(), st.data())
def test_projecting_a_prefix_gives_a_prefix(messages: list[Message], data: st.DataObject) -> None:
    full = project(messages)
    k = data.draw(st.integers(0, len(messages)))
    part = project(messages[:k])
    assert full[: len(part)] == part


@given(histories())
def test_complete_rounds_project_every_call_and_result(messages: list[Message]) -> None:
    history = project(messages)
    calls = [c for m in messages for c in m.tool_calls]
    results = [m for m in messages if m.role == "tool"]
    projected_calls = [c for t in history if isinstance(t, AssistantTurn) for c in t.tool_calls]
    assert sorted(projected_calls, key=lambda c: c.call_id) == sorted(calls, key=lambda c: c.call_id)
    assert sum(isinstance(t, ToolResultTurn) for t in history) == len(results)
    assert len(history) == sum(m.role in ("user", "assistant", "tool") for m in messages)
    # Each call is answered after its assistant turn and before the next non-result turn.
    for i, t in enumerate(history):
        if isinstance(t, AssistantTurn) and t.tool_calls:
            assert [c.index for c in t.tool_calls] == sorted(c.index for c in t.tool_calls)
            answers = history[i + 1 : i + 1 + len(t.tool_calls)]
            assert all(isinstance(a, ToolResultTurn) for a in answers)
            assert {a.call_id for a in answers} == {c.call_id for c in t.tool_calls}  # type: ignore[union-attr]


@st.composite
def any_round(draw: st.DrawFn, round_id: str) -> list[Message]:
    """A round with every result, or (its run was cancelled) some of them missing."""
    messages = draw(complete_round(round_id))
    keep = draw(st.integers(0, len(messages) - 1))
    return messages if draw(st.booleans()) else messages[: 1 + keep]


@st.composite
def histories_with_open_rounds(draw: st.DrawFn) -> list[Message]:
    out: list[Message] = []
    for n in range(draw(st.integers(0, 10))):
        kind = draw(st.sampled_from(["user", "assistant", "system", "round"]))
        if kind == "round":
            out += draw(any_round(f"r{n}"))
        elif kind == "system":
            out.append(system(draw(_text)))
        elif kind == "assistant":
            out.append(assistant(draw(_text)))
        else:
            out.append(user(draw(_text)))
    return out


@given(histories_with_open_rounds(), st.data())
def test_projecting_a_growing_history_equals_projecting_it_afresh(
    messages: list[Message], data: st.DataObject
) -> None:
    """Successive projections of a history as it grows (the same message objects, as the store's
    revisions share them) give exactly what a projection of fresh copies gives."""
    cuts = sorted(data.draw(st.lists(st.integers(0, len(messages)), max_size=5)))
    for k in [*cuts, len(messages)]:
        fresh = [attrs.evolve(m) for m in messages[:k]]
        assert project(messages[:k]) == project(fresh)
