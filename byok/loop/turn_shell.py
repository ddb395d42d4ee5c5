"""The turn of a command the user ran from the chat (shell_command_action): run it, commit what
it printed as a runtime message (the model reads it next turn), then publish the checkpoint that
lists the shell turn, three times (as a compaction run does), and end. No model is called."""

from __future__ import annotations

from byok.loop.replace import replace
from byok.loop.turn_state import Result, TurnState
from byok.loop.turn_values import Begin, Commit, FinalCheckpoints, RunShellCommand, ToolDone
from byok.model.messages import Message


def run_user_shell(s: TurnState, b: Begin) -> Result:
    return replace(s, phase="shell"), [RunShellCommand()]


def user_shell_done(s: TurnState, done: ToolDone) -> Result:
    """``done.content``: the command and its output as the model reads them; ``done.result`` the
    outcome the run layer makes the shell turn's blobs of."""
    message = Message(
        role="user", origin="runtime", text=done.content, event_id=f"user-shell:{s.request_id}"
    )
    final = FinalCheckpoints(steps=(), answer=None, usage=None, shell=done.result)
    return replace(s, phase="final_commit", next_publish=final), [Commit((message,))]
