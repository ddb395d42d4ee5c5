"""The turn machine's tool round: the assistant's staged checkpoint, the calls dispatched (the ones
the run did not offer refused), results committed one at a time in completion order, then the
settled checkpoint and the next call."""

from __future__ import annotations

from byok.loop import compaction
from byok.loop.replace import replace
from byok.loop.turn_state import LoopProtocolError, Result, Round, TurnState, call_model
from byok.loop.turn_values import (
    Command,
    Commit,
    Committed,
    Flush,
    Publish,
    Published,
    ResultBlobs,
    Reveal,
    RunTools,
    SettledCheckpoint,
    ShowToolDone,
    StagedCheckpoint,
    Step,
    ToolDone,
    ToolStep,
)
from byok.model.messages import Message


def round_committed(s: TurnState, _: Committed) -> Result:
    assert isinstance(s.next_publish, StagedCheckpoint)
    return replace(s, phase="round_publish"), [Publish(s.next_publish)]


def round_published(s: TurnState, inp: Published) -> Result:
    if inp.kind != "staged":
        raise LoopProtocolError(f"published {inp.kind} instead of the round's staged checkpoint")
    s, commands = run_tools(s)
    return s, [Reveal("staged"), *commands]


def refusal(name: str, mode: str, known: frozenset[str]) -> str:
    """The result of a call to a tool the run did not offer (clarification 15)."""
    if name in known:
        return f"Error: tool '{name}' is not available in {mode} mode; it was not run."
    return f"Error: unknown tool '{name}': it is not offered in {mode} mode; it was not run."


def run_tools(s: TurnState) -> Result:
    assert s.round is not None and s.plan is not None
    assistant, plan = s.round.assistant, s.plan
    refused = tuple(
        (c.call_id, refusal(c.name, plan.mode, plan.known))
        for c in assistant.tool_calls
        if c.name not in plan.offered
    )
    s = replace(s, phase="tools", next_publish=None)
    return s, [RunTools(assistant.model_call_id, assistant.tool_calls, refused)]


def tool_done(s: TurnState, done: ToolDone) -> Result:
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
        attachments=done.images,
    )
    # Every call has a card (a refused or unknown one its error card): it is a step of the turn.
    step = ToolStep(done.call_id, done.result)
    r = replace(r, committing=done, tool_steps=(*r.tool_steps, step))
    last = r.committed + 1 == _result_count(r)
    ahead = ResultBlobs(message, step, _settled_steps(s, r) if last else None)
    estimate = s.estimate + compaction.tokens_of(done.content)
    return replace(s, round=r, estimate=estimate), [Commit((message,), ahead=ahead)]


def _result_count(r: Round) -> int:
    # One result per call id: a round imported from a history another server wrote may name two
    # calls alike (the fold refuses that from a provider), and must still end.
    return len({c.call_id for c in r.assistant.tool_calls})


def _settled_steps(s: TurnState, r: Round) -> tuple[Step, ...]:
    """The turn's steps once the round is settled: its cards in the model's call order."""
    by_id = {t.call_id: t for t in r.tool_steps}
    return (*s.steps, *(by_id[c.call_id] for c in r.assistant.tool_calls if c.call_id in by_id))


def result_committed(s: TurnState, _: Committed) -> Result:
    r = s.round
    assert r is not None and r.committing is not None
    done = r.committing
    # A completed card means the result is in the history.
    commands: list[Command] = [ShowToolDone(done.call_id, done.result, r.assistant.model_call_id), Flush()]
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
    return call_model(s, [*commands, Publish(SettledCheckpoint(steps))], gated=True)


