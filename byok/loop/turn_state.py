"""The turn machine's state and the moves several phases share: starting a call (or a
compaction instead, when the next request would not fit), a failed call, the settled
checkpoint's publish, the end. loop/turn.py holds the table that uses them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import attrs

from byok.loop import ids
from byok.loop.model_call import CallFold
from byok.loop.replace import replace, replacer
from byok.loop.turn_values import (
    Begin,
    CallModel,
    Command,
    End,
    Failed,
    FinalCheckpoints,
    ModelFailed,
    Outcome,
    Published,
    Reveal,
    StagedCheckpoint,
    Step,
    ToolDone,
    ToolStep,
)
from byok.model.messages import Message
from byok.model.usage import Usage


class LoopProtocolError(Exception):
    """An input the turn's phase does not take: a bug of the run layer, never a peer's fault."""


Phase = Literal[
    "starting",  # the start point is being committed
    "calling",  # a provider call streams
    "round_commit",  # the round's assistant is being committed
    "round_publish",  # its staged checkpoint is being published
    "tools",  # the round's calls run; results are committed one at a time
    "final_commit",  # the answer is being committed
    "final_publish",  # the final checkpoints are being published
    "compacting",  # a compaction call streams the summary
    "compact_commit",  # the summary is being committed as the new history
    "shell",  # the command the user ran from the chat runs (shell_command_action)
    "ended",
]


@attrs.frozen
class Round:
    """The open tool round: results in completion order, committed one at a time."""

    assistant: Message
    seen: frozenset[str] = frozenset()  # call ids whose result arrived
    waiting: tuple[ToolDone, ...] = ()  # arrived, not yet committing
    committing: ToolDone | None = None
    committed: int = 0
    tool_steps: tuple[ToolStep, ...] = ()  # in completion order


@attrs.frozen
class TurnState:
    phase: Phase = "starting"
    plan: Begin | None = None  # what the run may do (its request id, mode, tools)
    calls: int = 0  # provider calls started (ids derive from the count)
    fold: CallFold | None = None
    shown: bool = False  # the current call put something on the client's screen
    steps: tuple[Step, ...] = ()  # this run's steps of the turn
    usage: Usage | None = None  # summed over the run's calls
    round: Round | None = None
    settling: bool = False  # the last round's settled checkpoint is being published
    call_failure: Failed | None = None  # the call failed while settling: ends after the publish
    next_publish: StagedCheckpoint | FinalCheckpoints | None = None  # after the commit under way
    outcome: Outcome | None = None
    estimate: int = 0  # tokens the next request is expected to hold (compaction decides on it)
    compactions: int = 0  # compactions this run made (one at most)

    @property
    def request_id(self) -> str:
        return "" if self.plan is None else self.plan.request_id


replace_state = replacer(TurnState)  # the hot path's: one call per provider chunk
Result = tuple[TurnState, list[Command]]
Handler = Callable[[TurnState, Any], Result]



def call_model(s: TurnState, commands: list[Command], *, gated: bool) -> Result:
    assert s.plan is not None
    limit = s.plan.context_limit
    if limit and s.estimate > limit and not s.compactions and (s.calls or s.plan.summarizable):
        return compact(s, commands, gated=gated)
    n = s.calls + 1
    call_id = ids.model_call_id(s.request_id, n)
    s = replace(s, phase="calling", calls=n, fold=CallFold(call_id), shown=False, settling=gated, round=None)
    return s, [*commands, CallModel(call_id, gated=gated)]

def compact(s: TurnState, commands: list[Command], *, gated: bool) -> Result:
    """A compaction call instead of the next model call: the history would not fit (or the user
    asked, summarize_action)."""
    n = s.calls + 1
    call_id = ids.model_call_id(s.request_id, n)
    s = replace(
        s,
        phase="compacting",
        calls=n,
        fold=CallFold(call_id),
        shown=False,
        settling=gated,
        round=None,
        compactions=s.compactions + 1,
    )
    return s, [*commands, CallModel(call_id, gated=gated, compact=True)]


def model_failed(s: TurnState, inp: ModelFailed) -> Result:
    if s.settling:
        # The committed results' checkpoint still goes out; the run ends after it.
        return replace(s, call_failure=inp.failure), []
    if _may_compact_after(s, inp.failure):
        return compact(s, [], gated=False)
    return end_turn(s, inp.failure)


def _may_compact_after(s: TurnState, failure: Failed) -> bool:
    """A call the provider refused as too long, before anything of it was shown, in a run that
    has not compacted yet: the turn compacts and calls again instead of failing."""
    assert s.plan is not None
    worth = s.calls > 1 or s.plan.summarizable  # the first call: only with history to summarize
    return failure.overflow and not s.shown and not s.compactions and s.phase == "calling" and worth


def settled_published(s: TurnState, inp: Published) -> Result:
    if inp.kind != "settled" or not s.settling:
        raise LoopProtocolError(f"published {inp.kind} while calling the model")
    s = replace(s, settling=False)
    if s.call_failure is not None:
        failure = s.call_failure
        if _may_compact_after(s, failure):
            return compact(replace(s, call_failure=None), [Reveal("settled")], gated=False)
        s, end = end_turn(s, failure)
        return s, [Reveal("settled"), *end]
    return s, [Reveal("settled")]

def end_turn(s: TurnState, outcome: Outcome) -> Result:
    return replace(s, phase="ended", outcome=outcome), [End(outcome, s.usage)]



