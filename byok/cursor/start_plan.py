"""Where a run starts, decided in values: from the run request and what the first store trip
found, which steps the start point takes (import the client's transcript, append the runtime
message, move to the client's checkpoint, append finished subagents' reports), where the turn
it continues comes from, and what the turn machine does first. run/start_point.py performs the
steps; the content they move (which revision a resume lands on) is history.resume_point's.
"""

from __future__ import annotations

from typing import Literal

import attrs

from byok.cursor.background import is_subagent_finished, simulated_user_message
from byok.cursor.checkpoint import TurnRecord, empty_turn
from byok.cursor.interaction_actions import EVENT_ACTIONS, event_user_message
from byok.cursor.request import RunStart
from byok.model.messages import Message
from byok.pb.agent import v1 as agent


@attrs.frozen
class StartPlan:
    imports: bool  # byok has never seen the conversation: import the client's transcript first
    append_runtime: bool  # the user turn's runtime message is still to be appended (after the import)
    resume: bool  # move the head to the client's checkpoint (resume_point decides where)
    completions: tuple[agent.BackgroundTaskCompletion, ...]  # finished subagents' reports to append
    # Where the turn comes from: the user's message, the client's copy of its last turn (a blob
    # to GET), none, or the message a background completion simulates.
    turn: Literal["user", "fetch", "empty", "simulated"]
    simulated: agent.BackgroundTaskCompletion | None = None
    # An action's runtime message to append (async answers, a plan to build; interaction_actions).
    event: bool = False


def may_import(st: RunStart) -> bool:
    return st.client_state is not None and bool(st.client_state.root_prompt_messages_json)


def plan_start(st: RunStart, head_version: int, appended: bool) -> StartPlan:
    """``head_version`` and ``appended``: what the first store trip found (0: byok has no
    history of the conversation) and whether it appended the user turn's runtime message."""
    if st.user_turn:
        # The first trip appends it unless the client's transcript must be imported first.
        return StartPlan(
            imports=not appended, append_runtime=not appended, resume=False, completions=(), turn="user"
        )
    imports = head_version == 0 and may_import(st)
    if st.action in ("resume_action", "summarize_action", *CONTROL_ACTIONS):
        # A summary compacts the history at the client's checkpoint, as a resume finds it.
        if not may_import(st):  # a checkpoint without roots: nothing to move to
            return StartPlan(imports, False, False, (), "empty")
        assert st.client_state is not None
        return StartPlan(imports, False, True, (), "fetch" if st.client_state.turns else "empty")
    if st.action in EVENT_ACTIONS:
        return StartPlan(imports, False, False, (), "simulated", event=True)
    if st.action == "shell_command_action":
        # The user's command is a turn of its own, after the conversation as byok has it.
        return StartPlan(imports, False, False, (), "empty")
    assert st.action == "background_task_completion_action", st.action
    finished = tuple(c for c in st.completions if is_subagent_finished(c))
    first = finished[0] if finished else st.completions[0]
    return StartPlan(imports, False, False, finished, "simulated", first)


def planned_turn(st: RunStart, plan: StartPlan) -> TurnRecord | None:
    """The turn the run continues, when the plan knows it without the client (None: fetch it)."""
    if plan.turn == "user":
        assert st.user_message is not None
        return TurnRecord(st.request_id, bytes(st.user_message))
    if plan.turn == "simulated":
        if plan.event:
            return TurnRecord(st.request_id, bytes(event_user_message(st)))
        assert plan.simulated is not None
        return TurnRecord(st.request_id, bytes(simulated_user_message(plan.simulated)))
    if plan.turn == "empty":
        return empty_turn(st.request_id)
    return None


def ends_with_answer(messages: tuple[Message, ...]) -> bool:
    return bool(messages) and messages[-1].role == "assistant" and not messages[-1].tool_calls


# Actions that change nothing in the conversation: the run only answers with its checkpoints.
CONTROL_ACTIONS = ("cancel_subagent_action", "background_subagent_action")


def first_step(
    action: str, staged: Message | None, messages: tuple[Message, ...], *, repeated: bool = False
) -> Literal["call", "tools", "final", "compact", "shell"]:
    """What the turn machine does first (its Begin's ``start``). ``repeated``: a background
    completion, async answers or a plan to build an earlier run already appended (a retry)."""
    if action == "summarize_action":
        return "compact"
    if action == "shell_command_action":
        return "shell"
    if action in CONTROL_ACTIONS:
        return "final"  # never a staged round again: the user asked about a subagent, not this turn
    if staged is not None:
        return "tools"  # a resume of a staged round: its tools run again, no provider call
    if action == "resume_action" and ends_with_answer(messages):
        return "final"  # resumed from the turn-end staged checkpoint: only those are missing
    if repeated and ends_with_answer(messages):
        # The completion (or the async answers, the plan to build) was answered already: a second
        # answer would follow the first.
        return "final"
    return "call"
