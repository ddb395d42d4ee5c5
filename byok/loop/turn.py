"""The turn as a state machine: ``transition(state, input) -> (state, commands)``.

What a run decides lives here, as values: when to call the model, what to commit and in which
order, which checkpoint to publish, which tool calls run, when the turn ends and how. The run
layer (run/driver.py) feeds it inputs and performs its commands; nothing here does I/O, reads
a clock or makes an id (ids derive from the request id: loop/ids.py).

``TABLE`` says which input is legal in which phase; anything else is a ``LoopProtocolError``.
A provider stream that breaks the event contract raises ``ModelProtocolError`` from the fold,
with the state unchanged, so the provider task that fed it fails the call as its own.

Frame orders (seeds 000 §19, §21, §22.3):
  tool round: assistant committed -> staged checkpoint -> Execs -> each result committed (in
              completion order) -> settled checkpoint, while the next call's request goes out
  turn end:   answer committed -> turn_ended, staged, settled, settled again -> EndStream {}
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import attrs

from byok.loop import ids
from byok.loop.emits import ToolArgsOut, ToolCallOpened
from byok.loop.model_call import CallFold
from byok.loop.replace import replace, replacer
from byok.loop.turn_values import (
    AnswerStep,
    Begin,
    CallModel,
    CallUsage,
    Cancel,
    Canceled,
    Command,
    Commit,
    Committed,
    End,
    Failed,
    Fault,
    FinalCheckpoints,
    Flush,
    Input,
    ModelEnded,
    ModelEvents,
    ModelFailed,
    ModeSwitched,
    Outcome,
    Publish,
    Published,
    ResultBlobs,
    Reveal,
    RunTools,
    SettledCheckpoint,
    Show,
    ShowToolDone,
    StagedCheckpoint,
    Step,
    Succeeded,
    ThinkingStep,
    ToolDone,
    ToolStep,
    UseMode,
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

    @property
    def request_id(self) -> str:
        return "" if self.plan is None else self.plan.request_id

    @property
    def carded(self) -> frozenset[str]:
        return frozenset() if self.plan is None else self.plan.carded


_replace_state = replacer(TurnState)  # the hot path's: one call per provider chunk
Result = tuple[TurnState, list[Command]]
Handler = Callable[[TurnState, Any], Result]


def transition(state: TurnState, inp: Input) -> Result:
    handler = TABLE.get((state.phase, type(inp)))
    if handler is None:
        raise LoopProtocolError(f"{type(inp).__name__} is not taken in phase {state.phase!r}")
    return handler(state, inp)


# --- starting ----------------------------------------------------------------------------------


def _begin(s: TurnState, b: Begin) -> Result:
    s = replace(s, plan=b)
    if b.start == "call":
        return _call_model(s, [], gated=False)
    if b.start == "tools":
        if b.staged is None or not b.staged.tool_calls:
            raise LoopProtocolError("a staged round to run again needs its assistant's calls")
        return _run_tools(replace(s, round=Round(b.staged)))
    final = FinalCheckpoints(steps=(), answer=None, usage=None)
    return replace(s, phase="final_publish"), [Publish(final)]


def _call_model(s: TurnState, commands: list[Command], *, gated: bool) -> Result:
    n = s.calls + 1
    call_id = ids.model_call_id(s.request_id, n)
    s = replace(s, phase="calling", calls=n, fold=CallFold(call_id), shown=False, settling=gated, round=None)
    return s, [*commands, CallModel(call_id, gated=gated)]


# --- calling -----------------------------------------------------------------------------------


def _model_events(s: TurnState, inp: ModelEvents) -> Result:
    if s.settling:
        raise LoopProtocolError("model output before the settled checkpoint was published")
    assert s.fold is not None
    fold, emits = s.fold.handle_all(inp.events, inp.now_s)
    if not emits:
        return _replace_state(s, fold=fold), []
    for e in emits:
        if type(e) in _TOOL_EMITS and e.name not in s.carded:  # type: ignore[union-attr]
            # A tool the run did not offer (or one without a card) draws nothing.
            carded = s.carded
            emits = [e for e in emits if type(e) not in _TOOL_EMITS or e.name in carded]  # type: ignore[union-attr]
            if not emits:
                return _replace_state(s, fold=fold), []
            break
    if s.shown:
        return _replace_state(s, fold=fold), [Show(tuple(emits))]
    # The call's first visible output goes on the wire before the rest is parsed.
    return _replace_state(s, fold=fold, shown=True), [Show(tuple(emits)), Flush()]


_TOOL_EMITS = (ToolCallOpened, ToolArgsOut)


def _model_ended(s: TurnState, _: ModelEnded) -> Result:
    if s.settling:
        raise LoopProtocolError("a provider call ended before the settled checkpoint was published")
    assert s.fold is not None
    result = s.fold.result()  # ModelProtocolError: the stream ended without a complete Done
    message = result.message
    steps = s.steps
    if message.thinking:
        steps = (*steps, ThinkingStep(message.thinking, result.thinking_duration_ms))
    if message.text:
        steps = (*steps, AnswerStep(message.text))
    usage = result.usage if s.usage is None else s.usage + result.usage
    s = replace(s, steps=steps, usage=usage, fold=None)
    commands: list[Command] = [CallUsage(result.usage)]
    if result.reason == "stop":
        final = FinalCheckpoints(steps, message, usage)
        s = replace(s, phase="final_commit", next_publish=final)
        return s, [*commands, Commit((message,), ahead=final)]
    # evolve, not replace: a Message keeps memos of its content (its id) that must not carry over.
    assistant = attrs.evolve(message, tool_round_id=ids.tool_round_id(s.request_id, s.calls))
    staged = StagedCheckpoint(assistant, steps)
    s = replace(s, phase="round_commit", round=Round(assistant), next_publish=staged)
    return s, [*commands, Commit((assistant,), ahead=staged)]


def _model_failed(s: TurnState, inp: ModelFailed) -> Result:
    if s.settling:
        # The committed results' checkpoint still goes out; the run ends after it.
        return replace(s, call_failure=inp.failure), []
    return _end(s, inp.failure)


def _settled_published(s: TurnState, inp: Published) -> Result:
    if inp.kind != "settled" or not s.settling:
        raise LoopProtocolError(f"published {inp.kind} while calling the model")
    s = replace(s, settling=False)
    if s.call_failure is not None:
        s, end = _end(s, s.call_failure)
        return s, [Reveal("settled"), *end]
    return s, [Reveal("settled")]


# --- a tool round ------------------------------------------------------------------------------


def _round_committed(s: TurnState, _: Committed) -> Result:
    assert isinstance(s.next_publish, StagedCheckpoint)
    return replace(s, phase="round_publish"), [Publish(s.next_publish)]


def _round_published(s: TurnState, inp: Published) -> Result:
    if inp.kind != "staged":
        raise LoopProtocolError(f"published {inp.kind} instead of the round's staged checkpoint")
    s, commands = _run_tools(s)
    return s, [Reveal("staged"), *commands]


def refusal(name: str, mode: str, known: frozenset[str]) -> str:
    """The result of a call to a tool the run did not offer (clarification 15)."""
    if name in known:
        return f"Error: tool '{name}' is not available in {mode} mode; it was not run."
    return f"Error: unknown tool '{name}': it is not offered in {mode} mode; it was not run."


def _run_tools(s: TurnState) -> Result:
    assert s.round is not None and s.plan is not None
    assistant, plan = s.round.assistant, s.plan
    refused = tuple(
        (c.call_id, refusal(c.name, plan.mode, plan.known))
        for c in assistant.tool_calls
        if c.name not in plan.offered
    )
    s = replace(s, phase="tools", next_publish=None)
    return s, [RunTools(assistant.model_call_id, assistant.tool_calls, refused)]


def _tool_done(s: TurnState, done: ToolDone) -> Result:
    r = s.round
    assert r is not None
    if done.call_id in r.seen or all(c.call_id != done.call_id for c in r.assistant.tool_calls):
        return s, []  # a repeated result, or one of an earlier round: not this round's
    r = replace(r, seen=r.seen | {done.call_id})
    if r.committing is not None:
        return replace(s, round=replace(r, waiting=(*r.waiting, done))), []
    return _commit_result(s, r, done)


def _commit_result(s: TurnState, r: Round, done: ToolDone) -> Result:
    call = next(c for c in r.assistant.tool_calls if c.call_id == done.call_id)
    message = Message(
        role="tool",
        origin="tool",
        text=done.content,
        tool_call_id=done.call_id,
        tool_name=call.name,
        is_error=done.is_error,
        tool_round_id=r.assistant.tool_round_id,
        completion_seq=r.committed + 1,
    )
    step = ToolStep(done.call_id, done.result) if call.name in s.carded else None
    tool_steps = r.tool_steps if step is None else (*r.tool_steps, step)
    r = replace(r, committing=done, tool_steps=tool_steps)
    last = r.committed + 1 == _result_count(r)
    ahead = ResultBlobs(message, step, _settled_steps(s, r) if last else None)
    return replace(s, round=r), [Commit((message,), ahead=ahead)]


def _result_count(r: Round) -> int:
    # One result per call id: a round imported from a history another server wrote may name two
    # calls alike (the fold refuses that from a provider), and must still end.
    return len({c.call_id for c in r.assistant.tool_calls})


def _settled_steps(s: TurnState, r: Round) -> tuple[Step, ...]:
    """The turn's steps once the round is settled: its cards in the model's call order."""
    by_id = {t.call_id: t for t in r.tool_steps}
    return (*s.steps, *(by_id[c.call_id] for c in r.assistant.tool_calls if c.call_id in by_id))


def _result_committed(s: TurnState, _: Committed) -> Result:
    r = s.round
    assert r is not None and r.committing is not None
    done = r.committing
    commands: list[Command] = []
    name = next(c.name for c in r.assistant.tool_calls if c.call_id == done.call_id)
    if name in s.carded:
        # A completed card means the result is in the history.
        commands.append(ShowToolDone(done.call_id, done.result, r.assistant.model_call_id))
    commands.append(Flush())
    r = replace(r, committing=None, committed=r.committed + 1)
    if r.waiting:
        s, more = _commit_result(s, replace(r, waiting=r.waiting[1:]), r.waiting[0])
        return s, [*commands, *more]
    if r.committed < _result_count(r):
        return replace(s, round=r), commands
    # The round is complete: its settled checkpoint goes out while the next request does; the
    # call's output waits for it (clarification 12).
    steps = _settled_steps(s, r)
    s = replace(s, steps=steps)
    return _call_model(s, [*commands, Publish(SettledCheckpoint(steps))], gated=True)


# --- the turn's end ----------------------------------------------------------------------------


def _final_committed(s: TurnState, _: Committed) -> Result:
    assert isinstance(s.next_publish, FinalCheckpoints)
    return replace(s, phase="final_publish"), [Publish(s.next_publish)]


def _final_published(s: TurnState, inp: Published) -> Result:
    if inp.kind != "final":
        raise LoopProtocolError(f"published {inp.kind} instead of the final checkpoints")
    s, end = _end(s, Succeeded())
    return s, [Reveal("final"), *end]


def _end(s: TurnState, outcome: Outcome) -> Result:
    return replace(s, phase="ended", outcome=outcome), [End(outcome, s.usage)]


def _fault(s: TurnState, inp: Fault) -> Result:
    return _end(s, inp.failure)


def _cancel(s: TurnState, _: Cancel) -> Result:
    return _end(s, Canceled())


def _mode_switched(s: TurnState, switched: ModeSwitched) -> Result:
    """The round's next model call offers the new mode's tools; what this round already
    dispatched runs to its end (the switch does not refuse a call after the fact)."""
    assert s.plan is not None
    plan = replace(
        s.plan,
        mode=switched.mode,
        offered=switched.offered,
        carded=switched.offered & s.plan.known,
    )
    return replace(s, plan=plan), [UseMode(switched.mode)]


def _ignore(s: TurnState, _: object) -> Result:
    return s, []


# --- the table: (phase, input) -> what the turn does --------------------------------------------

_LIVE: tuple[Phase, ...] = (
    "starting",
    "calling",
    "round_commit",
    "round_publish",
    "tools",
    "final_commit",
    "final_publish",
)
_INPUTS: tuple[type, ...] = (
    Begin,
    ModelEvents,
    ModelEnded,
    ModelFailed,
    ToolDone,
    ModeSwitched,
    Committed,
    Published,
    Fault,
    Cancel,
)

TABLE: dict[tuple[Phase, type], Handler] = {
    ("starting", Begin): _begin,
    ("calling", ModelEvents): _model_events,
    ("calling", ModelEnded): _model_ended,
    ("calling", ModelFailed): _model_failed,
    ("calling", Published): _settled_published,
    ("round_commit", Committed): _round_committed,
    ("round_publish", Published): _round_published,
    ("tools", ToolDone): _tool_done,
    ("tools", Committed): _result_committed,
    ("tools", ModeSwitched): _mode_switched,
    ("final_commit", Committed): _final_committed,
    ("final_publish", Published): _final_published,
    # A result of an earlier round's call, arriving late: not this round's.
    **{(p, ToolDone): _ignore for p in _LIVE if p != "tools"},
    **{(p, Fault): _fault for p in _LIVE},
    **{(p, Cancel): _cancel for p in _LIVE},
    # Once the end is decided, a late cancel or result changes nothing (the outcome is sent).
    **{("ended", t): _ignore for t in _INPUTS},
}


def table_rows() -> list[tuple[str, str, str]]:
    """(phase, input, handler) for every legal pair: the table as docs show it."""
    return [(p, t.__name__, h.__name__.lstrip("_")) for (p, t), h in TABLE.items()]
