"""The invariants the fault injection checks after every run (tests/integration/
test_fault_injection.py): terminal frames against the run records, the committed history from
SQLite, the provider requests (dangling tool calls, repeats, the prefix property), and the
daemon's own byte-level prefix meter."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sqlite3
from collections import Counter
from typing import Any

import attrs
import trio

from byok.loop import compaction
from byok.model.messages import Message
from tests.support.fault_harness import OK, Expect, Harness, outcome

# --- invariants ------------------------------------------------------------------------------------


def _dump(m: dict[str, Any]) -> str:
    return json.dumps(m, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


async def _run_record(h: Harness, rid: str) -> Any:
    with trio.fail_after(5):
        while True:
            run = h.store.run(rid)
            if run is not None and run.status != "running":
                return run
            await trio.sleep(0.005)


async def check_run(h: Harness, expects: list[Expect]) -> list[str]:
    errors: list[str] = []
    for e in expects:
        c = e.client
        errors += c.append_errors + [f"{c.rid}: {p}" for p in e.problems]
        if len(c.terminals) != 1:
            errors.append(
                f"{c.rid}: {len(c.terminals)} terminal frames {c.terminals} "
                f"(streams ended without one: {c.eof_without_terminal}; {' '.join(c.history)})"
            )
            continue
        got = outcome(c.terminals[0])
        if got not in e.outcomes:
            errors.append(
                f"{c.rid}: terminal {c.terminals[0]}, expected one of {sorted(e.outcomes)} "
                f"({' '.join(c.history)})"
            )
        e.got = got
        message = c.terminals[0].get("error", {}).get("message", "")
        if e.error_has is not None and got != OK and e.error_has not in message:
            errors.append(f"{c.rid}: the run ended with {message!r}, which does not say {e.error_has!r}")
        if e.store_refused:
            if got == "internal" and not message.startswith("byok's database failed: sqlite: "):
                errors.append(f"{c.rid}: a refused write ended the run with {message!r}")
            continue  # its record was written only if the disk took it
        run = await _run_record(h, c.rid)
        status = {OK: "success", "canceled": "canceled"}.get(got, "error")
        if run.status != status or (status == "error" and run.error_code != got):
            errors.append(f"{c.rid}: run record {run.status}/{run.error_code} but terminal {got}")
    for conv in dict.fromkeys(e.conv for e in expects):  # each conversation once, in order
        errors += _check_history(h, conv, [e for e in expects if e.conv == conv])
    errors += check_provider_requests(h)
    return errors


def _check_history(h: Harness, conv: str, expects: list[Expect]) -> list[str]:
    """The conversation's head after its runs: it only grew (an edit branched, a compaction
    started it over), each runtime event once, each answer and tool result where it belongs."""
    errors: list[str] = []
    now = h.store.head(conv)
    head = now.messages
    before = prior = h.heads.get(conv, ())
    for e in expects:
        if e.edit_of is not None:  # the history branched from where the edited message was sent
            edited = f"run-request:{e.edit_of}"
            anchor = h.anchors.get(e.edit_of)
            before = anchor if anchor is not None else before[: [m.event_id for m in before].index(edited)]
            if any(m.event_id == edited for m in head):
                errors.append(f"{e.client.rid}: the edited message {edited} is still in the head")
    compactor = _compacted_by(head, expects)
    if compactor is not None:
        errors += _check_compaction(h, conv, compactor, prior, head)
    elif head[: len(before)] != before:
        errors.append(f"{conv}: the head lost or rewrote committed messages ({len(before)} -> {len(head)})")
    for e in expects:
        if e.compacts == "must" and e.got == OK and e is not compactor:
            errors.append(f"{e.client.rid}: succeeded without compacting the history")
    h.heads[conv], h.head_revisions[conv] = head, now.revision_id
    events = Counter(m.event_id for m in head if m.event_id)
    errors += [f"{conv}: runtime event {k} committed {n} times" for k, n in events.items() if n > 1]
    for e in expects:
        got = e.got
        key = f"run-request:{e.client.rid}"
        n = events.get(key, 0)
        if n == 0 and e is compactor and h.store.runtime_event_message(conv, key) is not None:
            n = 1  # summarized: it is in the revision the compaction left
        may_lack = got == "canceled" or (e.store_refused and got != OK) or not e.runtime
        if got is not None and (n > 1 or (not may_lack and n != 1)):
            errors.append(f"{e.client.rid} ({got}): runtime message committed {n} times")
        if got == OK and e.runtime:
            h.sent.setdefault(conv, []).append((e.client.message_id, e.client.rid))
        at = [m.event_id for m in head].index(key) if key in events else None
        if at is not None:
            # An edit of it branches from where it was sent: for the message a compaction kept
            # after its summary, the history before the summary.
            kept = e is compactor and at == 1
            h.anchors[e.client.rid] = _sent_onto(h, conv, key, len(prior)) if kept else head[:at]
        if got == OK and e.final_text is not None:
            answers = [m.text for m in head if m.role == "assistant"]
            if e.final_text not in answers:
                errors.append(f"{e.client.rid}: answer {e.final_text!r} not in the committed history")
        if got == OK and e.tool_error is not None:
            call_id, text = e.tool_error
            results = [m.text for m in head if m.role == "tool" and m.tool_call_id == call_id]
            if len(results) != 1 or text not in results[0]:
                errors.append(
                    f"{e.client.rid}: result of {call_id} is {results!r}, expected one with {text!r}"
                )
    calls: set[str] = set()
    answered: Counter[str] = Counter()
    for m in head:
        calls.update(tc.call_id for tc in m.tool_calls)
        if m.role == "tool":
            answered[m.tool_call_id] += 1
            if m.tool_call_id not in calls:
                errors.append(f"{conv}: tool result for {m.tool_call_id} answers no earlier call")
    errors += [f"{conv}: {n} results for call {k}" for k, n in answered.items() if n > 1]
    return errors


def _sent_onto(h: Harness, conv: str, key: str, start: int) -> tuple[Message, ...]:
    """The history the runtime message ``key`` was appended to: the revision it ended, found
    among those holding more than ``start`` messages, less that message."""
    for count in range(start + 1, start + 64):
        for revision, last in h.store.revisions_with_count(conv, count):
            if last.event_id == key:
                return h.store.messages_at(revision)[:-1]
    raise AssertionError(f"{conv}: no revision ends with {key}")


def _compacted_by(head: tuple[Message, ...], expects: list[Expect]) -> Expect | None:
    """The run among ``expects`` whose summary the head starts with, if any."""
    if not head or head[0].origin != "summary":
        return None
    _, _, rid = head[0].event_id.split(":", 2)
    return next((e for e in expects if e.client.rid == rid), None)


def _check_compaction(
    h: Harness, conv: str, e: Expect, before: tuple[Message, ...], head: tuple[Message, ...]
) -> list[str]:
    """A run compacted the history: the head starts over with its summary (numbered after the
    ones before it), none of the older messages is in it, and the revision they were in is
    intact."""
    errors: list[str] = []
    rid = e.client.rid
    if e.compacts == "no":
        errors.append(f"{rid}: compacted the history, which it should have left as it was")
    summary = head[0]
    count = compaction.summary_count(before) if e.summaries_before is None else e.summaries_before
    expected = f"summary:{count + 1}:{rid}"
    if summary.event_id != expected:
        errors.append(f"{rid}: the summary is {summary.event_id}, expected {expected}")
    if e.summary is not None and compaction.summary_text(summary) != e.summary.strip():
        errors.append(f"{rid}: the summary holds {compaction.summary_text(summary)!r}, not {e.summary!r}")
    older = {m.id for m in before}
    # An unanswered user message that ended the summarized history is kept after the summary.
    kept = 2 if len(head) > 1 and head[1].role == "user" and head[1].origin in ("user", "runtime") else 1
    if any(m.id in older for m in head[kept:]):
        errors.append(f"{rid}: the compacted history still holds messages from before the summary")
    revision = h.head_revisions.get(conv)
    if revision is not None and h.store.messages_at(revision) != before:
        errors.append(f"{rid}: the revision before the compaction changed")
    return errors


def check_provider_requests(h: Harness) -> list[str]:
    errors: list[str] = []
    requests = h.provider.requests
    for i in range(h.checked_requests, len(requests)):
        body = requests[i].json
        shape = _shape(body)
        if shape is None:
            errors.append(f"provider request {i} is neither a Chat, a Responses nor a Messages request")
            continue
        elements, first_user, dangling, has_results = shape
        dumps = [_dump(m) for m in elements]
        if len(set(dumps)) != len(dumps):
            again = next(d for n, d in enumerate(dumps) if d in dumps[:n])
            errors.append(f"provider request {i} repeats a message: {again[:300]}")
        errors += [f"provider request {i}: {p}" for p in dangling]
        # The conversation is named by its first user message (unique per conversation here);
        # on Anthropic by that message's first block: later user turns may join the message.
        first = elements[first_user] if len(elements) > first_user else None
        key = "" if first is None else _dump(_user_blocks(first)[0] if "system" in body else first)
        h.arrivals.append((hashlib.sha256(requests[i].body).hexdigest(), key))
        if i in h.provider.unscripted:
            continue  # a cancelled run's request that arrived late: not part of the sequence
        previous = h.last_request_of.get(key)
        if previous is not None and _starts_a_branch(h.edit_texts, dumps, previous):
            previous = None  # an edit's first request: the head's checks are its own
        h.tool_requests += has_results
        h.prefix_checks += previous is not None
        compacting = is_compaction(dumps)
        if previous is not None and "system" in body and _merges_into_last(previous, dumps):
            # Anthropic's roles alternate: a user turn after one that got no answer (a failed or
            # cancelled run) joins its message, as anthropic_request documents.
            pass
        elif previous is not None and compacting and _summarizes_a_prefix(previous, dumps):
            pass
        elif previous is not None and dumps[: len(previous)] != previous:
            at = next(
                (n for n, (a, b) in enumerate(zip(previous, dumps, strict=False)) if a != b), len(dumps)
            )
            was = previous[at][:300] if at < len(previous) else "-"
            now = dumps[at][:300] if at < len(dumps) else "(missing)"
            errors.append(
                f"provider request {i} does not extend the previous request of its conversation: "
                f"element {at} was {was} and is {now}"
            )
        if not compacting:
            # The compaction instruction is no part of the conversation: the request after a
            # compaction that failed extends the one before it (after one that succeeded, the
            # history starts with the summary, a conversation key of its own).
            h.last_request_of[key] = dumps
    for i in range(h.checked_requests, len(requests)):
        # Checked: only its place in the list matters now. Kept whole, 3,000 runs' requests
        # (their parsed JSON) grew this process to 1.6 GB, and the cyclic GC's full passes over
        # them paused the daemon sharing the process for up to 0.95 s, past the KV ACK timeout.
        requests[i] = attrs.evolve(requests[i], body=b"")
    h.checked_requests = len(requests)
    return errors


# In the last message of a compaction call (prompt/modes/compaction/system.md).
COMPACTION_INSTRUCTION = "write a summary of the conversation so far"
# In the message a compacted history starts with (loop/compaction.summary_message).
SUMMARY_MARK = "<conversation_summary>"


def is_compaction(dumps: list[str]) -> bool:
    return bool(dumps) and COMPACTION_INSTRUCTION in dumps[-1]


def _summarizes_a_prefix(previous: list[str], dumps: list[str]) -> bool:
    """A compaction request whose history (all but the instruction) is a prefix of
    ``previous``: taken at the client's checkpoint (behind a turn that failed), or without the
    turn's new user message (kept for after the summary)."""
    return dumps[:-1] == previous[: len(dumps) - 1]


