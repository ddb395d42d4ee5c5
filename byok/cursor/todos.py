"""The conversation's todo list: a deterministic fold over its messages (seeds 000 §24).

The messages are the only source of truth. Each TodoWrite call's arguments, applied in the
order its successful result was committed, move the list on: ``merge=false`` replaces it,
``merge=true`` updates the items it names by id and appends new ones. Nothing else keeps a
todo list; the checkpoint's ``todos`` blobs (one encoded ``TodoItem`` each) and the TodoWrite
card are views of the fold, so a restart, a resume or an edit that branches gets the list of
the history it stands on.

``TodoFold`` keeps the fold of a conversation's history and extends it as the history grows
(the same way ``checkpoint.RootList`` does): after a restart the first checkpoint reads the
stored rows' raw JSON for the tool's name instead of decoding every message.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from byok.cursor.carry_blocks import TODOS_CLOSE, TODOS_OPEN, block
from byok.cursor.checkpoint import Blob
from byok.model.messages import Message
from byok.pb.agent import v1 as agent

TOOL_NAME = "TodoWrite"
_RAW_NAME = b'"TodoWrite"'  # how a stored row names the tool (a call's name, a result's tool_name)
_RAW_CARRY = TODOS_OPEN.strip().encode()  # a summary carrying a list

STATUSES = ("pending", "in_progress", "completed", "cancelled")
_STATUS_VALUES = {
    "pending": agent.TodoStatus.PENDING,
    "in_progress": agent.TodoStatus.IN_PROGRESS,
    "completed": agent.TodoStatus.COMPLETED,
    "cancelled": agent.TodoStatus.CANCELLED,
}


class TodoError(Exception):
    """A TodoWrite call that cannot be applied; the message goes back to the model."""


@attrs.frozen
class Todo:
    id: str
    content: str
    status: str  # one of STATUSES
    dependencies: tuple[str, ...] = ()


@attrs.frozen
class TodoPatch:
    """One item of a TodoWrite call: what it sets (None: left as it is, in a merge)."""

    id: str
    content: str | None = None
    status: str | None = None
    dependencies: tuple[str, ...] | None = None


@attrs.frozen
class TodoWrite:
    items: tuple[TodoPatch, ...]
    merge: bool


TodoList = tuple[Todo, ...]


def parse_todo_write(args: Mapping[str, Any]) -> TodoWrite:
    """A TodoWrite call's arguments, validated (TodoError names what is wrong)."""
    items = args.get("todos")
    if not isinstance(items, list):
        raise TodoError("argument 'todos' must be a list of todo items")
    merge = args.get("merge", False)
    if not isinstance(merge, bool):
        raise TodoError("argument 'merge' must be a boolean")
    patches: list[TodoPatch] = []
    seen: set[str] = set()
    for n, item in enumerate(items, 1):
        if not isinstance(item, dict):
            raise TodoError(f"todo {n} must be an object with an id")
        todo_id = item.get("id")
        if not isinstance(todo_id, str) or not todo_id:
            raise TodoError(f"todo {n} needs an 'id' (a non-empty string)")
        if todo_id in seen:
            raise TodoError(f"todo id '{todo_id}' appears twice")
        seen.add(todo_id)
        content = item.get("content")
        if content is not None and not isinstance(content, str):
            raise TodoError(f"todo '{todo_id}': 'content' must be a string")
        status = item.get("status")
        if status is not None and status not in STATUSES:
            raise TodoError(f"todo '{todo_id}': 'status' must be one of {', '.join(STATUSES)}")
        deps = item.get("dependencies")
        if deps is not None and (not isinstance(deps, list) or not all(isinstance(d, str) for d in deps)):
            raise TodoError(f"todo '{todo_id}': 'dependencies' must be a list of todo ids")
        patches.append(TodoPatch(todo_id, content, status, None if deps is None else tuple(deps)))
    return TodoWrite(tuple(patches), merge)


def apply_todo_write(current: TodoList, write: TodoWrite) -> TodoList:
    """The list after ``write``. A new item needs its content; its status defaults to pending."""
    if not write.merge:
        return tuple(_new(p) for p in write.items)
    todos = list(current)
    index = {t.id: i for i, t in enumerate(todos)}
    for p in write.items:
        i = index.get(p.id)
        if i is None:
            index[p.id] = len(todos)
            todos.append(_new(p))
            continue
        old = todos[i]
        todos[i] = Todo(
            old.id,
            old.content if p.content is None else p.content,
            old.status if p.status is None else p.status,
            old.dependencies if p.dependencies is None else p.dependencies,
        )
    return tuple(todos)


