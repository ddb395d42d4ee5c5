"""Perturbations of valid provider streams: each provider's noise events (plausible fields, some
holding any JSON) and the edits the parser property applies (drop, dup, swap, insert, set or
delete a field deep in an event, cut the bytes).
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

from tests.fuzz.provider_streams import PARSERS, Turn, sse_wire, turns
from tests.fuzz.support import any_json, args_texts, json_object, small_ints, words

# Chat Completions chunks.
_chat_usage = json_object(
    prompt_tokens=small_ints,
    completion_tokens=small_ints,
    prompt_tokens_details=json_object(cached_tokens=small_ints),
    completion_tokens_details=json_object(reasoning_tokens=small_ints),
    prompt_cache_hit_tokens=small_ints,
)
_chat_tool = json_object(
    index=small_ints,
    id=st.sampled_from(["c1", "c2", ""]),
    type=st.just("function"),
    function=json_object(name=st.sampled_from(["Read", "f", ""]), arguments=args_texts),
)
_chat_choice = json_object(
    index=small_ints,
    delta=json_object(
        role=st.just("assistant"),
        content=words,
        reasoning_content=words,
        reasoning=words,
        refusal=words,
        tool_calls=st.lists(_chat_tool, max_size=2),
    ),
    finish_reason=st.sampled_from(["stop", "tool_calls", "length", "content_filter", "x"]),
)
_chat_chunk = json_object(
    choices=st.lists(_chat_choice, max_size=2),
    usage=_chat_usage,
    error=json_object(
        message=words, code=st.sampled_from([429, 500, "x"]), status_code=st.sampled_from([400, 503])
    ),
)
_chat_noise = st.tuples(
    st.sampled_from([None, None, "error"]), _chat_chunk | st.sampled_from(["[DONE]", "{not json"])
)

# Responses events.
_resp_item = json_object(
    type=st.sampled_from(["message", "function_call", "reasoning", "web_search_call"]),
    id=st.sampled_from(["i1", "i2"]),
    call_id=st.sampled_from(["c1", "c2", ""]),
    name=st.sampled_from(["Read", ""]),
    arguments=args_texts,
    content=st.lists(json_object(type=st.just("output_text"), text=words, refusal=words), max_size=2),
    summary=st.lists(json_object(type=st.just("summary_text"), text=words), max_size=2),
    encrypted_content=words,
    phase=words,
)
_resp_usage = json_object(
    input_tokens=small_ints,
    output_tokens=small_ints,
    input_tokens_details=json_object(cached_tokens=small_ints, cache_write_tokens=small_ints),
    output_tokens_details=json_object(reasoning_tokens=small_ints),
)
_RESP_TYPES = [
    "response.created",
    "response.output_item.added",
    "response.output_item.done",
    "response.output_text.delta",
    "response.refusal.delta",
    "response.reasoning_summary_text.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_part.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.completed",
    "response.failed",
    "response.incomplete",
    "error",
    "response.future_event",
]
_resp_event = json_object(
    {"type": st.sampled_from(_RESP_TYPES)},
    output_index=small_ints,
    item_id=st.sampled_from(["i1", "i2"]),
    item=_resp_item,
    delta=words,
    arguments=args_texts,
    summary_index=small_ints,
    response=json_object(
        usage=_resp_usage,
        error=json_object(code=st.sampled_from(["server_error", "x"]), message=words),
        incomplete_details=json_object(reason=words),
    ),
    error=json_object(code=st.sampled_from(["rate_limit_exceeded", "x"]), message=words),
    code=st.sampled_from(["server_error", "x"]),
    message=words,
)
_resp_noise = st.tuples(
    st.sampled_from([None, "response.completed"]), _resp_event | st.sampled_from(["[DONE]", "{not json"])
)

# Anthropic Messages events.
_an_usage = json_object(
    input_tokens=small_ints,
    output_tokens=small_ints,
    cache_read_input_tokens=small_ints,
    cache_creation_input_tokens=small_ints,
    output_tokens_details=json_object(thinking_tokens=small_ints),
)
_an_event = json_object(
    {
        "type": st.sampled_from(
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
                "ping",
                "error",
                "future_event",
            ]
        )
    },
    index=small_ints,
    content_block=json_object(
        type=st.sampled_from(["text", "thinking", "redacted_thinking", "tool_use", "server_tool_use", "x"]),
        id=st.sampled_from(["t1", "t2", ""]),
        name=st.sampled_from(["Read", ""]),
        text=words,
        thinking=words,
        signature=words,
        data=words,
        input=st.just({}),
    ),
    delta=json_object(
        type=st.sampled_from(
            ["text_delta", "thinking_delta", "signature_delta", "input_json_delta", "citations_delta"]
        ),
        text=words,
        thinking=words,
        signature=words,
        partial_json=args_texts,
        stop_reason=st.sampled_from(
            ["end_turn", "tool_use", "max_tokens", "refusal", "pause_turn", "stop_sequence"]
        ),
    ),
    usage=_an_usage,
    message=json_object(usage=_an_usage),
    error=json_object(type=st.sampled_from(["overloaded_error", "invalid_request_error"]), message=words),
)
_an_noise = st.tuples(st.sampled_from([None, "message_stop"]), _an_event | st.sampled_from(["{not json"]))

_noise = {"openai_chat": _chat_noise, "openai_responses": _resp_noise, "anthropic": _an_noise}


_PATH = st.lists(st.integers(0, 7), min_size=1, max_size=4)


def _perturbations(kind: str) -> st.SearchStrategy[tuple[Any, ...]]:
    at = st.integers(0, 40)  # an event index, taken modulo the stream's length
    return st.one_of(
        st.tuples(st.sampled_from(["drop", "dup"]), at),
        st.tuples(st.just("swap"), at, at),
        st.tuples(st.just("insert"), at, _noise[kind]),
        st.tuples(st.just("set"), at, _PATH, any_json),  # a field deep in an event gets any JSON
        st.tuples(st.just("del"), at, _PATH),
        st.tuples(st.just("cut"), st.integers(0, 3000)),  # the bytes end early
    )


def _edit_field(event: Any, path: list[int], op: str, value: Any) -> Any:
    """``event`` with the field that ``path`` picks replaced by ``value`` (or deleted)."""
    if not isinstance(event, dict | list) or not event:
        return value if op == "set" else event
    node = event
    for depth, step in enumerate(path):
        keys = sorted(node) if isinstance(node, dict) else list(range(len(node)))
        key = keys[step % len(keys)]
        child = node[key]
        if depth + 1 < len(path) and isinstance(child, dict | list) and child:
            node = child
            continue
        if op == "set":
            node[key] = value
        else:
            del node[key]
        break
    return event


def perturbed_wire(events: list[tuple[str | None, Any]], ops: tuple[tuple[Any, ...], ...]) -> bytes:
    events = copy.deepcopy(events)
    cut: int | None = None
    for op in ops:
        n = len(events)
        if op[0] == "cut":
            cut = op[1]
        elif op[0] == "insert":
            events.insert(op[1] % (n + 1), op[2])
        elif not events:
            continue
        elif op[0] == "drop":
            del events[op[1] % n]
        elif op[0] == "dup":
            events.insert(op[1] % n, copy.deepcopy(events[op[1] % n]))
        elif op[0] == "swap":
            i, j = op[1] % n, op[2] % n
            events[i], events[j] = events[j], events[i]
        else:
            name, data = events[op[1] % n]
            events[op[1] % n] = (name, _edit_field(data, op[2], op[0], op[3] if op[0] == "set" else None))
    wire = sse_wire(events)
    return wire if cut is None else wire[: cut % (len(wire) + 1)]


@st.composite
def stream_cases(draw: st.DrawFn) -> tuple[str, Turn, tuple[tuple[Any, ...], ...]]:
    kind = draw(st.sampled_from(sorted(PARSERS)), label="kind")
    turn = draw(turns, label="turn")
    n = draw(st.sampled_from([0, 1, 1, 2, 3]), label="how many perturbations")  # 1 in 5 unperturbed
    ops = draw(st.lists(_perturbations(kind), min_size=n, max_size=n).map(tuple), label="perturbations")
    return kind, turn, ops
