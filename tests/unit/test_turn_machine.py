"""The turn machine's table, row by row: a state, an input, the commands it must give.

No daemon, no trio: values in, values out."""

from __future__ import annotations

import attrs
import pytest

from byok.loop import compaction, ids
from byok.loop.emits import (
    SummaryDone,
    SummaryOut,
    SummaryStarted,
    TextOut,
    ThinkingDone,
    ThinkingOut,
    TokensOut,
    ToolArgsOut,
    ToolCallOpened,
)
from byok.loop.model_call import ModelProtocolError
from byok.loop.turn import TABLE, LoopProtocolError, TurnState, refusal, table_rows, transition
from byok.loop.turn_values import (
    AnswerStep,
    Begin,
    CallModel,
    CallUsage,
    Cancel,
    Canceled,
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
    Publish,
    Published,
    ResultBlobs,
    Reveal,
    RunShellCommand,
    RunTools,
    SettledCheckpoint,
    Show,
    ShowToolDone,
    StagedCheckpoint,
    Succeeded,
    ThinkingStep,
    ToolDone,
    ToolStep,
    UseMode,
)
from byok.model import events as ev
from byok.model.messages import Message, ToolCall
from byok.model.usage import Usage

RID = "req-1"
USAGE = Usage(100, 10)
TOOLS = frozenset({"Read", "Grep", "Write"})
BEGIN = Begin(RID, "agent", "call", offered=TOOLS, known=TOOLS)
MC1 = ids.model_call_id(RID, 1)
MC2 = ids.model_call_id(RID, 2)


def run(state: TurnState, *inputs: Input) -> tuple[TurnState, list]:
    commands: list = []
    for inp in inputs:
        state, out = transition(state, inp)
        commands += out
    return state, commands


def text_call(*texts: str) -> ModelEvents:
    return ModelEvents(
        (ev.Started(), *(ev.TextDelta(t) for t in texts), ev.UsageReported(USAGE), ev.Done("stop")), 1.0
    )


def tool_call(*calls: tuple[str, str]) -> ModelEvents:
    events: list[ev.ModelEvent] = []
    for i, (call_id, name) in enumerate(calls):
        events += [ev.ToolCallStarted(i, call_id, name), ev.ToolCallEnded(i, "{}")]
    return ModelEvents((*events, ev.UsageReported(USAGE), ev.Done("tool_use")), 2.0)


def at_tools(*calls: tuple[str, str], begin: Begin = BEGIN) -> tuple[TurnState, Message]:
    s, _ = run(TurnState(), begin, tool_call(*calls), ModelEnded(), Committed(), Published("staged"))
    assert s.phase == "tools" and s.round is not None
    return s, s.round.assistant


def done(call_id: str, text: str = "ok") -> ToolDone:
    return ToolDone(call_id, text, False, f"card:{call_id}")


# --- starting --------------------------------------------------------------------------------


def test_begin_calls_the_model_with_an_id_derived_from_the_request() -> None:
    s, out = transition(TurnState(), BEGIN)
    assert out == [CallModel(MC1, gated=False)]
    assert s.phase == "calling" and s.calls == 1
    assert MC1 == ids.model_call_id(RID, 1) != ids.model_call_id("req-2", 1)
    assert len(MC1) == 36 and MC1[14] == "8"  # UUID-shaped, version 8 (derived)


def test_begin_with_a_staged_round_runs_its_tools_without_calling_the_model() -> None:
    staged = Message(
        role="assistant",
        origin="assistant",
        tool_calls=(ToolCall("c1", "Read", "{}", 0),),
        tool_round_id="r-old",
        model_call_id="mc-old",
    )
    s, out = transition(TurnState(), attrs.evolve(BEGIN, start="tools", staged=staged))
    assert out == [RunTools("mc-old", staged.tool_calls, ())]
    assert s.phase == "tools"


def test_begin_after_the_answer_only_publishes_the_final_checkpoints() -> None:
    s, out = transition(TurnState(), attrs.evolve(BEGIN, start="final"))
    assert out == [Publish(FinalCheckpoints((), None, None))]
    s, out = transition(s, Published("final"))
    assert out == [Reveal("final"), End(Succeeded(), None)]
    assert s.phase == "ended"


