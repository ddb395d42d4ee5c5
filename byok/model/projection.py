"""Canonical messages -> provider-neutral history.

A tool round is stored as one assistant message carrying all its calls (tool_round_id set),
followed by one tool message per result in completion order. Projection emits one assistant
turn with the calls in their original index order, followed by the results in completion order.
A round with a call that has no result (its run was cancelled) is not projected at all.
"""

from __future__ import annotations

from collections.abc import Iterable

from byok.model.messages import Message
from byok.model.request import AssistantTurn, HistoryItem, ToolResultTurn, UserTurn


def project(messages: Iterable[Message]) -> tuple[HistoryItem, ...]:
    out: list[HistoryItem] = []
    msgs = [m for m in messages if m.role != "system"]
    i = 0
    while i < len(msgs):
        m = msgs[i]
        if m.role == "user":
            out.append(UserTurn(m.text))
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
            head = assistants[0]
            calls.sort(key=lambda c: c.index)
            out.append(AssistantTurn(head.text, head.thinking, head.replay, tuple(calls)))
            for r in sorted(results, key=lambda r: r.completion_seq):
                out.append(ToolResultTurn(r.tool_call_id, r.tool_name, r.text, r.is_error))
        elif m.role == "assistant":
            out.append(AssistantTurn(m.text, m.thinking, m.replay))
            i += 1
        else:
            raise ValueError(f"tool result outside a tool round: {m.tool_call_id!r}")
    return tuple(out)
