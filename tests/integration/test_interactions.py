"""The interaction tools end to end: the model (the fake provider) calls AskQuestion, SwitchMode or
CreatePlan, the daemon sends Cursor's InteractionQuery, the simulated user answers it
(byok/devtools/sim_user.py), and the next provider call reads the typed result. Every run is
replayed byte for byte at teardown (conftest)."""

from __future__ import annotations

import json

from byok.devtools.cursor_sim import CursorSim, Transcript, user_turn
from byok.devtools.sim_user import SimUser, ask_completion_request, execute_plan_request, start_plan_request
from byok.pb.agent import v1 as agent
from tests.integration.conftest import Daemon
from tests.support.fake_provider import chat_text_script, chat_tool_script

MODEL = "byok-demo"

QUESTIONS = {
    "title": "Setup",
    "questions": [
        {
            "id": "db",
            "prompt": "Which database?",
            "options": [{"id": "pg", "label": "PostgreSQL"}, {"id": "lite", "label": "SQLite"}],
        },
        {
            "id": "extras",
            "prompt": "Which extras?",
            "options": [{"id": "cache", "label": "A cache"}, {"id": "auth", "label": "Login"}],
            "allow_multiple": True,
        },
    ],
}


def sim_with(d: Daemon, user: SimUser) -> CursorSim:
    return CursorSim(d.base_url, d.client, on_query=user)


def turn(
    text: str, conv: str, *, mode: agent.AgentMode = agent.AgentMode.AGENT, mid: str = ""
) -> agent.AgentRunRequest:
    return user_turn(
        text, conversation_id=conv, model_id=MODEL, message_id=mid or f"m-{text[:10]}", mode=mode
    )


def tool_results(d: Daemon, request: int) -> list[dict]:
    return [m for m in d.provider.requests[request].json["messages"] if m["role"] == "tool"]


def card(tr: Transcript, field: str) -> agent.ToolCall:
    """The tool_call_completed card whose oneof is ``field`` (the only one)."""
    done = [
        f.message.interaction_update.tool_call_completed.tool_call
        for f in tr.frames
        if f.kind == "interaction_update.tool_call_completed"
    ]
    found = [c for c in done if getattr(c, field) is not None]
    assert len(found) == 1, done
    return found[0]


def assert_query_between_started_and_completed(tr: Transcript, query_kind: str) -> None:
    kinds = tr.kinds()
    started = kinds.index("interaction_update.tool_call_started")
    query = kinds.index(f"interaction_query.{query_kind}")
    completed = kinds.index("interaction_update.tool_call_completed")
    assert started < query < completed


async def ask(d: Daemon, user: SimUser, conv: str) -> Transcript:
    d.provider.enqueue(
        chat_tool_script([("call-ask", "AskQuestion", json.dumps(QUESTIONS))]),
        chat_text_script(["Noted."]),
    )
    tr = await sim_with(d, user).run(f"req-{conv}", turn("Set it up", conv))
    assert tr.end_stream == {}, tr.end_stream
    return tr


async def test_ask_question_answered(daemon: Daemon) -> None:
    user = SimUser(answers={"extras": (["cache", "auth"], "Redis please")})
    tr = await ask(daemon, user, "conv-ask")
    [query] = user.seen
    ask_query = query.ask_question_interaction_query
    assert ask_query.tool_call_id == "call-ask"
    assert [q.id for q in ask_query.args.questions] == ["db", "extras"]
    assert ask_query.args.questions[1].allow_multiple
    assert_query_between_started_and_completed(tr, "ask_question_interaction_query")
    [result] = tool_results(daemon, 1)
    assert result["tool_call_id"] == "call-ask"
    assert "Which database? -> PostgreSQL" in result["content"]
    assert "Which extras? -> A cache, Login" in result["content"]
    assert "Redis please" in result["content"]
    answer = card(tr, "ask_question_tool_call").ask_question_tool_call
    assert answer.result.success.answers[1].selected_option_ids == ["cache", "auth"]
    assert answer.args.title == "Setup"