def test_a_fault_before_the_start_ends_the_run_with_it() -> None:
    failure = Failed("already_exists", "request id already used")
    s, out = transition(TurnState(), Fault(failure))
    assert out == [End(failure, None)] and s.outcome == failure


# --- calling ---------------------------------------------------------------------------------


def test_text_is_shown_as_it_comes_and_flushed_after_the_first_visible_output() -> None:
    s, _ = transition(TurnState(), BEGIN)
    s, out = transition(s, ModelEvents((ev.Started(),), 0.0))
    assert out == []  # nothing visible: no flush either
    s, out = transition(s, ModelEvents((ev.TextDelta("Hel"), ev.TextDelta("lo")), 0.1))
    assert out == [Show((TextOut("Hel"), TextOut("lo"))), Flush()]
    s, out = transition(s, ModelEvents((ev.TextDelta("!"),), 0.2))
    assert out == [Show((TextOut("!"),))]


def test_a_stop_commits_the_answer_with_the_final_checkpoints_set_ahead() -> None:
    s, _ = run(TurnState(), BEGIN, text_call("Hi"))
    s, out = transition(s, ModelEnded())
    answer = out[1].messages[0]
    assert (answer.role, answer.text, answer.model_call_id) == ("assistant", "Hi", MC1)
    final = FinalCheckpoints((AnswerStep("Hi"),), answer, USAGE)
    assert out == [CallUsage(USAGE), Commit((answer,), ahead=final)]
    s, out = transition(s, Committed())
    assert out == [Publish(final)]
    s, out = transition(s, Published("final"))
    assert out == [Reveal("final"), End(Succeeded(), USAGE)]


def test_thinking_becomes_a_step_with_its_duration_from_the_events_times() -> None:
    s, _ = transition(TurnState(), BEGIN)
    s, out = run(
        s,
        ModelEvents((ev.ThinkingDelta("hm"),), 10.0),
        ModelEvents((ev.ThinkingDelta("m"),), 10.5),
        ModelEvents((ev.TextDelta("A"), ev.UsageReported(USAGE), ev.Done("stop")), 11.0),
        ModelEnded(),
    )
    shows = [e for c in out if isinstance(c, Show) for e in c.emits]
    assert shows == [ThinkingOut("hm"), ThinkingOut("m"), ThinkingDone(500), TextOut("A"), TokensOut(10)]
    assert s.steps == (ThinkingStep("hmm", 500), AnswerStep("A"))


def test_a_stream_that_ends_without_done_is_a_protocol_error_of_the_provider() -> None:
    s, _ = run(TurnState(), BEGIN, ModelEvents((ev.TextDelta("x"),), 0.0))
    with pytest.raises(ModelProtocolError):
        transition(s, ModelEnded())


def test_a_bad_event_raises_and_leaves_the_state_as_it_was() -> None:
    s, _ = run(TurnState(), BEGIN, ModelEvents((ev.UsageReported(USAGE),), 0.0))
    with pytest.raises(ModelProtocolError):
        transition(s, ModelEvents((ev.UsageReported(USAGE),), 0.0))
    assert s.fold is not None and s.fold.usage == USAGE


def test_a_failed_call_ends_the_run_with_the_provider_error() -> None:
    failure = Failed("unavailable", "HTTP 500", provider=True)
    s, _ = transition(TurnState(), BEGIN)
    s, out = transition(s, ModelFailed(failure))
    assert out == [End(failure, None)]


def test_every_tool_call_gets_its_placeholder_offered_or_not() -> None:
    begin = attrs.evolve(BEGIN, offered=frozenset({"Read"}))
    s, _ = transition(TurnState(), begin)
    s, out = transition(
        s,
        ModelEvents(
            (
                ev.ToolCallStarted(0, "c1", "Read"),
                ev.ToolCallArgsDelta(0, "{}"),
                ev.ToolCallStarted(1, "c2", "Teleport"),
                ev.ToolCallArgsDelta(1, "{}"),
            ),
            0.0,
        ),
    )
    assert out == [
        Show(
            (
                ToolCallOpened("c1", "Read", MC1),
                ToolArgsOut("c1", "Read", "{}", MC1),
                ToolCallOpened("c2", "Teleport", MC1),
                ToolArgsOut("c2", "Teleport", "{}", MC1),
            )
        ),
        Flush(),
    ]


# --- a tool round ----------------------------------------------------------------------------


