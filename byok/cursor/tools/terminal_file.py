"""A backgrounded shell's terminal file, read as it grows (sans-IO: bytes in, state out).

Cursor keeps the output of a shell it moved to the background in
``<RequestContextEnv.terminals_folder>/<shell_id>.txt``: a YAML-ish header between ``---``
lines (pid, cwd, command, ...), the output, and, once the command ended, a footer block
``---`` / ``exit_code: N`` (or ``error: ...``) / ``elapsed_ms: N`` / ``ended_at: ...`` / ``---``.
``TerminalTail`` is fed what the file gained since the last read and says what the waiting
AwaitShell needs: whether it ended (and how), whether the pattern matched, and the end of the
output.

Memory stays bounded however long the log: the pattern is searched in the last
``SCAN_LIMIT`` characters of output (each new piece with an overlap, so a match across two
reads is found), and the model sees the last ``TAIL_LIMIT`` bytes.
"""

from __future__ import annotations

import codecs
import re

import attrs

SCAN_LIMIT = 1 << 20  # characters of output kept for the pattern
TAIL_LIMIT = 16 * 1024  # bytes of output the model sees (the reference server's cap)
_OVERLAP = 4096  # characters searched again with each new piece: a match across two reads
_FOOTER_MAX = 4096  # a footer is short; a longer "block" at the end is output
_FOOTER = re.compile(
    rb"\n---\n(?:exit_code: (?P<code>-?\d+|unknown)|error: (?P<error>[^\n]*))\n"
    rb"(?:elapsed_ms: (?P<elapsed>\d+)\n)?ended_at: [^\n]*\n---\n\Z"
)


@attrs.frozen
class TerminalView:
    """What a read of the terminal file found."""

    output_length: int  # bytes of output (header and footer excluded) seen so far
    tail: str  # the end of the output, at most TAIL_LIMIT bytes of it
    omitted: int  # bytes of output before ``tail``
    ended: bool  # the footer is there: the command is over
    exit_code: int | None = None  # from the footer ("unknown": None)
    error: str = ""  # the footer's error line, when the command could not run
    elapsed_ms: int | None = None
    match: str | None = None  # the first text the pattern matched


# The footer's lines after its "---", in order: (a line that fits, the lines that may follow it).
_FOOTER_LINES: dict[str, tuple[re.Pattern[bytes], tuple[str, ...]]] = {
    "code": (re.compile(rb"exit_code: (?:-?\d+|unknown)|error: .*"), ("elapsed", "ended")),
    "elapsed": (re.compile(rb"elapsed_ms: \d+"), ("ended",)),
    "ended": (re.compile(rb"ended_at: .*"), ("close",)),
    "close": (re.compile(rb"---"), ()),
}
_STARTS = {"code": (b"exit_code: ", b"error: "), "elapsed": (b"elapsed_ms: ",), "ended": (b"ended_at: ",)}


def _footer_prefix(rest: bytes) -> bool:
    """Whether ``rest`` (what follows a "\\n---\\n") may be the start of a footer's lines."""
    *complete, partial = rest.split(b"\n")
    allowed: tuple[str, ...] = ("code",)
    for line in complete:
        kind = next((k for k in allowed if _FOOTER_LINES[k][0].fullmatch(line)), None)
        if kind is None:
            return False
        allowed = _FOOTER_LINES[kind][1]
    if not partial:
        return bool(allowed)
    for kind in allowed:
        for start in _STARTS.get(kind, (b"---",)):
            if start.startswith(partial) or partial.startswith(start):
                return True
    return False


