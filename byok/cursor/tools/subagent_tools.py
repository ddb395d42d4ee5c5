"""Task (a subagent: one ``subagent_args`` Exec; the client runs the child as its own run) and
UpdateCurrentStep (local: a subagent's progress report to its parent's Task card).

Seeds 000 §33.1: the subagent type is encoded twice, as the TaskArgs oneof for Cursor's card and
as a plain string in SubagentArgs; the model is resolved here, once, from the run request's
overrides and the parent's model. §33.6: the parent's Task completes when the client returns the
child's agent id, with "Subagent name / Subagent ID" for the model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from byok.cursor.tools.base import (
    Action,
    Invocation,
    Phased,
    ToolArgError,
    ToolDef,
    ToolOutcome,
    optional_bool,
    optional_text,
    require_str,
)
from byok.cursor.tools.exec_results import no_variant, typed_one_shot, variant
from byok.model.messages import Message
from byok.pb.agent import v1 as agent

GENERAL = "generalPurpose"
# Subagent types Cursor's TaskArgs oneof names; any other type is a custom one, by its own name.
_TYPE_FIELDS = {
    "explore": "explore",
    "shell": "shell",
    "bash": "bash",
    "debug": "debug",
    "cursor-guide": "cursor_guide",
    "computer-use": "computer_use",
    "browser-use": "browser_use",
    "media-review": "media_review",
    "vm-setup-helper": "vm_setup_helper",
    "watch-video": "watch_video",
}


def subagent_type(name: str) -> agent.SubagentType:
    """TaskArgs.subagent_type for a type name: generalPurpose is ``unspecified``."""
    if name == GENERAL:
        return agent.SubagentType(unspecified=agent.SubagentTypeUnspecified())
    field = _TYPE_FIELDS.get(name)
    if field is None:
        return agent.SubagentType(custom=agent.SubagentTypeCustom(name=name))
    record = getattr(agent, "SubagentType" + "".join(p.capitalize() for p in field.split("_")))()
    return agent.SubagentType(**{field: record})


class ModelRefused(Exception):
    """The run request disables this subagent type."""


def resolve_model(kind: str, asked: str | None, parent_model: str, overrides: tuple[Any, ...]) -> str:
    """The model a Task's child runs on: the run request's override for the type wins (a model,
    inherit, or disabled); without one, an explicit model as asked, else the parent's."""
    for override in overrides:
        if override.subagent_type != kind:
            continue
        if override.disabled:
            raise ModelRefused(f"subagents of type {kind!r} are disabled for this conversation")
        if override.model is not None and override.model.model_id:
            return override.model.model_id
        return parent_model  # inherit
    if asked and asked != "inherit":
        return asked
    return parent_model


# --- Task --------------------------------------------------------------------------------------


def _parse_task(args: Mapping[str, Any]) -> Mapping[str, Any]:
    return {
        "description": require_str(args, "description"),
        "prompt": require_str(args, "prompt"),
        "subagent_type": optional_text(args, "subagent_type") or GENERAL,
        "model": optional_text(args, "model"),
        "resume": optional_text(args, "resume"),
        "run_in_background": bool(optional_bool(args, "run_in_background")),
    }


def _task_args(args: Mapping[str, Any]) -> agent.TaskArgs:
    return agent.TaskArgs(
        description=args["description"],
        prompt=args["prompt"],
        subagent_type=subagent_type(args["subagent_type"]),
        model=args["model"],
        resume=args["resume"],
    )


def _task_ui(args: Mapping[str, Any]) -> agent.TaskToolCall:
    return agent.TaskToolCall(args=_task_args(args))


def _task_card(args: Mapping[str, Any], result: agent.TaskResult) -> agent.ToolCall:
    return agent.ToolCall(task_tool_call=agent.TaskToolCall(args=_task_args(args), result=result))


def _task_error(args: Mapping[str, Any], message: str) -> ToolOutcome:
    result = agent.TaskResult(error=agent.TaskError(error=message))
    return ToolOutcome(message, True, _task_card(args, result))


def _task_outcome(args: Mapping[str, Any], result: agent.SubagentResult) -> ToolOutcome:
    name, value = variant(result)
    if name == "error":
        text = f"The subagent failed: {value.error or 'unknown error'}"
        return _task_error(args, text)
    if name != "success":
        return _task_error(args, no_variant("subagent_result"))
    if not value.agent_id:
        return _task_error(args, "protocol error: the client created a subagent without an agent id")
    reason = value.background_reason
    background = args["run_in_background"] or reason != agent.SubagentBackgroundReason.UNSPECIFIED
    success = agent.TaskSuccess(
        agent_id=value.agent_id,
        is_background=background,
        background_reason=reason,
        transcript_path=value.transcript_path,
    )
    card = _task_card(args, agent.TaskResult(success=success))
    final = value.final_message or ""
    if args["resume"] and args["resume"] != "self":
        # A resumed subagent is not a new one: only what it did this time.
        return ToolOutcome(final or "The subagent finished without a final message.", False, card)
    lines = [f"Subagent name: {args['description']}", f"Subagent ID: {value.agent_id}"]
    if final:
        lines += ["", final]
    elif background:
        lines += ["", "It runs in the background; its report arrives when it finishes."]
    return ToolOutcome("\n".join(lines), False, card)


