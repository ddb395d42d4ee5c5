"""What a conversation action sent into a live run means (sans-IO): the run layer performs it.

- ``background_shell_action``: the user moved a running Shell card to the background. Cursor's
  control for that (``force_background_shell_args``) goes out for the call, whose stream then
  ends ``backgrounded`` and finishes the call as usual (cursor/exec_router.py).
- ``user_message_action``: a new message while the agent is still working. A user message
  starts a new turn with a new request (seeds 000 §22.2, §22.4: the run_request carries it);
  byok does not take one into a turn under way, and a message that reached no model must not
  look handled. So the run stops at once (the user's new message means "stop and listen"),
  with an error that quotes the message and says to send it again; what the run committed
  so far stays in the history, and nothing of the message is. Never dropped in silence.
- Anything else (a resume, a summarize, a plan action sent beside the run): logged and left;
  those start runs of their own.

A ``background_shell_action`` that arrives as a run_request of its own is handed to the
conversation's live run as such a message (run/service.py), without starting a run: a new run
would supersede the live one and stop the very shell it names.
"""

from __future__ import annotations

import attrs
import betterproto2

from byok.pb.agent import v1 as agent

_QUOTE = 80  # characters of the message quoted in the error


@attrs.frozen
class ForceBackground:
    call_id: str


@attrs.frozen
class StopRun:
    code: str  # a Connect error code
    message: str


@attrs.frozen
class Ignore:
    why: str


LiveAction = ForceBackground | StopRun | Ignore


def live_action(action: agent.ConversationAction) -> LiveAction:
    name, value = betterproto2.which_one_of(action, "action")
    if isinstance(value, agent.BackgroundShellAction):
        if not value.tool_call_id:
            return Ignore("background_shell_action names no tool call")
        return ForceBackground(value.tool_call_id)
    if isinstance(value, agent.UserMessageAction):
        text = " ".join((value.user_message.text if value.user_message is not None else "").split())
        quoted = text if len(text) <= _QUOTE else text[: _QUOTE - 1] + "…"
        return StopRun(
            "failed_precondition",
            f"A new message arrived while the agent was still working ({quoted!r}). byok takes one"
            " message per request, so it stopped this run and did not send that message to the"
            " model; send it again.",
        )
    return Ignore(f"conversation action {name or '(none)'} is not taken during a run")


def background_shell_message(call_id: str) -> agent.AgentClientMessage:
    """A ``background_shell_action`` that came as a run_request, as the message its run takes."""
    action = agent.ConversationAction(
        background_shell_action=agent.BackgroundShellAction(tool_call_id=call_id)
    )
    return agent.AgentClientMessage(conversation_action=action)
