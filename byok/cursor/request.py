"""AgentRunRequest -> RunStart: what one run must do, validated (sans-IO)."""

from __future__ import annotations

import attrs
import betterproto2

from byok.cursor.agent_modes import UnknownModeError, run_mode
from byok.cursor.pasted_images import selected_images, verified_blobs
from byok.pb.agent import v1 as agent


class RunRequestError(Exception):
    """The run_request cannot start a run. ``code`` is the Connect code to answer with."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@attrs.frozen
class RunStart:
    request_id: str
    conversation_id: str
    model_id: str
    action: str  # the ConversationAction oneof name
    user_message: agent.UserMessage | None
    request_context: agent.RequestContext | None
    mode: agent.AgentMode
    client_state: agent.ConversationStateStructure | None
    completions: tuple[agent.BackgroundTaskCompletion, ...] = ()
    conversation_group_id: str = ""  # the root conversation of a subagent tree ("" for a root)
    mcp_tools: agent.McpTools | None = None  # MCP tools the client announced in the run request
    # The run is a subagent's (AgentRunRequest.subagent_type_name): it runs the subagent set.
    subagent_type: str = ""
    # A subagent's run: its parent run's request id and the parent's Task call id
    # (x-parent-request-id, x-parent-agent-tool-call-id), ("", "") for a root run.
    parent: tuple[str, str] = ("", "")
    # Per subagent type, the model its Task calls run on (an override, inherit, or disabled).
    subagent_model_overrides: tuple[agent.SubagentModelOverride, ...] = ()
    # cancel_subagent_action's subagent id, background_subagent_action's Task call id,
    # background_shell_action's Shell call id, shell_command_action's exec id.
    target: str = ""
    # The client asked for no UpdateCurrentStep tool (suppress_subagent_progress_update_tool).
    no_progress_tool: bool = False
    # Blobs the client delivered with the request (pasted images), verified against their ids.
    # Only the start point reads them, so the run log leaves them out.
    pre_fetched: dict[bytes, bytes] = attrs.field(factory=dict, eq=False, repr=False)

    @property
    def image_count(self) -> int:
        """How many images the user's message carries."""
        return len(selected_images(self.user_message))

    @property
    def mode_dir(self) -> str:
        """The mode's asset directory (parse_run_request refused a mode byok does not run)."""
        return run_mode(self.mode, self.subagent_type)

    # An action that continues the conversation with what the user did in Cursor's UI (async
    # answers, a plan to build): the whole ConversationAction (cursor/interaction_actions.py).
    event_action: agent.ConversationAction | None = None

    @property
    def user_turn(self) -> bool:
        """The run starts from a message the user wrote (start_plan_action: one that starts planning)."""
        return self.action in USER_TURNS


# Actions whose run starts from the user's own message.
USER_TURNS = ("user_message_action", "start_plan_action")


def requested_model_id(req: agent.AgentRunRequest) -> str:
    # The newer field first; older clients only send model_details.
    if req.requested_model is not None and req.requested_model.model_id:
        return req.requested_model.model_id
    if req.model_details is not None and req.model_details.model_id:
        return req.model_details.model_id
    return ""


def parse_run_request(
    request_id: str, req: agent.AgentRunRequest, parent: tuple[str, str] = ("", "")
) -> RunStart:
    model_id = requested_model_id(req)
    if not model_id:
        raise RunRequestError("invalid_argument", "run_request must select a model")
    if not req.conversation_id:
        raise RunRequestError("invalid_argument", "run_request has no conversation_id")
    if req.action is None:
        raise RunRequestError("invalid_argument", "run_request has no action")
    action, value = betterproto2.which_one_of(req.action, "action")
    if not action:
        raise RunRequestError("invalid_argument", "run_request action has no variant set")
    user_message: agent.UserMessage | None = None
    context: agent.RequestContext | None = None
    completions: tuple[agent.BackgroundTaskCompletion, ...] = ()
    target = ""
    event: agent.ConversationAction | None = None
    mode = agent.AgentMode.UNSPECIFIED  # the action's own mode, when it names one
    if isinstance(value, agent.UserMessageAction | agent.StartPlanAction):
        if value.user_message is None:
            raise RunRequestError("invalid_argument", f"{action} carries no user_message")
        user_message = value.user_message
        context = value.request_context
        if isinstance(value, agent.StartPlanAction) and user_message.mode == agent.AgentMode.UNSPECIFIED:
            mode = agent.AgentMode.PLAN
    elif isinstance(value, agent.AsyncAskQuestionCompletionAction):
        if not value.original_tool_call_id:
            raise RunRequestError("invalid_argument", f"{action} names no original_tool_call_id")
        answered, _ = betterproto2.which_one_of(value.result or agent.AskQuestionResult(), "result")
        if answered not in ("success", "rejected", "error"):
            raise RunRequestError(
                "invalid_argument", f"{action} carries no answer (result: {answered or 'none'})"
            )
        event = req.action
    elif isinstance(value, agent.ExecutePlanAction):
        context = value.request_context
        mode = value.execution_mode or agent.AgentMode.AGENT
        event = req.action
    elif isinstance(value, agent.ResumeAction):
        context = value.request_context
    elif isinstance(value, agent.SummarizeAction):
        pass  # compacts the history the client's checkpoint holds; no new input
    elif isinstance(value, agent.BackgroundTaskCompletionAction):
        completions = tuple(value.completions)
        if not completions:
            raise RunRequestError("invalid_argument", "background_task_completion_action has no completions")
        if any(not c.task_id for c in completions):
            raise RunRequestError("invalid_argument", "a background task completion has no task_id")
    elif isinstance(value, agent.CancelSubagentAction):
        if not value.subagent_id:
            raise RunRequestError("invalid_argument", "cancel_subagent_action has no subagent_id")
        target = value.subagent_id
    elif isinstance(value, agent.BackgroundSubagentAction):
        if not value.tool_call_id:
            raise RunRequestError("invalid_argument", "background_subagent_action has no tool_call_id")
        target = value.tool_call_id
    elif isinstance(value, agent.ShellCommandAction):
        # A command the user ran from the chat: a turn of its own (cursor/user_shell.py).
        if value.shell_command is None or not value.shell_command.command.strip():
            raise RunRequestError("invalid_argument", "shell_command_action has no command")
        event = req.action
        target = value.exec_id
    elif isinstance(value, agent.BackgroundShellAction):
        # Meant for the run whose Shell call it names (run/service.py hands it there).
        if not value.tool_call_id:
            raise RunRequestError("invalid_argument", "background_shell_action has no tool_call_id")
        target = value.tool_call_id
    else:
        raise RunRequestError("unimplemented", f"conversation action {action} is not supported yet")
    if mode == agent.AgentMode.UNSPECIFIED:
        mode = _mode(user_message, req.conversation_state)
    subagent_type = req.subagent_type_name or ""
    try:
        run_mode(mode, subagent_type)
    except UnknownModeError as e:
        raise RunRequestError("unimplemented", str(e)) from None
    return RunStart(
        request_id=request_id,
        conversation_id=req.conversation_id,
        model_id=model_id,
        action=action,
        user_message=user_message,
        request_context=context,
        mode=mode,
        client_state=req.conversation_state,
        completions=completions,
        conversation_group_id=req.conversation_group_id or "",
        mcp_tools=req.mcp_tools,
        subagent_type=subagent_type,
        event_action=event,
        parent=parent,
        subagent_model_overrides=tuple(req.subagent_model_overrides),
        target=target,
        no_progress_tool=bool(req.suppress_subagent_progress_update_tool),
        pre_fetched=verified_blobs(req.pre_fetched_blobs),
    )


