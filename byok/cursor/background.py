"""Background task completions -> the runtime message the model reacts to (sans-IO)."""

from __future__ import annotations

from byok.model.messages import Message
from byok.pb.agent import v1 as agent

FOLLOW_UP = (
    "A background subagent you started has finished; its report is above. Do whatever follow-up "
    "the report calls for. If nothing is needed, say so briefly. When you mention the subagent, "
    "link it as [its name](its id) rather than a generic label."
)


def is_subagent_finished(c: agent.BackgroundTaskCompletion) -> bool:
    return (
        c.kind == agent.BackgroundTaskKind.SUBAGENT
        and c.reason == agent.BackgroundTaskCompletionReason.TASK_FINISHED
    )


def completion_event_id(c: agent.BackgroundTaskCompletion) -> str:
    # One message per finished subagent, ever: a retried completion appends nothing.
    return f"subagent-completed:{c.task_id}"


def completion_message(c: agent.BackgroundTaskCompletion) -> Message:
    lines = [f'<subagent_completion id="{c.task_id}" status="{c.status.name.lower()}">']
    if c.title:
        lines.append(f"Title: {c.title}")
    if c.output_path:
        lines.append(f"Transcript: {c.output_path}")
    if c.detail:
        lines += ["", c.detail]
    lines += ["</subagent_completion>", "", FOLLOW_UP]
    return Message(role="user", origin="runtime", text="\n".join(lines), event_id=completion_event_id(c))


def simulated_user_message(c: agent.BackgroundTaskCompletion) -> agent.UserMessage:
    """The Cursor UserMessage of the turn a completion starts (UI and blob graph)."""
    return agent.UserMessage(
        text=c.title or "Background task finished",
        message_id=completion_event_id(c),
        is_simulated_msg=True,
        simulated_msg_reason=agent.SimulatedMsgReason.BACKGROUND_TASK_COMPLETION,
    )
