"""The interaction tools without a daemon: arguments, the query each sends, every answer variant
(and the wrong ones), the second phase (an Exec, server work), and their typed cards."""

from __future__ import annotations

import json
from typing import Any

import pytest

from byok.cursor.tools.ask_question_tool import ASK_QUESTION, answers_text, question_args
from byok.cursor.tools.base import (
    Finish,
    Invocation,
    Note,
    SendExec,
    SendQuery,
    StartWork,
    ToolArgError,
    ToolDef,
)
from byok.cursor.tools.env import ToolEnv
from byok.cursor.tools.modes import ModeSwitch
from byok.cursor.tools.plan_tool import CREATE_PLAN
from byok.cursor.tools.server_work_tools import GENERATE_IMAGE, WEB_SEARCH
from byok.cursor.tools.switch_mode_tool import SWITCH_MODE
from byok.cursor.tools.web_fetch_tool import MODEL_TEXT_LIMIT, WEB_FETCH
from byok.cursor.tools.work import (
    ImageMade,
    ImageWork,
    SearchHit,
    SearchResults,
    SearchWork,
    WorkFailed,
    decode_result,
    encode_result,
)
from byok.pb.agent import v1 as agent

QUESTIONS = {
    "questions": [
        {
            "id": "db",
            "prompt": "Which database?",
            "options": [{"id": "pg", "label": "PG"}, {"id": "l", "label": "Lite"}],
        }
    ]
}


def start(tool: ToolDef, args: dict[str, Any], env: ToolEnv | None = None) -> tuple[Any, list]:
    execution = tool.execute(Invocation("call-1", tool.name, "mc-1", tool.parse(args), env or ToolEnv()))
    return execution, execution.start()


def answer(**result: Any) -> agent.InteractionResponse:
    return agent.InteractionResponse(id=1, **result)


def finished(actions: list) -> Any:
    (done,) = [a for a in actions if isinstance(a, Finish)]
    return done.outcome


# --- AskQuestion ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({}, "'questions' must be a non-empty list"),
        ({"questions": []}, "'questions' must be a non-empty list"),
        ({"questions": [{"id": "q", "prompt": "?", "options": [{"id": "a", "label": "A"}]}]}, "at least 2"),
        ({"questions": [{"id": "q", "prompt": " ", "options": []}]}, "'prompt' must be a non-empty string"),
        ({"questions": [QUESTIONS["questions"][0]] * 2}, "question ids must be unique"),
        (
            {"questions": [{"id": "q", "prompt": "?", "options": [{"id": "a", "label": "A"}] * 2}]},
            "option ids must be unique",
        ),
    ],
)
def test_ask_question_arguments_are_checked(args: dict, problem: str) -> None:
    with pytest.raises(ToolArgError, match=problem):
        ASK_QUESTION.parse(args)


def test_ask_question_sends_its_query_and_reads_the_answer() -> None:
    execution, actions = start(ASK_QUESTION, QUESTIONS)
    (send,) = actions
    assert isinstance(send, SendQuery)
    query = send.query.ask_question_interaction_query
    assert query.tool_call_id == "call-1" and query.args.questions[0].options[1].label == "Lite"
    chosen = agent.AskQuestionSuccessAnswer(question_id="db", selected_option_ids=["l"], freeform_text="fast")
    result = agent.AskQuestionResult(success=agent.AskQuestionSuccess(answers=[chosen]))
    outcome = finished(
        execution.on_answer(
            answer(ask_question_interaction_response=agent.AskQuestionInteractionResponse(result))
        )
    )
    assert outcome.content == "The user answered:\n- Which database? -> Lite\n  The user wrote: fast"
    assert not outcome.is_error and outcome.ui.ask_question_tool_call.result == result
    # A repeated answer after the end changes nothing.
    assert (
        execution.on_answer(
            answer(ask_question_interaction_response=agent.AskQuestionInteractionResponse(result))
        )
        == []
    )


def test_answers_text_keeps_what_it_cannot_place() -> None:
    args = ASK_QUESTION.parse(QUESTIONS)
    questions = question_args(args).questions
    odd = [
        agent.AskQuestionSuccessAnswer(question_id="db", selected_option_ids=["zz"]),
        agent.AskQuestionSuccessAnswer(question_id="other", selected_option_ids=["x"], freeform_text="hi"),
    ]
    assert (
        answers_text(questions, odd)
        == "- Which database? -> zz\n- (question other) -> x\n  The user wrote: hi"
    )
    assert answers_text(questions, []) == "- Which database? -> (no answer)"


@pytest.mark.parametrize(
    ("result", "text", "is_error"),
    [
        (agent.AskQuestionResult(rejected=agent.AskQuestionRejected("busy")), "declined to answer", True),
        (agent.AskQuestionResult(error=agent.AskQuestionError("boom")), "could not be asked: boom", True),
        (agent.AskQuestionResult(async_=agent.AskQuestionAsync()), "answer these questions later", False),
        (agent.AskQuestionResult(), "protocol error", True),
    ],
)
def test_ask_question_other_answers(result: agent.AskQuestionResult, text: str, is_error: bool) -> None:
    execution, _ = start(ASK_QUESTION, QUESTIONS)
    outcome = finished(
        execution.on_answer(
            answer(ask_question_interaction_response=agent.AskQuestionInteractionResponse(result))
        )
    )
    assert text in outcome.content and outcome.is_error is is_error


