"""parse_run_request: AgentRunRequest -> RunStart, or a RunRequestError with a Connect code."""

from __future__ import annotations

import pytest

from byok.cursor.request import RunRequestError, parse_run_request, requested_model_id
from byok.pb.agent import v1 as agent

Mode = agent.AgentMode


def user_action(
    text: str = "hi", mode: agent.AgentMode = Mode.UNSPECIFIED, context: agent.RequestContext | None = None
) -> agent.ConversationAction:
    return agent.ConversationAction(
        user_message_action=agent.UserMessageAction(
            user_message=agent.UserMessage(text=text, message_id="m-1", mode=mode),
            request_context=context,
        )
    )


def request(**overrides: object) -> agent.AgentRunRequest:
    fields: dict[str, object] = {
        "conversation_id": "conv-1",
        "requested_model": agent.RequestedModel(model_id="byok/claude"),
        "action": user_action(),
    }
    fields.update(overrides)
    return agent.AgentRunRequest(**fields)  # type: ignore[arg-type]


def wire(req: agent.AgentRunRequest) -> agent.AgentRunRequest:
    """What the server actually sees: the request after a protobuf round trip."""
    return agent.AgentRunRequest.parse(bytes(req))


def error_of(req: agent.AgentRunRequest) -> RunRequestError:
    with pytest.raises(RunRequestError) as info:
        parse_run_request("rq", wire(req))
    return info.value


def test_valid_user_message_request() -> None:
    context = agent.RequestContext()
    req = request(action=user_action("fix it", Mode.ASK, context))
    start = parse_run_request("rq-7", wire(req))
    assert start.request_id == "rq-7"
    assert start.conversation_id == "conv-1"
    assert start.model_id == "byok/claude"
    assert start.action == "user_message_action"
    assert start.user_message is not None
    assert start.user_message.text == "fix it"
    assert start.user_message.message_id == "m-1"
    assert start.request_context is not None
    assert start.mode == Mode.ASK
    assert start.client_state is None


# -- model ---------------------------------------------------------------------------------------------


def test_requested_model_wins_over_model_details() -> None:
    req = request(
        requested_model=agent.RequestedModel(model_id="new"), model_details=agent.ModelDetails(model_id="old")
    )
    assert parse_run_request("rq", wire(req)).model_id == "new"


def test_model_details_is_the_fallback() -> None:
    req = request(requested_model=None, model_details=agent.ModelDetails(model_id="old"))
    assert parse_run_request("rq", wire(req)).model_id == "old"


def test_empty_requested_model_falls_back_to_model_details() -> None:
    req = request(
        requested_model=agent.RequestedModel(max_mode=True), model_details=agent.ModelDetails(model_id="old")
    )
    assert requested_model_id(wire(req)) == "old"


@pytest.mark.parametrize(
    "models",
    [
        {"requested_model": None},
        {"requested_model": agent.RequestedModel(model_id="")},
        {"requested_model": None, "model_details": agent.ModelDetails(display_name="x")},
        {"requested_model": agent.RequestedModel(), "model_details": agent.ModelDetails()},
    ],
)
def test_missing_model_is_invalid_argument(models: dict) -> None:
    err = error_of(request(**models))
    assert err.code == "invalid_argument"
    assert err.message == str(err)


# -- required fields -------------------------------------------------------------------------------


@pytest.mark.parametrize("conversation_id", [None, ""])
def test_missing_conversation_id_is_invalid_argument(conversation_id: str | None) -> None:
    assert error_of(request(conversation_id=conversation_id)).code == "invalid_argument"


def test_missing_action_is_invalid_argument() -> None:
    assert error_of(request(action=None)).code == "invalid_argument"


def test_action_without_a_variant_is_invalid_argument() -> None:
    action = agent.ConversationAction(triggering_auth_id="auth")
    assert error_of(request(action=action)).code == "invalid_argument"


def test_user_message_action_without_user_message_is_invalid_argument() -> None:
    action = agent.ConversationAction(user_message_action=agent.UserMessageAction())
    assert error_of(request(action=action)).code == "invalid_argument"


def test_a_cancel_action_as_a_run_request_is_unimplemented() -> None:
    err = error_of(request(action=agent.ConversationAction(cancel_action=agent.CancelAction(reason="x"))))
    assert err.code == "unimplemented"