def test_tool_use_commits_the_assistant_with_its_staged_checkpoint_then_publishes_it() -> None:
    s, _ = run(TurnState(), BEGIN, tool_call(("c1", "Read")))
    s, out = transition(s, ModelEnded())
    assistant = out[1].messages[0]
    assert assistant.tool_round_id == ids.tool_round_id(RID, 1)
    staged = StagedCheckpoint(assistant, ())
    assert out == [CallUsage(USAGE), Commit((assistant,), ahead=staged)]
    s, out = transition(s, Committed())
    assert out == [Publish(staged)]
    s, out = transition(s, Published("staged"))
    assert out == [Reveal("staged"), RunTools(MC1, assistant.tool_calls, ())]


def test_results_commit_one_at_a_time_in_completion_order() -> None:
    s, _ = at_tools(("c1", "Read"), ("c2", "Grep"))
    s, out = transition(s, done("c2", "two"))
    (commit,) = out
    assert commit.messages[0].tool_call_id == "c2" and commit.messages[0].completion_seq == 1
    assert commit.ahead == ResultBlobs(commit.messages[0], ToolStep("c2", "card:c2"), None)
    s, out = transition(s, done("c1", "one"))
    assert out == []  # waits for the commit under way
    s, out = transition(s, Committed())
    second = out[2].messages[0]
    assert out[:2] == [ShowToolDone("c2", "card:c2", MC1), Flush()]
    assert (second.tool_call_id, second.completion_seq, second.text) == ("c1", 2, "one")
    # The last result carries the settled turn: its steps in the model's call order.
    settled = (ToolStep("c1", "card:c1"), ToolStep("c2", "card:c2"))
    assert out[2].ahead.settled_steps == settled
    s, out = transition(s, Committed())
    assert out == [
        ShowToolDone("c1", "card:c1", MC1),
        Flush(),
        Publish(SettledCheckpoint(settled)),
        CallModel(MC2, gated=True),
    ]
    assert s.phase == "calling" and s.settling


def test_a_repeated_or_foreign_result_is_ignored() -> None:
    s, _ = at_tools(("c1", "Read"), ("c2", "Read"))
    s, _ = transition(s, done("c1"))
    assert transition(s, done("c1"))[1] == []
    assert transition(s, done("c9"))[1] == []


def test_a_tool_the_run_did_not_offer_is_refused_never_run() -> None:
    begin = attrs.evolve(BEGIN, mode="ask", offered=frozenset({"Read"}))
    calls = tool_call(("c1", "Write"), ("c2", "Read"), ("c3", "Nope"))
    s0, _ = run(TurnState(), begin, calls, ModelEnded(), Committed())
    s, out = transition(s0, Published("staged"))
    assert s.round is not None
    assert out == [
        Reveal("staged"),
        RunTools(
            MC1,
            s.round.assistant.tool_calls,
            (("c1", refusal("Write", "ask", TOOLS)), ("c3", refusal("Nope", "ask", TOOLS))),
        ),
    ]
    assert "Write" in refusal("Write", "ask", TOOLS) and "ask mode" in refusal("Write", "ask", TOOLS)
    assert "unknown tool 'Nope'" in refusal("Nope", "ask", TOOLS)
    # A refused call's result has its error card: a step of the turn, shown once committed.
    s, out = transition(s, done("c1", refusal("Write", "ask", TOOLS)))
    assert out[0].ahead.step == ToolStep("c1", "card:c1")
    s, out = transition(s, Committed())
    assert out == [ShowToolDone("c1", "card:c1", MC1), Flush()]


def test_model_output_waits_for_the_settled_checkpoint() -> None:
    s, _ = at_tools(("c1", "Read"))
    s, _ = run(s, done("c1"), Committed())
    with pytest.raises(LoopProtocolError):
        transition(s, ModelEvents((ev.TextDelta("x"),), 0.0))
    s, out = transition(s, Published("settled"))
    assert out == [Reveal("settled")] and not s.settling
    s, out = transition(s, ModelEvents((ev.TextDelta("x"),), 0.0))
    assert out == [Show((TextOut("x"),)), Flush()]


def test_a_call_that_fails_while_settling_ends_after_the_checkpoint_is_out() -> None:
    s, _ = at_tools(("c1", "Read"))
    s, _ = run(s, done("c1"), Committed())
    failure = Failed("unavailable", "boom", provider=True)
    s, out = transition(s, ModelFailed(failure))
    assert out == [] and s.phase == "calling"
    s, out = transition(s, Published("settled"))
    assert out == [Reveal("settled"), End(failure, USAGE)]


