"""AwaitShell's server work: poll a backgrounded shell's terminal file until the command ends,
its output matches the pattern, or the wait is up (a trio deadline).

The file is on the user's machine, next to the daemon, and each poll reads only what it gained
since the last one (a first look at a long log starts at its last ``SCAN_LIMIT`` bytes), so
the reads are small and done in line; the waiting between them is ``trio.sleep``. Polls start
every 50 ms and back off to every 500 ms. A file that does not exist when the wait ends is
reported as missing; one that appears meanwhile is read from then on.
"""

from __future__ import annotations

import os
import re

import trio

from byok.cursor.tools.await_shell import TerminalWait, TerminalWaited
from byok.cursor.tools.terminal_file import SCAN_LIMIT, TerminalTail

FIRST_POLL_S = 0.05
MAX_POLL_S = 0.5
_READ_MAX = 1 << 20  # bytes one poll reads at most; the next poll reads on


async def wait_for_terminal(work: TerminalWait) -> TerminalWaited:
    started = trio.current_time()
    deadline = started + work.block_until_ms / 1000
    if not work.path:
        await trio.sleep_until(deadline)
        return TerminalWaited(waited_ms=_ms(trio.current_time() - started))
    pattern = re.compile(work.pattern, re.MULTILINE) if work.pattern is not None else None
    tail = TerminalTail(pattern)
    seen = False
    pause = FIRST_POLL_S
    while True:
        seen = _read(work.path, tail) or seen
        view = tail.view()
        now = trio.current_time()
        if view.ended or view.match is not None or now >= deadline:
            break
        await trio.sleep(min(pause, deadline - now))
        pause = min(pause * 2, MAX_POLL_S)
    if not seen:
        return TerminalWaited(waited_ms=_ms(now - started), missing=True)
    return TerminalWaited(
        waited_ms=_ms(now - started),
        output_length=view.output_length,
        tail=view.tail,
        omitted=view.omitted,
        ended=view.ended,
        exit_code=view.exit_code,
        error=view.error,
        elapsed_ms=view.elapsed_ms,
        match=view.match,
    )


def _read(path: str, tail: TerminalTail) -> bool:
    """Feed ``tail`` what the file gained; False when there is no such file."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < tail.offset:  # rewritten from the start: read it again
                tail.reset()
            if tail.offset == 0 and size > SCAN_LIMIT:
                tail.start_at(size - SCAN_LIMIT)
            f.seek(tail.offset)
            data = f.read(_READ_MAX)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # there, but unreadable for now: the next poll tries again
    tail.feed(data)
    return True


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))