@pytest.mark.parametrize(
    ("action", "target"),
    [
        (agent.ConversationAction(cancel_subagent_action=agent.CancelSubagentAction(subagent_id="s")), "s"),
        (
            agent.ConversationAction(
                background_subagent_action=agent.BackgroundSubagentAction(tool_call_id="t")
            ),
            "t",
        ),
    ],
)
def test_subagent_actions_name_their_target(action: agent.ConversationAction, target: str) -> None:
    start = parse_run_request("r", request(action=action))
    assert start.target == target


@pytest.mark.parametrize(
    "action",
    [
        agent.ConversationAction(cancel_subagent_action=agent.CancelSubagentAction()),
        agent.ConversationAction(background_subagent_action=agent.BackgroundSubagentAction()),
    ],
)
def test_subagent_actions_without_a_target_are_invalid(action: agent.ConversationAction) -> None:
    assert error_of(request(action=action)).code == "invalid_argument"


def test_shell_actions_name_their_command_and_call() -> None:
    shell = agent.ShellCommandAction(shell_command=agent.ShellCommand(command="ls -la"), exec_id="x-7")
    start = parse_run_request("r", request(action=agent.ConversationAction(shell_command_action=shell)))
    assert start.action == "shell_command_action" and start.target == "x-7"
    assert (
        start.event_action is not None
        and start.event_action.shell_command_action.shell_command.command == "ls -la"
    )
    empty = agent.ShellCommandAction(shell_command=agent.ShellCommand(command="  "))
    assert (
        error_of(request(action=agent.ConversationAction(shell_command_action=empty))).code
        == "invalid_argument"
    )
    bg = agent.BackgroundShellAction(tool_call_id="call_1")
    start = parse_run_request("r", request(action=agent.ConversationAction(background_shell_action=bg)))
    assert (start.action, start.target) == ("background_shell_action", "call_1")
    nameless = agent.ConversationAction(background_shell_action=agent.BackgroundShellAction())
    assert error_of(request(action=nameless)).code == "invalid_argument"


def test_resume_action_carries_its_request_context() -> None:
    ctx = agent.RequestContext(env=agent.RequestContextEnv(os_version="linux"))
    start = parse_run_request(
        "r", request(action=agent.ConversationAction(resume_action=agent.ResumeAction(request_context=ctx)))
    )
    assert start.action == "resume_action"
    assert start.user_message is None
    assert start.request_context is not None and start.request_context.env.os_version == "linux"


def test_background_completion_needs_task_ids() -> None:
    empty = agent.ConversationAction(background_task_completion_action=agent.BackgroundTaskCompletionAction())
    assert error_of(request(action=empty)).code == "invalid_argument"
    done = agent.BackgroundTaskCompletion(task_id="sub-1", kind=agent.BackgroundTaskKind.SUBAGENT)
    action = agent.ConversationAction(
        background_task_completion_action=agent.BackgroundTaskCompletionAction(completions=[done])
    )
    start = parse_run_request("r", request(action=action))
    assert [c.task_id for c in start.completions] == ["sub-1"]


def test_model_is_checked_before_the_action() -> None:
    err = error_of(
        request(requested_model=None, action=agent.ConversationAction(resume_action=agent.ResumeAction()))
    )
    assert err.code == "invalid_argument"


# -- mode ----------------------------------------------------------------------------------------------


def state(mode: agent.AgentMode | None) -> agent.ConversationStateStructure:
    return agent.ConversationStateStructure(mode=mode)


@pytest.mark.parametrize(
    ("message_mode", "state_mode", "expected"),
    [
        (Mode.PLAN, None, Mode.PLAN),
        (Mode.PLAN, Mode.ASK, Mode.PLAN),  # the user just switched: the message wins
        (Mode.UNSPECIFIED, Mode.ASK, Mode.ASK),
        (Mode.UNSPECIFIED, Mode.DEBUG, Mode.DEBUG),
        (Mode.UNSPECIFIED, Mode.UNSPECIFIED, Mode.AGENT),
        (Mode.UNSPECIFIED, None, Mode.AGENT),
        (Mode.MULTITASK, Mode.PLAN, Mode.MULTITASK),
        (Mode.UNSPECIFIED, Mode.MULTITASK, Mode.MULTITASK),
        (Mode.ASK, Mode.TRIAGE, Mode.ASK),  # a mode byok does not run, overridden by the message
    ],
)
def test_mode_resolution(
    message_mode: agent.AgentMode, state_mode: agent.AgentMode | None, expected: agent.AgentMode
) -> None:
    req = request(action=user_action(mode=message_mode), conversation_state=state(state_mode))
    start = parse_run_request("rq", wire(req))
    assert start.mode == expected
    assert start.mode_dir == {Mode.MULTITASK: "multitask"}.get(expected, expected.name.lower())


