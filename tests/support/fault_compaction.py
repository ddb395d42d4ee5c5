"""Compaction in the fault injection (tests/integration/test_fault_injection.py): runs whose next
request would not fit a small model's window, a provider that finds a request too long, and
summarize_action; with the compaction's own call failing, cut, cancelled, dropped or shut down.

A run on a conversation's small model (fault_kinds.SMALL_WINDOW) compacts before its first call
when the client's last checkpoint measured more than the limit, and after a tool round whose
call reported BIG_USAGE. The plan reads the client's checkpoint to know which will happen, so the
provider's scripts are queued in the order the run asks for them.
"""

from __future__ import annotations

import random

import trio

from byok.loop import compaction as compaction_values
from byok.pb.agent import v1 as agent
from tests.support.fake_provider import Script, error_script
from tests.support.fault_checks import check_run
from tests.support.fault_harness import GRACE_S, MAX_TRIES, OK, Client, Expect, Harness, cancel_message, drive
from tests.support.fault_kinds import BIG_USAGE, SMALL_LIMIT, Kind

# What a provider says when a request does not fit (providers/http_errors.exceeds_context).
TOO_LONG = "This model's maximum context length is 16000 tokens. Please reduce the length of the messages."


def measured(h: Harness, conv: str) -> int:
    """The tokens the client's last checkpoint of ``conv`` measured (0 without one)."""
    state = h.states.get(conv)
    details = None if state is None else state.token_details
    return 0 if details is None else details.used_tokens


def summarize_request(h: Harness, conv: str, model: str) -> agent.AgentRunRequest:
    return agent.AgentRunRequest(
        conversation_state=h.states.get(conv) or agent.ConversationStateStructure(),
        action=agent.ConversationAction(summarize_action=agent.SummarizeAction()),
        requested_model=agent.RequestedModel(model_id=model),
        conversation_id=conv,
    )


