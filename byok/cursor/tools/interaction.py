"""The shape shared by tools that start with an InteractionQuery (sans-IO).

Seeds 000 §26.13: AskQuestion, CreatePlan and SwitchMode get their result in the answer itself;
WebFetch, WebSearch and GenerateImage only get an approval (or a rejection, which is the typed
terminal result), after which byok goes on with an Exec or server work. Either way the answer
must be the query's own response variant; anything else is a protocol error for the model,
never a guess.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import betterproto2

from byok.cursor.tools.base import Action, Phased, SendQuery, ToolOutcome
from byok.pb.agent import v1 as agent

# When the user declined: the canonical text names who said no, and why when they said.
DECLINED = "The user declined"


def declined(what: str, reason: str) -> str:
    """One sentence: "The user declined <what> (<reason>)." """
    reason = " ".join(reason.split())
    return f"{DECLINED} {what} ({reason})." if reason else f"{DECLINED} {what}."


class Interaction(Phased):
    """One InteractionQuery whose ``expected`` response variant goes to ``on_value``; a subclass
    with a second phase (an Exec, server work) overrides that phase's callback."""

    def __init__(
        self,
        query: agent.InteractionQuery,
        expected: str,
        on_value: Callable[[Any], list[Action]],
        failure: Callable[[str], ToolOutcome],
    ) -> None:
        self._query = query
        self._expected = expected
        self._on_value = on_value
        self._failure = failure

    def start(self) -> list[Action]:
        return [SendQuery(self._query)]

    def fail(self, message: str) -> list[Action]:
        return self.finish(self._failure(message))

    def on_answer(self, response: agent.InteractionResponse) -> list[Action]:
        if self.done:
            return []
        field, value = betterproto2.which_one_of(response, "result")
        if field != self._expected or value is None:
            got = field or "an empty response"
            return self.fail(f"protocol error: expected {self._expected}, got {got}")
        return self._on_value(value)
