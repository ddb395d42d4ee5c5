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
  compaction: summary_started, summary deltas -> summary committed (a new root revision) ->
              summary_completed -> the turn's next call on the compacted history; a
              summarize_action run ends instead: turn_ended, the checkpoint three times
  user shell: the Exec, its output deltas -> the runtime message committed -> turn_ended, the
              checkpoint with the shell turn three times
"""

from __future__ import annotations

import attrs

from byok.loop import compaction, ids
from byok.loop.replace import replace
from byok.loop.turn_compaction import summary_committed, summary_ended, summary_events, summary_failed
from byok.loop.turn_round import (
    refusal,
    result_committed,
    round_committed,
    round_published,
    run_tools,
    tool_done,
)
from byok.loop.turn_shell import run_user_shell, user_shell_done
from byok.loop.turn_state import (
    Handler,
    LoopProtocolError,
    Phase,
    Result,
    Round,
    TurnState,
    call_model,
    compact,
    end_turn,
    model_failed,
    replace_state,
    settled_published,
)
from byok.loop.turn_values import (
    AnswerStep,
    Begin,
    CallUsage,
    Cancel,
    Canceled,
    Command,
    Commit,
    Committed,
    Fault,
    FinalCheckpoints,
    Flush,
    Input,
    ModelEnded,
    ModelEvents,
    ModelFailed,
    ModeSwitched,
    Publish,
    Published,
    Reveal,
    Show,
    StagedCheckpoint,
    Succeeded,
    ThinkingStep,
    ToolDone,
    UseMode,
)

__all__ = ["TABLE", "LoopProtocolError", "TurnState", "refusal", "table_rows", "transition"]


def transition(state: TurnState, inp: Input) -> Result:
    handler = TABLE.get((state.phase, type(inp)))
    if handler is None:
        raise LoopProtocolError(f"{type(inp).__name__} is not taken in phase {state.phase!r}")
    return handler(state, inp)


# --- starting ----------------------------------------------------------------------------------


def _begin(s: TurnState, b: Begin) -> Result:
    s = replace(s, plan=b, estimate=b.estimate)
    if b.start == "call":
        return call_model(s, [], gated=False)
    if b.start == "compact":
        return compact(s, [], gated=False)
    if b.start == "shell":
        return run_user_shell(s, b)
    if b.start == "tools":
        if b.staged is None or not b.staged.tool_calls:
            raise LoopProtocolError("a staged round to run again needs its assistant's calls")
        return run_tools(replace(s, round=Round(b.staged)))
    final = FinalCheckpoints(steps=(), answer=None, usage=None)
    return replace(s, phase="final_publish"), [Publish(final)]


# --- calling -----------------------------------------------------------------------------------


def _model_events(s: TurnState, inp: ModelEvents) -> Result:
    if s.settling:
        raise LoopProtocolError("model output before the settled checkpoint was published")
    assert s.fold is not None
    fold, emits = s.fold.handle_all(inp.events, inp.now_s)
    if not emits:
        return replace_state(s, fold=fold), []
    if s.shown:
        return replace_state(s, fold=fold), [Show(tuple(emits))]
    # The call's first visible output goes on the wire before the rest is parsed.
    return replace_state(s, fold=fold, shown=True), [Show(tuple(emits)), Flush()]


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
    s = replace(s, steps=steps, usage=usage, fold=None, estimate=compaction.next_request(result.usage))
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


# --- the turn's end ----------------------------------------------------------------------------


def _final_committed(s: TurnState, _: Committed) -> Result:
    assert isinstance(s.next_publish, FinalCheckpoints)
    return replace(s, phase="final_publish"), [Publish(s.next_publish)]


def _final_published(s: TurnState, inp: Published) -> Result:
    if inp.kind != "final":
        raise LoopProtocolError(f"published {inp.kind} instead of the final checkpoints")
    s, end = end_turn(s, Succeeded())
    return s, [Reveal("final"), *end]

def _fault(s: TurnState, inp: Fault) -> Result:
    return end_turn(s, inp.failure)


def _cancel(s: TurnState, _: Cancel) -> Result:
    return end_turn(s, Canceled())


def _mode_switched(s: TurnState, switched: ModeSwitched) -> Result:
    """The round's next model call offers the new mode's tools; what this round already
    dispatched runs to its end (the switch does not refuse a call after the fact)."""
    assert s.plan is not None
    plan = replace(s.plan, mode=switched.mode, offered=switched.offered)
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
    "compacting",
    "compact_commit",
    "shell",
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
    ("calling", ModelFailed): model_failed,
    ("calling", Published): settled_published,
    ("round_commit", Committed): round_committed,
    ("round_publish", Published): round_published,
    ("tools", ToolDone): tool_done,
    ("tools", Committed): result_committed,
    ("tools", ModeSwitched): _mode_switched,
    ("final_commit", Committed): _final_committed,
    ("final_publish", Published): _final_published,
    ("compacting", ModelEvents): summary_events,
    ("compacting", ModelEnded): summary_ended,
    ("compacting", ModelFailed): summary_failed,
    ("compacting", Published): settled_published,
    ("compact_commit", Committed): summary_committed,
    ("shell", ToolDone): user_shell_done,
    # A result of an earlier round's call, arriving late: not this round's.
    **{(p, ToolDone): _ignore for p in _LIVE if p not in ("tools", "shell")},
    **{(p, Fault): _fault for p in _LIVE},
    **{(p, Cancel): _cancel for p in _LIVE},
    # Once the end is decided, a late cancel or result changes nothing (the outcome is sent).
    **{("ended", t): _ignore for t in _INPUTS},
}


def table_rows() -> list[tuple[str, str, str]]:
    """(phase, input, handler) for every legal pair: the table as docs show it."""
    return [(p, t.__name__, h.__name__.lstrip("_")) for (p, t), h in TABLE.items()]

