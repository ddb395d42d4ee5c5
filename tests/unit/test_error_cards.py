"""Cards for everything: a call byok does not run (unknown, refused, bad arguments) still gets a
started card and a completed card with a typed error result."""

from __future__ import annotations

import betterproto2
import pytest

from byok.cursor.exec_router import ExecRouter, dispatch
from byok.cursor.tools.base import ToolOutcome
from byok.cursor.tools.error_cards import UNKNOWN_PROVIDER, unknown_tool_call, with_error
from byok.cursor.tools.registry import build_registry
from byok.model.messages import ToolCall
from byok.pb.agent import v1 as agent

REGISTRY = build_registry()


def run_round(calls: tuple[ToolCall, ...], refused: dict[str, str]) -> tuple[list, dict[str, ToolOutcome]]:
    sent: list[bytes] = []
    done: dict[str, ToolOutcome] = {}
    router = ExecRouter(sent.append, "req", lambda cid, o: done.__setitem__(cid, o))
    dispatch(router, REGISTRY, sent.append, "mc", calls, refused)
    frames = [agent.AgentServerMessage().parse(f) for f in sent]
    return frames, done


def started(frames: list) -> dict[str, agent.ToolCall]:
    return {
        f.interaction_update.tool_call_started.call_id: f.interaction_update.tool_call_started.tool_call
        for f in frames
        if f.interaction_update is not None and f.interaction_update.tool_call_started is not None
    }


def test_an_unknown_tool_gets_a_named_card_with_its_arguments_and_an_error() -> None:
    call = ToolCall("c1", "Teleport", '{"to": "mars", "n": 2}', 0)
    frames, done = run_round((call,), {"c1": "Error: unknown tool 'Teleport'"})
    card = started(frames)["c1"].mcp_tool_call
    assert card is not None and card.result is None
    assert (card.args.name, card.args.tool_name, card.args.provider_identifier) == (
        "Teleport",
        "Teleport",
        UNKNOWN_PROVIDER,
    )
    assert card.args.args["to"].string_value == "mars" and card.args.args["n"].number_value == 2
    outcome = done["c1"]
    assert outcome.is_error and outcome.content == "Error: unknown tool 'Teleport'"
    assert outcome.ui.mcp_tool_call.result.error.error == outcome.content
    assert len(frames) == 1  # nothing but the started card: no Exec


def test_a_refused_tool_keeps_its_own_card_with_its_error_variant() -> None:
    call = ToolCall("c1", "Write", '{"path": "a.txt", "contents": "x"}', 0)
    frames, done = run_round((call,), {"c1": "Error: tool 'Write' is not available in ask mode"})
    card = started(frames)["c1"].edit_tool_call
    assert card is not None and card.args.path == "a.txt" and card.result is None
    result = done["c1"].ui.edit_tool_call.result
    assert result.error.error == "Error: tool 'Write' is not available in ask mode"
    assert result.error.path == "a.txt"
    assert not any(f.exec_server_message for f in frames)


def test_unusable_arguments_show_the_tools_placeholder_and_the_problem() -> None:
    frames, done = run_round((ToolCall("c1", "Read", '{"path": 3}', 0),), {})
    assert started(frames)["c1"] == agent.ToolCall(read_tool_call=agent.ReadToolCall())
    outcome = done["c1"]
    assert outcome.is_error and "'path' must be a string" in outcome.content
    assert outcome.ui.read_tool_call.result.error.error_message == outcome.content
    frames, done = run_round((ToolCall("c2", "Grep", "{not json", 0),), {})
    assert "invalid JSON arguments" in done["c2"].content
    assert done["c2"].ui.grep_tool_call.result.error.error == done["c2"].content


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_registered_card_has_a_typed_error_variant(name: str) -> None:
    tool = REGISTRY[name]
    card = with_error(tool.tool_call(tool.placeholder()), "boom")
    _, record = betterproto2.which_one_of(card, "tool")
    assert record.result is not None
    _, error = betterproto2.which_one_of(record.result, "result")
    assert "boom" in bytes(error).decode(errors="replace")


def test_the_unknown_placeholder_has_no_arguments_until_they_are_complete() -> None:
    assert unknown_tool_call("X").mcp_tool_call.args.args == {}
    assert unknown_tool_call("X", "c", "[1, 2]").mcp_tool_call.args.args == {}  # not an object
