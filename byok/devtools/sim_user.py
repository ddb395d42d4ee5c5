"""The user's side of the simulated Cursor: how each InteractionQuery is answered.

``SimUser`` is a ``CursorSim(on_query=...)`` callback. Per query kind it approves, rejects,
answers (AskQuestion: chosen options; CreatePlan: the plan file's URI), answers ``async`` (the
user will answer later), errs, or leaves the query unanswered; ``repeat`` sends every answer
twice (a late duplicate the server must ignore). It keeps every query it saw, so a test can
answer an async AskQuestion later with ``ask_completion_request`` and build Cursor's other
plan and question actions.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import betterproto2

from byok.devtools.cursor_sim import interaction_answer
from byok.pb.agent import v1 as agent

# Query oneof field -> its response field.
RESPONSES = {
    "ask_question_interaction_query": "ask_question_interaction_response",
    "create_plan_request_query": "create_plan_request_response",
    "switch_mode_request_query": "switch_mode_request_response",
    "web_fetch_request_query": "web_fetch_request_response",
    "web_search_request_query": "web_search_request_response",
    "generate_image_request_query": "generate_image_request_response",
}
# The approval-only responses and their Approved/Rejected classes.
_APPROVALS = {
    "switch_mode_request_response": (
        agent.SwitchModeRequestResponse,
        agent.SwitchModeRequestResponseApproved,
    ),
    "web_fetch_request_response": (agent.WebFetchRequestResponse, agent.WebFetchRequestResponseApproved),
    "web_search_request_response": (agent.WebSearchRequestResponse, agent.WebSearchRequestResponseApproved),
    "generate_image_request_response": (
        agent.GenerateImageRequestResponse,
        agent.GenerateImageRequestResponseApproved,
    ),
}
_REJECTED = {
    "switch_mode_request_response": agent.SwitchModeRequestResponseRejected,
    "web_fetch_request_response": agent.WebFetchRequestResponseRejected,
    "web_search_request_response": agent.WebSearchRequestResponseRejected,
    "generate_image_request_response": agent.GenerateImageRequestResponseRejected,
}

DEFAULT_PLAN_URI = "file:///home/user/.cursor/plans/plan.plan.md"


def query_kind(query: agent.InteractionQuery) -> str:
    name, _ = betterproto2.which_one_of(query, "query")
    return name


def first_options(args: agent.AskQuestionArgs) -> list[agent.AskQuestionSuccessAnswer]:
    """Each question answered with its first option."""
    return [
        agent.AskQuestionSuccessAnswer(
            question_id=q.id, selected_option_ids=[q.options[0].id] if q.options else []
        )
        for q in args.questions
    ]


@attrs.define
class SimUser:
    # query kind (its oneof field) -> "approve" | "reject" | "answer" | "async" | "error" | "ignore"
    # (AskQuestion and CreatePlan "approve" means "answer"; "async" is AskQuestion's alone)
    decisions: Mapping[str, str] = attrs.Factory(dict)
    reason: str = ""  # a rejection's reason
    # AskQuestion: question id -> (option ids, freeform text); unlisted questions get their first option
    answers: Mapping[str, tuple[list[str], str]] = attrs.Factory(dict)
    plan_uri: str = DEFAULT_PLAN_URI
    repeat: bool = False  # send every answer twice
    seen: list[agent.InteractionQuery] = attrs.Factory(list)

    def __call__(self, query: agent.InteractionQuery) -> list[agent.AgentClientMessage] | None:
        self.seen.append(query)
        kind = query_kind(query)
        decision = self.decisions.get(kind, "approve")
        if decision == "ignore" or kind not in RESPONSES:
            return None
        field = RESPONSES[kind]
        if field in _APPROVALS:
            response = self._approval(field, decision)
        elif kind == "ask_question_interaction_query":
            response = agent.AskQuestionInteractionResponse(result=self.ask_result(query, decision))
        else:
            response = agent.CreatePlanRequestResponse(result=self._plan_result(decision))
        answer = interaction_answer(query, **{field: response})
        return [answer, answer] if self.repeat else [answer]

    def _approval(self, field: str, decision: str) -> object:
        cls, approved = _APPROVALS[field]
        if decision == "reject":
            return cls(rejected=_REJECTED[field](reason=self.reason))
        return cls(approved=approved())

    def ask_result(self, query: agent.InteractionQuery, decision: str = "answer") -> agent.AskQuestionResult:
        if decision == "reject":
            return agent.AskQuestionResult(rejected=agent.AskQuestionRejected(reason=self.reason))
        if decision == "error":
            return agent.AskQuestionResult(error=agent.AskQuestionError(error_message="the form failed"))
        if decision == "async":
            return agent.AskQuestionResult(async_=agent.AskQuestionAsync())
        args = query.ask_question_interaction_query.args
        answers = first_options(args)
        for a in answers:
            if a.question_id in self.answers:
                a.selected_option_ids, a.freeform_text = self.answers[a.question_id]
        return agent.AskQuestionResult(success=agent.AskQuestionSuccess(answers=answers))

    def _plan_result(self, decision: str) -> agent.CreatePlanResult:
        if decision in ("reject", "error"):
            return agent.CreatePlanResult(
                error=agent.CreatePlanError(error=self.reason or "the plan was not saved")
            )
        return agent.CreatePlanResult(plan_uri=self.plan_uri, success=agent.CreatePlanSuccess())

    def queries(self, kind: str) -> list[agent.InteractionQuery]:
        return [q for q in self.seen if query_kind(q) == kind]


def _request(
    action: agent.ConversationAction,
    *,
    conversation_id: str,
    model_id: str,
    state: agent.ConversationStateStructure | None,
) -> agent.AgentRunRequest:
    return agent.AgentRunRequest(
        conversation_state=state or agent.ConversationStateStructure(),
        action=action,
        requested_model=agent.RequestedModel(model_id=model_id),
        conversation_id=conversation_id,
    )


def ask_completion_request(
    query: agent.InteractionQuery,
    result: agent.AskQuestionResult,
    *,
    conversation_id: str,
    model_id: str,
    state: agent.ConversationStateStructure | None = None,
) -> agent.AgentRunRequest:
    """The run_request Cursor sends when the user answers an AskQuestion that went async."""
    ask = query.ask_question_interaction_query
    completion = agent.AsyncAskQuestionCompletionAction(
        original_tool_call_id=ask.tool_call_id, original_args=ask.args, result=result
    )
    action = agent.ConversationAction(async_ask_question_completion_action=completion)
    return _request(action, conversation_id=conversation_id, model_id=model_id, state=state)


def execute_plan_request(
    *,
    conversation_id: str,
    model_id: str,
    plan_text: str | None = None,
    plan_uri: str = "",
    kickoff_message_id: str = "",
    state: agent.ConversationStateStructure | None = None,
) -> agent.AgentRunRequest:
    """The run_request of Cursor's "Build" on a plan: ``plan_text`` is the plan file as the user
    left it (None: the action carries no plan, byok uses the conversation's own)."""
    execute = agent.ExecutePlanAction(
        request_context=agent.RequestContext(),
        plan_file_uri=plan_uri or None,
        plan_file_content=plan_text,
        execution_mode=agent.AgentMode.AGENT,
        kickoff_message_id=kickoff_message_id or None,
    )
    action = agent.ConversationAction(execute_plan_action=execute)
    return _request(action, conversation_id=conversation_id, model_id=model_id, state=state)


def start_plan_request(
    text: str,
    *,
    conversation_id: str,
    model_id: str,
    message_id: str,
    state: agent.ConversationStateStructure | None = None,
) -> agent.AgentRunRequest:
    """The run_request of a message sent to start planning (Cursor's plan action)."""
    start = agent.StartPlanAction(
        user_message=agent.UserMessage(text=text, message_id=message_id, mode=agent.AgentMode.PLAN),
        request_context=agent.RequestContext(),
    )
    action = agent.ConversationAction(start_plan_action=start)
    return _request(action, conversation_id=conversation_id, model_id=model_id, state=state)
