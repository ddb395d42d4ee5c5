"""The blocks a compaction's summary ends with, so the folds of the messages (the todo list, the
plan) start again from what the summarized history had (cursor/compaction_carry.py writes them)."""

from __future__ import annotations

TODOS_OPEN, TODOS_CLOSE = "<todo_list>\n", "\n</todo_list>"
PLAN_OPEN, PLAN_CLOSE = "<current_plan>\n", "\n</current_plan>"


def block(text: str, opening: str, closing: str) -> str | None:
    """The last such block's content in ``text``, or None."""
    start = text.rfind(opening)
    if start < 0:
        return None
    end = text.find(closing, start)
    return None if end < 0 else text[start + len(opening) : end]
