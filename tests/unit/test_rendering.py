"""Request bodies spliced from cached element texts (byok/providers/rendering.py) and the call
record's prefix meter built on them: the bytes are exactly a whole-body json.dumps, the
elements are exactly the spans a walk of the body finds, and evicting the cache changes
nothing."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from byok.model.messages import ReplayState, ToolCall
from byok.model.request import (
    AssistantTurn,
    HistoryItem,
    ModelRequest,
    ModelSettings,
    RenderedRequest,
    ToolResultTurn,
    ToolSpec,
    UserTurn,
)
from byok.providers import anthropic_request, openai_chat_request, openai_responses_request, rendering
from byok.providers.adapters import adapter_for
from byok.run.call_log import CallLog
from byok.run.call_meter import compare_prefix, finalize_and_hash, message_hashes, stored_message_hashes
from byok.run.redaction import may_hold_secret as _may_hold_secret
from byok.run.redaction import redact as _redact
from byok.run.redaction import redact_body
from byok.store import AsyncStore, LlmCallRecord

KINDS = ("openai_chat", "openai_responses", "anthropic")


def dumpb(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


# --- the plain renders: the whole body built as objects and dumped at once --------------------


def plain_chat(req: ModelRequest) -> bytes:
    flag = req.settings.replay_reasoning_on_tool_turns
    messages = [{"role": "system", "content": req.system}] if req.system else []
    messages += [openai_chat_request._message(item, flag) for item in req.history]
    body: dict[str, Any] = {
        "model": req.settings.upstream_model,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if req.settings.cache_key:
        body["prompt_cache_key"] = req.settings.cache_key
    body["messages"] = messages
    if req.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": json.loads(t.parameters_json),
                },
            }
            for t in req.tools
        ]
    return finish(body, req)


def plain_responses(req: ModelRequest) -> bytes:
    items: list[Any] = []
    for item in req.history:
        if isinstance(item, UserTurn):
            items.append({"role": "user", "content": item.text})
        elif isinstance(item, AssistantTurn):
            items.extend(openai_responses_request._assistant_items(item))
        elif isinstance(item, ToolResultTurn):
            items.append({"type": "function_call_output", "call_id": item.call_id, "output": item.content})
    body: dict[str, Any] = {
        "model": req.settings.upstream_model,
        "stream": True,
        "store": False,
        "include": ["reasoning.encrypted_content"],
    }
    if req.settings.cache_key:
        body["prompt_cache_key"] = req.settings.cache_key
    if req.system:
        body["instructions"] = req.system
    body["input"] = items
    if req.tools:
        body["tools"] = [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": json.loads(t.parameters_json),
                "strict": False,
            }
            for t in req.tools
        ]
    return finish(body, req, "max_output_tokens")


def plain_anthropic(req: ModelRequest) -> bytes:
    messages: list[dict[str, Any]] = []
    for item in req.history:
        if isinstance(item, UserTurn):
            anthropic_request._append(messages, "user", [{"type": "text", "text": item.text}])
        elif isinstance(item, ToolResultTurn):
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": item.call_id,
                "content": item.content,
            }
            if item.is_error:
                block["is_error"] = True
            anthropic_request._append(messages, "user", [block])
        elif isinstance(item, AssistantTurn):
            blocks = anthropic_request._assistant_blocks(item)
            if blocks:
                anthropic_request._append(messages, "assistant", blocks)
    s = req.settings
    body: dict[str, Any] = {
        "model": s.upstream_model,
        "max_tokens": s.max_output_tokens
        if s.max_output_tokens is not None
        else anthropic_request.DEFAULT_MAX_TOKENS,
        "stream": True,
    }
    if s.prompt_cache:
        body["cache_control"] = {"type": "ephemeral"}
    if req.system:
        body["system"] = req.system
    body["messages"] = messages
    if req.tools:
        body["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": json.loads(t.parameters_json)}
            | ({"eager_input_streaming": True} if s.eager_input_streaming else {})
            for t in req.tools
        ]
    return finish(body, req, None)


def finish(body: dict[str, Any], req: ModelRequest, max_key: str | None = "max_tokens") -> bytes:
    if max_key is not None and req.settings.max_output_tokens is not None:
        body[max_key] = req.settings.max_output_tokens
    for key, value in req.settings.extra_body:
        body[key] = value
    return dumpb(body)


PLAIN: dict[str, Callable[[ModelRequest], bytes]] = {
    "openai_chat": plain_chat,
    "openai_responses": plain_responses,
    "anthropic": plain_anthropic,
}


# --- random histories ------------------------------------------------------------------------

# Quotes, backslashes, control characters (escaped even with ensure_ascii=False), non-BMP text,
# the Kelvin sign, and text that mentions secret-looking keys.
PIECES = [*'ab \n\t"\\\x00\x1b/\u00e9\u20ac\U0001f600\u212a:{}', "api_key", 'Authorization":']
texts = st.lists(st.sampled_from(PIECES), max_size=12).map("".join)
ids = st.sampled_from(["c1", "c2", "toolu_3", "call_4"])
# A call id that is a hole's text (dumpb_spliced): the element must still come out as itself.
result_ids = st.one_of(ids, st.just(rendering._hole(0)))
arguments = st.one_of(
    st.dictionaries(
        st.sampled_from(["path", "q", "api_key", "n"]), st.one_of(texts, st.integers()), max_size=3
    ).map(json.dumps),
    st.sampled_from(["", "not json", "[1]"]),
)
tool_calls = st.lists(
    st.builds(ToolCall, ids, st.sampled_from(["Read", "Grep"]), arguments, st.integers(0, 3)),
    max_size=3,
    unique_by=lambda c: c.call_id,
)


@st.composite
def replays(draw: st.DrawFn, text: str, calls: list[ToolCall]) -> ReplayState | None:
    kind = draw(st.sampled_from([None, "openai_chat", "openai_responses", "anthropic"]))
    if kind == "openai_chat":
        return ReplayState(kind, json.dumps({"reasoning_content": draw(texts)}))
    if kind == "openai_responses":
        saved: list[dict[str, Any]] = [
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "e"}
        ]
        if draw(st.booleans()):
            saved.append({"type": "message", "id": "msg_1", "text": text if draw(st.booleans()) else "other"})
        saved += [{"type": "function_call", "id": f"fc_{c.call_id}", "call_id": c.call_id} for c in calls]
        return ReplayState(kind, json.dumps({"items": saved}))
    if kind == "anthropic":
        blocks: list[dict[str, Any]] = [{"type": "thinking", "thinking": draw(texts), "signature": "sig"}]
        if draw(st.booleans()):
            blocks.append({"type": "text", "text": text})
        blocks += [{"type": "tool_use", "id": c.call_id, "name": c.name} for c in calls]
        return ReplayState(kind, json.dumps({"blocks": blocks}))
    return None


@st.composite
def assistant_turns(draw: st.DrawFn) -> AssistantTurn:
    text = draw(st.one_of(st.just(""), texts))
    calls = draw(tool_calls)
    return AssistantTurn(text, "", draw(replays(text, calls)), tuple(calls))


# What a user turn or tool result holds: a short text, one past json_string's replace
# threshold, or a hole's own text (which must come out as itself).
contents = st.one_of(
    texts,
    texts.filter(bool).map(lambda t: t * (5000 // len(t) + 1)),
    st.sampled_from([rendering._hole(0), rendering._hole(1)]),
)
items = st.one_of(
    st.builds(UserTurn, contents),
    assistant_turns(),
    st.builds(ToolResultTurn, result_ids, st.sampled_from(["Read", "Grep"]), contents, st.booleans()),
)
histories = st.lists(items, max_size=12).map(tuple)
extra_bodies = st.sampled_from(
    [
        (),
        (("temperature", 0.5),),
        (("model", "override"), ("metadata", {"api_key": "sk-1"})),
        # The tools array replaced: the cached tools text must not be spliced over it.
        (("tools", [{"type": "function", "name": "x"}]),),
        # What the meter reads, replaced or added: the elements come from a walk of the body.
        (("messages", [{"role": "user", "content": "x"}]),),
        (("system", "other"),),
        (("instructions", ["a", 1]),),
        (("input", []),),
    ]
)
requests = st.builds(
    ModelRequest,
    st.one_of(st.just(""), texts),
    st.sampled_from([(), (ToolSpec("Read", "reads", '{"type":"object"}'),)]),
    histories,
    st.builds(
        ModelSettings,
        st.just("m"),
        st.sampled_from([None, 100]),
        st.booleans(),
        extra_bodies,
        st.booleans(),
        st.booleans(),
    ),
)


@contextmanager
def fragments(max_bytes: int) -> Iterator[None]:
    saved = rendering.FRAGMENTS.max_bytes
    rendering.forget_rendered()
    rendering.FRAGMENTS.max_bytes = max_bytes
    try:
        yield
    finally:
        rendering.forget_rendered()
        rendering.FRAGMENTS.max_bytes = saved


def render(kind: str, req: ModelRequest) -> RenderedRequest:
    return adapter_for(kind).render(req)


# --- (a) bytes, (b) elements, (c) eviction ---------------------------------------------------------

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("large_min", [rendering.LARGE_MIN, 1], ids=["large", "every-text-spliced"])
@PROPERTY
@given(req=requests)
def test_body_is_the_plain_full_render(kind: str, large_min: int, req: ModelRequest) -> None:
    saved = rendering.LARGE_MIN
    rendering.LARGE_MIN = large_min  # 1: dumpb_spliced splices every text
    rendering.forget_rendered()
    try:
        expected = PLAIN[kind](req)
        assert render(kind, req).body == expected
        assert render(kind, req).body == expected  # from the cache
    finally:
        rendering.LARGE_MIN = saved


@pytest.mark.parametrize("kind", KINDS)
@PROPERTY
@given(req=requests)
def test_elements_are_the_spans_a_walk_of_the_body_finds(kind: str, req: ModelRequest) -> None:
    rendered = render(kind, req)
    walked = rendering.split_body(rendered.body)
    assert walked is not None
    assert (rendered.elements, rendered.head, rendered.array, rendered.model) == (
        walked.elements,
        walked.head,
        walked.array,
        walked.model,
    )
    obj = json.loads(rendered.body)
    assert rendered.model == str(obj["model"])
    key = "input" if isinstance(obj.get("input"), list) else "messages"
    assert rendered.array is not None and rendered.elements is not None
    start, end = rendered.array
    assert rendered.body[start:end] == dumpb(obj[key])  # the array's bytes as sent
    head = [dumpb(obj[h]) for h in ("instructions" if key == "input" else "system",) if h in obj]
    assert list(rendered.elements) == head + [dumpb(e) for e in obj[key]]
    # The meter's hashes: of each element's bytes, from the render and from the stored body alike.
    hashes = tuple(hashlib.sha256(e).digest() for e in rendered.elements)
    assert message_hashes(rendered.body) == hashes
    rec = LlmCallRecord("r", "c", "p", rendered.model, rendered.body, "", "", "ok", 0, rendered=rendered)
    out, current = finalize_and_hash(rec)
    assert current == hashes
    assert out.messages_sha256 == hashlib.sha256(rendered.body[start:end]).hexdigest()
    assert out.request_body == redact_body(rendered.body)
    assert finalize_and_hash(attrs_without_render(rec)) == (out, current)


def attrs_without_render(rec: LlmCallRecord) -> LlmCallRecord:
    return attrs.evolve(rec, rendered=None, model="")


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=100, deadline=None)
@given(req=requests, budget=st.sampled_from([0, 300, 2000]))
def test_cache_eviction_does_not_change_the_bytes(kind: str, req: ModelRequest, budget: int) -> None:
    warm = render(kind, req)
    with fragments(budget):  # nothing fits, or items evict each other within one render
        for _ in range(2):
            cold = render(kind, req)
            assert cold.body == warm.body and cold.elements == warm.elements
            assert rendering.FRAGMENTS.size <= budget


def test_a_duplicate_key_counts_once_like_json_loads() -> None:
    body = b'{"messages":[1],"model":"a","messages":[{"x":2}, 3] ,"model":7}'
    split = rendering.split_body(body)
    assert split is not None and split.elements == (b'{"x":2}', b"3") and split.model == "7"
    assert rendering.split_body(b'{"messages":[1],"messages":"x"}') == RenderedRequest(
        b'{"messages":[1],"messages":"x"}', ""
    )
    for bad in (b"", b"[1]", b'{"messages":[1,]}', b'{"a":1} x', b'{"a" 1}', b"\xff"):
        assert rendering.split_body(bad) is None, bad
    assert rendering.split_body(b'{ "model" : "m" }') == RenderedRequest(b'{ "model" : "m" }', "m")
    # Non-ASCII text before the array: the span is in bytes.
    body = '{"system":"é€","messages":[ "ü" ]}'.encode()
    split = rendering.split_body(body)
    assert split is not None and split.array is not None
    assert body[split.array[0] : split.array[1]] == '[ "ü" ]'.encode()
    assert split.elements == ('"é€"'.encode(), '"ü"'.encode()) and split.head == 1


# --- (d) the prefix meter ----------------------------------------------------------------------


def tool_loop(n: int, edited: bool = False) -> tuple[HistoryItem, ...]:
    out: list[HistoryItem] = []
    for i in range(n):
        calls = (ToolCall(f"c{i}a", "Read", '{"path":"a"}', 0), ToolCall(f"c{i}b", "Grep", '{"q":"x"}', 1))
        text = "question 0 (edited)" if edited and i == 0 else f"question {i} é"
        out += [
            UserTurn(text),
            AssistantTurn("Looking.", tool_calls=calls),
            ToolResultTurn(f"c{i}a", "Read", f"read {i}\n" * 20),
            ToolResultTurn(f"c{i}b", "Grep", f"grep {i}\n" * 10, is_error=i % 2 == 1),
            AssistantTurn(f"answer {i}"),
        ]
    return tuple(out)


def call(kind: str, history: tuple[HistoryItem, ...], request_id: str) -> LlmCallRecord:
    req = ModelRequest("sys", (ToolSpec("Read", "reads", "{}"),), history, ModelSettings("m"))
    rendered = render(kind, req)
    return LlmCallRecord(
        "r", "conv-" + kind, "p", rendered.model, rendered.body, "", "", "ok", 0, rendered=rendered
    )


@pytest.mark.parametrize("kind", KINDS)
def test_meter_extends_and_breaks(kind: str) -> None:
    first = finalize_and_hash(call(kind, tool_loop(3), "r1"))[1]
    # The next call of the tool loop: the assistant turn and its results are appended.
    longer = tool_loop(4)[:-1]
    second = finalize_and_hash(call(kind, longer, "r2"))[1]
    extends, common = compare_prefix(first, second)
    assert extends is True and common == len(first or ())
    # An edited early message breaks the prefix right there (after the system element).
    edited = finalize_and_hash(call(kind, tool_loop(4, edited=True), "r3"))[1]
    assert compare_prefix(second, edited) == (False, 1)


@pytest.mark.parametrize("kind", KINDS)
async def test_call_log_meter_in_memory_and_after_a_restart(kind: str, tmp_path: Path) -> None:
    async with await AsyncStore.open(tmp_path / "data") as store:
        log = CallLog(store)
        log.submit(call(kind, tool_loop(2), "r1"))
        log.submit(call(kind, tool_loop(3)[:-1], "r2"))
        await log.flush()
        log.submit(call(kind, tool_loop(3), "r3"))  # the in-memory hashes of r2
        await log.flush()
        restarted = CallLog(store)  # no memory: the last stored body is walked
        restarted.submit(call(kind, tool_loop(4), "r4"))
        restarted.submit(call(kind, tool_loop(1), "r5"))  # shorter: does not extend
        await restarted.flush()
        got = [(c.prefix_extends, c.common_prefix_messages) for c in await store.llm_calls("r")]
        assert [g[0] for g in got] == [None, True, True, True, False]
        rows = await store.llm_calls("r")
        assert all(r.model == "m" and r.request_sha256 for r in rows)
        assert rows[1].common_prefix_messages == len(message_hashes(rows[0].request_body) or ())


async def test_a_redacted_stored_body_is_unknown_after_a_restart(tmp_path: Path) -> None:
    extra = (("metadata", {"api_key": "sk-secret"}),)
    req = ModelRequest("sys", (), tool_loop(1), ModelSettings("m", extra_body=extra))
    rendered = render("openai_chat", req)
    async with await AsyncStore.open(tmp_path / "data") as store:
        log = CallLog(store)
        log.submit(LlmCallRecord("r", "c", "p", "m", rendered.body, "", "", "ok", 0, rendered=rendered))
        log.submit(LlmCallRecord("r", "c", "p", "m", rendered.body, "", "", "ok", 0, rendered=rendered))
        await log.flush()
        restarted = CallLog(store)
        restarted.submit(LlmCallRecord("r", "c", "p", "m", rendered.body, "", "", "ok", 0, rendered=rendered))
        await restarted.flush()
        rows = await store.llm_calls("r")
    assert all(b"sk-secret" not in (r.request_body or b"") for r in rows)
    # In memory the meter compares what was sent; the stored body no longer is that.
    assert [r.prefix_extends for r in rows] == [None, True, None]
    assert stored_message_hashes(rows[0].request_body) is None


# --- the redaction pre-check ---------------------------------------------------------------------

keys = st.sampled_from(
    ["role", "content", "api_key", "X-Api-Key", "apiKey", "APIKEY", "proxy-authorization", "Authorization",
     "api_\u212aey", "get_api_key_docs", "api__key", "x\x1bapi_key", "authorization ", "ok"]
)  # fmt: skip
json_values = st.recursive(
    st.one_of(st.none(), st.integers(), texts, keys),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)),
    max_leaves=10,
)


@settings(max_examples=1000, deadline=None)
@given(obj=json_values, ensure_ascii=st.booleans(), spaced=st.booleans())
def test_the_secret_precheck_never_misses_what_redaction_would_change(
    obj: Any, ensure_ascii: bool, spaced: bool
) -> None:
    body = json.dumps(obj, ensure_ascii=ensure_ascii, separators=(", ", ": ") if spaced else (",", ":"))
    if _redact(obj)[1]:
        assert _may_hold_secret(body.encode())


def test_the_secret_precheck_skips_text_that_only_mentions_keys() -> None:
    mention = dumpb({"role": "tool", "content": 'headers = {"Authorization": key, "api_key": k}\x1b[0m'})
    assert not _may_hold_secret(mention)
    assert _may_hold_secret(dumpb({"x": {"Api-Key": "k"}}))
    assert _may_hold_secret(b'{"api\\u005fkey":"k"}')
    assert _may_hold_secret('{"api_\u212aey":"k"}'.encode())


# --- (d) the kept prefix: a render starts from the last render's final prefix ----------------------

# One step of a conversation as renders see it: grow (a turn), cut back (an edit or a resume
# branching from an earlier point), swap the last item, or another conversation in between.
steps = st.one_of(
    st.tuples(st.just("grow"), st.lists(items, min_size=1, max_size=4)),
    st.tuples(st.just("cut"), st.integers(0, 12)),
    st.tuples(st.just("swap"), items),
    st.tuples(st.just("other"), histories),
)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=150, deadline=None)
@given(
    start=histories,
    plan=st.lists(steps, max_size=8),
    system=st.one_of(st.just(""), texts),
    flag=st.booleans(),
    copy=st.booleans(),
    cache=st.booleans(),
)
def test_a_render_after_other_renders_is_the_plain_full_render(
    kind: str,
    start: tuple[Any, ...],
    plan: list[tuple[str, Any]],
    system: str,
    flag: bool,
    copy: bool,
    cache: bool,
) -> None:
    tools = (ToolSpec("Read", "reads", '{"type":"object"}'),)
    if kind == "anthropic":  # each kind's caching fields on or off
        model_settings = ModelSettings("m", None, flag, prompt_cache=cache, eager_input_streaming=cache)
    else:
        model_settings = ModelSettings("m", None, flag, cache_key="byok-k" if cache else "")
    history = start
    for op, arg in plan:
        if op == "grow":
            history = history + tuple(arg)
        elif op == "cut":
            history = history[:arg]
        elif op == "swap" and history:
            history = (*history[:-1], arg)
        elif op == "other":
            render(kind, ModelRequest(system, tools, arg, model_settings))
        if copy:  # equal items that are other objects (a history decoded again)
            history = tuple(attrs.evolve(i) for i in history)
        req = ModelRequest(system, tools, history, model_settings)
        rendered = render(kind, req)
        assert rendered.body == PLAIN[kind](req)
        walked = rendering.split_body(rendered.body)
        assert walked is not None and rendered.elements == walked.elements


def test_a_grown_history_looks_up_only_its_new_items() -> None:
    """The kept prefix is used: a render of a grown history asks the fragment cache only for
    the items it added (Chat: one lookup per new item, none for the system message)."""
    user = [UserTurn(f"question {i}") for i in range(50)]
    req = ModelRequest("sys", (), tuple(user), ModelSettings("m"))
    render("openai_chat", req)
    looked_up: list[Any] = []
    real_get = rendering.FRAGMENTS.get

    def spy(key: Any) -> Any:
        looked_up.append(key)
        return real_get(key)

    rendering.FRAGMENTS.get = spy  # type: ignore[method-assign]
    try:
        grown = attrs.evolve(req, history=(*user, UserTurn("one more")))
        assert render("openai_chat", grown).body == PLAIN["openai_chat"](grown)
    finally:
        del rendering.FRAGMENTS.get
    assert [key[1] for key in looked_up] == [UserTurn("one more")]


def test_kept_prefixes_hold_no_more_than_the_fragment_cache_may() -> None:
    """Each adapter key keeps its last render's prefix; together they stay within the fragment
    cache's budget, the oldest dropped first, and a dropped one only costs the per-item path."""
    big = tuple(UserTurn("x" * 400 + str(i)) for i in range(10))  # ~4.1 KB of element texts
    with fragments(20_000):  # counted twice: the items' own texts stay alive too
        chat = ModelRequest("", (), big, ModelSettings("m"))
        responses = ModelRequest("", (), big[:9], ModelSettings("m"))
        render("openai_chat", chat)
        assert rendering.rendered_prefix(("openai_chat", True, ""), big)[0] == 10
        render("openai_responses", responses)  # 2 x (4.3 + 3.9) KB: both fit
        assert rendering.rendered_prefix(("openai_chat", True, ""), big)[0] == 10
        render("anthropic", ModelRequest("", (), big, ModelSettings("m")))  # one message: nothing final
        other = ModelRequest(
            "", (), tuple(UserTurn("y" * 400 + str(i)) for i in range(10)), ModelSettings("m", None, False)
        )
        render("openai_chat", other)  # a third prefix: the oldest (Chat's first) goes
        assert rendering.rendered_prefix(("openai_chat", True, ""), big) == (0, [], 0)
        assert rendering.rendered_prefix("openai_responses", big)[0] == 9
        for req, kind in ((chat, "openai_chat"), (responses, "openai_responses"), (other, "openai_chat")):
            assert render(kind, req).body == PLAIN[kind](req)