class RenderUses(logging.Handler):
    """Counts the turns that started from a stored render (byok.render's debug record)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "from their stored render" in record.getMessage():
            self.records.append(record)


@attrs.frozen
class MeterCheck:
    errors: list[str]
    compared: int  # calls the meter compared with a previous one
    merged: int  # Anthropic calls whose last message took the next user turn
    branched: int  # edits' first calls
    unrecorded: int  # calls whose previous call's record was lost (the disk refused its write)
    summaries: int = 0  # first calls on a new summary (not compared, on purpose)
    around: int = 0  # compactions after a too-long request, calls after a compaction that wrote nothing


def check_call_records(
    db: sqlite3.Connection,
    edit_texts: set[str],
    plans: dict[str, str],
    arrivals: list[tuple[str, str]],
    starts_ms: list[int],
) -> MeterCheck:
    """The daemon's own prefix meter, byte for byte over the whole loop and across restarts:
    every call of a conversation extends its previous call (the meter's: even one cancelled
    before the provider got it), but an edit's first call (its user message holds one of
    ``edit_texts``), and an Anthropic call whose last message took the next user turn; both
    told from the two bodies as stored; and a call whose previous request to the provider
    (``arrivals``: each body's SHA-256 and conversation key, in order) has no record, which the
    store refused to write. ``plans``: each request id's fault, for the errors."""
    compared = db.execute("SELECT count(*) FROM llm_calls WHERE prefix_extends IS NOT NULL").fetchone()[0]
    rows = db.execute(
        "SELECT id, request_id, conversation_id, common_prefix_messages FROM llm_calls "
        "WHERE prefix_extends = 0 ORDER BY id"
    ).fetchall()
    errors: list[str] = []
    merged = branched = unrecorded = around = 0
    recorded = {sha for (sha,) in db.execute("SELECT request_sha256 FROM llm_calls")}
    for i, rid, conv, common in rows:
        before = db.execute(
            "SELECT id, request_id, status, error FROM llm_calls WHERE conversation_id = ? AND id < ? "
            "ORDER BY id DESC LIMIT 1",
            (conv, i),
        ).fetchone()
        if before is None:
            # Compared, yet no call of its conversation is recorded before it: the meter's
            # previous call is one whose record the refusing disk lost.
            unrecorded += 1
            continue
        now, was = _stored_elements(db, i), _stored_elements(db, before[0])
        if _lost_in_between(db, arrivals, recorded, before[0], i):
            unrecorded += 1
        elif now is not None and was is not None and _starts_a_branch(edit_texts, now[1], was[1]):
            branched += 1
        elif now is not None and was is not None and now[0] and _merges_into_last(was[1], now[1]):
            merged += 1
        elif now is not None and was is not None and _around_compaction(now[1], was[1]):
            around += 1
        else:
            fault, before_fault = _plan_of(plans, rid), _plan_of(plans, before[1])
            errors.append(
                f"llm_calls {i} ({rid} [{fault}], {conv}): does not extend its conversation's previous "
                f"call {before} [{before_fault}] ({common} messages shared)"
            )
    summaries = _check_new_prefixes(db, plans, errors, arrivals, recorded, starts_ms)
    return MeterCheck(errors, compared, merged, branched, unrecorded, summaries, around)


def _around_compaction(now: list[str], was: list[str]) -> bool:
    """The two ways a compaction's call leaves the conversation's prefix on purpose. A compaction
    summarizes the history at the client's checkpoint, which may lack the last call's last
    messages (a turn that failed: its user message is committed, the client got no checkpoint
    of it), or the turn's new user message, kept for after the summary when the provider
    refused the request as too long: its history is a prefix of the previous call's. And the
    call after a compaction that wrote no summary (failed, cancelled) holds all of that call
    but its last message, the instruction."""
    history = was[:-1] if is_compaction(was) else was  # a compaction's instruction is not kept
    extends = now[: len(history)] == history
    if is_compaction(now):
        return extends or _summarizes_a_prefix(history, now)
    return is_compaction(was) and extends


def _plan_of(plans: dict[str, str], rid: str) -> str | None:
    """The fault of the loop's plan a request id belongs to (its own, a preempted first run's,
    a setup run's, a child's or a background completion's)."""
    found = re.match(r"fi-req-\d+", rid)
    return plans.get(found.group(0)) if found else None


def _check_new_prefixes(
    db: sqlite3.Connection,
    plans: dict[str, str],
    errors: list[str],
    arrivals: list[tuple[str, str]],
    recorded: set[str],
    starts_ms: list[int],
) -> int:
    """A call that is not compared (prefix_extends NULL) after an earlier call of its
    conversation is the first call on a new summary, and every such call is one: its history
    starts with a summary no earlier call's did, unless the call before it on that summary is
    one whose record the refusing disk lost (the meter compared with it). One more may be left
    uncompared: a call on a summary no answer follows yet, the first on it since the daemon
    restarted (which then cannot know it was called on; docs/architecture.md). Returns how
    many first calls on a summary there were."""
    rows = db.execute(
        "SELECT id, request_id, conversation_id, prefix_extends, started_at_ms FROM llm_calls ORDER BY id"
    ).fetchall()
    last: dict[str, int] = {}  # conversation -> its last call
    called: dict[str, dict[str, int]] = {}  # conversation -> summary -> when a call on it last started
    count = 0
    for i, rid, conv, extends, at_ms in rows:
        stored = _stored_elements(db, i)
        summary = None if stored is None else _summary_head(stored[1], anthropic=stored[0])
        previous = last.get(conv)
        last[conv] = i
        seen = called.setdefault(conv, {})
        new = summary is not None and summary not in seen
        restarted = summary in seen and any(seen[summary] < t <= at_ms for t in starts_ms)
        unanswered = stored is not None and not _answered_after_summary(stored[1])
        if summary is not None:
            seen[summary] = at_ms
        if previous is None:
            continue  # a conversation's first call has nothing to compare with
        count += new
        if new and extends is not None and not _lost_in_between(db, arrivals, recorded, previous, i):
            errors.append(
                f"llm_calls {i} ({rid} [{_plan_of(plans, rid)}], {conv}): the first call on a new summary "
                f"was compared with call {previous} (prefix_extends {extends}; the summaries before: "
                f"{sorted(s[:120] for s in seen - {summary})}; the previous call's body "
                f"{'unreadable' if _stored_elements(db, previous) is None else 'read'})"
            )
        elif extends is None and not new and not (restarted and unanswered):
            errors.append(
                f"llm_calls {i} ({rid} [{_plan_of(plans, rid)}], {conv}): not compared with call "
                f"{previous} (prefix_extends NULL), yet it is no first call on a new summary"
            )
    return count


def _answered_after_summary(elements: list[str]) -> bool:
    """Whether an assistant message follows the summary a history starts with."""
    roles = [json.loads(d).get("role") for d in elements]
    return "assistant" in roles[roles.index("user") + 1 :] if "user" in roles else False


def _summary_head(elements: list[str], *, anthropic: bool) -> str | None:
    """The summary message a history's first user message is (dumped), or None."""
    users = [d for d in elements if json.loads(d).get("role") == "user"]
    if not users:
        return None
    first = json.loads(users[0])
    text = _dump(_user_blocks(first)[0]) if anthropic else users[0]
    return text if SUMMARY_MARK in text else None


def _lost_in_between(
    db: sqlite3.Connection, arrivals: list[tuple[str, str]], recorded: set[str], before: int, call: int
) -> bool:
    """Whether the provider got a request of the call's conversation, between the two calls'
    requests, that has no record."""
    query = "SELECT request_sha256 FROM llm_calls WHERE id = ?"
    (sha_before,), (sha,) = (db.execute(query, (n,)).fetchone() for n in (before, call))
    at = max((n for n, (s, _) in enumerate(arrivals) if s == sha), default=None)
    if at is None:
        return False
    key = arrivals[at][1]
    start = max((n for n, (s, _) in enumerate(arrivals[:at]) if s == sha_before), default=-1)
    return any(k == key and s not in recorded for s, k in arrivals[start + 1 : at])


def _stored_elements(db: sqlite3.Connection, call_id: int) -> tuple[bool, list[str]] | None:
    """Whether a stored call is an Anthropic one, and its history's elements, dumped."""
    (body,) = db.execute("SELECT request_body FROM llm_call_bodies WHERE id = ?", (call_id,)).fetchone()
    parsed = json.loads(body) if body else None
    shape = _shape(parsed)
    if shape is None:
        return None
    return "system" in parsed, [_dump(m) for m in shape[0]]


def _starts_a_branch(edit_texts: set[str], dumps: list[str], previous: list[str]) -> bool:
    """An edit's first request: its last element holds an edit's text the previous did not."""
    return bool(dumps) and any(t in dumps[-1] and not any(t in d for d in previous) for t in edit_texts)


Shape = tuple[list[dict[str, Any]], int, list[str], bool]


def _shape(body: Any) -> Shape | None:
    """A request's history elements, the index of its first user message, what dangles in it,
    and whether it carries a tool result."""
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("input"), list):  # Responses: the system prompt is "instructions"
        items = body["input"]
        return (
            items,
            0,
            _dangling_responses(items),
            any(i.get("type") == "function_call_output" for i in items),
        )
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    if "system" in body:  # Anthropic Messages: tool results are blocks of a user message
        results = any(b.get("type") == "tool_result" for m in messages for b in _blocks(m))
        return messages, 0, _dangling_anthropic(messages), results
    return messages, 1, _dangling(messages), any(m["role"] == "tool" for m in messages)


