"""The todo list as a fold of the messages (cursor/todos.py) and the TodoWrite tool built on it."""

from __future__ import annotations

import json

import pytest

from byok.cursor import todos as td
from byok.cursor.tools.base import Finish, Invocation
from byok.cursor.tools.env import ToolEnv
from byok.cursor.tools.todo_tool import TODO_WRITE
from byok.model.messages import Message, ToolCall
from byok.pb.agent import v1 as agent


def write(*items: dict, merge: bool = False) -> str:
    return json.dumps({"todos": list(items), "merge": merge})


def round_of(*calls: tuple[str, str, str], errors: frozenset[str] = frozenset()) -> list[Message]:
    """An assistant with these (call id, name, arguments) calls, then each one's result."""
    assistant = Message(
        role="assistant",
        origin="assistant",
        tool_calls=tuple(ToolCall(cid, name, args, i) for i, (cid, name, args) in enumerate(calls)),
    )
    results = [
        Message(
            role="tool", origin="tool", text="r", tool_call_id=cid, tool_name=name, is_error=cid in errors
        )
        for cid, name, _ in calls
    ]
    return [assistant, *results]


A = {"id": "a", "content": "Read the code", "status": "in_progress"}
B = {"id": "b", "content": "Write tests"}


def test_merge_false_replaces_and_merge_true_updates_by_id_and_appends() -> None:
    start = td.apply_todo_write((), td.parse_todo_write(json.loads(write(A, B))))
    assert start == (td.Todo("a", "Read the code", "in_progress"), td.Todo("b", "Write tests", "pending"))
    merged = td.apply_todo_write(
        start,
        td.parse_todo_write(
            {"todos": [{"id": "a", "status": "completed"}, {"id": "c", "content": "Ship"}], "merge": True}
        ),
    )
    assert merged == (
        td.Todo("a", "Read the code", "completed"),
        td.Todo("b", "Write tests", "pending"),
        td.Todo("c", "Ship", "pending"),
    )
    assert td.apply_todo_write(merged, td.parse_todo_write({"todos": [], "merge": False})) == ()


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({"todos": "x"}, "must be a list"),
        ({"todos": [{"content": "x"}]}, "needs an 'id'"),
        ({"todos": [{"id": "a", "content": "x"}, {"id": "a", "content": "y"}]}, "appears twice"),
        ({"todos": [{"id": "a", "content": "x", "status": "done"}]}, "must be one of"),
        ({"todos": [], "merge": "yes"}, "'merge' must be a boolean"),
    ],
)
def test_bad_arguments_name_the_problem(args: dict, problem: str) -> None:
    with pytest.raises(td.TodoError, match=problem):
        td.parse_todo_write(args)


def test_a_new_item_needs_its_content() -> None:
    with pytest.raises(td.TodoError, match="'z' is new"):
        td.apply_todo_write((), td.parse_todo_write({"todos": [{"id": "z"}], "merge": True}))


def test_the_fold_applies_successful_results_in_commit_order_only() -> None:
    history = [
        Message(role="user", origin="runtime", text="plan it"),
        *round_of(("c1", "TodoWrite", write(A, B))),
        *round_of(
            ("c2", "TodoWrite", write({"id": "b", "status": "completed"}, merge=True)),
            ("c3", "TodoWrite", write({"id": "x"}, merge=True)),  # new without content: an error
            errors=frozenset({"c3"}),
        ),
        *round_of(("c4", "Read", "{}")),
    ]
    assert td.fold_todos(history) == (
        td.Todo("a", "Read the code", "in_progress"),
        td.Todo("b", "Write tests", "completed"),
    )
    # A result marked as an error changes nothing, whatever its call said.
    failed = round_of(("c5", "TodoWrite", write(B)), errors=frozenset({"c5"}))
    assert td.fold_todos([*history, *failed]) == td.fold_todos(history)
    # A call whose result is not committed yet changes nothing either.
    assert td.fold_todos([*history, failed[0]]) == td.fold_todos(history)


