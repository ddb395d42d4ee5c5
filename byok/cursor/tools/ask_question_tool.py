"""AskQuestion: multiple-choice questions put to the user through ``ask_question_interaction_query``.

The answer ends the call (seeds 000 §26.13): ``success`` with the answers, ``error``,
``rejected`` (the user dismissed the form), or ``async`` (the user will answer later: the call
ends now, and the answers come back as ``async_ask_question_completion_action``, a run of its
own that continues the conversation with them; cursor/interaction_actions.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from byok.cursor.tools.base import (
    Action,
    Invocation,
    ToolArgError,
    ToolDef,
    ToolOutcome,
    optional_bool,
    optional_text,
)
from byok.cursor.tools.exec_results import no_variant, variant, with_detail
from byok.cursor.tools.interaction import Interaction, declined
from byok.pb.agent import v1 as agent

ASYNC_TEXT = (
    "The user will answer these questions later. Their answers will arrive in a later message of "
    "this conversation: do not wait for them and do not ask again now. Go on with whatever does "
    "not depend on them, or end your turn."
)


def _text(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ToolArgError(f"{where}: '{key}' must be a non-empty string")
    return value


def _options(question: Mapping[str, Any], where: str) -> list[dict[str, str]]:
    options = question.get("options")
    if not isinstance(options, list) or len(options) < 2:
        raise ToolArgError(f"{where}: 'options' must be a list of at least 2 options")
    out: list[dict[str, str]] = []
    for j, option in enumerate(options):
        at = f"{where}.options[{j}]"
        if not isinstance(option, dict):
            raise ToolArgError(f"{at} must be an object with 'id' and 'label'")
        out.append({"id": _text(option, "id", at), "label": _text(option, "label", at)})
    if len({o["id"] for o in out}) != len(out):
        raise ToolArgError(f"{where}: option ids must be unique")
    return out


def parse_questions(args: Mapping[str, Any]) -> Mapping[str, Any]:
    questions = args.get("questions")
    if not isinstance(questions, list) or not questions:
        raise ToolArgError("argument 'questions' must be a non-empty list of questions")
    parsed: list[dict[str, Any]] = []
    for i, question in enumerate(questions):
        where = f"questions[{i}]"
        if not isinstance(question, dict):
            raise ToolArgError(f"{where} must be an object with 'id', 'prompt' and 'options'")
        parsed.append(
            {
                "id": _text(question, "id", where),
                "prompt": _text(question, "prompt", where),
                "options": _options(question, where),
                "allow_multiple": bool(optional_bool(question, "allow_multiple")),
            }
        )
    if len({q["id"] for q in parsed}) != len(parsed):
        raise ToolArgError("question ids must be unique")
    return {"title": optional_text(args, "title") or "", "questions": parsed}


def question_args(args: Mapping[str, Any]) -> agent.AskQuestionArgs:
    return agent.AskQuestionArgs(
        title=args["title"],
        questions=[
            agent.AskQuestionArgsQuestion(
                id=q["id"],
                prompt=q["prompt"],
                options=[agent.AskQuestionArgsOption(id=o["id"], label=o["label"]) for o in q["options"]],
                allow_multiple=q["allow_multiple"],
            )
            for q in args["questions"]
        ],
    )


def _ui(args: Mapping[str, Any]) -> agent.AskQuestionToolCall:
    return agent.AskQuestionToolCall(args=question_args(args))


def answers_text(
    questions: Sequence[agent.AskQuestionArgsQuestion], answers: Sequence[agent.AskQuestionSuccessAnswer]
) -> str:
    """The answers as the model reads them: each question's prompt, then the labels chosen (an
    option id the question does not have is shown as it came) and any text the user typed."""
    by_id = {a.question_id: a for a in answers}
    known = {q.id for q in questions}
    lines = []
    for q in questions:
        labels = {o.id: o.label for o in q.options}
        a = by_id.get(q.id)
        chosen = [] if a is None else [labels.get(i, i) for i in a.selected_option_ids]
        text = "" if a is None else a.freeform_text.strip()
        if not chosen and not text:
            lines.append(f"- {q.prompt} -> (no answer)")
            continue
        lines.append(f"- {q.prompt} -> {', '.join(chosen) if chosen else '(no option chosen)'}")
        if text:
            lines.append(f"  The user wrote: {text}")
    for a in answers:
        if a.question_id not in known:  # answers to questions the call did not ask, as they came
            lines.append(f"- (question {a.question_id}) -> {', '.join(a.selected_option_ids) or '(none)'}")
            if a.freeform_text.strip():
                lines.append(f"  The user wrote: {a.freeform_text.strip()}")
    return "\n".join(lines)


def result_text(args: agent.AskQuestionArgs, result: agent.AskQuestionResult) -> tuple[str, bool] | None:
    """(canonical text, is_error) of a terminal AskQuestionResult; None for ``async`` or no variant."""
    name, value = variant(result)
    if name == "success":
        return "The user answered:\n" + answers_text(args.questions, value.answers), False
    if name == "rejected":
        return declined("to answer the questions", value.reason), True
    if name == "error":
        return with_detail("The questions could not be asked", value.error_message or "unknown error"), True
    return None


class _Ask(Interaction):
    def __init__(self, inv: Invocation) -> None:
        self._args = inv.args
        query = agent.InteractionQuery(
            ask_question_interaction_query=agent.AskQuestionInteractionQuery(
                args=question_args(inv.args), tool_call_id=inv.call_id
            )
        )
        super().__init__(query, "ask_question_interaction_response", self._answered, self._error)

    def _card(self, result: agent.AskQuestionResult) -> agent.ToolCall:
        return agent.ToolCall(
            ask_question_tool_call=agent.AskQuestionToolCall(question_args(self._args), result)
        )

    def _error(self, message: str) -> ToolOutcome:
        result = agent.AskQuestionResult(error=agent.AskQuestionError(error_message=message))
        return ToolOutcome(message, True, self._card(result))

    def _answered(self, response: agent.AskQuestionInteractionResponse) -> list[Action]:
        result = response.result or agent.AskQuestionResult()
        name, _ = variant(result)
        if name == "async_":
            return self.finish(ToolOutcome(ASYNC_TEXT, False, self._card(result)))
        done = result_text(question_args(self._args), result)
        if done is None:
            return self.fail(no_variant("ask_question_interaction_response"))
        return self.finish(ToolOutcome(done[0], done[1], self._card(result)))


ASK_QUESTION = ToolDef(
    name="AskQuestion",
    ui_field="ask_question_tool_call",
    placeholder=agent.AskQuestionToolCall,
    parse=parse_questions,
    ui=_ui,
    execute=_Ask,
    transport="interaction",
)

TOOLS: tuple[ToolDef, ...] = (ASK_QUESTION,)
