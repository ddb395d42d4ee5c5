"""proto_decode.parse against betterproto2's Message.parse: the same message (unknown fields
included) or an error for the same input, over arbitrary bytes and over wire streams built from
each class's own fields, with right and wrong wire types, nesting, truncation and packing."""

from __future__ import annotations

import struct
import subprocess
import sys
from typing import Any

import betterproto2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from byok.cursor import proto_decode
from byok.cursor.encode import varint
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver

CLASSES: tuple[type[betterproto2.Message], ...] = (
    agent.AgentClientMessage,
    aiserver.BidiAppendRequest,
    aiserver.BidiRequestId,
    agent.ConversationTurnStructure,
    agent.ConversationStateStructure,  # maps, enums, repeated bytes
    agent.ShellCommandParsingResultRedirect,  # packed uint32
    agent.ReadTodosArgs,  # packed enum
    agent.AwaitTaskComplete,  # sint32, uint64
    agent.CodeResult,  # float
)


def outcome(parse: Any, cls: type[betterproto2.Message], data: bytes) -> Any:
    try:
        return parse(cls, data)
    except Exception:
        return "error"


def reference(cls: type[betterproto2.Message], data: bytes) -> Any:
    return cls.parse(data)


def same(a: Any, b: Any) -> bool:
    """Equal values, field by field, with unknown fields (Message.__eq__ skips those) and NaN
    equal to NaN inside lists too (where Message.__eq__ tells two NaNs apart)."""
    if isinstance(a, betterproto2.Message):
        if type(a) is not type(b) or a._unknown_fields != b._unknown_fields:
            return False
        return all(same(getattr(a, f), getattr(b, f)) for f in a._betterproto.meta_by_field_name)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and (a == b or (a != a and b != b))  # NaN equals NaN here


def check(cls: type[betterproto2.Message], data: bytes) -> None:
    want = outcome(reference, cls, data)
    got = outcome(proto_decode.parse, cls, data)
    if want == "error" or got == "error":
        assert want == got, (want, got)
    else:
        assert same(got, want), (got, want)


_RIGHT_WIRE = {
    "double": 1,
    "fixed64": 1,
    "sfixed64": 1,
    "float": 5,
    "fixed32": 5,
    "sfixed32": 5,
    "string": 2,
    "bytes": 2,
    "message": 2,
    "map": 2,
}


@st.composite
def wire_stream(draw: st.DrawFn, cls: type[betterproto2.Message], depth: int = 0) -> bytes:
    """Fields of ``cls`` (and a few unknown numbers), mostly with the wire type their type has."""
    meta = cls._betterproto
    numbers = sorted(meta.field_name_by_number)
    out = bytearray()
    for _ in range(draw(st.integers(0, 5))):
        number = draw(st.sampled_from([*numbers, 0, 1000, 2**29 - 1]) if numbers else st.just(1000))
        name = meta.field_name_by_number.get(number)
        fmeta = meta.meta_by_field_name[name] if name else None
        right = _RIGHT_WIRE.get(fmeta.proto_type, 0) if fmeta else 0
        if fmeta is not None and fmeta.repeated and fmeta.proto_type in betterproto2.PACKED_TYPES:
            right = draw(st.sampled_from([right, 2]))  # packed or one at a time
        wire = draw(st.sampled_from([right] * 6 + [0, 1, 2, 3, 4, 5, 6, 7]))
        out += varint(number << 3 | wire)
        if wire == 0:
            out += varint(draw(st.integers(0, 2**70 - 1)))
        elif wire in (1, 5):
            out += draw(st.binary(min_size=8 if wire == 1 else 4, max_size=8 if wire == 1 else 4))
        elif wire == 2:
            payload = draw(_payload(cls, name, fmeta, depth))
            out += varint(len(payload)) + payload
    cut = draw(st.sampled_from([None] * 5 + ["cut"]))
    if cut and out:
        out = out[: draw(st.integers(0, len(out) - 1))]
    return bytes(out)