def test_a_publish_that_fails_while_calling_ends_the_run() -> None:
    s, _ = at_tools(("c1", "Read"))
    s, _ = run(s, done("c1"), Committed())
    failure = Failed("internal", "checkpoint not published: no ACK")
    s, out = transition(s, Fault(failure))
    assert out == [End(failure, USAGE)]


# --- cancel and the end ------------------------------------------------------------------------


@pytest.mark.parametrize("phase", ["starting", "calling", "round_commit", "round_publish", "tools"])
def test_cancel_ends_any_live_phase_canceled(phase: str) -> None:
    s = attrs.evolve(TurnState(), phase=phase)  # type: ignore[arg-type]
    s, out = transition(s, Cancel())
    assert out == [End(Canceled(), None)]


def test_once_ended_a_late_cancel_or_result_changes_nothing() -> None:
    s, _ = run(TurnState(), BEGIN, text_call("Hi"), ModelEnded(), Committed(), Published("final"))
    assert s.outcome == Succeeded()
    for late in (Cancel(), done("c1"), Fault(Failed("internal", "x"))):
        assert transition(s, late) == (s, [])


def test_an_input_the_phase_does_not_take_is_a_loop_protocol_error() -> None:
    with pytest.raises(LoopProtocolError):
        transition(TurnState(), Committed())
    s, _ = transition(TurnState(), BEGIN)
    with pytest.raises(LoopProtocolError):
        transition(s, Published("final"))


def test_every_row_of_the_table_is_listed() -> None:
    rows = table_rows()
    assert len(rows) == len(TABLE)
    assert ("calling", "ModelEvents", "model_events") in rows


def test_a_mode_switch_changes_what_the_next_call_may_offer() -> None:
    plan_tools = frozenset({"Read", "Grep"})
    s, _ = at_tools(("c1", "SwitchMode"), begin=attrs.evolve(BEGIN, known=TOOLS | {"SwitchMode"}))
    s, out = transition(s, ModeSwitched("plan", plan_tools))
    assert out == [UseMode("plan")]
    assert s.plan is not None
    assert (s.plan.mode, s.plan.offered) == ("plan", plan_tools)
    # The round goes on as before; the next call's Write is refused as not offered in plan mode.
    s, _ = run(s, done("c1"), Committed())
    assert s.phase == "calling"
    s, out = run(s, Published("settled"), tool_call(("c2", "Write")), ModelEnded(), Committed())
    s, out = transition(s, Published("staged"))
    assert out[1].refused == (("c2", refusal("Write", "plan", s.plan.known)),)


def test_a_mode_switch_outside_a_tool_round_is_a_loop_protocol_error() -> None:
    s, _ = run(TurnState(), BEGIN)
    with pytest.raises(LoopProtocolError):
        transition(s, ModeSwitched("plan", frozenset()))


# --- compaction --------------------------------------------------------------------------------


def summary_call(*texts: str) -> ModelEvents:
    return ModelEvents(
        (ev.Started(), *(ev.TextDelta(t) for t in texts), ev.UsageReported(USAGE), ev.Done("stop")), 3.0
    )


def test_a_request_past_the_limit_compacts_first_then_calls_on_the_summary() -> None:
    begin = attrs.evolve(BEGIN, context_limit=1000, estimate=1500, summaries=2)
    s, out = run(TurnState(), begin)
    assert out == [CallModel(MC1, compact=True)] and s.phase == "compacting"
    s, out = transition(s, summary_call("All ", "so far."))
    assert out == [
        Show((SummaryStarted(), SummaryOut("All "), SummaryOut("so far."), TokensOut(10))),
        Flush(),
    ]
    s, out = transition(s, ModelEnded())
    (usage, commit) = out
    assert usage == CallUsage(USAGE) and commit.rebase
    (summary,) = commit.messages
    assert summary.origin == "summary" and summary.event_id == f"summary:3:{RID}"
    assert compaction.summary_text(summary) == "All so far." and compaction.summary_count((summary,)) == 3
    s, out = transition(s, Committed())
    assert out == [Show((SummaryDone(),)), Flush(), CallModel(MC2)]
    # One compaction per run: a summary that is still too long does not start another.
    s, _ = run(s, tool_call(("c1", "Read")), ModelEnded(), Committed(), Published("staged"))
    s, out = run(s, done("c1", "x" * 9000), Committed())
    assert out[-1] == CallModel(ids.model_call_id(RID, 3), gated=True)