class SetupFailed(Exception):
    """The turn that was to fill the window failed: the plan stops, with what its check found."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors) or "the setup turn failed")
        self.errors = errors


async def compaction(
    h: Harness,
    rng: random.Random,
    fault: str,
    k: Kind,
    index: int,
    conv: str,
    client: Client,
    append_first: bool,
) -> list[Expect]:
    """One compaction plan (``fault``: "compaction" succeeds, "compaction_fails" has its call
    fail, "compaction_cancel" has the run stop or its stream drop while the summary streams).
    Returns the compacting run's expectation; a turn before it is checked here."""
    tag = f"r{index}"
    p = h.provider
    answer = [f"{tag} answer ", f"after the summary {rng.randrange(10**6)}"]
    summary = [f"{tag} summary: ", "the user asked things ", "and got answers."]
    earlier: list[str] = []
    counted: int | None = None
    text = f"{tag}: {fault}"
    # How the run comes to compact.
    if measured(h, conv) > SMALL_LIMIT:
        how = "start"  # the client's meter is past the small window already
    else:
        # A too-long first call compacts only with history before the new message to summarize.
        how = rng.choice(["start", "round", "summarize", *(["overflow"] if h.heads.get(conv) else [])])
    if how == "start" and measured(h, conv) <= SMALL_LIMIT:
        # A turn that reports a history near the window (on the usual model: it fits there).
        setup = Client(h, f"fi-req-{index}s", dup=client.dup, reorder=client.reorder)
        p.enqueue(k.text([f"{tag} setup answer"], usage=BIG_USAGE))
        await drive(h, setup, conv, f"{text} (setup)", append_first=append_first)
        # Checked now: the compaction summarizes what it committed. What the check finds is
        # reported with the compacting run (a run is checked once).
        earlier = await check_run(h, [Expect(setup, frozenset({OK}), conv, f"{tag} setup answer")])
        if setup.terminals != [{}]:
            raise SetupFailed(earlier)
    before: list[Script] = []  # the run's calls before the compaction's
    after: list[Script] = [k.text(answer)]  # and after it
    model = k.small_model
    request = None
    if how == "round":
        before.append(k.tools([(f"{tag}-c0", "Read", '{"path":"a.txt"}')], usage=BIG_USAGE))
    elif how == "overflow":
        before.append(error_script(400, TOO_LONG))
        model = k.model
    elif how == "summarize":
        # Taken at the client's checkpoint when it has one, else at the head; a history with
        # nothing before its last, unanswered message is nothing to summarize.
        state = h.states.get(conv)
        at_checkpoint = state is not None and bool(state.root_prompt_messages_json)
        counted = state.self_summary_count if state is not None and at_checkpoint else None
        if not at_checkpoint and not compaction_values.kept_tail(h.heads.get(conv, ())):
            request = summarize_request(h, conv, k.model)
            p.enqueue(k.text(summary))  # never asked for
            expect = Expect(client, frozenset({"failed_precondition"}), conv, None, runtime=False)
            expect.error_has = "no history to summarize"
            await drive(h, client, conv, "", append_first=append_first, request=request)
            return [expect]
        request = summarize_request(h, conv, k.model)
        after = []
    expect = Expect(client, frozenset({OK}), conv, None if how == "summarize" else "".join(answer))
    expect.problems += earlier
    expect.compacts, expect.summary, expect.runtime = "must", "".join(summary), how != "summarize"
    if how == "summarize":
        expect.summaries_before = counted
    good = k.text(summary)
    reconnect: dict[str, object] = {}
    stop_during = None
    variant = ""
    if fault == "compaction":
        scripts = [good]
    elif fault == "compaction_fails":
        variant = failure = rng.choice(
            ["http_final", "http_retried", "cut_before_output", "cut_mid_summary", "truncated", "empty"]
        )
        expect.compacts = "no"
        expect.outcomes = frozenset({"unavailable"})
        expect.error_has = "compaction failed"
        expect.final_text = None
        shown = k.first_output(good, summary) + 1
        if failure == "http_final":
            if rng.random() < 0.5:
                scripts = [error_script(400, "injected bad request")]
            else:
                scripts = [error_script(503, "injected overload") for _ in range(MAX_TRIES)]
        elif failure in ("http_retried", "cut_before_output"):
            cut = Script(chunks=good.chunks, close_after=shown - 1)
            scripts = [error_script(503, "injected") if failure == "http_retried" else cut, good]
            expect.compacts, expect.outcomes, expect.error_has = "must", frozenset({OK}), None
            expect.final_text = None if how == "summarize" else "".join(answer)
        elif failure == "cut_mid_summary":
            scripts = [Script(chunks=good.chunks, close_after=rng.randint(shown, len(good.chunks) - 1))]
        elif failure == "truncated":
            scripts = [Script(chunks=good.chunks[: rng.randint(1, k.finish_at(good))])]
        else:
            scripts = [k.text(["  "])]
            expect.outcomes = frozenset({"internal"})
        if expect.outcomes != frozenset({OK}):
            after = []
    else:  # compaction_cancel: the summary streams slowly while the run is stopped
        words = [f"{tag} summary w{i} " for i in range(10)]
        variant = stop = rng.choice(["cancel", "drop_expire", "drop_reconnect", "shutdown", "kv_missing"])
        slow = k.text(words, delay_s=0.06 if stop == "drop_expire" else 0.02)
        scripts = [slow]
        expect.summary = "".join(words)
        expect.compacts = "may"
        expect.outcomes = frozenset({"canceled", OK})
        if stop == "drop_reconnect":
            expect.compacts, expect.outcomes = "must", frozenset({OK})
            reconnect = {"drop_after": 1, "drop_from": "interaction_update.summary_started"}
            reconnect["reconnect_after"] = rng.choice([0.0, 0.05])
        elif stop == "drop_expire":
            reconnect = {"drop_after": 1, "drop_from": "interaction_update.summary_started"}
            reconnect["reconnect_after"] = GRACE_S + 0.25
        elif stop == "kv_missing":
            # The checkpoints' SETs are never acknowledged: the run ends at the first one, before
            # the compaction (a tool round's staged checkpoint) or after its commit.
            client.kv = "missing"
            expect.outcomes = frozenset({"internal"})
        else:
            seen = len(p.requests) + len(before)
            delay = rng.uniform(0.0, 0.2)

            async def stop_during() -> None:
                with_request = seen + 1  # the compaction's own request
                while len(p.requests) < with_request:
                    await p.requested_since(len(p.requests))
                await trio.sleep(delay)
                if stop == "shutdown":
                    await h.restart()
                else:
                    await client.send(cancel_message())

            client.server_may_stop = stop == "shutdown"
    p.enqueue(*before, *scripts, *after)
    await drive(
        h,
        client,
        conv,
        text,
        append_first=append_first,
        model=model,
        request=request,
        during=stop_during,
        **reconnect,  # type: ignore[arg-type]
    )
    h.variants[" ".join(filter(None, (fault, how, variant)))] += 1
    if fault == "compaction" and rng.random() < 0.25:
        await h.restart()  # the next turns start on the compacted history with a fresh daemon
    return [expect]