@st.composite
def _payload(draw: st.DrawFn, cls: Any, name: str | None, fmeta: Any, depth: int) -> bytes:
    kind = fmeta.proto_type if fmeta is not None else "bytes"
    if kind in ("message", "map") and depth < 4 and draw(st.booleans() | st.just(True)):
        sub = cls._betterproto.cls_by_field[name]
        return draw(wire_stream(sub, depth + 1))
    if kind == "string":
        return draw(st.text(max_size=40).map(str.encode) | st.binary(max_size=8))
    if kind in betterproto2.PACKED_TYPES:
        if kind in ("float", "fixed32", "sfixed32"):
            return b"".join(
                struct.pack("<I", v) for v in draw(st.lists(st.integers(0, 2**32 - 1), max_size=4))
            )
        if kind in ("double", "fixed64", "sfixed64"):
            return b"".join(
                struct.pack("<Q", v) for v in draw(st.lists(st.integers(0, 2**64 - 1), max_size=4))
            )
        body = b"".join(varint(v) for v in draw(st.lists(st.integers(0, 2**64 - 1), max_size=4)))
        return body[: draw(st.integers(0, len(body)))] if draw(st.booleans()) else body
    return draw(st.binary(max_size=24))


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_structured_streams_decode_as_betterproto2_does(
    cls: type[betterproto2.Message], data: st.DataObject
) -> None:
    check(cls, data.draw(wire_stream(cls)))


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=64))
def test_arbitrary_bytes_decode_as_betterproto2_does(cls: type[betterproto2.Message], data: bytes) -> None:
    check(cls, data)


def test_a_large_read_result_decodes_equal_and_varints_at_their_limits() -> None:
    text = "".join(f"line {i}\n" for i in range(20_000))
    msg = agent.AgentClientMessage(
        exec_client_message=agent.ExecClientMessage(
            id=7,
            exec_id="call_big",
            read_result=agent.ReadResult(
                success=agent.ReadSuccess(path="big.txt", content=text, total_lines=20_000)
            ),
        )
    )
    check(agent.AgentClientMessage, bytes(msg))
    assert proto_decode.parse(agent.AgentClientMessage, bytes(msg)) == msg
    ten = b"\x08" + b"\xff" * 9 + b"\x01"  # a 10-byte varint: read; an 11th byte: an error
    check(aiserver.BidiAppendRequest, ten)
    check(aiserver.BidiAppendRequest, b"\x08" + b"\xff" * 10 + b"\x01")
    check(aiserver.BidiAppendRequest, b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01")  # huge length
    with pytest.raises(ValueError):
        proto_decode.parse(aiserver.BidiAppendRequest, b"\x18\xff")  # a value varint cut short


_PRIME_CHECK = """
import dataclasses, sys
import betterproto2
from byok.cursor import proto_decode
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver

def shape(value):
    if isinstance(value, type) and value.__name__ == "Entry":  # a map's entry class, made per build
        return [(f.name, f.type, dict(f.metadata)) for f in dataclasses.fields(value)]
    return value

def shapes(meta):
    return {k: shape(v) for k, v in meta.cls_by_field.items()}

NAMES = ("field_name_by_number", "meta_by_field_name", "sorted_field_names", "oneof_field_by_group")
NAMES += ("default_gen",)
primed = proto_decode.prime([agent, aiserver])
bad = []
for module in (agent, aiserver):
    for cls in vars(module).values():
        if not (isinstance(cls, type) and issubclass(cls, betterproto2.Message)):
            continue
        if cls.__module__ != module.__name__:
            continue
        got, want = cls.__dict__["_betterproto_meta"], betterproto2.ProtoClassMetadata(cls)
        for name in NAMES:
            if getattr(got, name) != getattr(want, name):
                bad.append((cls.__name__, name))
        if shapes(got) != shapes(want):
            bad.append((cls.__name__, "cls_by_field"))
print(primed, bad)
sys.exit(1 if bad or primed < 700 else 0)
"""


def test_prime_builds_the_metadata_betterproto2_builds() -> None:
    """In a fresh interpreter (this one's classes may have built theirs already): every class's
    primed metadata equals what betterproto2 builds for it on first use."""
    done = subprocess.run([sys.executable, "-c", _PRIME_CHECK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