def test_a_round_that_fills_the_window_compacts_before_the_next_call() -> None:
    begin = attrs.evolve(BEGIN, context_limit=1000)
    s, _ = at_tools(("c1", "Read"), begin=begin)
    s, out = run(s, done("c1", "x" * 3000), Committed())
    assert out[-2:] == [Publish(SettledCheckpoint(s.steps)), CallModel(MC2, gated=True, compact=True)]
    # Its output waits for the settled checkpoint, as any gated call's.
    with pytest.raises(LoopProtocolError):
        transition(s, summary_call("x"))
    s, out = transition(s, Published("settled"))
    assert out == [Reveal("settled")]


def test_a_provider_refusing_the_length_compacts_and_calls_again() -> None:
    too_long = Failed("unavailable", "maximum context length", provider=True, overflow=True)
    s, _ = run(TurnState(), attrs.evolve(BEGIN, context_limit=100_000))
    s, out = transition(s, ModelFailed(too_long))
    assert out == [CallModel(MC2, compact=True)]
    # A compaction refused as too long too ends the run, saying the history is unchanged.
    s, out = transition(s, ModelFailed(too_long))
    (end,) = out
    assert isinstance(end, End) and end.outcome.message.startswith(
        "compaction failed: maximum context length"
    )
    assert "history is unchanged" in end.outcome.message


def test_summarize_action_compacts_and_ends_with_the_compacted_checkpoints() -> None:
    s, out = run(TurnState(), attrs.evolve(BEGIN, start="compact"))
    assert out == [CallModel(MC1, compact=True)]
    s, out = run(s, summary_call("S"), ModelEnded(), Committed())
    assert out[-1] == Publish(FinalCheckpoints((), None, USAGE, compacted=True))
    s, out = transition(s, Published("final"))
    assert out == [Reveal("final"), End(Succeeded(), USAGE)]


def test_an_empty_summary_fails_the_run_and_commits_nothing() -> None:
    s, _ = run(TurnState(), attrs.evolve(BEGIN, start="compact"))
    s, out = run(s, summary_call("  "), ModelEnded())
    assert not any(isinstance(c, Commit) for c in out)
    assert isinstance(out[-1], End) and "no summary" in out[-1].outcome.message


# --- a user's shell command (shell_command_action) --------------------------------------------


def test_a_user_shell_command_runs_commits_its_output_and_publishes_its_turn() -> None:
    s, out = transition(TurnState(), attrs.evolve(BEGIN, start="shell"))
    assert out == [RunShellCommand()] and s.phase == "shell"
    assert transition(s, Cancel())[1] == [End(Canceled(), None)]
    s, out = transition(s, ToolDone("x-1", "The user ran a command in the shell:\n$ ls", False, "outcome"))
    (commit,) = out
    message = commit.messages[0]
    assert (message.role, message.origin, message.event_id) == ("user", "runtime", f"user-shell:{RID}")
    assert message.text.endswith("$ ls") and commit.ahead is None
    final = FinalCheckpoints(steps=(), answer=None, usage=None, shell="outcome")
    s, out = transition(s, Committed())
    assert out == [Publish(final)]
    s, out = transition(s, Published("final"))
    assert out == [Reveal("final"), End(Succeeded(), None)]


def test_a_new_message_alone_past_the_limit_is_not_compacted() -> None:
    # Nothing a summary could save: the call goes out, and the provider says what it says.
    begin = attrs.evolve(BEGIN, context_limit=1000, estimate=5000, summarizable=False)
    _, out = run(TurnState(), begin)
    assert out == [CallModel(MC1)]


def test_a_first_call_too_long_with_nothing_to_summarize_fails_with_the_providers_words() -> None:
    too_long = Failed("unavailable", "maximum context length", provider=True, overflow=True)
    s, _ = run(TurnState(), attrs.evolve(BEGIN, context_limit=100_000, summarizable=False))
    s, out = transition(s, ModelFailed(too_long))
    assert out == [End(too_long, None)]
