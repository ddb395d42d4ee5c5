"""Decode one top-level string field of a JSON object while the object is still streaming.

Providers stream a tool call's arguments as JSON text in arbitrary fragments. To show a Write
or StrReplace card filling in while the model is still generating, byok needs the decoded
characters of one field ("contents", "new_string") as soon as they arrive, long before the
object is complete and ``json.loads`` could run.

The scanner is lenient: it never raises. Input that is not a JSON object yields nothing; odd
escapes pass through. Only the first occurrence of the key at the top level counts; the same
key inside a nested object or array is ignored.
"""

from __future__ import annotations

import re

_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX = frozenset("0123456789abcdefABCDEF")
# The next character that ends a plain run inside a string.
_STRING_SPECIAL = re.compile(r'["\\]')

# What the scanner is looking at.
_BEFORE = 0  # before the opening "{"
_OUTSIDE = 1  # inside the object, between tokens
_STRING = 2  # inside a string
_DEAD = 3  # the top level is not an object, or it has ended

# Which string the scanner is inside.
_KEY = 0  # a key of the top-level object: decoded, to know whose value comes next
_TARGET = 1  # the value of our key: decoded and emitted
_SKIP = 2  # any other string: only its end matters


class JsonStringField:
    """``feed(fragment)`` returns the newly decoded characters of ``key``'s string value."""

    def __init__(self, key: str) -> None:
        self._key = key
        self._state = _BEFORE
        self._depth = 0  # object/array nesting; the top-level object is depth 1
        self._expect_key = False  # at depth 1: the next string is a key (after "{" or ",")
        self._last_key: str | None = None
        self._kind = _SKIP
        self._key_buf: list[str] = []
        self._escape: str | None = None  # None, "\\" after a backslash, or "\\u..." so far
        self._high_surrogate: str | None = None  # a decoded \uD800-\uDBFF awaiting its pair
        self._done = False

    @property
    def done(self) -> bool:
        """The value's closing quote has been seen: no more characters will come."""
        return self._done

    def feed(self, fragment: str) -> str:
        out: list[str] = []
        i, n = 0, len(fragment)
        while i < n and self._state != _DEAD:
            if self._state == _STRING:
                i = self._scan_string(fragment, i, out)
            else:
                self._structural(fragment[i])
                i += 1
        return "".join(out)

    # --- outside strings -------------------------------------------------------------------

    def _structural(self, ch: str) -> None:
        if self._state == _BEFORE:
            if ch == "{":
                self._state, self._depth, self._expect_key = _OUTSIDE, 1, True
            elif not ch.isspace():
                self._state = _DEAD
            return
        if ch == '"':
            self._state = _STRING
            if self._depth != 1:
                self._kind = _SKIP
            elif self._expect_key:
                self._kind = _KEY
                self._key_buf = []
            elif self._last_key == self._key and not self._done:
                self._kind = _TARGET
            else:
                self._kind = _SKIP
        elif ch in "{[":
            self._depth += 1
        elif ch in "}]":
            self._depth -= 1
            if self._depth == 0:
                self._state = _DEAD
        elif ch == "," and self._depth == 1:
            self._expect_key = True
        # ":" numbers, literals and whitespace change nothing the scanner tracks.

    # --- inside strings --------------------------------------------------------------------

    def _scan_string(self, s: str, i: int, out: list[str]) -> int:
        """Consume string characters from ``s[i:]``; return where scanning stopped."""
        n = len(s)
        while i < n:
            if self._escape is not None:
                i = self._scan_escape(s, i, out)
                continue
            match = _STRING_SPECIAL.search(s, i)
            end = match.start() if match else n
            if end > i:
                self._emit(s[i:end], out)
                i = end
            if match is None:
                return n
            i += 1
            if match.group() == "\\":
                self._escape = "\\"
            else:
                self._close_string(out)
                return i
        return i

    def _scan_escape(self, s: str, i: int, out: list[str]) -> int:
        assert self._escape is not None
        ch = s[i]
        if self._escape == "\\":
            if ch == "u":
                self._escape = "\\u"
                return i + 1
            self._escape = None
            self._emit(_SIMPLE_ESCAPES.get(ch, ch), out)
            return i + 1
        # Collecting the 4 hex digits of \uXXXX, which may be split across fragments.
        if ch not in _HEX:
            # Malformed: give the text back as it was and rescan this character normally.
            raw, self._escape = self._escape, None
            self._emit(raw, out)
            return i
        self._escape += ch
        if len(self._escape) == 6:
            code, self._escape = int(self._escape[2:], 16), None
            self._emit_code_unit(code, out)
        return i + 1

    def _emit_code_unit(self, code: int, out: list[str]) -> None:
        """One decoded \\uXXXX: pair surrogates like ``json.loads`` does, lone ones pass through."""
        if self._high_surrogate is not None and 0xDC00 <= code <= 0xDFFF:
            high, self._high_surrogate = ord(self._high_surrogate), None
            self._emit(chr(0x10000 + ((high - 0xD800) << 10) + (code - 0xDC00)), out)
        elif 0xD800 <= code <= 0xDBFF:
            self._emit("", out)  # an earlier unpaired high surrogate goes out as it is
            self._high_surrogate = chr(code)
        else:
            self._emit(chr(code), out)

    def _emit(self, text: str, out: list[str]) -> None:
        if self._high_surrogate is not None:
            # Anything but a low-surrogate escape ends the wait for a pair.
            text, self._high_surrogate = self._high_surrogate + text, None
        if not text:
            return
        if self._kind == _TARGET:
            out.append(text)
        elif self._kind == _KEY:
            self._key_buf.append(text)

    def _close_string(self, out: list[str]) -> None:
        self._emit("", out)
        self._state = _OUTSIDE
        if self._depth != 1:
            return
        if self._kind == _KEY:
            self._last_key = "".join(self._key_buf)
            self._expect_key = False
        elif self._kind == _TARGET:
            self._done = True