@pytest.mark.parametrize(
    ("message_mode", "state_mode", "named"),
    [
        (Mode.TRIAGE, None, "mode TRIAGE;"),
        (Mode.PROJECT, Mode.AGENT, "mode PROJECT;"),
        (Mode.UNSPECIFIED, Mode.PROJECT, "mode PROJECT;"),  # a resumed state's mode is checked too
        (99, None, "mode 99 (unknown to byok);"),  # a value newer than the schema
    ],
)
def test_a_mode_byok_does_not_run_is_refused_by_name(
    message_mode: agent.AgentMode, state_mode: agent.AgentMode | None, named: str
) -> None:
    req = request(action=user_action(mode=message_mode), conversation_state=state(state_mode))
    err = error_of(req)
    assert err.code == "unimplemented"
    assert named in err.message and "agent, ask, plan, debug, multitask" in err.message


def test_a_subagent_run_uses_the_subagent_set_whatever_its_mode() -> None:
    req = request(action=user_action(mode=Mode.PLAN), subagent_type_name="generalPurpose")
    start = parse_run_request("rq", wire(req))
    assert (start.subagent_type, start.mode, start.mode_dir) == ("generalPurpose", Mode.PLAN, "subagent")
    assert parse_run_request("rq", wire(request())).subagent_type == ""


def test_mode_defaults_to_agent_without_state() -> None:
    assert parse_run_request("rq", wire(request())).mode == Mode.AGENT


def test_client_state_is_passed_through() -> None:
    client = agent.ConversationStateStructure(turns=[b"\x01" * 32], mode=Mode.ASK)
    start = parse_run_request("rq", wire(request(conversation_state=client)))
    assert start.client_state is not None
    assert bytes(start.client_state) == bytes(client)


def test_start_plan_action_is_a_user_turn_in_plan_mode() -> None:
    message = agent.UserMessage(text="plan it", message_id="m-9")
    action = agent.ConversationAction(start_plan_action=agent.StartPlanAction(user_message=message))
    start = parse_run_request("r", wire(request(action=action)))
    assert start.user_turn and start.mode == Mode.PLAN and start.user_message == message
    # A start-plan message that names its own mode keeps it.
    message.mode = Mode.AGENT
    assert parse_run_request("r", wire(request(action=action))).mode == Mode.AGENT
    empty = agent.ConversationAction(start_plan_action=agent.StartPlanAction())
    assert error_of(request(action=empty)).code == "invalid_argument"


def ask_completion(result: agent.AskQuestionResult | None, call_id: str = "c1") -> agent.ConversationAction:
    completion = agent.AsyncAskQuestionCompletionAction(original_tool_call_id=call_id, result=result)
    return agent.ConversationAction(async_ask_question_completion_action=completion)


def test_async_answers_carry_the_whole_action() -> None:
    answered = agent.AskQuestionResult(success=agent.AskQuestionSuccess())
    state = agent.ConversationStateStructure(mode=Mode.PLAN)
    start = parse_run_request("r", wire(request(action=ask_completion(answered), conversation_state=state)))
    assert not start.user_turn and start.user_message is None
    assert start.event_action == ask_completion(answered)
    assert start.mode == Mode.PLAN  # the conversation's mode: the action names none
    # Answers must be answers: no call id, no result, or "later" again are refused.
    assert error_of(request(action=ask_completion(answered, call_id=""))).code == "invalid_argument"
    assert error_of(request(action=ask_completion(None))).code == "invalid_argument"
    later = agent.AskQuestionResult(async_=agent.AskQuestionAsync())
    assert "carries no answer" in error_of(request(action=ask_completion(later))).message


def test_execute_plan_runs_in_its_execution_mode() -> None:
    execute = agent.ExecutePlanAction(request_context=agent.RequestContext(), plan_file_content="# P")
    start = parse_run_request(
        "r", wire(request(action=agent.ConversationAction(execute_plan_action=execute)))
    )
    assert start.mode == Mode.AGENT and start.request_context is not None
    assert start.event_action is not None and start.event_action.execute_plan_action == execute
    execute.execution_mode = Mode.DEBUG
    start = parse_run_request(
        "r", wire(request(action=agent.ConversationAction(execute_plan_action=execute)))
    )
    assert start.mode == Mode.DEBUG
