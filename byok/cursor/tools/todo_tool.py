"""TodoWrite: a server-local tool (no client round trip) that moves the conversation's todo list.

The list before the call is the fold of the committed history (``ToolEnv.messages``) and of the
TodoWrite calls of this round the model made before this one (local tools finish at dispatch,
in call order, so those are the results committed just before this one). The result for the
model is the whole list after the call; Cursor's ``update_todos_tool_call`` card carries the
list before the call in its arguments and the list after it in its result, which is how the
card tells what changed (the reference server found Cursor reads it that way).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from byok.cursor import todos as td
from byok.cursor.tools.base import Finish, Invocation, Phased, ToolArgError, ToolDef, ToolOutcome
from byok.pb.agent import v1 as agent


def _parse(args: Mapping[str, Any]) -> Mapping[str, Any]:
    try:
        write = td.parse_todo_write(args)
    except td.TodoError as e:
        raise ToolArgError(str(e)) from None
    return {"write": write}


def _args(write: td.TodoWrite, items: tuple[td.Todo | td.TodoPatch, ...]) -> agent.UpdateTodosArgs:
    return agent.UpdateTodosArgs(todos=[td.todo_item(i) for i in items], merge=write.merge)


def _ui(args: Mapping[str, Any]) -> agent.UpdateTodosToolCall:
    write: td.TodoWrite = args["write"]
    return agent.UpdateTodosToolCall(args=_args(write, write.items))


def todos_before(inv: Invocation) -> td.TodoList:
    """The list this call starts from: the committed history's, then this round's earlier
    TodoWrite calls'."""
    env = inv.env
    messages = () if env is None else env.messages
    todos = td.fold_todos(messages) if env is None else env.todos.todos(messages)
    assistant = next((m for m in reversed(messages) if m.role == "assistant"), None)
    if assistant is None or not any(c.call_id == inv.call_id for c in assistant.tool_calls):
        return todos
    for call in assistant.tool_calls:
        if call.call_id == inv.call_id:
            break
        if call.name == td.TOOL_NAME:
            todos = td.applied(todos, call.arguments)
    return todos


class TodoWriteExecution(Phased):
    def __init__(self, inv: Invocation) -> None:
        self._inv = inv

    def start(self) -> list[Any]:
        write: td.TodoWrite = self._inv.args["write"]
        before = todos_before(self._inv)
        try:
            after = td.apply_todo_write(before, write)
        except td.TodoError as e:
            return self.fail(str(e))
        success = agent.UpdateTodosSuccess(
            todos=[td.todo_item(t) for t in after], total_count=len(after), was_merge=write.merge
        )
        card = agent.UpdateTodosToolCall(
            args=_args(write, before), result=agent.UpdateTodosResult(success=success)
        )
        outcome = ToolOutcome(
            content=td.describe(after), is_error=False, ui=agent.ToolCall(update_todos_tool_call=card)
        )
        return self.finish(outcome)

    def fail(self, message: str) -> list[Any]:
        write: td.TodoWrite = self._inv.args["write"]
        card = agent.UpdateTodosToolCall(
            args=_args(write, write.items),
            result=agent.UpdateTodosResult(error=agent.UpdateTodosError(error=message)),
        )
        ui = agent.ToolCall(update_todos_tool_call=card)
        self.done = True
        return [Finish(ToolOutcome(content=f"Error: {message}", is_error=True, ui=ui))]


TODO_WRITE = ToolDef(
    name=td.TOOL_NAME,
    ui_field="update_todos_tool_call",
    placeholder=agent.UpdateTodosToolCall,
    parse=_parse,
    ui=_ui,
    execute=TodoWriteExecution,
    transport="local",
)

TOOLS: tuple[ToolDef, ...] = (TODO_WRITE,)