def test_an_answer_of_another_kind_is_a_protocol_error() -> None:
    execution, _ = start(ASK_QUESTION, QUESTIONS)
    approved = agent.SwitchModeRequestResponse(approved=agent.SwitchModeRequestResponseApproved())
    outcome = finished(execution.on_answer(answer(switch_mode_request_response=approved)))
    assert outcome.content == (
        "protocol error: expected ask_question_interaction_response, got switch_mode_request_response"
    )
    assert outcome.ui.ask_question_tool_call.result.error.error_message == outcome.content


# --- CreatePlan ----------------------------------------------------------------------------------------


def test_create_plan_needs_a_plan_and_well_formed_todos() -> None:
    with pytest.raises(ToolArgError, match="'plan'"):
        CREATE_PLAN.parse({"name": "x"})
    with pytest.raises(ToolArgError, match=r"todos\[0\]: 'content'"):
        CREATE_PLAN.parse({"plan": "# P", "todos": [{"id": "a"}]})


def test_create_plan_saved_and_not_saved() -> None:
    execution, (send,) = start(CREATE_PLAN, {"plan": "# P", "todos": [{"id": "a", "content": "do"}]})
    query = send.query.create_plan_request_query
    assert query.args.todos[0].status == agent.TodoStatus.PENDING and query.tool_call_id == "call-1"
    saved = agent.CreatePlanResult(plan_uri="file:///p.md", success=agent.CreatePlanSuccess())
    outcome = finished(
        execution.on_answer(answer(create_plan_request_response=agent.CreatePlanRequestResponse(saved)))
    )
    assert outcome.content.startswith("Plan saved: file:///p.md\n") and not outcome.is_error
    execution, _ = start(CREATE_PLAN, {"plan": "# P"})
    failed = agent.CreatePlanResult(error=agent.CreatePlanError("disk full"))
    outcome = finished(
        execution.on_answer(answer(create_plan_request_response=agent.CreatePlanRequestResponse(failed)))
    )
    assert outcome.content == "The plan could not be saved: disk full" and outcome.is_error


# --- SwitchMode ----------------------------------------------------------------------------------------


def test_switch_mode_approved_notes_the_switch_then_finishes() -> None:
    execution, (send,) = start(SWITCH_MODE, {"target_mode_id": "Plan"}, ToolEnv(mode="agent"))
    assert send.query.switch_mode_request_query.args.target_mode_id == "plan"
    approved = agent.SwitchModeRequestResponse(approved=agent.SwitchModeRequestResponseApproved())
    note, done = execution.on_answer(answer(switch_mode_request_response=approved))
    assert note == Note(ModeSwitch("plan"))
    success = done.outcome.ui.switch_mode_tool_call.result.success
    assert (success.from_mode_id, success.to_mode_id) == ("agent", "plan")


def test_switch_mode_to_the_current_mode_asks_nobody() -> None:
    _, actions = start(SWITCH_MODE, {"target_mode_id": "plan"}, ToolEnv(mode="plan"))
    outcome = finished(actions)
    assert outcome.is_error and "in plan mode already" in outcome.content


def test_switch_mode_to_an_unknown_mode_is_an_argument_error() -> None:
    with pytest.raises(ToolArgError, match="must be one of plan, agent"):
        SWITCH_MODE.parse({"target_mode_id": "debug"})


# --- WebFetch ------------------------------------------------------------------------------------------


def fetched(**success: Any) -> agent.ExecClientMessage:
    return agent.ExecClientMessage(
        id=1, fetch_result=agent.FetchResult(success=agent.FetchSuccess(**success))
    )


def approved_fetch() -> Any:
    execution, _ = start(WEB_FETCH, {"url": "https://example.com/a"})
    approval = agent.WebFetchRequestResponse(approved=agent.WebFetchRequestResponseApproved())
    (send,) = execution.on_answer(answer(web_fetch_request_response=approval))
    assert isinstance(send, SendExec)
    assert send.message.fetch_args == agent.FetchArgs(url="https://example.com/a", tool_call_id="call-1")
    return execution


def test_web_fetch_needs_a_full_url() -> None:
    for bad in ("example.com", "file:///etc/passwd", "https://"):
        with pytest.raises(ToolArgError, match="full http"):
            WEB_FETCH.parse({"url": bad})


def test_web_fetch_approved_then_fetched() -> None:
    outcome = finished(
        approved_fetch().on_result(fetched(url="https://example.com/a", content="hi", status_code=200))
    )
    assert outcome.content == "Fetched https://example.com/a (HTTP 200):\n\nhi"
    assert outcome.ui.web_fetch_tool_call.result.success.markdown == "hi"


def test_a_long_page_is_cut_for_the_model_only() -> None:
    page = "x" * (MODEL_TEXT_LIMIT + 10)
    outcome = finished(approved_fetch().on_result(fetched(content=page, status_code=200)))
    assert outcome.content.endswith("(page truncated: 10 more characters)")
    assert outcome.ui.web_fetch_tool_call.result.success.markdown == page


