"""CreatePlan: the plan goes to Cursor in ``create_plan_request_query``; Cursor saves it (a plan
file the user reviews) and answers with its URI, which ends the call.

What the conversation's current plan is, is folded from the messages (cursor/plan_state.py): the
call's arguments and this result's text, whose first line names the plan file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from byok.cursor.tools.base import (
    Action,
    Invocation,
    ToolArgError,
    ToolDef,
    ToolOutcome,
    optional_text,
    require_str,
)
from byok.cursor.tools.exec_results import no_variant, variant, with_detail
from byok.cursor.tools.interaction import Interaction
from byok.pb.agent import v1 as agent

# The first line of a saved plan's result; plan_state reads the plan file's URI back from it.
SAVED = "Plan saved"
NEXT = (
    "The user reviews the plan and decides when to build it. End your turn now with a short "
    "summary of the plan; do not start implementing it."
)


def parse_todos(args: Mapping[str, Any]) -> list[dict[str, str]]:
    todos = args.get("todos")
    if todos is None:
        return []
    if not isinstance(todos, list):
        raise ToolArgError("argument 'todos' must be a list of {id, content} objects")
    out: list[dict[str, str]] = []
    for i, todo in enumerate(todos):
        if not isinstance(todo, dict):
            raise ToolArgError(f"todos[{i}] must be an object with 'id' and 'content'")
        for key in ("id", "content"):
            value = todo.get(key)
            if not isinstance(value, str) or not value.strip():
                raise ToolArgError(f"todos[{i}]: '{key}' must be a non-empty string")
        out.append({"id": todo["id"], "content": todo["content"]})
    return out


def parse_plan(args: Mapping[str, Any]) -> Mapping[str, Any]:
    return {
        "plan": require_str(args, "plan"),
        "name": optional_text(args, "name") or "",
        "overview": optional_text(args, "overview") or "",
        "todos": parse_todos(args),
    }


def plan_args(args: Mapping[str, Any]) -> agent.CreatePlanArgs:
    return agent.CreatePlanArgs(
        plan=args["plan"],
        todos=[
            agent.TodoItem(id=t["id"], content=t["content"], status=agent.TodoStatus.PENDING)
            for t in args["todos"]
        ],
        overview=args["overview"],
        name=args["name"],
    )


def _ui(args: Mapping[str, Any]) -> agent.CreatePlanToolCall:
    return agent.CreatePlanToolCall(args=plan_args(args))


def saved_text(uri: str) -> str:
    return f"{SAVED}: {uri}\n{NEXT}" if uri else f"{SAVED}.\n{NEXT}"


class _CreatePlan(Interaction):
    def __init__(self, inv: Invocation) -> None:
        self._args = inv.args
        query = agent.InteractionQuery(
            create_plan_request_query=agent.CreatePlanRequestQuery(
                args=plan_args(inv.args), tool_call_id=inv.call_id
            )
        )
        super().__init__(query, "create_plan_request_response", self._answered, self._error)

    def _card(self, result: agent.CreatePlanResult) -> agent.ToolCall:
        return agent.ToolCall(create_plan_tool_call=agent.CreatePlanToolCall(plan_args(self._args), result))

    def _error(self, message: str) -> ToolOutcome:
        return ToolOutcome(
            message, True, self._card(agent.CreatePlanResult(error=agent.CreatePlanError(message)))
        )

    def _answered(self, response: agent.CreatePlanRequestResponse) -> list[Action]:
        result = response.result or agent.CreatePlanResult()
        name, value = variant(result)
        if name == "success":
            return self.finish(ToolOutcome(saved_text(result.plan_uri), False, self._card(result)))
        if name == "error":
            text = with_detail("The plan could not be saved", value.error or "unknown error")
            return self.finish(ToolOutcome(text, True, self._card(result)))
        return self.fail(no_variant("create_plan_request_response"))


CREATE_PLAN = ToolDef(
    name="CreatePlan",
    ui_field="create_plan_tool_call",
    placeholder=agent.CreatePlanToolCall,
    parse=parse_plan,
    ui=_ui,
    execute=_CreatePlan,
    transport="interaction",
)

TOOLS: tuple[ToolDef, ...] = (CREATE_PLAN,)
