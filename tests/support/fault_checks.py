"""The invariants the fault injection checks after every run (tests/integration/
test_fault_injection.py): terminal frames against the run records, the committed history from
SQLite, the provider requests (dangling tool calls, repeats, the prefix property), and the
daemon's own byte-level prefix meter."""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
from collections import Counter
from typing import Any

import attrs
import trio

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
        errors += c.append_errors
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
        if e.store_refused:
            message = c.terminals[0].get("error", {}).get("message", "")
            if got == "internal" and not message.startswith("byok's database failed: sqlite: "):
                errors.append(f"{c.rid}: a refused write ended the run with {message!r}")
            continue  # its record was written only if the disk took it
        run = await _run_record(h, c.rid)
        status = {OK: "success", "canceled": "canceled"}.get(got, "error")
        if run.status != status or (status == "error" and run.error_code != got):
            errors.append(f"{c.rid}: run record {run.status}/{run.error_code} but terminal {got}")
    conv = expects[0].conv
    head = h.store.head(conv).messages
    before = h.heads.get(conv, ())
    for e in expects:
        if e.edit_of is not None:  # the history branched from the revision before the edited message
            edited = f"run-request:{e.edit_of}"
            before = before[: [m.event_id for m in before].index(edited)]
            if any(m.event_id == edited for m in head):
                errors.append(f"{e.client.rid}: the edited message {edited} is still in the head")
    if head[: len(before)] != before:
        errors.append(f"{conv}: the head lost or rewrote committed messages ({len(before)} -> {len(head)})")
    h.heads[conv] = head
    events = Counter(m.event_id for m in head if m.event_id)
    errors += [f"{conv}: runtime event {k} committed {n} times" for k, n in events.items() if n > 1]
    for e in expects:
        got = e.got
        n = events.get(f"run-request:{e.client.rid}", 0)
        may_lack = got == "canceled" or (e.store_refused and got != OK)
        if got is not None and (n > 1 or (not may_lack and n != 1)):
            errors.append(f"{e.client.rid} ({got}): runtime message committed {n} times")
        if got == OK:
            h.sent.setdefault(conv, []).append((e.client.message_id, e.client.rid))
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
    errors += check_provider_requests(h)
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
        if previous is not None and "system" in body and _merges_into_last(previous, dumps):
            # Anthropic's roles alternate: a user turn after one that got no answer (a failed or
            # cancelled run) joins its message, as anthropic_request documents.
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
        h.last_request_of[key] = dumps
    for i in range(h.checked_requests, len(requests)):
        # Checked: only its place in the list matters now. Kept whole, 3,000 runs' requests
        # (their parsed JSON) grew this process to 1.6 GB, and the cyclic GC's full passes over
        # them paused the daemon sharing the process for up to 0.95 s, past the KV ACK timeout.
        requests[i] = attrs.evolve(requests[i], body=b"")
    h.checked_requests = len(requests)
    return errors


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


def check_call_records(
    db: sqlite3.Connection, edit_texts: set[str], plans: dict[str, str], arrivals: list[tuple[str, str]]
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
    merged = branched = unrecorded = 0
    recorded = {sha for (sha,) in db.execute("SELECT request_sha256 FROM llm_calls")}
    for i, rid, conv, common in rows:
        before = db.execute(
            "SELECT id, request_id, status FROM llm_calls WHERE conversation_id = ? AND id < ? "
            "ORDER BY id DESC LIMIT 1",
            (conv, i),
        ).fetchone()
        now, was = _stored_elements(db, i), _stored_elements(db, before[0])
        if _lost_in_between(db, arrivals, recorded, before[0], i):
            unrecorded += 1
        elif now is not None and was is not None and _starts_a_branch(edit_texts, now[1], was[1]):
            branched += 1
        elif now is not None and was is not None and now[0] and _merges_into_last(was[1], now[1]):
            merged += 1
        else:
            fault, before_fault = plans.get(rid.rstrip("a")), plans.get(before[1].rstrip("a"))
            errors.append(
                f"llm_calls {i} ({rid} [{fault}], {conv}): does not extend its conversation's previous "
                f"call {before} [{before_fault}] ({common} messages shared)"
            )
    return MeterCheck(errors, compared, merged, branched, unrecorded)


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
