"""The current plan folded from the messages (seeds 000 §24), and the runtime messages of the
actions that continue a conversation (async answers, a plan to build)."""

from __future__ import annotations

import json

import pytest

from byok.cursor.interaction_actions import event_id, event_message, event_user_message
from byok.cursor.plan_state import current_plan
from byok.cursor.request import parse_run_request
from byok.cursor.tools.plan_tool import saved_text
from byok.loop.turn_values import FailedError
from byok.model.messages import Message, ToolCall
from byok.pb.agent import v1 as agent

TEMPLATE = "{{TIMESTAMP}}\n{{USER_QUERY}}"


def call(call_id: str, name: str, args: dict | str) -> Message:
    arguments = args if isinstance(args, str) else json.dumps(args)
    return Message(role="assistant", origin="assistant", tool_calls=(ToolCall(call_id, name, arguments, 0),))


def result(call_id: str, name: str, text: str, is_error: bool = False) -> Message:
    return Message(
        role="tool", origin="tool", text=text, tool_call_id=call_id, tool_name=name, is_error=is_error
    )


def plan(call_id: str, text: str, uri: str = "", **extra: object) -> tuple[Message, Message]:
    return call(call_id, "CreatePlan", {"plan": text, **extra}), result(
        call_id, "CreatePlan", saved_text(uri)
    )


USER = Message(role="user", origin="runtime", text="plan a cache")


def test_no_plan_until_one_is_saved() -> None:
    assert current_plan(()) is None
    assert current_plan((USER,)) is None
    asked, _ = plan("c1", "# A")
    assert current_plan((USER, asked)) is None  # called, not answered yet
    refused = result("c1", "CreatePlan", "The plan could not be saved: disk full.", is_error=True)
    assert current_plan((USER, asked, refused)) is None


def test_a_revision_keeps_the_plan_its_id_and_its_file() -> None:
    first = plan("c1", "# A", "file:///a.md", name="Cache", todos=[{"id": "t", "content": "do"}])
    second = plan("c2", "# A, revised")
    state = current_plan((USER, *first, *second))
    assert state is not None
    assert (state.plan_id, state.name, state.text, state.uri) == (
        "c1",
        "Cache",
        "# A, revised",
        "file:///a.md",
    )
    assert state.todos == ()
    assert state.registry() == {"c1": agent.PlanRegistryEntry(id="c1", path="file:///a.md")}
    assert agent.ConversationPlan().parse(state.blob()).plan == "# A, revised"


def test_calls_that_planned_nothing_are_skipped() -> None:
    broken = call("c9", "CreatePlan", "{not json"), result("c9", "CreatePlan", "Plan saved.")
    other = call("c8", "Read", {"path": "a"}), result("c8", "Read", "Plan saved: nope")
    assert current_plan((USER, *broken, *other)) is None


def test_the_fold_of_a_longer_history_starts_from_the_memo() -> None:
    history = (USER, *plan("c1", "# A"))
    assert current_plan(history) is not None
    assert history[-1].memo_get("plan_fold") is not None
    longer = (*history, *plan("c2", "# B"))
    assert current_plan(longer).text == "# B"  # type: ignore[union-attr]
    # A prefix ending on a message with a memo reads it.
    assert current_plan(longer[:3]).text == "# A"  # type: ignore[union-attr]


# --- actions that continue the conversation --------------------------------------------------------


def start_of(action: agent.ConversationAction) -> object:
    request = agent.AgentRunRequest(
        conversation_id="conv", requested_model=agent.RequestedModel(model_id="m"), action=action
    )
    return parse_run_request("req-9", request)


ASKED = {
    "questions": [
        {
            "id": "db",
            "prompt": "Which database?",
            "options": [{"id": "pg", "label": "PG"}, {"id": "l", "label": "Lite"}],
        }
    ]
}


def answered(args: agent.AskQuestionArgs | None) -> agent.ConversationAction:
    chosen = agent.AskQuestionSuccessAnswer(question_id="db", selected_option_ids=["l"])
    completion = agent.AsyncAskQuestionCompletionAction(
        original_tool_call_id="c-ask",
        original_args=args,
        result=agent.AskQuestionResult(success=agent.AskQuestionSuccess(answers=[chosen])),
    )
    return agent.ConversationAction(async_ask_question_completion_action=completion)


def test_async_answers_read_the_questions_from_the_history_when_the_action_lacks_them() -> None:
    st = start_of(answered(None))
    history = (USER, call("c-ask", "AskQuestion", ASKED), result("c-ask", "AskQuestion", "later"))
    message = event_message(st, history, TEMPLATE, "2026-01-01T00:00:00+00:00")  # type: ignore[arg-type]
    assert message.event_id == event_id(st) == "ask-question-answered:c-ask"  # type: ignore[arg-type]
    assert message.role == "user" and message.origin == "runtime"
    assert "Which database? -> Lite" in message.text
    assert message.text.startswith('<ask_question_answers tool_call_id="c-ask">')
    shown = event_user_message(st)  # type: ignore[arg-type]
    assert shown.is_simulated_msg and shown.message_id == "ask-question-answered:c-ask"


def test_a_build_without_any_plan_fails_clearly() -> None:
    st = start_of(agent.ConversationAction(execute_plan_action=agent.ExecutePlanAction()))
    with pytest.raises(FailedError) as info:
        event_message(st, (USER,), TEMPLATE, "now")  # type: ignore[arg-type]
    assert info.value.failure.code == "failed_precondition"
    assert event_id(st) == "execute-plan:req-9"  # type: ignore[arg-type]


def test_a_build_of_the_conversations_plan_in_the_modes_template() -> None:
    execute = agent.ExecutePlanAction(kickoff_message_id="kick", plan_id="p1")
    st = start_of(agent.ConversationAction(execute_plan_action=execute))
    message = event_message(st, (USER, *plan("c1", "# Cache")), TEMPLATE, "2026-01-01")  # type: ignore[arg-type]
    assert message.text.startswith("2026-01-01\n<user_query>\nThe user approved the plan below.")
    assert message.text.endswith("<plan>\n# Cache\n</plan>\n</user_query>")
    assert message.event_id == "execute-plan:kick"
    shown = event_user_message(st)  # type: ignore[arg-type]
    assert shown.message_id == "kick" and shown.execute_plan_info.plan_id == "p1"  # type: ignore[union-attr]
    assert shown.simulated_msg_reason == agent.SimulatedMsgReason.PLAN_EXECUTION
