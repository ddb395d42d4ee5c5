"""Provider-call bodies stored as tails of the previous call's: every body reads back byte for
byte, a conversation's next call stores only what it adds, and nothing unverifiable is chained."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from byok.model.messages import ToolCall
from byok.model.request import (
    AssistantTurn,
    HistoryItem,
    ModelRequest,
    ModelSettings,
    ToolResultTurn,
    ToolSpec,
    UserTurn,
)
from byok.providers import rendering
from byok.providers.adapters import adapter_for
from byok.run.body_chain import layout_of, shared_bytes
from byok.run.call_log import CallLog
from byok.run.call_meter import Finalized, compare_prefix, extends_compared, finalize_with_layout
from byok.store import AsyncStore, BodyBase, ComparedPrefix, LlmCallRecord, SQLiteStore, call_bodies
from byok.store.call_bodies import MAX_CHAIN, MIN_SHARED

KINDS = ("openai_chat", "openai_responses", "anthropic")


def rec(conversation: str, body: bytes, base: BodyBase | None = None, request_id: str = "r") -> LlmCallRecord:
    return LlmCallRecord(request_id, conversation, "p", "m", body, "aa", "bb", "ok", 0, body_base=base)


def stored_row(store: SQLiteStore, row_id: int) -> tuple[bytes, int | None, int | None, int]:
    assert store._conn is not None
    return store._conn.execute(
        "SELECT request_body, body_base_id, body_shared_bytes, body_depth FROM llm_calls WHERE id = ?",
        (row_id,),
    ).fetchone()


def view_body(store: SQLiteStore, row_id: int) -> bytes:
    assert store._conn is not None
    return bytes(
        store._conn.execute("SELECT request_body FROM llm_call_bodies WHERE id = ?", (row_id,)).fetchone()[0]
    )


# --- the store's format --------------------------------------------------------------------------


def test_a_chain_reads_back_whole_and_stores_only_tails(tmp_path: Path) -> None:
    head = '{"model":"m","messages":["é€ '.encode() + b"x" * MIN_SHARED
    bodies = [head + b'"]}', head + b'","second"]}', head + '","second","third ü"]}'.encode()]
    with SQLiteStore.open_in(tmp_path) as store:
        (first,) = store.record_llm_calls([rec("c", bodies[0])])
        (second,) = store.record_llm_calls([rec("c", bodies[1], BodyBase(first, len(head)))])
        (third,) = store.record_llm_calls([rec("c", bodies[2], BodyBase(second, len(bodies[1]) - 2))])
        got = store.llm_calls("r")
        assert [r.request_body for r in got] == bodies
        assert [r.body_base for r in got] == [
            None,
            BodyBase(first, len(head)),
            BodyBase(second, len(bodies[1]) - 2),
        ]
        assert stored_row(store, second) == (b'","second"]}', first, len(head), 1)
        assert stored_row(store, third)[0] == ',"third ü"]}'.encode() and stored_row(store, third)[3] == 2
        assert [view_body(store, i) for i in (first, second, third)] == bodies
        last = store.last_llm_call("c")
        assert last is not None and last.request_body == bodies[2]


def test_claims_the_store_cannot_use_are_stored_whole(tmp_path: Path) -> None:
    body = b"y" * (2 * MIN_SHARED)
    with SQLiteStore.open_in(tmp_path) as store:
        (other,) = store.record_llm_calls([rec("other", body)])
        (base,) = store.record_llm_calls([rec("c", body)])
        claims = [
            BodyBase(other, MIN_SHARED),  # another conversation's call
            BodyBase(base + 100, MIN_SHARED),  # no such call
            BodyBase(base, MIN_SHARED - 1),  # too little shared to be worth it
            BodyBase(base, len(body) + 1),  # more than the body holds
        ]
        ids = store.record_llm_calls([rec("c", body, claim, request_id="claims") for claim in claims])
        for row_id in ids:
            assert stored_row(store, row_id) == (body, None, None, 0)
        assert [r.request_body for r in store.llm_calls("claims")] == [body] * 4


def test_chains_are_capped(tmp_path: Path) -> None:
    body = b"z" * MIN_SHARED
    with SQLiteStore.open_in(tmp_path) as store:
        (previous,) = store.record_llm_calls([rec("c", body)])
        depths = []
        for i in range(MAX_CHAIN + 2):
            grown = body + str(i).encode()
            (previous,) = store.record_llm_calls([rec("c", grown, BodyBase(previous, len(body)))])
            depths.append(stored_row(store, previous)[3])
            body = grown
        assert depths[:MAX_CHAIN] == [*range(1, MAX_CHAIN), 0]  # the 32nd is stored whole
        assert depths[MAX_CHAIN:] == [1, 2]
        assert store.last_llm_call("c").request_body == body  # type: ignore[union-attr]


def test_version_3_rows_read_as_whole_bodies(tmp_path: Path) -> None:
    from byok.store import schema

    path = tmp_path / "db.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    for statements in schema.MIGRATIONS[:3]:
        for statement in statements:
            conn.execute(statement)
    conn.execute("PRAGMA user_version = 3")
    conn.execute(
        "INSERT INTO llm_calls (request_id, conversation_id, provider_id, model, request_body,"
        " request_sha256, messages_sha256, status, event_count, byte_count, started_at_ms)"
        " VALUES ('old', 'c', 'p', 'm', ?, 'aa', 'bb', 'ok', 0, 0, 1)",
        (b'{"messages":[]}',),
    )
    conn.close()
    with SQLiteStore(path) as store:
        (old,) = store.llm_calls("old")
        assert old.request_body == b'{"messages":[]}' and old.body_base is None
        assert view_body(store, old.id) == b'{"messages":[]}'  # type: ignore[arg-type]
        # No compared prefix (schema 6): the call after it reads this body to compare.
        assert store.last_llm_call_prefix("c") == ComparedPrefix(old.id, None, None, None)  # type: ignore[arg-type]


# --- layouts ------------------------------------------------------------------------------------

elements = st.lists(st.text(max_size=8).map(lambda t: rendering.dumpb(t)), max_size=6)


@settings(max_examples=300, deadline=None)
@given(
    common=elements,
    a=elements,
    b=elements,
    lead=st.sampled_from(['{"model":"m","messages":', '{"x":1,"messages":']),
)
def test_shared_bytes_is_a_true_common_prefix(
    common: list[bytes], a: list[bytes], b: list[bytes], lead: str
) -> None:
    def body(items: list[bytes]) -> bytes:
        return lead.encode() + b"[" + b",".join(items) + b"]}"

    first, second = body(common + a), body(common + b)
    la, lb = (layout_of(x, rendering.split_body(x), _digests(x)) for x in (first, second))  # type: ignore[arg-type]
    assert la is not None and lb is not None
    shared = shared_bytes(la, lb)
    assert first[:shared] == second[:shared]
    # Through the last leading element both share, or through "[" when none.
    xs, ys = common + a, common + b
    k = next((i for i, (x, y) in enumerate(zip(xs, ys, strict=False)) if x != y), min(len(xs), len(ys)))
    assert shared == len(lead) + 1 + (sum(map(len, xs[:k])) + k - 1 if k else 0)


def _digests(body: bytes) -> tuple[bytes, ...]:
    import hashlib

    split = rendering.split_body(body)
    assert split is not None and split.elements is not None
    return tuple(hashlib.sha256(e).digest() for e in split.elements)


def test_a_body_with_whitespace_in_its_array_has_no_layout() -> None:
    body = b'{"messages":[1, 2]}'
    split = rendering.split_body(body)
    assert split is not None and layout_of(body, split, _digests(body)) is None


# --- the call log ---------------------------------------------------------------------------------


def history(n: int) -> tuple[HistoryItem, ...]:
    out: list[HistoryItem] = []
    for i in range(n):
        calls = (ToolCall(f"c{i}", "Read", '{"path":"a"}', 0),)
        out += [
            UserTurn(f"question {i} é"),
            AssistantTurn("Looking.", tool_calls=calls),
            ToolResultTurn(f"c{i}", "Read", f"line {i}\n" * 600),
            AssistantTurn(f"answer {i}"),
        ]
    return tuple(out)


def call(kind: str, n: int, request_id: str, extra: tuple[tuple[str, object], ...] = ()) -> LlmCallRecord:
    req = ModelRequest(
        "sys", (ToolSpec("Read", "reads", "{}"),), history(n), ModelSettings("m", extra_body=extra)
    )
    rendered = adapter_for(kind).render(req)
    return LlmCallRecord(request_id, "conv", "p", "", rendered.body, "", "", "ok", 0, rendered=rendered)


@pytest.mark.parametrize("kind", KINDS)
async def test_call_log_stores_each_call_as_the_previous_ones_tail(kind: str, tmp_path: Path) -> None:
    sent = [call(kind, n, f"r{n}") for n in (2, 3, 4, 1, 5)]
    async with await AsyncStore.open(tmp_path / "data") as store:
        log = CallLog(store)
        for record in sent[:3]:
            log.submit(record)
            await log.flush()  # one batch each: a base is a written row
        restarted = CallLog(store)  # no memory: the last row is read back and walked
        for record in sent[3:]:
            restarted.submit(record)
            await restarted.flush()
        rows = [r for n in (2, 3, 4, 1, 5) for r in await store.llm_calls(f"r{n}")]
        assert [r.request_body for r in rows] == [r.request_body for r in sent]
        bases = [r.body_base for r in rows]
        assert bases[0] is None and all(b is not None for b in bases[1:])
        assert [b.record_id for b in bases[1:]] == [r.id for r in rows[:-1]]  # type: ignore[union-attr]
        raw = store._store._conn.execute(  # type: ignore[union-attr]
            "SELECT length(request_body) FROM llm_calls ORDER BY id"
        ).fetchall()
        sizes = [len(r.request_body or b"") for r in sent]
        for (stored,), size, row in zip(raw[1:], sizes[1:], rows[1:], strict=True):
            assert stored == size - row.body_base.shared_bytes  # type: ignore[union-attr]
        # A call one exchange longer stores about that exchange (~5 KB of a 15-20 KB body); the
        # shorter call after them only its closing bytes.
        assert raw[1][0] < sizes[1] / 2 and raw[2][0] < sizes[2] / 3 and raw[3][0] < 200
        assert [r.prefix_extends for r in rows] == [None, True, True, False, True]


async def test_a_redacted_body_is_stored_whole_and_is_never_a_base(tmp_path: Path) -> None:
    secret = (("metadata", {"api_key": "sk-secret"}),)
    async with await AsyncStore.open(tmp_path / "data") as store:
        log = CallLog(store)
        for n, extra in ((2, secret), (3, ())):
            log.submit(call("openai_chat", n, f"r{n}", extra))
            await log.flush()
        rows = [r for n in (2, 3) for r in await store.llm_calls(f"r{n}")]
    assert b"sk-secret" not in (rows[0].request_body or b"")
    assert rows[1].body_base is None  # what is stored of the first is not what was sent


async def test_a_new_prefix_that_extends_the_previous_call_is_recorded_as_extending(tmp_path: Path) -> None:
    """A run marks a call that may be the first on a new summary; one that turns out to extend
    the call before it (a restarted daemon's run could not tell) is compared as any other, one
    that does not is a new prefix on purpose, not a miss."""
    async with await AsyncStore.open(tmp_path / "data") as store:
        log = CallLog(store)
        for n, new_prefix in ((2, False), (3, True), (1, True)):
            log.submit(attrs.evolve(call("openai_chat", n, f"r{n}"), new_prefix=new_prefix))
            await log.flush()
        rows = [r for n in (2, 3, 1) for r in await store.llm_calls(f"r{n}")]
    assert [r.prefix_extends for r in rows] == [None, True, None]


def request(kind: str, n: int, request_id: str, system: str = "sys") -> LlmCallRecord:
    req = ModelRequest(system, (ToolSpec("Read", "reads", "{}"),), history(n), ModelSettings("m"))
    rendered = adapter_for(kind).render(req)
    return LlmCallRecord(request_id, "conv", "p", "", rendered.body, "", "", "ok", 0, rendered=rendered)


async def _after_restart(
    data: Path, before: LlmCallRecord, after: LlmCallRecord, *, forget_prefixes: bool
) -> tuple[LlmCallRecord, int, int]:
    """``after`` recorded by a call log with no memory, its predecessor ``before`` by another:
    (its row, the bytes stored for it, how many stored bodies that write read back)."""
    async with await AsyncStore.open(data) as store:
        log = CallLog(store)
        log.submit(before)
        await log.flush()
        conn = store._store._conn
        assert conn is not None
        if forget_prefixes:  # as rows written before schema 6 are
            conn.execute("UPDATE llm_calls SET compared_bytes = NULL, compared_sha256 = NULL")
        reads = 0
        full_body = call_bodies.full_body

        def counted(*args: object) -> bytes | None:
            nonlocal reads
            reads += 1
            return full_body(*args)  # type: ignore[arg-type]

        call_bodies.full_body = counted  # type: ignore[assignment]
        try:
            restarted = CallLog(store)
            restarted.submit(after)
            await restarted.flush()
        finally:
            call_bodies.full_body = full_body  # type: ignore[assignment]
        (row,) = await store.llm_calls(after.request_id)
        (stored,) = conn.execute(
            "SELECT length(request_body) FROM llm_calls WHERE id = ?", (row.id,)
        ).fetchone()
        return row, stored, reads


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("change", "proven"),
    [("longer", True), ("same", True), ("shorter", False), ("new system prompt", False)],
)
async def test_after_a_restart_the_compared_prefix_stands_for_the_previous_body(
    kind: str, change: str, proven: bool, tmp_path: Path
) -> None:
    """The call after a restart is compared with its predecessor's compared prefix alone when it
    holds all of it, and with the body read back otherwise; either way the meter and the stored
    tail are what walking the previous body gives (rows from before schema 6 have no prefix)."""
    before = request(kind, 4, "r1")
    after = {
        "longer": request(kind, 5, "r2"),
        "same": request(kind, 4, "r2"),
        "shorter": request(kind, 1, "r2"),
        "new system prompt": request(kind, 5, "r2", system="other"),
    }[change]
    row, stored, reads = await _after_restart(tmp_path / "a", before, after, forget_prefixes=False)
    walked, walked_stored, walked_reads = await _after_restart(
        tmp_path / "b", before, after, forget_prefixes=True
    )
    assert walked_reads == 1
    assert reads == (0 if proven else 1)
    assert (row.prefix_extends, row.common_prefix_messages) == (
        walked.prefix_extends,
        walked.common_prefix_messages,
    )
    assert row.body_base == walked.body_base and stored == walked_stored
    assert row.request_body == after.request_body
    assert row.prefix_extends is proven
    if proven:
        assert row.body_base is not None and stored < len(after.request_body or b"") / 3


def test_the_compared_prefix_covers_instructions_written_after_the_array() -> None:
    def finalized(body: bytes) -> Finalized:
        return finalize_with_layout(LlmCallRecord("r", "c", "p", "", body, "", "", "ok", 0))

    lead = b'{"model":"m","input":[' + b'{"role":"user","content":"%s"},' % (b"x" * MIN_SHARED)
    previous = finalized(lead + b'{"role":"user","content":"b"}],"instructions":"be brief"}').record
    assert previous.compared_messages == 3  # instructions, then the two inputs
    prefix = ComparedPrefix(1, previous.compared_bytes, previous.compared_messages, previous.compared_sha256)
    for instructions, extends in ((b"be brief", True), (b"be long", False)):
        body = lead + b'{"role":"user","content":"b"},{"role":"user","content":"c"}],"instructions":"%s"}' % (
            instructions
        )
        assert extends_compared(body, finalized(body).mark, prefix) is extends
    # Same bytes, but the previous last element continues: not the same elements.
    body = lead + b'{"role":"user","content":"b"}' + b'x],"instructions":"be brief"}'
    same_head = finalized(lead + b'{"role":"user","content":"b"}],"instructions":"be brief"}').mark
    assert extends_compared(body[:-1] + b"}", same_head, prefix) is False
    assert extends_compared(lead + b'{"role":"user","content":"b"}]}', same_head, prefix) is True


heads = st.sampled_from([None, b'"be brief"', b'"be long"'])


@settings(max_examples=400, deadline=None)
@given(common=elements, a=elements, b=elements, head_a=heads, head_b=heads, after=st.booleans())
def test_the_compared_prefix_never_claims_more_than_the_bodies_share(
    common: list[bytes],
    a: list[bytes],
    b: list[bytes],
    head_a: bytes | None,
    head_b: bytes | None,
    after: bool,
) -> None:
    """Whenever the check against a compared prefix says a body extends the previous one, the
    meter's hashes say so too (the same lead and instructions: it always finds out)."""

    def body(items: list[bytes], head: bytes | None) -> bytes:
        extra = b"" if head is None else b'"instructions":' + head
        array = b'"input":[' + b",".join(items) + b"]"
        fields = [array, extra] if after else [extra, array]
        return b'{"model":"m",' + b",".join(f for f in fields if f) + b"}"

    first = finalize_with_layout(LlmCallRecord("r", "c", "p", "", body(common + a, head_a), "", "", "ok", 0))
    second = finalize_with_layout(LlmCallRecord("r", "c", "p", "", body(common + b, head_b), "", "", "ok", 0))
    rec = first.record
    assert rec.compared_sha256 is not None and rec.compared_bytes is not None
    prefix = ComparedPrefix(1, rec.compared_bytes, rec.compared_messages, rec.compared_sha256)
    extends, common_count = compare_prefix(first.hashes, second.hashes)
    claimed = extends_compared(second.record.request_body, second.mark, prefix)
    if claimed:
        assert extends is True and common_count == rec.compared_messages
    if head_a == head_b:
        assert claimed is bool(extends)