async def test_a_late_answer_sent_twice_is_taken_once(daemon: Daemon) -> None:
    """The user takes a while (the run waits, its stream stays open), and the answer arrives
    twice: the second is ignored."""
    user = SimUser(repeat=True)
    sim = sim_with(daemon, user)
    sim.query_delay = lambda query: 0.2
    daemon.provider.enqueue(
        chat_tool_script([("call-ask", "AskQuestion", json.dumps(QUESTIONS))]), chat_text_script(["Noted."])
    )
    tr = await sim.run("req-late", turn("Set it up", "conv-late"))
    assert tr.end_stream == {}, tr.end_stream
    kinds = tr.kinds()
    assert kinds.count("interaction_update.tool_call_completed") == 1
    assert kinds.index("interaction_query.ask_question_interaction_query") < kinds.index(
        "interaction_update.tool_call_completed"
    )
    asked = next(f.at for f in tr.frames if f.kind == "interaction_query.ask_question_interaction_query")
    done = next(f.at for f in tr.frames if f.kind == "interaction_update.tool_call_completed")
    assert done - asked >= 0.2  # the run waited for the user
    [result] = tool_results(daemon, 1)
    assert "Which database? -> PostgreSQL" in result["content"]
    assert [name for _, name in tr.appends].count("interaction_response") == 2


async def test_ask_question_rejected(daemon: Daemon) -> None:
    user = SimUser(decisions={"ask_question_interaction_query": "reject"}, reason="not now")
    tr = await ask(daemon, user, "conv-ask-no")
    [result] = tool_results(daemon, 1)
    assert result["content"] == "The user declined to answer the questions (not now)."
    assert card(tr, "ask_question_tool_call").ask_question_tool_call.result.rejected.reason == "not now"


async def test_ask_question_async_then_the_answers_continue_the_conversation(daemon: Daemon) -> None:
    conv = "conv-ask-later"
    user = SimUser(decisions={"ask_question_interaction_query": "async"}, repeat=True)
    tr = await ask(daemon, user, conv)
    [result] = tool_results(daemon, 1)
    assert "answer these questions later" in result["content"]
    assert card(tr, "ask_question_tool_call").ask_question_tool_call.result.async_ is not None
    # Later the user answers: Cursor sends the answers as a conversation action of their own.
    [query] = user.seen
    answers = SimUser(answers={"db": (["lite"], "")}).ask_result(query)
    request = ask_completion_request(
        query, answers, conversation_id=conv, model_id=MODEL, state=tr.checkpoints()[-1]
    )
    daemon.provider.enqueue(chat_text_script(["SQLite it is."]))
    later = await daemon.sim.run("req-ask-answered", request)
    assert later.end_stream == {}, later.end_stream
    assert later.text() == "SQLite it is."
    last = daemon.provider.requests[-1].json["messages"]
    runtime = last[-1]
    assert runtime["role"] == "user" and 'tool_call_id="call-ask"' in runtime["content"]
    assert "Which database? -> SQLite" in runtime["content"]
    # The history before it is the first turn's, unchanged (prefix property).
    first = daemon.provider.requests[1].json["messages"]
    assert last[: len(first)] == first
    # The same answers again (a retried action, new request id): nothing is appended and the
    # model is not called again; the next turn's history holds the answers once.
    calls = len(daemon.provider.requests)
    again = await daemon.sim.run("req-ask-answered-2", request)
    assert again.end_stream == {}, again.end_stream
    assert len(daemon.provider.requests) == calls and again.text() == ""
    daemon.provider.enqueue(chat_text_script(["ok"]))
    follow = turn("And now?", conv)
    follow.conversation_state = again.checkpoints()[-1]
    assert (await daemon.sim.run("req-ask-follow", follow)).end_stream == {}
    history = daemon.provider.requests[-1].json["messages"]
    assert sum('tool_call_id="call-ask"' in str(m["content"]) for m in history) == 1


