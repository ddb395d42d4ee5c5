"""``replace(value, **changes)``: a frozen attrs value with some fields changed, at a fraction of
``attrs.evolve``'s cost. The turn machine makes a new state for every provider event (text
deltas come by the thousand), and evolve, which gathers every field into keyword arguments and
runs ``__init__``, was most of a transition's time. Each class gets one generated function that
copies its slots. Only for classes without converters, validators or memo fields (not for a
Message, whose id is a memo of its content): fields are set as given."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import attrs

T = TypeVar("T")

_MISSING: Any = object()
_REPLACERS: dict[type, Callable[..., Any]] = {}


def replacer(cls: type) -> Callable[..., Any]:
    """``cls``'s own replace function (``replacer(C)(value, field=...)``), for a hot path."""
    fn = _REPLACERS.get(cls)
    if fn is None:
        fn = _REPLACERS[cls] = _generate(cls)
    return fn


def _generate(cls: type) -> Callable[..., Any]:
    names = [a.name for a in attrs.fields(cls)]
    params = ", ".join(f"{n}=_M" for n in names)
    lines = "".join(f"    _s(new, {n!r}, v.{n} if {n} is _M else {n})\n" for n in names)
    source = f"def replace(v, *, {params}):\n    new = _new(_cls)\n{lines}    return new\n"
    namespace: dict[str, Any] = {"_M": _MISSING, "_s": object.__setattr__, "_new": object.__new__}
    namespace["_cls"] = cls
    exec(source, namespace)
    return namespace["replace"]  # type: ignore[no-any-return]


def replace(value: T, **changes: Any) -> T:
    return replacer(type(value))(value, **changes)  # type: ignore[no-any-return]
