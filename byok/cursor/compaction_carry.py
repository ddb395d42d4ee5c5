"""What a compaction carries past the summary (sans-IO): the todo list and the current plan.

Both are folds of the messages (cursor/todos.py, cursor/plan_state.py), and a compacted history
starts over with its summary. So the summary message ends with them, in blocks the folds read as
their starting state (cursor/carry_blocks.py) and the model reads as part of the summary.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import attrs

from byok.cursor.carry_blocks import PLAN_CLOSE, PLAN_OPEN, TODOS_CLOSE, TODOS_OPEN
from byok.cursor.plan_state import current_plan
from byok.cursor.todos import fold_todos
from byok.model.messages import Message


def carried(summary: Message, before: Sequence[Message]) -> Message:
    """``summary`` ending with the todo list and the plan ``before`` (what it summarizes) has."""
    blocks = []
    todos = fold_todos(before)
    if todos:
        write = {
            "merge": False,
            "todos": [
                {"id": t.id, "content": t.content, "status": t.status, "dependencies": list(t.dependencies)}
                for t in todos
            ],
        }
        blocks.append("The todo list so far:\n" + TODOS_OPEN + _json(write) + TODOS_CLOSE)
    plan = current_plan(before)
    if plan is not None:
        blocks.append("The current plan:\n" + PLAN_OPEN + _json(attrs.asdict(plan)) + PLAN_CLOSE)
    if not blocks:
        return summary
    return attrs.evolve(summary, text=summary.text + "\n\n" + "\n\n".join(blocks))


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