async def test_switch_mode_mid_turn_changes_the_next_calls_tools_and_prompt(daemon: Daemon) -> None:
    user = SimUser()
    daemon.provider.enqueue(
        chat_tool_script(
            [("call-sw", "SwitchMode", json.dumps({"target_mode_id": "plan", "explanation": "big"}))]
        ),
        chat_text_script(["Planning now."]),
    )
    tr = await sim_with(daemon, user).run("req-switch", turn("Refactor everything", "conv-switch"))
    assert tr.end_stream == {}, tr.end_stream
    [query] = user.seen
    assert query.switch_mode_request_query.args.target_mode_id == "plan"
    assert query.switch_mode_request_query.args.tool_call_id == "call-sw"
    before, after = (r.json for r in daemon.provider.requests)
    tools = lambda body: {t["function"]["name"] for t in body["tools"]}  # noqa: E731
    assert "SwitchMode" in tools(before) and "Write" in tools(before)
    assert "CreatePlan" in tools(after) and "Write" not in tools(after) and "SwitchMode" not in tools(after)
    assert before["messages"][0]["content"] != after["messages"][0]["content"]
    assert "Plan mode" in after["messages"][0]["content"]
    assert tool_results(daemon, 1)[0]["content"].startswith("Switched from agent mode to plan mode")
    switched = card(tr, "switch_mode_tool_call").switch_mode_tool_call.result.success
    assert (switched.from_mode_id, switched.to_mode_id) == ("agent", "plan")
    checkpoints = tr.checkpoints()
    assert checkpoints[0].mode == agent.AgentMode.AGENT  # the round's staged checkpoint
    assert checkpoints[-1].mode == agent.AgentMode.PLAN


async def test_switch_mode_rejected_keeps_the_mode(daemon: Daemon) -> None:
    user = SimUser(decisions={"switch_mode_request_query": "reject"})
    daemon.provider.enqueue(
        chat_tool_script([("call-sw", "SwitchMode", json.dumps({"target_mode_id": "plan"}))]),
        chat_text_script(["Fine."]),
    )
    tr = await sim_with(daemon, user).run("req-switch-no", turn("Refactor", "conv-switch-no"))
    assert tr.end_stream == {}, tr.end_stream
    before, after = (r.json for r in daemon.provider.requests)
    assert before["tools"] == after["tools"]
    assert tool_results(daemon, 1)[0]["content"] == (
        "The user declined the switch to plan mode. Stay in agent mode."
    )
    assert card(tr, "switch_mode_tool_call").switch_mode_tool_call.result.rejected is not None
    assert tr.checkpoints()[-1].mode == agent.AgentMode.AGENT


PLAN = {
    "name": "Cache layer",
    "overview": "Add a cache.",
    "plan": "# Cache layer\n\n- add cache.py\n- wire it in app.py",
    "todos": [{"id": "cache", "content": "Write cache.py"}, {"id": "wire", "content": "Use it"}],
}


async def test_create_plan_is_kept_in_the_checkpoint(daemon: Daemon) -> None:
    user = SimUser(plan_uri="file:///plans/cache.plan.md")
    daemon.provider.enqueue(
        chat_tool_script([("call-plan", "CreatePlan", json.dumps(PLAN))]), chat_text_script(["Plan ready."])
    )
    tr = await sim_with(daemon, user).run(
        "req-plan", turn("Plan a cache", "conv-plan", mode=agent.AgentMode.PLAN)
    )
    assert tr.end_stream == {}, tr.end_stream
    [query] = user.seen
    plan_query = query.create_plan_request_query
    assert plan_query.tool_call_id == "call-plan"
    assert plan_query.args.plan == PLAN["plan"] and [t.id for t in plan_query.args.todos] == ["cache", "wire"]
    [result] = tool_results(daemon, 1)
    assert result["content"].startswith("Plan saved: file:///plans/cache.plan.md\n")
    assert (
        card(tr, "create_plan_tool_call").create_plan_tool_call.result.plan_uri
        == "file:///plans/cache.plan.md"
    )
    staged, settled = tr.checkpoints()[0], tr.checkpoints()[-1]
    assert staged.plan is None and not staged.plans  # no plan before the call's result
    assert settled.plans == {
        "call-plan": agent.PlanRegistryEntry(id="call-plan", path="file:///plans/cache.plan.md")
    }
    sim = daemon.sim
    plan = agent.ConversationPlan().parse(user_blob(sim, tr, settled.plan))
    assert plan.plan == PLAN["plan"]