def _mode(
    user_message: agent.UserMessage | None, state: agent.ConversationStateStructure | None
) -> agent.AgentMode:
    if user_message is not None and user_message.mode != agent.AgentMode.UNSPECIFIED:
        # The message's mode wins over the restored state's: the user may just have switched.
        return user_message.mode
    if state is not None and state.mode:
        return state.mode
    return agent.AgentMode.AGENT


def encode_start(st: RunStart) -> dict[str, object]:
    """``st`` as JSON values (a run's input log): its protobuf parts as their bytes, in hex."""

    def hexed(m: object | None) -> str | None:
        return None if m is None else bytes(m).hex()  # type: ignore[call-overload]

    return {
        "request_id": st.request_id,
        "conversation_id": st.conversation_id,
        "model_id": st.model_id,
        "action": st.action,
        "user_message": hexed(st.user_message),
        "request_context": hexed(st.request_context),
        "mode": int(st.mode),
        "client_state": hexed(st.client_state),
        "completions": [bytes(c).hex() for c in st.completions],
        "conversation_group_id": st.conversation_group_id,
        "mcp_tools": hexed(st.mcp_tools),
        "subagent_type": st.subagent_type,
        "event_action": hexed(st.event_action),
        "parent": list(st.parent),
        "subagent_model_overrides": [bytes(o).hex() for o in st.subagent_model_overrides],
        "target": st.target,
        "no_progress_tool": st.no_progress_tool,
    }


def decode_start(obj: dict[str, object]) -> RunStart:
    def parsed(cls: type, value: object) -> object:
        return None if value is None else cls().parse(bytes.fromhex(str(value)))

    completions = obj.get("completions") or []
    assert isinstance(completions, list)
    return RunStart(
        request_id=str(obj["request_id"]),
        conversation_id=str(obj["conversation_id"]),
        model_id=str(obj["model_id"]),
        action=str(obj["action"]),
        user_message=parsed(agent.UserMessage, obj["user_message"]),  # type: ignore[arg-type]
        request_context=parsed(agent.RequestContext, obj["request_context"]),  # type: ignore[arg-type]
        mode=agent.AgentMode(int(obj["mode"])),  # type: ignore[call-overload]
        client_state=parsed(agent.ConversationStateStructure, obj["client_state"]),  # type: ignore[arg-type]
        completions=tuple(agent.BackgroundTaskCompletion().parse(bytes.fromhex(c)) for c in completions),
        conversation_group_id=str(obj.get("conversation_group_id") or ""),
        mcp_tools=parsed(agent.McpTools, obj.get("mcp_tools")),  # type: ignore[arg-type]
        subagent_type=str(obj.get("subagent_type") or ""),
        event_action=parsed(agent.ConversationAction, obj.get("event_action")),  # type: ignore[arg-type]
        parent=tuple(obj.get("parent") or ("", "")),  # type: ignore[arg-type]
        subagent_model_overrides=tuple(
            agent.SubagentModelOverride().parse(bytes.fromhex(o))
            for o in obj.get("subagent_model_overrides") or []  # type: ignore[attr-defined]
        ),
        target=str(obj.get("target") or ""),
        no_progress_tool=bool(obj.get("no_progress_tool")),
    )