def _blocks(m: dict[str, Any]) -> list[dict[str, Any]]:
    return m["content"] if isinstance(m["content"], list) else []


def _merges_into_last(previous: list[str], dumps: list[str]) -> bool:
    """``dumps`` extends ``previous`` but for its last message, a user message that now has
    more blocks after its own."""
    n = len(previous)
    if len(dumps) < n or dumps[: n - 1] != previous[: n - 1]:
        return False
    was, now = json.loads(previous[-1]), json.loads(dumps[n - 1])
    if was["role"] != "user" or now["role"] != "user":
        return False
    blocks = _user_blocks(was)
    return _user_blocks(now)[: len(blocks)] == blocks and len(_user_blocks(now)) > len(blocks)


def _user_blocks(m: dict[str, Any]) -> list[dict[str, Any]]:
    """A user message's blocks, its plain string form as the one text block it stands for."""
    content = m["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _dangling_anthropic(messages: list[dict[str, Any]]) -> list[str]:
    """Each assistant turn's tool_use blocks are answered by the next message's tool_result
    blocks, exactly; no tool_result answers anything else."""
    out: list[str] = []
    calls: list[str] = []  # the previous message's tool_use ids
    for i, m in enumerate(messages):
        blocks = _blocks(m)
        results = [b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"]
        if sorted(results) != sorted(calls):
            out.append(f"tool_use {sorted(calls)} answered by {sorted(results)} at {i}")
        calls = [b["id"] for b in blocks if b.get("type") == "tool_use"]
    if calls:
        out.append(f"tool_use {sorted(calls)} unanswered at the end")
    return out


def _dangling_responses(items: list[dict[str, Any]]) -> list[str]:
    """Each function_call has exactly one function_call_output after it, and each output a call."""
    out: list[str] = []
    answers: Counter[str] = Counter()
    calls: set[str] = set()
    for i, item in enumerate(items):
        if item.get("type") == "function_call":
            calls.add(item["call_id"])
        elif item.get("type") == "function_call_output":
            if item["call_id"] not in calls:
                out.append(f"orphan function_call_output {item['call_id']!r} at {i}")
            answers[item["call_id"]] += 1
    out += [f"function_call {c!r} answered {answers[c]} times" for c in sorted(calls) if answers[c] != 1]
    return out


def _dangling(messages: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        if m["role"] == "tool":
            out.append(f"orphan tool result {m.get('tool_call_id')!r} at {i}")
        if m["role"] == "assistant" and m.get("tool_calls"):
            want = {c["id"] for c in m["tool_calls"]}
            got: list[str] = []
            i += 1
            while i < len(messages) and messages[i]["role"] == "tool":
                got.append(messages[i]["tool_call_id"])
                i += 1
            if sorted(got) != sorted(want):
                out.append(f"tool calls {sorted(want)} answered by {sorted(got)}")
            continue
        i += 1
    return out