def test_the_conversations_fold_extends_a_growing_history_and_refolds_another() -> None:
    first = round_of(("c1", "TodoWrite", write(A)))
    fold = td.TodoFold()
    history = tuple(first)
    assert fold.todos(history) == (td.Todo("a", "Read the code", "in_progress"),)
    grown = (*history, *round_of(("c2", "TodoWrite", write({"id": "a", "status": "completed"}, merge=True))))
    assert fold.todos(grown)[0].status == "completed"
    # ``after``: a result about to be committed, not kept.
    extra = round_of(("c3", "TodoWrite", write(B, merge=True)))
    assert [t.id for t in fold.todos(grown, tuple(extra))] == ["a", "b"]
    assert [t.id for t in fold.todos(grown)] == ["a"]
    # An edit branched away: another history (other objects) is folded from its start.
    other = tuple(round_of(("c9", "TodoWrite", write(B))))
    assert [t.id for t in fold.todos(other)] == ["b"]
    blobs = fold.blobs(fold.todos(other))
    assert [agent.TodoItem().parse(b.data).content for b in blobs] == ["Write tests"]


def test_stored_rows_that_never_name_the_tool_stay_undecoded() -> None:
    rows = [Message(role="user", origin="runtime", text=f"message {i}") for i in range(3)]
    rows += round_of(("c1", "TodoWrite", write(A)))
    stored = [Message.stored(m.id, m.encode()) for m in rows]
    assert td.fold_todos(stored) == (td.Todo("a", "Read the code", "in_progress"),)
    assert [m.stored_size is None for m in stored] == [False, False, False, True, True]


def run_todo_write(call_id: str, arguments: str, history: list[Message]) -> Finish:
    env = ToolEnv(messages=tuple(history))
    inv = Invocation(call_id, "TodoWrite", "mc", TODO_WRITE.parse(json.loads(arguments)), env)
    (finish,) = TODO_WRITE.execute(inv).start()
    assert isinstance(finish, Finish)
    return finish


def test_the_card_shows_the_list_before_in_its_args_and_after_in_its_result() -> None:
    history = round_of(("c1", "TodoWrite", write(A, B)))
    update = write({"id": "a", "status": "completed"}, merge=True)
    assistant = round_of(("c2", "TodoWrite", update))[0]
    finish = run_todo_write("c2", update, [*history, assistant])
    card = finish.outcome.ui.update_todos_tool_call
    assert [t.status for t in card.args.todos] == [agent.TodoStatus.IN_PROGRESS, agent.TodoStatus.PENDING]
    assert card.args.merge
    success = card.result.success
    assert [t.status for t in success.todos] == [agent.TodoStatus.COMPLETED, agent.TodoStatus.PENDING]
    assert (success.total_count, success.was_merge) == (2, True)
    assert not finish.outcome.is_error
    lines = finish.outcome.content.splitlines()
    assert lines[1:] == ["- [completed] a: Read the code", "- [pending] b: Write tests"]


def test_two_calls_in_one_round_apply_in_call_order() -> None:
    first, second = write(A), write(B, merge=True)
    assistant = round_of(("c1", "TodoWrite", first), ("c2", "TodoWrite", second))[0]
    finish = run_todo_write("c2", second, [assistant])
    assert [t.id for t in finish.outcome.ui.update_todos_tool_call.result.success.todos] == ["a", "b"]


def test_an_update_that_cannot_apply_is_an_error_card() -> None:
    args = write({"id": "q", "status": "completed"}, merge=True)
    finish = run_todo_write("c1", args, [round_of(("c1", "TodoWrite", args))[0]])
    assert finish.outcome.is_error and "'q' is new" in finish.outcome.content
    assert "'q' is new" in finish.outcome.ui.update_todos_tool_call.result.error.error
