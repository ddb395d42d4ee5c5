"""The turn machine's compaction phases: the summary streamed as summary frames, committed as the
new history, then the turn's next call (or, for summarize_action, the run's end)."""

from __future__ import annotations

from byok.loop import compaction
from byok.loop.emits import (
    SummaryDone,
    SummaryOut,
    SummaryStarted,
    TextOut,
    TokensOut,
)
from byok.loop.replace import replace
from byok.loop.turn_state import (
    LoopProtocolError,
    Result,
    TurnState,
    call_model,
    end_turn,
    model_failed,
    replace_state,
)
from byok.loop.turn_values import (
    CallUsage,
    Command,
    Commit,
    Committed,
    Failed,
    FinalCheckpoints,
    Flush,
    ModelEnded,
    ModelEvents,
    ModelFailed,
    Publish,
    Show,
)


def summary_events(s: TurnState, inp: ModelEvents) -> Result:
    if s.settling:
        raise LoopProtocolError("model output before the settled checkpoint was published")
    assert s.fold is not None
    fold, emits = s.fold.handle_all(inp.events, inp.now_s)
    # The summary replaces the text deltas; its reasoning and any tool call draw nothing.
    shown = [SummaryOut(e.text) if type(e) is TextOut else e for e in emits if type(e) in _SHOWN]
    if s.shown:
        return replace_state(s, fold=fold), [Show(tuple(shown))] if shown else []
    return replace_state(s, fold=fold, shown=True), [Show((SummaryStarted(), *shown)), Flush()]


_SHOWN = (TextOut, TokensOut)


def summary_ended(s: TurnState, _: ModelEnded) -> Result:
    if s.settling:
        raise LoopProtocolError("a provider call ended before the settled checkpoint was published")
    assert s.fold is not None and s.plan is not None
    result = s.fold.result()
    usage = result.usage if s.usage is None else s.usage + result.usage
    s = replace(s, usage=usage, fold=None)
    commands: list[Command] = [CallUsage(result.usage)]
    if not result.message.text.strip():
        failure = Failed("internal", "compaction failed: the model wrote no summary; history unchanged")
        s, end = end_turn(s, failure)
        return s, [*commands, *end]
    summary = compaction.summary_message(result.message.text, s.request_id, s.plan.summaries + 1)
    s = replace(s, phase="compact_commit", estimate=compaction.tokens_of(summary.text))
    return s, [*commands, Commit((summary,), rebase=True)]


def summary_failed(s: TurnState, inp: ModelFailed) -> Result:
    f = inp.failure
    failure = Failed(f.code, f"compaction failed: {f.message}; the history is unchanged", f.provider)
    return model_failed(s, ModelFailed(failure))


def summary_committed(s: TurnState, _: Committed) -> Result:
    assert s.plan is not None
    commands: list[Command] = [Show((SummaryDone(),)), Flush()]
    if s.plan.start == "compact":
        final = FinalCheckpoints(steps=s.steps, answer=None, usage=s.usage, compacted=True)
        return replace(s, phase="final_publish"), [*commands, Publish(final)]
    return call_model(s, commands, gated=False)


