"""Fuzzing: arbitrary bytes and structures into every parser a peer can reach.

This module holds what the fuzz modules (tests/fuzz/test_fuzz_*.py) share: the ``fuzz(n)``
settings, the known-bugs filter, and the strategies and helpers several of them use.

The contract under test: a bad input ends in the module's declared error value (ProtocolError,
ProviderError, RootJsonError, EditError, RunRequestError, StaleRevision...), never in another
exception, a hang or a corrupted store; a good input gives the same answer however it is
chunked. Each ``@fuzz(n)`` target runs ``n`` examples in ``make test`` and
``BYOK_FUZZ_EXAMPLES`` examples in ``make fuzz`` (see tests/fuzz/conftest.py, docs/fuzzing.md).

Known bugs: a generic property that would keep tripping over a bug already reported may let
exactly that failure (exception type + byok file + function, ``KNOWN_BUGS``) through while a
strict xfail test pins the bug with a minimal input. When the bug is fixed the xfail starts
passing, strict mode fails it, and both the xfail and its ``KNOWN_BUGS`` entry go. The bugs
found so far are fixed; their minimal inputs stay in the test modules as regression tests.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Any

import betterproto2
from hypothesis import settings
from hypothesis import strategies as st

import byok
from byok.model.messages import Message, ReplayState, ToolCall

_PROFILE = settings.get_profile("byok-fuzz")  # registered by tests/fuzz/conftest.py
_LONG = bool(os.environ.get("BYOK_FUZZ_EXAMPLES"))


def fuzz(ci_examples: int) -> settings:
    """The profile, with ``ci_examples`` examples unless a long run set its own count."""
    return settings(_PROFILE, max_examples=_PROFILE.max_examples if _LONG else ci_examples)


# --- known bugs ------------------------------------------------------------------------------------

_BYOK_DIR = str(Path(byok.__file__).resolve().parent)

# (exception type, byok file, function) of failures already pinned by a strict xfail.
# Empty: every bug these properties found so far is fixed (see docs/fuzzing.md).
KNOWN_BUGS: frozenset[tuple[str, str, str]] = frozenset()


def _site(e: BaseException) -> tuple[str, str, str]:
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if str(Path(f.filename).resolve()).startswith(_BYOK_DIR)]
    f = (ours or frames)[-1]
    return (type(e).__name__, Path(f.filename).name, f.name)


def known_bug(e: BaseException) -> bool:
    return isinstance(e, Exception) and _site(e) in KNOWN_BUGS


# --- shared strategies -----------------------------------------------------------------------------

texts = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=20)


def split(data: Any, cuts: list[int]) -> list[Any]:
    """``data`` cut at the given offsets (clamped, sorted): the pieces concatenate back to it."""
    points = sorted({min(max(c, 0), len(data)) for c in cuts})
    pieces, last = [], 0
    for p in [*points, len(data)]:
        pieces.append(data[last:p])
        last = p
    return pieces


cut_offsets = st.lists(st.integers(0, 400), max_size=8)

# JSON of any shape (for "the field is there but has the wrong type").
any_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4),
    lambda c: st.lists(c, max_size=2) | st.dictionaries(st.text(max_size=3), c, max_size=2),
    max_leaves=6,
)


def json_object(required: dict[str, Any] | None = None, **optional: Any) -> st.SearchStrategy[dict[str, Any]]:
    """A JSON object whose fields each hold a plausible value or, sometimes, any JSON at all."""
    return st.fixed_dictionaries(
        {k: s | any_json for k, s in (required or {}).items()},
        optional={k: s | any_json for k, s in optional.items()},
    )


small_ints = st.integers(0, 2)
words = st.sampled_from(["", "a", "b c", "\n", "é", "😀"])
args_texts = st.sampled_from(["", "{", '{"path"', ':"a"}', "{}", '{"a":1}', "]"])


# --- well-typed protobuf messages (BidiAppend data, AgentClientMessage handling) -------------------

_INT_RANGES = {
    "int32": (-(2**31), 2**31 - 1),
    "sint32": (-(2**31), 2**31 - 1),
    "sfixed32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "fixed32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "sint64": (-(2**63), 2**63 - 1),
    "sfixed64": (-(2**63), 2**63 - 1),
    "uint64": (0, 2**64 - 1),
    "fixed64": (0, 2**64 - 1),
}


def _scalar(proto_type: str, cls: Any) -> st.SearchStrategy[Any]:
    if proto_type == "string":
        return st.text(max_size=12)
    if proto_type == "bytes":
        return st.binary(max_size=12)
    if proto_type == "bool":
        return st.booleans()
    if proto_type in _INT_RANGES:
        lo, hi = _INT_RANGES[proto_type]
        return st.integers(0, 3) | st.integers(lo, hi)
    if proto_type in ("float", "double"):
        return st.floats(allow_nan=False, width=32 if proto_type == "float" else 64)
    if proto_type == "enum":
        return st.sampled_from(list(cls))
    raise NotImplementedError(proto_type)


_PROTO_CACHE: dict[tuple[type, int], st.SearchStrategy[Any]] = {}


def protos(cls: type[betterproto2.Message], depth: int = 3) -> st.SearchStrategy[Any]:
    """Well-typed messages of ``cls`` with any subset of fields set (one variant per oneof)."""
    key = (cls, depth)
    if key in _PROTO_CACHE:
        return _PROTO_CACHE[key]
    info = cls()._betterproto
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for name, meta in info.meta_by_field_name.items():
        if meta.map_meta is not None:
            continue
        fcls = info.cls_by_field[name]
        if meta.proto_type == "message":
            if depth <= 0:
                continue
            s = st.deferred(lambda fcls=fcls: protos(fcls, depth - 1))
        else:
            s = _scalar(meta.proto_type, fcls)
        fields[name] = st.lists(s, max_size=2) if meta.repeated else s
    groups: dict[str, list[str]] = {}
    for name in fields:
        group = info.meta_by_field_name[name].group
        if group:
            groups.setdefault(group, []).append(name)
    plain = {k: v for k, v in fields.items() if not info.meta_by_field_name[k].group}

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        kw = draw(st.fixed_dictionaries({}, optional=plain))
        for names in groups.values():
            pick = draw(st.none() | st.sampled_from(names))
            if pick is not None:
                kw[pick] = draw(fields[pick])
        return cls(**kw)

    _PROTO_CACHE[key] = build()
    return _PROTO_CACHE[key]


# --- byok Messages (blob graph, store) -------------------------------------------------------------

short_ids = st.text(alphabet="abc-_:01", max_size=6)
_calls = st.lists(
    st.builds(
        ToolCall,
        call_id=short_ids.filter(bool),
        name=short_ids.filter(bool),
        arguments=texts,
        index=st.integers(0, 5),
    ),
    max_size=2,
    unique_by=lambda c: c.call_id,
).map(tuple)
model_messages = st.one_of(
    st.builds(
        Message,
        role=st.just("user"),
        origin=st.sampled_from(["user", "runtime"]),
        text=texts,
        event_id=short_ids,
    ),
    st.builds(
        Message,
        role=st.just("assistant"),
        origin=st.just("assistant"),
        text=texts,
        thinking=texts,
        replay=st.none()
        | st.builds(ReplayState, provider_kind=st.sampled_from(["anthropic", "x"]), data=texts),
        tool_calls=_calls,
        tool_round_id=short_ids,
        model_call_id=short_ids,
    ),
    st.builds(
        Message,
        role=st.just("tool"),
        origin=st.just("tool"),
        text=texts,
        tool_call_id=short_ids.filter(bool),
        tool_name=short_ids,
        is_error=st.booleans(),
        tool_round_id=short_ids,
        completion_seq=st.integers(0, 3),
    ),
)
