"""Pure text helpers for the edit tools: newline normalisation, unique replacement, diffs.

Text is LF-normalised everywhere: what the model reads, what it matches against and what byok
writes back. A CRLF file is therefore matched after normalising and written back with LF
line endings (the write is the normalised text; byok does not restore the original endings).
"""

from __future__ import annotations

import difflib


class EditError(Exception):
    """The edit cannot be applied. The message is returned to the model as a tool error."""


def normalize_newlines(text: str) -> str:
    """CRLF and lone CR become LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


class NewlineNormalizer:
    """``normalize_newlines`` over a text that arrives in chunks.

    A chunk that ends in CR is ambiguous (the next chunk may start with LF, making one CRLF),
    so that CR is held back until the next chunk or ``flush``.
    """

    def __init__(self) -> None:
        self._pending_cr = False

    def feed(self, chunk: str) -> str:
        if not chunk:
            return ""
        if self._pending_cr:
            chunk = "\r" + chunk
            self._pending_cr = False
        if chunk.endswith("\r"):
            chunk = chunk[:-1]
            self._pending_cr = True
        return normalize_newlines(chunk)

    def flush(self) -> str:
        """The end of the text: a held CR was a line ending of its own."""
        if self._pending_cr:
            self._pending_cr = False
            return "\n"
        return ""


def count_occurrences(text: str, needle: str) -> int:
    """Occurrences of ``needle`` in ``text``, overlapping ones included.

    Overlaps count because each one is a different place the model may have meant:
    "aa" in "aaa" is ambiguous even though ``str.count`` says 1.
    """
    count = 0
    start = text.find(needle)
    while start != -1:
        count += 1
        start = text.find(needle, start + 1)
    return count


def replace_unique(
    text: str, old: str, new: str, replace_all: bool = False, *, path: str = "the file"
) -> str:
    """Replace ``old`` with ``new`` in ``text`` and return the LF-normalised result.

    All three strings are LF-normalised first, so a CRLF file matches an LF ``old`` (and the
    other way round). Without ``replace_all`` the match must be unique.
    """
    text, old, new = normalize_newlines(text), normalize_newlines(old), normalize_newlines(new)
    if not old:
        raise EditError("old_string must not be empty")
    if old == new:
        raise EditError("old_string and new_string are identical; there is nothing to change")
    occurrences = count_occurrences(text, old)
    if occurrences == 0:
        raise EditError(f"old_string not found in {path}")
    if replace_all:
        return text.replace(old, new)
    if occurrences > 1:
        raise EditError(
            f"old_string occurs {occurrences} times in {path}; "
            "include more surrounding context to make it unique or set replace_all"
        )
    return text.replace(old, new, 1)


_NO_NEWLINE = "\\ No newline at end of file\n"


def unified_diff(path: str, before: str | None, after: str) -> tuple[str, int, int]:
    """A unified diff of ``before`` -> ``after`` and the counts of added and removed lines.

    ``before`` None means the file is new (diffed from /dev/null, every line added). A last
    line without a newline is marked the way git marks it, so the diff stays well-formed.
    """
    old_lines = (before or "").splitlines(keepends=True)
    new_lines = after.splitlines(keepends=True)
    lines = list(
        difflib.unified_diff(
            old_lines,
            new_lines,
            # Paths as given (often absolute): git's a/ b/ prefixes would make "a//abs/path".
            fromfile="/dev/null" if before is None else path,
            tofile=path,
        )
    )
    added = removed = 0
    parts: list[str] = []
    for index, line in enumerate(lines):
        # The first two lines are the ---/+++ headers; a removed line may itself start with "--".
        if index >= 2 and line.startswith("+"):
            added += 1
        elif index >= 2 and line.startswith("-"):
            removed += 1
        if line.endswith("\n"):
            parts.append(line)
        else:
            parts.append(line + "\n" + _NO_NEWLINE)
    return "".join(parts), added, removed
