"""Protobuf bytes -> betterproto2 messages, decoded the way ``Message.parse`` decodes them, at
a fraction of the cost for what Cursor sends byok.

betterproto2 reads every varint a byte at a time from a ``BytesIO`` and copies each
length-delimited field twice (the read, and the raw bytes it keeps beside it) at every level of
nesting: a 2.2 MB Read result, four levels deep, was nine copies of its text (1.0 ms warm, 12.7 ms
when the heap's pages had been handed back and were faulted in again). Here a field is a pair of
offsets into the one buffer until its value is made: a string is decoded once from a view, a
submessage is decoded in place.

The result is the message ``cls.parse(data)`` returns, field for field and unknown field for
unknown field, and this raises where it raises (property-tested against it, tests/unit/
test_proto_decode.py): its quirks are kept, as callers check what it gives (``well_typed``).
A truncated tag ends the message; a truncated length-delimited value is cut short; a group or
an invalid wire type has no payload and leaves ``None``; a value of the wrong wire type is kept
as read.
"""

from __future__ import annotations

import functools
import inspect
import sys
import typing
from collections.abc import Iterable
from types import ModuleType
from typing import Any, TypeVar

import betterproto2
from betterproto2 import PACKED_TYPES, TYPE_MAP, TYPE_MESSAGE, TYPE_STRING

M = TypeVar("M", bound=betterproto2.Message)

_PACKED = frozenset(PACKED_TYPES)
_FIXED_32 = frozenset((betterproto2.TYPE_FLOAT, betterproto2.TYPE_FIXED32, betterproto2.TYPE_SFIXED32))
_FIXED_64 = frozenset((betterproto2.TYPE_DOUBLE, betterproto2.TYPE_FIXED64, betterproto2.TYPE_SFIXED64))
_MAX_VARINT_BYTES = 10  # betterproto2's limit: a varint needing an 11th byte is an error


class Truncated(ValueError):
    """A varint ran past the end of its message (betterproto2's EOFError)."""


def parse(cls: type[M], data: bytes | bytearray | memoryview) -> M:
    """``cls.parse(data)``, without its copies. Raises ValueError (or a subclass) where that
    raises; the message is not checked beyond what it checks (see ``well_typed``)."""
    buf = bytes(data)
    try:
        return _message(cls, buf, memoryview(buf), 0, len(buf))
    except Truncated:
        raise ValueError("varint runs past the end of its message") from None
    except (OverflowError, RecursionError) as e:
        raise ValueError(str(e)) from None


def varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` in ``buf[:end]`` and the position after it. Raises Truncated when
    it runs past ``end``, ValueError when it needs more than ten bytes."""
    result = shift = 0
    for _ in range(_MAX_VARINT_BYTES):
        if pos >= end:
            raise Truncated
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
    raise ValueError("Too many bytes when decoding varint.")


@functools.cache
def _fields(cls: type) -> tuple[dict[int, tuple[str, Any, Any]], bool]:
    """Per class: field number -> (name, metadata, class of a message or map entry value), and
    whether the class is a pydantic dataclass (betterproto2 validates those after a parse)."""
    meta = cls._betterproto  # type: ignore[attr-defined]
    by_number = {}
    for number, name in meta.field_name_by_number.items():
        fmeta = meta.meta_by_field_name[name]
        sub = meta.cls_by_field.get(name) if fmeta.proto_type in (TYPE_MESSAGE, TYPE_MAP) else None
        by_number[number] = (name, fmeta, sub)
    return by_number, cls()._is_pydantic()


def _message(cls: type[M], buf: bytes, view: memoryview, pos: int, end: int) -> M:
    msg = cls()
    by_number, pydantic = _fields(cls)
    unknown: list[bytes] = []
    while pos < end:
        start = pos
        key = buf[pos]
        if key < 0x80:
            pos += 1
        else:
            try:
                key, pos = varint(buf, pos, end)
            except Truncated:
                break  # a tag cut short ends the message, as in betterproto2
        wire = key & 7
        value: Any = None
        if wire == 0:
            value, pos = varint(buf, pos, end)
        elif wire == 2:
            length, pos = varint(buf, pos, end)
            if length > sys.maxsize:  # betterproto2's read(length) raises OverflowError
                raise ValueError(f"length {length} does not fit an index")
            vend = min(pos + length, end)
            value = (pos, vend)
            pos = vend
        elif wire == 1 or wire == 5:
            vend = min(pos + (8 if wire == 1 else 4), end)
            value = bytes(view[pos:vend])
            pos = vend
        field = by_number.get(key >> 3)
        if field is None:
            unknown.append(bytes(view[start:pos]))
            continue
        name, fmeta, sub = field
        proto_type = fmeta.proto_type
        if wire == 2:
            a, b = value
            if proto_type in _PACKED:
                values = _packed(msg, fmeta, name, buf, view, a, b)
                if fmeta.repeated:
                    getattr(msg, name).extend(values)
                else:
                    setattr(msg, name, values)
                continue
            value = _delimited(fmeta, sub, buf, view, a, b)
        elif wire in (0, 1, 5):  # groups and invalid wire types keep None, as in betterproto2
            value = msg._postprocess_single(wire, fmeta, name, value)
        if proto_type == TYPE_MAP:
            if not isinstance(value, betterproto2.Message):  # betterproto2: AttributeError
                raise ValueError(f"map field {name} is not length-delimited")
            getattr(msg, name)[value.key] = value.value
        elif fmeta.repeated:
            getattr(msg, name).append(value)
        else:
            setattr(msg, name, value)
    if unknown:
        msg._unknown_fields = b"".join(unknown)
    if pydantic:
        msg._validate()
    return msg


def _delimited(fmeta: Any, sub: Any, buf: bytes, view: memoryview, a: int, b: int) -> Any:
    proto_type = fmeta.proto_type
    if proto_type == TYPE_STRING:
        return str(view[a:b], "utf-8")
    if proto_type == TYPE_MESSAGE and fmeta.unwrap:
        return _message(fmeta.unwrap(), buf, view, a, b).to_wrapped()
    if sub is not None:  # a message, or a map's entry
        return _message(sub, buf, view, a, b)
    return bytes(view[a:b])


def _packed(msg: Any, fmeta: Any, name: str, buf: bytes, view: memoryview, a: int, b: int) -> list[Any]:
    """A packed repeated scalar, element by element as betterproto2 reads it (a short last
    fixed-width element reaches struct.unpack and raises there)."""
    proto_type = fmeta.proto_type
    out: list[Any] = []
    pos = a
    while pos < b:
        if proto_type in _FIXED_32 or proto_type in _FIXED_64:
            step = 4 if proto_type in _FIXED_32 else 8
            wire = 5 if step == 4 else 1
            raw: Any = bytes(view[pos : min(pos + step, b)])
            pos += step
        else:
            wire = 0
            raw, pos = varint(buf, pos, b)
        out.append(msg._postprocess_single(wire, fmeta, name, raw))
    return out


def prime(modules: Iterable[ModuleType]) -> int:
    """Build betterproto2's metadata of every message class in ``modules`` now, and this module's
    field tables; returns how many classes. betterproto2 builds a class's metadata on its first
    use and resolves all of the class's type hints once per field: the 729 classes of byok/pb
    took 282 ms that way (the first run_request alone 47 ms, on its turn's path); with each
    class's hints resolved once, 45 ms, here, at startup."""
    count = 0
    for module in modules:
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if not issubclass(cls, betterproto2.Message) or cls.__module__ != module.__name__:
                continue
            if "_betterproto_meta" not in cls.__dict__:
                hints = typing.get_type_hints(cls, sys.modules[cls.__module__].__dict__, {})
                cls._type_hints = classmethod(lambda _cls, hints=hints: hints)  # type: ignore[attr-defined]
                try:
                    cls._betterproto_meta = betterproto2.ProtoClassMetadata(cls)  # type: ignore[attr-defined]
                finally:
                    del cls._type_hints  # type: ignore[attr-defined]
            _fields(cls)
            count += 1
    return count