async def test_create_plan_then_execute_plan_action_builds_it_in_agent_mode(daemon: Daemon) -> None:
    conv = "conv-build"
    user = SimUser(plan_uri="file:///plans/cache.plan.md")
    daemon.provider.enqueue(
        chat_tool_script([("call-plan", "CreatePlan", json.dumps(PLAN))]), chat_text_script(["Plan ready."])
    )
    planned = await sim_with(daemon, user).run(
        "req-planning", turn("Plan it", conv, mode=agent.AgentMode.PLAN)
    )
    assert planned.end_stream == {}, planned.end_stream
    # "Build": the action carries no plan, so byok builds the conversation's own.
    daemon.provider.enqueue(chat_text_script(["Building."]))
    request = execute_plan_request(
        conversation_id=conv, model_id=MODEL, kickoff_message_id="kick-1", state=planned.checkpoints()[-1]
    )
    built = await daemon.sim.run("req-build", request)
    assert built.end_stream == {}, built.end_stream
    body = daemon.provider.requests[-1].json
    assert "Write" in {t["function"]["name"] for t in body["tools"]}  # agent mode's tools
    runtime = body["messages"][-1]
    assert runtime["role"] == "user" and "approved the plan below" in runtime["content"]
    assert PLAN["plan"] in runtime["content"] and "file:///plans/cache.plan.md" not in runtime["content"]
    settled = built.checkpoints()[-1]
    assert settled.mode == agent.AgentMode.AGENT
    assert set(settled.plans) == {"call-plan"}  # the plan is still the conversation's
    turn_blob = agent.ConversationTurnStructure().parse(daemon.sim.blobs[settled.turns[-1]])
    shown = agent.UserMessage().parse(daemon.sim.blobs[turn_blob.agent_conversation_turn.user_message])
    assert shown.is_simulated_msg and shown.simulated_msg_reason == agent.SimulatedMsgReason.PLAN_EXECUTION
    assert shown.message_id == "kick-1"
    # The user edited the plan file before building again: the file as they left it wins.
    daemon.provider.enqueue(chat_text_script(["Building the edit."]))
    edited = execute_plan_request(
        conversation_id=conv,
        model_id=MODEL,
        plan_text="# Cache layer\n\n- only cache.py",
        plan_uri="file:///plans/cache.plan.md",
        kickoff_message_id="kick-2",
        state=settled,
    )
    again = await daemon.sim.run("req-build-2", edited)
    assert again.end_stream == {}, again.end_stream
    content = daemon.provider.requests[-1].json["messages"][-1]["content"]
    assert "- only cache.py" in content and "The plan file: file:///plans/cache.plan.md" in content


async def test_execute_plan_with_no_plan_anywhere_fails_clearly(daemon: Daemon) -> None:
    request = execute_plan_request(conversation_id="conv-no-plan", model_id=MODEL, kickoff_message_id="k")
    tr = await daemon.sim.run("req-no-plan", request)
    assert tr.error is not None and tr.error["code"] == "failed_precondition", tr.end_stream
    assert "carries no plan" in tr.error["message"]
    assert not daemon.provider.requests


async def test_start_plan_action_runs_in_plan_mode(daemon: Daemon) -> None:
    daemon.provider.enqueue(chat_text_script(["Let me look around first."]))
    request = start_plan_request(
        "Plan a cache", conversation_id="conv-start-plan", model_id=MODEL, message_id="sp-1"
    )
    request.action.start_plan_action.user_message.mode = agent.AgentMode.UNSPECIFIED
    tr = await daemon.sim.run("req-start-plan", request)
    assert tr.end_stream == {}, tr.end_stream
    body = daemon.provider.requests[-1].json
    assert "CreatePlan" in {t["function"]["name"] for t in body["tools"]}
    assert "Plan mode" in body["messages"][0]["content"]
    assert "Plan a cache" in body["messages"][-1]["content"]
    assert tr.checkpoints()[-1].mode == agent.AgentMode.PLAN


def user_blob(sim: CursorSim, tr: Transcript, blob_id: bytes | None) -> bytes:
    """A blob the run SET on the client (sims keep their own store)."""
    assert blob_id is not None
    for f in tr.frames:
        kv = f.message.kv_server_message
        if kv is not None and kv.set_blob_args is not None and kv.set_blob_args.blob_id == blob_id:
            return kv.set_blob_args.blob_data
    return sim.blobs[blob_id]
