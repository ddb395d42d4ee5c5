"""Is a decoded protobuf message well typed?

betterproto2 decodes by wire type, not by the declared type: a message field sent as a varint
comes back as an int, a string field sent as a varint as an int. Such values blow up far from
the input (AttributeError in a handler, bytes(int) allocating gigabytes on re-encode), so every
message a peer sends is checked once, at the edge, before anything reads it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Any

import betterproto2

_SCALAR: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "bytes": (bytes,),
    "bool": (bool,),
    "double": (float, int),
    "float": (float, int),
}
_INTS = {
    "int32",
    "int64",
    "uint32",
    "uint64",
    "sint32",
    "sint64",
    "fixed32",
    "fixed64",
    "sfixed32",
    "sfixed64",
}
MAX_DEPTH = 64


def _value_ok(proto_type: str, value: Any, depth: int) -> bool:
    if proto_type == "message":
        return isinstance(value, betterproto2.Message) and well_typed(value, depth + 1)
    if proto_type == "enum":
        return isinstance(value, enum.Enum | int) and not isinstance(value, bool)
    if proto_type in _INTS:
        return isinstance(value, int) and not isinstance(value, bool)
    allowed = _SCALAR.get(proto_type)
    return allowed is None or isinstance(value, allowed)


@functools.cache
def _plan(cls: type) -> tuple[tuple[str, str, Any, bool, bool], ...]:
    """(field name, proto type, map meta, repeated, may be None) of each proto field of a message
    class. None means "not set" only for a message, an optional scalar or a oneof member."""
    plan = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("betterproto")
        if meta is not None:
            nullable = bool(
                meta.proto_type == "message" or meta.optional or meta.group or meta.repeated or meta.map_meta
            )
            plan.append((f.name, meta.proto_type, meta.map_meta, meta.repeated, nullable))
    return tuple(plan)


def well_typed(msg: betterproto2.Message, depth: int = 0) -> bool:
    if depth > MAX_DEPTH:
        return False
    for name, proto_type, map_meta, repeated, nullable in _plan(type(msg)):
        value = getattr(msg, name)
        if value is None:
            # betterproto2 stores None for a field sent with a group or invalid wire type (3, 4,
            # 6, 7); a plain scalar field ("" / 0 / False when unset) is never None otherwise.
            if nullable:
                continue
            return False
        if map_meta is not None:
            if not isinstance(value, dict):
                return False
            key_meta, value_meta = map_meta
            for k, v in value.items():
                if not _value_ok(key_meta.proto_type, k, depth) or not _value_ok(
                    value_meta.proto_type, v, depth
                ):
                    return False
            continue
        if repeated:
            if not isinstance(value, list) or not all(_value_ok(proto_type, v, depth) for v in value):
                return False
            continue
        if not _value_ok(proto_type, value, depth):
            return False
    return True