def _execute_task(inv: Invocation) -> Any:
    args, env = inv.args, inv.env
    try:
        overrides = env.subagent_model_overrides
        model = resolve_model(args["subagent_type"], args["model"], env.model_id, overrides)
    except ModelRefused as e:
        return _Done(_task_error(args, f"Error: Task was not run: {e}."))
    exec_message = agent.ExecServerMessage(
        subagent_args=agent.SubagentArgs(
            tool_call_id=inv.call_id,
            subagent_type=args["subagent_type"],
            model_id=model,
            prompt=args["prompt"],
            resume_agent_id=args["resume"],
            run_in_background=args["run_in_background"],
            parent_conversation_id=env.conversation_id,
            root_parent_conversation_id=env.root_conversation_id,
        )
    )
    return typed_one_shot(
        exec_message, "subagent_result", lambda r: _task_outcome(args, r), lambda e: _task_error(args, e)
    )


class _Done(Phased):
    """A call that ends before any transport: its outcome at once."""

    def __init__(self, outcome: ToolOutcome) -> None:
        self._outcome = outcome

    def start(self) -> list[Action]:
        return self.finish(self._outcome)

    def fail(self, message: str) -> list[Action]:
        return []  # finished at its start: nothing can fail it later


TASK = ToolDef(
    name="Task",
    ui_field="task_tool_call",
    placeholder=agent.TaskToolCall,
    parse=_parse_task,
    ui=_task_ui,
    execute=_execute_task,
)


# --- UpdateCurrentStep -------------------------------------------------------------------------

UPDATE_CURRENT_STEP = "UpdateCurrentStep"


def _parse_update(args: Mapping[str, Any]) -> Mapping[str, Any]:
    out = {k: optional_text(args, k) for k in ("current_step", "final_summary", "completed_subtitle")}
    if not any(out.values()):
        raise ToolArgError("give at least one of current_step, final_summary, completed_subtitle")
    return out


def _update_args(args: Mapping[str, Any]) -> agent.CommunicateUpdateArgs:
    return agent.CommunicateUpdateArgs(
        current_step=args["current_step"],
        final_summary=args["final_summary"],
        completed_subtitle=args["completed_subtitle"],
    )


def _update_ui(args: Mapping[str, Any]) -> agent.CommunicateUpdateToolCall:
    return agent.CommunicateUpdateToolCall(args=_update_args(args))


def step_index(messages: tuple[Message, ...], call_id: str) -> int:
    """The one-based position of ``call_id``'s step in its turn: the turn's steps are each
    assistant message's thinking, then its text, then its calls in order (seeds 000 §26.13)."""
    steps = 0
    for m in messages:
        if m.role == "user":
            steps = 0  # a new turn
        elif m.role == "assistant":
            steps += bool(m.thinking) + bool(m.text)
            for call in m.tool_calls:
                steps += 1
                if call.call_id == call_id:
                    return steps
    return steps + 1


def _execute_update(inv: Invocation) -> Any:
    args = inv.args
    index = step_index(inv.env.messages, inv.call_id) if inv.env is not None else 1
    success = agent.CommunicateUpdateSuccess(current_step=args["current_step"] or "", message_index=index)
    card = agent.ToolCall(
        communicate_update_tool_call=agent.CommunicateUpdateToolCall(
            args=_update_args(args), result=agent.CommunicateUpdateResult(success=success)
        )
    )
    said = [v for v in (args["current_step"], args["final_summary"]) if v]
    return _Done(ToolOutcome("Progress reported to the parent agent: " + " / ".join(said), False, card))


UPDATE = ToolDef(
    name=UPDATE_CURRENT_STEP,
    ui_field="communicate_update_tool_call",
    placeholder=agent.CommunicateUpdateToolCall,
    parse=_parse_update,
    ui=_update_ui,
    execute=_execute_update,
    transport="local",
)


def progress(messages: tuple[Message, ...]) -> agent.CommunicateUpdateTurnState | None:
    """A subagent's progress, folded from its history: every successful UpdateCurrentStep's
    step (and its step's position), the last final summary and completed subtitle given."""
    failed = {m.tool_call_id for m in messages if m.role == "tool" and m.is_error}
    state = agent.CommunicateUpdateTurnState()
    seen = False
    steps = 0
    for m in messages:
        if m.role == "user":
            steps = 0
        if m.role != "assistant":
            continue
        steps += bool(m.thinking) + bool(m.text)
        for call in m.tool_calls:
            steps += 1
            if call.name != UPDATE_CURRENT_STEP or call.call_id in failed:
                continue
            try:
                args = _parse_update(json.loads(call.arguments or "{}"))
            except (ValueError, ToolArgError, AttributeError):
                continue
            seen = True
            if args["current_step"]:
                entry = agent.CommunicateUpdateHistoryEntry(step=args["current_step"], message_index=steps)
                state.history.append(entry)
            if args["final_summary"]:
                state.final_summary = args["final_summary"]
            if args["completed_subtitle"]:
                state.completed_subtitle = args["completed_subtitle"]
    return state if seen else None


def parent_progress(
    parent_call: str, messages: tuple[Message, ...]
) -> tuple[str, agent.CommunicateUpdateTurnState] | None:
    """A subagent run's (parent Task call id, progress) for its checkpoints; None for a root run
    (no parent call) or a subagent that reported nothing."""
    state = progress(messages) if parent_call else None
    return None if state is None else (parent_call, state)


TOOLS: tuple[ToolDef, ...] = (TASK, UPDATE)
