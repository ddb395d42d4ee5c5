"""Sans-IO Server-Sent Events decoder (WHATWG "event stream" interpretation).

Bytes in, ``SSEEvent`` values out. Line endings may be ``\\n``, ``\\r\\n`` or ``\\r`` and
may be split across ``feed`` calls. Work is done per line, never per byte, because this
sits on the hot path of every streamed token.
"""

from __future__ import annotations

import attrs

from byok.model.events import ModelEvent, ProviderError


@attrs.frozen
class SSEEvent:
    event: str  # "message" when the stream gave no ``event:`` line, as the spec says
    data: str  # ``data:`` lines joined with "\n"


class SSEDecoder:
    def __init__(self) -> None:
        # Bytes of the unterminated last line, kept as parts so that a long line arriving
        # in many small chunks is joined once, not re-copied on every feed.
        self._parts: list[bytes] = []
        self._cr = False  # a "\r" ended the last chunk: it may be the first half of "\r\n"
        self._data: list[str] = []
        self._event = ""
        self._fields = False  # a field line was seen since the last blank line
        self._first = True  # strip a UTF-8 BOM from the very first line only

    @property
    def has_partial(self) -> bool:
        """True when bytes of an undispatched event are pending; after ``end`` this means
        the stream was cut mid-event (the spec discards such an event)."""
        return self._fields or any(self._parts)

    def feed(self, data: bytes) -> list[SSEEvent]:
        if not self._cr and b"\n" not in data and b"\r" not in data:
            if data:
                self._parts.append(data)
            return []
        if self._cr:
            data = b"\r" + data
        if self._parts:
            data = b"".join(self._parts) + data
        self._cr = data.endswith(b"\r")
        if self._cr:
            data = data[:-1]
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        nl = data.rfind(b"\n")
        rest = data[nl + 1 :]
        self._parts = [rest] if rest else []
        if nl < 0:
            return []
        # Line breaks are ASCII, so everything before the last one is whole UTF-8.
        return self._lines(data[:nl].decode("utf-8", "replace").split("\n"))

    def end(self) -> list[SSEEvent]:
        """Call at EOF. A held "\\r" still terminates its line; an event without its
        closing blank line is discarded (see ``has_partial``)."""
        if not self._cr:
            return []
        line = b"".join(self._parts)
        self._parts, self._cr = [], False
        return self._lines([line.decode("utf-8", "replace")])

    def _lines(self, lines: list[str]) -> list[SSEEvent]:
        out: list[SSEEvent] = []
        if self._first and lines:
            self._first = False
            if lines[0].startswith("\ufeff"):
                lines[0] = lines[0][1:]
        for line in lines:
            if not line:
                if self._data:
                    out.append(SSEEvent(self._event or "message", "\n".join(self._data)))
                    self._data = []
                self._event = ""
                self._fields = False
                continue
            if line[0] == ":":
                continue  # comment / keep-alive
            field, _, value = line.partition(":")
            if value[:1] == " ":
                value = value[1:]
            self._fields = True
            if field == "data":
                self._data.append(value)
            elif field == "event":
                self._event = value
            # "id" and "retry" only matter to auto-reconnecting clients; we never reconnect.
        return out


class SSEStreamParser:
    """The frame the three stream parsers share: SSE decoding, and any field of the wrong JSON
    type deep in an event turned into a ProviderError (the stream is unusable, and the run must
    fail as a provider error, not as an internal one). Subclasses implement ``_handle`` and
    their own ``end`` on top of ``_drain_end``."""

    label = "provider"

    def __init__(self) -> None:
        self._sse = SSEDecoder()

    def feed(self, data: bytes) -> list[ModelEvent]:
        out: list[ModelEvent] = []
        for ev in self._sse.feed(data):
            self._event(ev, out)
        return out

    def _drain_end(self) -> list[ModelEvent]:
        out: list[ModelEvent] = []
        for ev in self._sse.end():
            self._event(ev, out)
        return out

    def _event(self, ev: SSEEvent, out: list[ModelEvent]) -> None:
        try:
            self._handle(ev, out)
        except (AttributeError, TypeError, KeyError, IndexError, ValueError) as e:
            raise ProviderError(f"malformed {self.label} stream event: {type(e).__name__}: {e}") from None

    def _handle(self, ev: SSEEvent, out: list[ModelEvent]) -> None:
        raise NotImplementedError
