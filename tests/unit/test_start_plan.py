"""The start point's plan, in values: which steps each action takes from what the first store
trip found, where its turn comes from, and what the turn machine does first."""

from __future__ import annotations

import pytest

from byok.cursor.background import simulated_user_message
from byok.cursor.request import RunStart, parse_run_request
from byok.cursor.start_plan import first_step, plan_start, planned_turn
from byok.devtools.cursor_sim import user_turn
from byok.model.messages import Message, ToolCall
from byok.pb.agent import v1 as agent
from tests.support.run_driver import background_request, resume_request

STATE = agent.ConversationStateStructure(root_prompt_messages_json=[b"s" * 32, b"m" * 32], turns=[b"t" * 32])


def start(req: agent.AgentRunRequest) -> RunStart:
    return parse_run_request("req", req)


def test_a_user_turn_imports_only_when_the_first_trip_could_not_append() -> None:
    st = start(user_turn("hi", conversation_id="c", model_id="m", message_id="m1", state=STATE))
    plan = plan_start(st, head_version=3, appended=True)
    assert (plan.imports, plan.append_runtime, plan.resume, plan.turn) == (False, False, False, "user")
    plan = plan_start(st, head_version=0, appended=False)  # new to byok: import, then append
    assert (plan.imports, plan.append_runtime) == (True, True)
    turn = planned_turn(st, plan)
    assert turn is not None and agent.UserMessage.parse(turn.user_message).text == "hi"


@pytest.mark.parametrize(("version", "imports"), [(0, True), (5, False)])
def test_a_resume_moves_to_the_checkpoint_and_fetches_the_clients_turn(version: int, imports: bool) -> None:
    st = start(resume_request(STATE, conversation_id="c"))
    plan = plan_start(st, head_version=version, appended=False)
    assert (plan.imports, plan.append_runtime, plan.resume, plan.turn) == (imports, False, True, "fetch")
    assert planned_turn(st, plan) is None  # the client has it


def test_a_resume_without_roots_or_turns() -> None:
    bare = start(resume_request(agent.ConversationStateStructure(), conversation_id="c"))
    plan = plan_start(bare, head_version=0, appended=False)
    assert (plan.imports, plan.resume, plan.turn) == (False, False, "empty")
    no_turns = start(
        resume_request(
            agent.ConversationStateStructure(root_prompt_messages_json=[b"s" * 32]), conversation_id="c"
        )
    )
    assert plan_start(no_turns, head_version=2, appended=False).turn == "empty"


def test_a_background_completion_appends_only_finished_subagents() -> None:
    finished = agent.BackgroundTaskCompletion(
        task_id="t1",
        kind=agent.BackgroundTaskKind.SUBAGENT,
        reason=agent.BackgroundTaskCompletionReason.TASK_FINISHED,
        title="done",
    )
    other = agent.BackgroundTaskCompletion(task_id="t0", title="shell")
    st = start(background_request([other, finished], conversation_id="c"))
    plan = plan_start(st, head_version=4, appended=False)
    assert [c.task_id for c in plan.completions] == ["t1"] and plan.turn == "simulated"
    turn = planned_turn(st, plan)
    assert turn is not None and turn.user_message == bytes(simulated_user_message(finished))
    only_other = start(background_request([other], conversation_id="c"))
    plan = plan_start(only_other, head_version=4, appended=False)
    assert plan.completions == () and plan.simulated is not None and plan.simulated.task_id == "t0"


def test_the_machines_first_step() -> None:
    answer = Message(role="assistant", origin="assistant", text="done")
    staged = Message(role="assistant", origin="assistant", tool_calls=(ToolCall("c", "Read", "{}", 0),))
    assert first_step("user_message_action", None, (answer,)) == "call"
    assert first_step("resume_action", staged, (staged,)) == "tools"
    assert first_step("resume_action", None, (answer,)) == "final"
    assert first_step("resume_action", None, (staged,)) == "call"
