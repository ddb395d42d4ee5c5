"""Canonical messages -> provider-neutral history.

A tool round is stored as one assistant message carrying all its calls (tool_round_id set),
followed by one tool message per result in completion order. Projection emits one assistant
turn with the calls in their original index order, followed by the results in completion order.
A round with a call that has no result (its run was cancelled) is not projected at all.

Each item is made once per message and kept in the message's memo: the same history projects to
the same item objects on every call, so the adapters' render cache finds them by identity and
cached hash instead of hashing and comparing thousands of items field by field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from byok.model.messages import Message, ToolCall
from byok.model.request import AssistantTurn, HistoryItem, ToolResultTurn, UserTurn


def _item(message: Message, make: Callable[..., HistoryItem], *args: Any) -> HistoryItem:
    return message.derived("history_item", make, *args)


def _user(m: Message) -> UserTurn:
    return UserTurn(m.text)


def _answer(m: Message) -> AssistantTurn:
    return AssistantTurn(m.text, m.thinking, m.replay)


def _round_turn(head: Message, calls: list[ToolCall]) -> AssistantTurn:
    return AssistantTurn(head.text, head.thinking, head.replay, tuple(calls))


def _result(m: Message) -> ToolResultTurn:
    return ToolResultTurn(m.tool_call_id, m.tool_name, m.text, m.is_error)


def project(messages: Iterable[Message]) -> tuple[HistoryItem, ...]:
    out: list[HistoryItem] = []
    msgs = [m for m in messages if m.role != "system"]
    i = 0
    while i < len(msgs):
        m = msgs[i]
        if m.role == "user":
            out.append(_item(m, _user))
            i += 1
        elif m.role == "assistant" and m.tool_round_id:
            round_id = m.tool_round_id
            assistants: list[Message] = []
            results: list[Message] = []
            while i < len(msgs) and msgs[i].tool_round_id == round_id:
                (assistants if msgs[i].role == "assistant" else results).append(msgs[i])
                i += 1
            answered = {r.tool_call_id for r in results}
            calls = [c for a in assistants for c in a.tool_calls]
            if not assistants or any(c.call_id not in answered for c in calls):
                # An unfinished round (its run was cancelled): neither its calls nor its results
                # reach a provider, so no dangling call and no orphan result.
                continue
            calls.sort(key=lambda c: c.index)
            if len(assistants) == 1:
                out.append(_item(assistants[0], _round_turn, calls))
            else:  # a round split over several assistant messages: not one message's item
                out.append(_round_turn(assistants[0], calls))
            for r in sorted(results, key=lambda r: r.completion_seq):
                out.append(_item(r, _result))
        elif m.role == "assistant":
            out.append(_item(m, _answer))
            i += 1
        else:
            raise ValueError(f"tool result outside a tool round: {m.tool_call_id!r}")
    return tuple(out)
