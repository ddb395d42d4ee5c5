"""Typed, checked access to a parsed TOML table: the reader ``byok.config`` builds its sections with.

Every failure names the file and the key path (``models[1].provider``, indexes 0-based). The
exception is made by the caller's ``make_error`` (``byok.config`` passes ``ConfigError``) so this
module stays below ``byok.config`` instead of importing it back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")

# (source, key path, problem) -> the exception to raise.
MakeError = Callable[[str, str, str], Exception]


def type_name(value: object) -> str:
    # TOML's own vocabulary reads better in an error than Python's.
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    names = {str: "string", float: "float", dict: "table", list: "array"}
    return names.get(type(value), "date/time")


class Table:
    """A TOML table being validated: typed getters that report errors with the key path."""

    def __init__(self, source: str, path: str, data: Mapping[str, object], make_error: MakeError) -> None:
        self.source = source
        self.path = path
        self.data = data
        self.make_error = make_error

    def key_path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str, problem: str) -> Exception:
        return self.make_error(self.source, self.key_path(key), problem)

    def check_keys(self, allowed: tuple[str, ...]) -> None:
        for key in self.data:
            if key not in allowed:
                raise self.error(key, f"unknown key (allowed: {', '.join(allowed)})")

    def _get(self, key: str, required: bool, check: Callable[[object], bool], expected: str) -> object:
        if key not in self.data:
            if required:
                raise self.error(key, "missing required key")
            return None
        value = self.data[key]
        if not check(value):
            raise self.error(key, f"expected {expected}, got {type_name(value)}")
        return value

    def string(self, key: str, *, required: bool = False, nonempty: bool = True) -> str | None:
        value = self._get(key, required, lambda v: isinstance(v, str), "string")
        assert value is None or isinstance(value, str)
        if value is not None and nonempty and not value.strip():
            raise self.error(key, "must not be empty")
        return value

    def integer(self, key: str, *, required: bool = False, minimum: int | None = 1) -> int | None:
        # bool is an int subclass in Python; TOML keeps them apart, so do we.
        value = self._get(key, required, lambda v: isinstance(v, int) and not isinstance(v, bool), "integer")
        assert value is None or isinstance(value, int)
        if value is not None and minimum is not None and value < minimum:
            raise self.error(key, f"must be >= {minimum}, got {value}")
        return value

    def number(self, key: str) -> float | None:
        value = self._get(
            key, False, lambda v: isinstance(v, int | float) and not isinstance(v, bool), "number"
        )
        assert value is None or isinstance(value, int | float)
        if value is not None and not value > 0:
            raise self.error(key, f"must be > 0, got {value}")
        return None if value is None else float(value)

    def boolean(self, key: str) -> bool | None:
        value = self._get(key, False, lambda v: isinstance(v, bool), "boolean")
        assert value is None or isinstance(value, bool)
        return value

    def strings(self, key: str) -> list[str] | None:
        value = self._get(key, False, lambda v: isinstance(v, list), "array of strings")
        assert value is None or isinstance(value, list)
        if value is None:
            return None
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise self.error(f"{key}[{i}]", f"expected string, got {type_name(item)}")
            if not item.strip():
                raise self.error(f"{key}[{i}]", "must not be empty")
        return list(value)

    def tables(self, key: str) -> list[Table]:
        value = self._get(key, False, lambda v: isinstance(v, list), "array of tables")
        assert value is None or isinstance(value, list)
        out = []
        for i, item in enumerate(value or []):
            item_path = f"{self.key_path(key)}[{i}]"
            if not isinstance(item, dict):
                raise self.make_error(self.source, item_path, f"expected table, got {type_name(item)}")
            out.append(Table(self.source, item_path, item, self.make_error))
        return out

    def json_table(self, key: str) -> dict[str, Any]:
        """A table whose values go into a JSON request as they are: nothing JSON cannot hold
        (a date/time, an infinite or NaN float) at any depth."""
        value = self._get(key, False, lambda v: isinstance(v, dict), "table")
        assert value is None or isinstance(value, dict)
        for path, bad in _non_json(value or {}, ""):
            raise self.error(f"{key}{path}", f"{bad} cannot be sent as JSON")
        return dict(value or {})

    def table(self, key: str) -> Table:
        value = self._get(key, False, lambda v: isinstance(v, dict), "table")
        assert value is None or isinstance(value, dict)
        return Table(self.source, self.key_path(key), value or {}, self.make_error)


def _non_json(value: object, path: str) -> Iterator[tuple[str, str]]:
    """(key path, what) of each value in ``value`` that JSON cannot represent."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _non_json(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _non_json(v, f"{path}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        yield path, f"the float {value}"
    elif not isinstance(value, str | int | float | bool):
        yield path, f"a {type_name(value)}"


def pick(value: T | None, default: T) -> T:
    return default if value is None else value


def check_url(table: Table, key: str, url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise table.error(key, f"expected an http(s) URL, got {url!r}")
    return url.rstrip("/")


def check_port(table: Table, key: str, port: int | None) -> int | None:
    # 0 means "any free port": the test harness and `byok serve --port 0` rely on it.
    if port is not None and not 0 <= port <= 65535:
        raise table.error(key, f"port must be between 0 and 65535, got {port}")
    return port