def _new(p: TodoPatch) -> Todo:
    if not p.content:
        raise TodoError(f"todo '{p.id}' is new: give its 'content'")
    return Todo(p.id, p.content, p.status or "pending", p.dependencies or ())


def todo_item(todo: Todo | TodoPatch) -> agent.TodoItem:
    """The TodoItem Cursor draws (and the checkpoint's blob holds). Times stay 0: the list is a
    fold of the messages, and the same history must give the same blobs."""
    return agent.TodoItem(
        id=todo.id,
        content=todo.content or "",
        status=_STATUS_VALUES.get(todo.status or "", agent.TodoStatus.UNSPECIFIED),
        dependencies=list(todo.dependencies or ()),
    )


def describe(todos: TodoList) -> str:
    """The list as the model reads it back."""
    if not todos:
        return "The todo list is now empty."
    lines = [f"The todo list now has {len(todos)} item{'s' if len(todos) != 1 else ''}:"]
    for t in todos:
        after = f" (after {', '.join(t.dependencies)})" if t.dependencies else ""
        lines.append(f"- [{t.status}] {t.id}: {t.content}{after}")
    return "\n".join(lines)


# --- the fold over a history ----------------------------------------------------------------


@attrs.define
class _Fold:
    todos: TodoList = ()
    calls: dict[str, str] = attrs.Factory(dict)  # TodoWrite call id -> its arguments, result pending

    def copy(self) -> _Fold:
        return _Fold(self.todos, dict(self.calls))

    def take(self, m: Message) -> None:
        if m.stored_size is not None and _RAW_NAME not in m.encode() and _RAW_CARRY not in m.encode():
            return  # an undecoded stored row that never names the tool: left undecoded
        if m.origin == "summary":
            # A compacted history starts over from the list its summary carries.
            carried = block(m.text, TODOS_OPEN, TODOS_CLOSE)
            self.todos, self.calls = (() if carried is None else applied((), carried)), {}
        elif m.role == "assistant":
            for c in m.tool_calls:
                if c.name == TOOL_NAME:
                    self.calls[c.call_id] = c.arguments
        elif m.role == "tool" and m.tool_name == TOOL_NAME:
            arguments = self.calls.pop(m.tool_call_id, None)
            if arguments is not None and not m.is_error:
                self.todos = applied(self.todos, arguments)


def applied(todos: TodoList, arguments: str) -> TodoList:
    """``todos`` after a TodoWrite call with these raw arguments; unchanged when they cannot be
    applied (such a call's result was an error, or another server's history holds it)."""
    try:
        args = json.loads(arguments or "{}")
        if not isinstance(args, dict):
            return todos
        return apply_todo_write(todos, parse_todo_write(args))
    except (ValueError, TodoError):
        return todos


def fold_todos(messages: Sequence[Message]) -> TodoList:
    fold = _Fold()
    for m in messages:
        fold.take(m)
    return fold.todos


class TodoFold:
    """The todo list of a conversation's history, extended as the history grows.

    Kept per conversation: a history that starts with the same first message object and holds
    the last folded message object at the same place extends what was folded (the store's
    history cache shares a parent's Message objects with every revision appended to it); any
    other history (an edit, an evicted cache) is folded again from its start.
    """

    __slots__ = ("_blobs", "_count", "_first", "_fold", "_last")

    def __init__(self) -> None:
        self._count = 0
        self._first: weakref.ref[Message] | None = None
        self._last: weakref.ref[Message] | None = None
        self._fold = _Fold()
        self._blobs: tuple[TodoList, tuple[Blob, ...]] = ((), ())

    def todos(self, history: Sequence[Message], after: Sequence[Message] = ()) -> TodoList:
        """The list at the end of ``history``, then of ``after`` (not kept: a result about to be
        committed)."""
        if not (
            0 < self._count <= len(history)
            and self._first is not None
            and self._last is not None
            and self._first() is history[0]
            and self._last() is history[self._count - 1]
        ):
            self._count, self._fold = 0, _Fold()
        fold = self._fold
        for i in range(self._count, len(history)):
            fold.take(history[i])
        if len(history) > self._count:
            self._count = len(history)
            self._first, self._last = weakref.ref(history[0]), weakref.ref(history[-1])
        if not after:
            return fold.todos
        ahead = fold.copy()
        for m in after:
            ahead.take(m)
        return ahead.todos

    def blobs(self, todos: TodoList) -> tuple[Blob, ...]:
        """The checkpoint's todo blobs for ``todos`` (the last list's are kept)."""
        if self._blobs[0] is not todos:
            self._blobs = (todos, tuple(Blob.of(bytes(todo_item(t))) for t in todos))
        return self._blobs[1]