@pytest.mark.parametrize(
    ("message", "text"),
    [
        (fetched(content="gone", status_code=404), "the server answered HTTP 404"),
        (
            agent.ExecClientMessage(
                id=1, fetch_result=agent.FetchResult(error=agent.FetchError(error="dns"))
            ),
            "the fetch failed: dns",
        ),
        (
            agent.ExecClientMessage(id=1, read_result=agent.ReadResult()),
            "protocol error: expected fetch_result, got read_result",
        ),
    ],
)
def test_web_fetch_failures(message: agent.ExecClientMessage, text: str) -> None:
    outcome = finished(approved_fetch().on_result(message))
    assert outcome.is_error and outcome.content == f"Cannot fetch https://example.com/a: {text}"
    assert outcome.ui.web_fetch_tool_call.result.error is not None


def test_web_fetch_results_before_the_approval_are_protocol_errors() -> None:
    execution, _ = start(WEB_FETCH, {"url": "https://example.com/a"})
    outcome = finished(execution.on_result(fetched(content="early")))
    assert "protocol error: unexpected exec result" in outcome.content


def test_web_fetch_rejected() -> None:
    execution, _ = start(WEB_FETCH, {"url": "https://example.com/a"})
    rejected = agent.WebFetchRequestResponse(rejected=agent.WebFetchRequestResponseRejected("no"))
    outcome = finished(execution.on_answer(answer(web_fetch_request_response=rejected)))
    assert outcome.content == "The user declined fetching https://example.com/a (no)."
    assert outcome.ui.web_fetch_tool_call.result.rejected.reason == "no"


# --- WebSearch and GenerateImage -----------------------------------------------------------------------


def test_without_its_backend_a_search_is_an_error_and_no_query() -> None:
    _, actions = start(WEB_SEARCH, {"search_term": "trio"}, ToolEnv(backends=frozenset({"images"})))
    outcome = finished(actions)
    assert outcome.is_error and outcome.content.startswith("Error: WebSearch is not available")
    assert not [a for a in actions if isinstance(a, SendQuery)]


def search() -> Any:
    execution, (send,) = start(WEB_SEARCH, {"search_term": " trio "}, ToolEnv(backends=frozenset({"search"})))
    assert send.query.web_search_request_query.args == agent.WebSearchArgs(
        search_term="trio", tool_call_id="call-1"
    )
    approval = agent.WebSearchRequestResponse(approved=agent.WebSearchRequestResponseApproved())
    assert execution.on_answer(answer(web_search_request_response=approval)) == [
        StartWork(SearchWork("trio"))
    ]
    return execution


def test_a_search_after_its_approval() -> None:
    hits = (SearchHit("Trio", "https://t.io", "structured\n  concurrency"), SearchHit("", "https://u.io", ""))
    outcome = finished(search().on_work(SearchResults(hits)))
    assert outcome.content == (
        'Web results for "trio":\n\n1. Trio\n   https://t.io\n   structured concurrency\n\n'
        "2. https://u.io\n   https://u.io"
    )
    assert [r.url for r in outcome.ui.web_search_tool_call.result.success.references] == [
        "https://t.io",
        "https://u.io",
    ]
    assert finished(search().on_work(SearchResults(()))).content == 'No web results for "trio".'


def test_a_search_that_failed_or_came_back_as_an_image() -> None:
    outcome = finished(search().on_work(WorkFailed("the search service answered HTTP 500")))
    assert outcome.content == "Web search failed: the search service answered HTTP 500" and outcome.is_error
    outcome = finished(search().on_work(ImageMade("aGk=")))
    assert outcome.content.startswith("Web search failed: protocol error")


def test_an_image_uses_the_description_the_user_approved() -> None:
    env = ToolEnv(backends=frozenset({"images"}))
    execution, (send,) = start(GENERATE_IMAGE, {"description": "a fox", "file_path": "fox.png"}, env)
    assert send.query.generate_image_request_query.args.file_path == "fox.png"
    edited = agent.GenerateImageRequestResponse(
        approved=agent.GenerateImageRequestResponseApproved("a red fox")
    )
    assert execution.on_answer(answer(generate_image_request_response=edited)) == [
        StartWork(ImageWork("a red fox"))
    ]
    outcome = finished(execution.on_work(ImageMade("aGk=", "image/png", revised_prompt="a vivid red fox")))
    assert outcome.content == (
        "Generated the image (0 KiB, image/png) and showed it to the user. Cursor was asked to save it as"
        " fox.png.\nThe image service rewrote the prompt as: a vivid red fox"
    )
    card = outcome.ui.generate_image_tool_call
    assert card.args.description == "a red fox" and card.result.success.image_data == "aGk="


def test_work_results_round_trip_through_the_log() -> None:
    for result in (
        SearchResults((SearchHit("t", "u", "s"),)),
        ImageMade("aGk=", "image/webp", "p"),
        WorkFailed("x"),
    ):
        assert decode_result(json.loads(json.dumps(encode_result(result)))) == result