class TerminalTail:
    def __init__(self, pattern: re.Pattern[str] | None) -> None:
        self._pattern = pattern
        self.reset()

    def reset(self) -> None:
        """Start over (the file was rewritten from its start)."""
        self.offset = 0  # bytes of the file consumed
        self._raw = bytearray()  # bytes not decoded yet, or held back as a possible footer
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._header_open: bool | None = None  # None: not known yet (the file's first bytes)
        self._text = ""  # the last SCAN_LIMIT characters of output
        self._scanned = 0  # characters of _text already searched
        self._tail = bytearray()  # the last TAIL_LIMIT bytes of output
        self._length = 0
        self._footer: re.Match[bytes] | None = None
        self.match: str | None = None

    def start_at(self, offset: int) -> None:
        """Reading starts at ``offset`` (a long file: only its end matters): no header there."""
        self.offset = offset
        self._header_open = False

    def feed(self, data: bytes) -> None:
        """The bytes the file gained after ``offset``."""
        self.offset += len(data)
        self._raw += data
        if self._header_open is None:
            if len(self._raw) < 4 and b"---\n".startswith(bytes(self._raw)):
                return  # too few bytes to know
            self._header_open = self._raw.startswith(b"---\n")
            if self._header_open:
                del self._raw[:4]
        if self._header_open:
            end = self._raw.find(b"\n---\n")
            if end < 0:
                return  # still in the header
            del self._raw[: end + 5]
            self._header_open = False
        end = bytes(self._raw[-_FOOTER_MAX:])
        self._footer = _FOOTER.search(end)
        if self._footer is not None:  # the command is over: all before the footer is output
            self._output(bytes(self._raw[: len(self._raw) - len(end) + self._footer.start()]))
            self._raw.clear()
            return
        # A footer may be arriving: keep the last bytes back until they cannot be one.
        keep = self._held_back()
        self._output(bytes(self._raw[: len(self._raw) - keep]))
        del self._raw[: len(self._raw) - keep]

    def _held_back(self) -> int:
        """How many trailing bytes may still turn out to be a footer (from its "\\n---\\n"); a
        "---" line of the output followed by anything a footer cannot hold is output at once."""
        at = self._raw.rfind(b"\n---\n", max(0, len(self._raw) - _FOOTER_MAX))
        if at >= 0 and _footer_prefix(bytes(self._raw[at + 5 :])):
            return len(self._raw) - at
        for n in (5, 4, 3, 2, 1):  # a partial "\n---\n" at the very end
            if self._raw.endswith(b"\n---\n"[:n]):
                return n
        return 0

    def _output(self, data: bytes) -> None:
        if not data:
            return
        self._length += len(data)
        self._tail += data
        if len(self._tail) > 2 * TAIL_LIMIT:
            del self._tail[: len(self._tail) - TAIL_LIMIT]
        text = self._decoder.decode(data)
        self._text += text
        if len(self._text) > SCAN_LIMIT:
            cut = len(self._text) - SCAN_LIMIT
            self._text = self._text[cut:]
            self._scanned = max(0, self._scanned - cut)
        if self._pattern is not None and self.match is None:
            start = max(0, self._scanned - _OVERLAP)
            found = self._pattern.search(self._text, start)
            if found is not None:
                self.match = found.group(0)
            self._scanned = len(self._text)

    def view(self) -> TerminalView:
        # Bytes held back as a possible footer are output until a footer completes them.
        held = bytes(self._raw) if self._header_open is False else b""
        tail = bytes((self._tail + held)[-TAIL_LIMIT:])
        length = self._length + len(held)
        footer = self._footer
        code = error = elapsed = None
        if footer is not None:
            raw_code = footer.group("code")
            code = int(raw_code) if raw_code not in (None, b"unknown") else None
            error = footer.group("error")
            elapsed = footer.group("elapsed")
        return TerminalView(
            output_length=length,
            tail=tail.decode("utf-8", errors="replace").lstrip("\ufffd"),
            omitted=length - len(tail),
            ended=footer is not None,
            exit_code=code,
            error="" if error is None else error.decode("utf-8", errors="replace"),
            elapsed_ms=None if elapsed is None else int(elapsed),
            match=self.match,
        )
