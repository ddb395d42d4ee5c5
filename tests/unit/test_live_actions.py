"""Conversation actions sent into a live run, as values (cursor/live_actions.py), and the router's
force-background control for a running shell."""

from __future__ import annotations

from byok.cursor.exec_router import ExecRouter
from byok.cursor.live_actions import ForceBackground, Ignore, StopRun, live_action
from byok.cursor.tools.base import Invocation
from byok.cursor.tools.shell_tool import SHELL
from byok.pb.agent import v1 as agent


def test_what_each_action_means() -> None:
    bg = agent.ConversationAction(background_shell_action=agent.BackgroundShellAction(tool_call_id="c1"))
    assert live_action(bg) == ForceBackground("c1")
    empty = agent.ConversationAction(background_shell_action=agent.BackgroundShellAction())
    assert isinstance(live_action(empty), Ignore)
    long = "word " * 40
    msg = agent.ConversationAction(
        user_message_action=agent.UserMessageAction(user_message=agent.UserMessage(text=long))
    )
    stop = live_action(msg)
    assert isinstance(stop, StopRun) and stop.code == "failed_precondition"
    assert "word word" in stop.message and "…" in stop.message and "send it again" in stop.message
    resume = agent.ConversationAction(resume_action=agent.ResumeAction())
    assert live_action(resume) == Ignore("conversation action resume_action is not taken during a run")


def test_force_background_goes_out_once_for_a_running_shell_only() -> None:
    sent: list[bytes] = []
    done: list[str] = []
    router = ExecRouter(sent.append, "req", lambda cid, o: done.append(cid))
    args = SHELL.parse({"command": "sleep 9"})
    router.begin("c1", "mc", SHELL.execute(Invocation("c1", "Shell", "mc", args)))
    shell_id = agent.AgentServerMessage().parse(sent[0]).exec_server_message.id
    assert router.force_background("c1")
    control = agent.AgentServerMessage().parse(sent[1]).exec_server_message
    assert control.force_background_shell_args.tool_call_id == "c1" and control.id == shell_id + 1
    assert not router.force_background("c1")  # asked already
    assert not router.force_background("c2")  # no such call
    # The control's own answers are absorbed; the shell's stream ends the call.
    accepted = agent.ForceBackgroundShellResult(status=agent.ForceBackgroundShellStatus.ACCEPTED)
    router.on_exec_message(agent.ExecClientMessage(id=control.id, force_background_shell_result=accepted))
    router.on_control(agent.ExecClientControlMessage(stream_close=agent.ExecClientStreamClose(id=control.id)))
    assert done == []
    backgrounded = agent.ShellStream(backgrounded=agent.ShellStreamBackgrounded(shell_id=4))
    router.on_exec_message(agent.ExecClientMessage(id=shell_id, shell_stream=backgrounded))
    assert done == ["c1"]
    assert not router.force_background("c1")  # finished
