"""The fault injection's user (tests/integration/test_fault_injection.py): how a request's
InteractionQueries are answered. Answers may come late (the run waits for them), twice, or
with an id the server never issued (both ignored), and approvals may be rejected; the
simulated user (byok/devtools/sim_user.py) builds each answer."""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable

import attrs
import trio

from byok.devtools.sim_user import SimUser, query_kind
from byok.pb.agent import v1 as agent

Send = Callable[[agent.AgentClientMessage], Awaitable[None]]

ASK = json.dumps(
    {
        "questions": [
            {
                "id": "q",
                "prompt": "Which one?",
                "options": [{"id": "a", "label": "A"}, {"id": "b", "label": "B"}],
            }
        ]
    }
)


@attrs.define
class Asking:
    """One request's user: every query gets ``decision`` after ``delay_s`` seconds."""

    decision: str = "approve"  # SimUser's decision for every query kind ("reject", "answer", ...)
    delay_s: float = 0.0
    repeat: bool = False  # the answer again, then one for an interaction id never issued
    answered: list[str] = attrs.Factory(list)  # the query kinds answered, in order

    async def answer(self, query: agent.InteractionQuery, send: Send) -> None:
        kind = query_kind(query)
        user = SimUser(decisions={kind: self.decision}, reason="injected: no")
        answers = user(query) or []
        await trio.sleep(self.delay_s)
        for answer in answers:
            await send(answer)
        self.answered.append(kind)
        if self.repeat and answers:
            await send(answers[0])
            stray = agent.InteractionResponse().parse(bytes(answers[0].interaction_response))
            stray.id += 1000
            await send(agent.AgentClientMessage(interaction_response=stray))


def interaction_plan(rng: random.Random, tag: str) -> tuple[list[tuple[str, str, str]], Asking, str]:
    """(the round's calls, how the user answers, what the call's result must hold)."""
    style = rng.choice(["answered", "late", "rejected_fetch", "rejected_switch"])
    call = f"{tag}-q"
    if style in ("answered", "late"):
        asking = Asking("answer", delay_s=rng.choice([0.05, 0.15]) if style == "late" else 0.0)
        return [(call, "AskQuestion", ASK)], _repeat(rng, asking), "Which one? -> A"
    if style == "rejected_fetch":
        args = json.dumps({"url": "https://example.invalid/page"})
        return [(call, "WebFetch", args)], _repeat(rng, Asking("reject")), "The user declined fetching"
    args = json.dumps({"target_mode_id": "plan"})
    return [(call, "SwitchMode", args)], _repeat(rng, Asking("reject")), "declined the switch to plan mode"


def _repeat(rng: random.Random, asking: Asking) -> Asking:
    asking.repeat = rng.random() < 0.4
    return asking
