"""The conversation's current plan, folded from its messages (sans-IO; seeds 000 §24).

The messages are the only source: a CreatePlan call (its arguments, in the assistant message)
whose result says the plan was saved makes that plan current; a later one revises it (the same
plan, its id kept: Cursor keeps one current plan per conversation). The checkpoint's ``plan``
and ``plans`` fields are views of the fold, so the same history always shows the same plan, and
a rollback or a restart finds it again.

Cheap on long histories: a message that does not mention CreatePlan is skipped on its encoded
bytes (a stored message is not decoded for it), and the fold of a history is memoised on its
last message, so a longer history of the same messages folds only what is new.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import attrs

from byok.cursor.carry_blocks import PLAN_CLOSE, PLAN_OPEN, block
from byok.cursor.tools.base import ToolArgError
from byok.cursor.tools.plan_tool import SAVED, parse_plan
from byok.model.messages import Message
from byok.pb.agent import v1 as agent

TOOL = "CreatePlan"
_MARK = TOOL.encode()
_CARRY_MARK = PLAN_OPEN.strip().encode()
_MEMO = "plan_fold"


@attrs.frozen
class PlanState:
    plan_id: str  # the call id of the CreatePlan call that made the plan first
    name: str  # its first call's name
    text: str
    overview: str
    todos: tuple[tuple[str, str], ...]  # (id, content)
    uri: str  # the plan file Cursor saved it to ("" when Cursor named none)

    def blob(self) -> bytes:
        """The checkpoint's ``plan`` blob: a ConversationPlan with the plan's text."""
        return bytes(agent.ConversationPlan(plan=self.text))

    def registry(self) -> dict[str, agent.PlanRegistryEntry]:
        """The checkpoint's ``plans`` map."""
        return {self.plan_id: agent.PlanRegistryEntry(id=self.plan_id, path=self.uri)}


@attrs.frozen
class _Fold:
    plan: PlanState | None = None
    calls: tuple[tuple[str, str], ...] = ()  # (call id, arguments) of CreatePlan calls not answered yet


def current_plan(messages: Sequence[Message]) -> PlanState | None:
    """The plan the history ends with, or None."""
    start, fold = len(messages), None
    while start > 0 and fold is None:
        fold = messages[start - 1].memo_get(_MEMO)
        if fold is None:
            start -= 1
    state: _Fold = fold if fold is not None else _Fold()
    for m in messages[start:]:
        raw = m.encode()
        if _MARK in raw or _CARRY_MARK in raw:
            state = _step(state, m)
    if messages and start < len(messages):
        messages[-1].memo_set(_MEMO, state)
    return state.plan


def _step(state: _Fold, m: Message) -> _Fold:
    if m.origin == "summary":
        return _Fold(plan=_carried(m))  # a compacted history starts over from its summary's plan
    if m.role == "assistant":
        new = tuple((c.call_id, c.arguments) for c in m.tool_calls if c.name == TOOL)
        return attrs.evolve(state, calls=state.calls + new) if new else state
    if m.role != "tool" or m.tool_name != TOOL:
        return state
    arguments = next((a for cid, a in state.calls if cid == m.tool_call_id), None)
    calls = tuple(c for c in state.calls if c[0] != m.tool_call_id)
    state = attrs.evolve(state, calls=calls)
    if arguments is None or m.is_error or not m.text.startswith(SAVED):
        return state
    try:
        raw = json.loads(arguments)
        args = parse_plan(raw) if isinstance(raw, dict) else None
    except (ValueError, ToolArgError):
        args = None
    if args is None:  # the call was refused for its arguments: it planned nothing
        return state
    first_line = m.text.split("\n", 1)[0]
    uri = first_line[len(SAVED) + 2 :] if first_line.startswith(SAVED + ": ") else ""
    old = state.plan
    plan = PlanState(
        plan_id=m.tool_call_id if old is None else old.plan_id,
        name=args["name"] if old is None or not old.name else old.name,
        text=args["plan"],
        overview=args["overview"],
        todos=tuple((t["id"], t["content"]) for t in args["todos"]),
        uri=uri or ("" if old is None else old.uri),
    )
    return attrs.evolve(state, plan=plan)


def _carried(summary: Message) -> PlanState | None:
    raw = block(summary.text, PLAN_OPEN, PLAN_CLOSE)
    if raw is None:
        return None
    try:
        obj = json.loads(raw)
        obj["todos"] = tuple((str(i), str(c)) for i, c in obj["todos"])
        return PlanState(**obj)
    except (ValueError, TypeError, KeyError):
        return None
