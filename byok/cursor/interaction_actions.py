"""Conversation actions that continue a conversation with something the user did in Cursor's UI
(sans-IO): the answers to an AskQuestion that went async (``async_ask_question_completion_action``)
and "build this plan" (``execute_plan_action``).

Each becomes one runtime user message, appended exactly once (its event id is the action's own
key: the question's tool call id, the plan's kickoff message), and the simulated UserMessage the
turn shows in Cursor's UI. A plan to execute comes from the action (the plan file as the user
left it) or, when the action carries none, from the conversation's own current plan.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import attrs

from byok.cursor.plan_state import current_plan
from byok.cursor.prompting import build_runtime_message
from byok.cursor.request import RunStart
from byok.cursor.tools.ask_question_tool import parse_questions, question_args, result_text
from byok.cursor.tools.base import ToolArgError
from byok.loop.turn_values import Failed, FailedError
from byok.model.messages import Message
from byok.pb.agent import v1 as agent

ASK_ANSWERED = "async_ask_question_completion_action"
EXECUTE_PLAN = "execute_plan_action"
EVENT_ACTIONS = (ASK_ANSWERED, EXECUTE_PLAN)

BUILD = (
    "The user approved the plan below. Implement it now, step by step, in the order it gives; keep "
    "to its scope, and say what you changed when you are done."
)


def event_id(st: RunStart) -> str:
    """The action's exactly-once key: the same answers or the same build click appends nothing new."""
    action = st.event_action
    assert action is not None
    if st.action == ASK_ANSWERED:
        return f"ask-question-answered:{action.async_ask_question_completion_action.original_tool_call_id}"
    execute = action.execute_plan_action
    return f"execute-plan:{execute.kickoff_message_id or st.request_id}"


def event_user_message(st: RunStart) -> agent.UserMessage:
    """The turn's UserMessage as Cursor's UI shows it (a simulated message)."""
    action = st.event_action
    assert action is not None
    if st.action == ASK_ANSWERED:
        return agent.UserMessage(
            text="Answered the questions", message_id=event_id(st), mode=st.mode, is_simulated_msg=True
        )
    execute = action.execute_plan_action
    info = agent.ExecutePlanInfo(plan_id=execute.plan_id or "", plan_title="") if execute.plan_id else None
    return agent.UserMessage(
        text="Build the plan",
        message_id=execute.kickoff_message_id or event_id(st),
        mode=st.mode,
        is_simulated_msg=True,
        simulated_msg_reason=agent.SimulatedMsgReason.PLAN_EXECUTION,
        execute_plan_info=info,
    )


def event_message(st: RunStart, messages: Sequence[Message], runtime_template: str, now_iso: str) -> Message:
    """The runtime message the action appends; raises FailedError when there is nothing to say
    (a build with no plan anywhere)."""
    action = st.event_action
    assert action is not None
    if st.action == ASK_ANSWERED:
        return _answers_message(action.async_ask_question_completion_action, messages, event_id(st))
    plan_text = _plan_text(action.execute_plan_action, messages)
    execute = action.execute_plan_action
    file = execute.plan_file_uri or execute.plan_file_path
    where = f"\nThe plan file: {file}" if file else ""
    query = agent.UserMessage(text=f"{BUILD}{where}\n\n<plan>\n{plan_text}\n</plan>")
    message = build_runtime_message(
        runtime_template,
        request_id=st.request_id,
        user_message=query,
        request_context=st.request_context,
        now_iso=now_iso,
        time_zone=None,
    )
    return attrs.evolve(message, event_id=event_id(st))


def _plan_text(execute: agent.ExecutePlanAction, messages: Sequence[Message]) -> str:
    if execute.plan_file_content:
        return execute.plan_file_content
    if execute.plan is not None and execute.plan.plan:
        return execute.plan.plan
    plan = current_plan(messages)
    if plan is None:
        raise FailedError(
            Failed("failed_precondition", "execute_plan_action carries no plan and the conversation has none")
        )
    return plan.text


def _answers_message(
    action: agent.AsyncAskQuestionCompletionAction, messages: Sequence[Message], key: str
) -> Message:
    call_id = action.original_tool_call_id
    args = action.original_args if action.original_args and action.original_args.questions else None
    args = args or _asked(call_id, messages) or agent.AskQuestionArgs()
    result = action.result or agent.AskQuestionResult()
    done = result_text(args, result)
    body = done[0] if done is not None else "The questions were not answered."
    text = (
        f'<ask_question_answers tool_call_id="{call_id}">\n'
        f"Your earlier AskQuestion call ({call_id}) has its answer now.\n{body}\n"
        "</ask_question_answers>\n\nContinue the task with this."
    )
    return Message(role="user", origin="runtime", text=text, event_id=key)


def _asked(call_id: str, messages: Sequence[Message]) -> agent.AskQuestionArgs | None:
    """The questions of call ``call_id`` as the model asked them (the history's own copy)."""
    for m in reversed(messages):
        for c in m.tool_calls if m.role == "assistant" else ():
            if c.call_id == call_id:
                try:
                    raw = json.loads(c.arguments)
                    return question_args(parse_questions(raw)) if isinstance(raw, dict) else None
                except (ValueError, ToolArgError):
                    return None
    return None
