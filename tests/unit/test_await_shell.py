"""AwaitShell: the terminal file read as it grows (cursor/tools/terminal_file.py), the wait on
it under a mock clock (run/terminal_wait.py), and the tool's arguments, card and text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trio
import trio.testing

from byok.cursor.tools.await_shell import AWAIT_SHELL, TerminalWait, TerminalWaited
from byok.cursor.tools.base import Finish, Invocation, StartWork, ToolArgError
from byok.cursor.tools.env import ToolEnv
from byok.cursor.tools.terminal_file import TAIL_LIMIT, TerminalTail
from byok.pb.agent import v1 as agent
from byok.run.terminal_wait import wait_for_terminal

HEADER = b"---\npid: 4242\ncwd: /w\ncommand: python3 -m http.server\nstarted_at: 2026-01-01T00:00:00Z\n---\n"
FOOTER = b"\n---\nexit_code: 3\nelapsed_ms: 1500\nended_at: 2026-01-01T00:00:02Z\n---\n"


def fed(*pieces: bytes, pattern: str | None = None) -> TerminalTail:
    tail = TerminalTail(re.compile(pattern, re.MULTILINE) if pattern else None)
    for piece in pieces:
        tail.feed(piece)
    return tail


def test_header_output_and_footer_in_any_pieces() -> None:
    whole = HEADER + b"line 1\nline 2" + FOOTER
    for cut in range(1, len(whole)):
        view = fed(whole[:cut], whole[cut:]).view()
        assert view.ended and view.exit_code == 3 and view.elapsed_ms == 1500
        assert view.tail == "line 1\nline 2" and view.output_length == 13, cut
    byte_by_byte = fed(*(whole[i : i + 1] for i in range(len(whole)))).view()
    assert byte_by_byte.tail == "line 1\nline 2" and byte_by_byte.ended


def test_a_running_command_has_no_footer_and_an_error_footer_says_why() -> None:
    view = fed(HEADER + b"serving\n---\nnot a footer\n").view()
    assert not view.ended and view.tail == "serving\n---\nnot a footer\n"
    failed = fed(HEADER + b"\n---\nerror: command not found\nended_at: x\n---\n").view()
    assert failed.ended and failed.error == "command not found" and failed.exit_code is None
    unknown = fed(b"out\n---\nexit_code: unknown\nended_at: x\n---\n").view()  # no header at all
    assert unknown.ended and unknown.exit_code is None and unknown.tail == "out"


def test_a_dash_line_in_the_output_holds_back_only_what_may_be_a_footer() -> None:
    tail = fed(HEADER + b"# Report\n---\nServer ready\nmore", pattern="ready")
    assert tail.match == "ready"  # not held back: "Server ready" is no footer line
    for partial in (b"\n---\nexit_co", b"\n---\nexit_code: 0\nelapsed_ms: 12\nend", b"\n---\n"):
        held = fed(HEADER + b"out" + partial, pattern="exit")
        assert held.match is None, partial  # may still be the footer: not searched yet
        assert held.view().tail == ("out" + partial.decode()), partial  # but shown


def test_the_pattern_matches_across_reads_and_the_tail_is_capped() -> None:
    view = fed(HEADER + b"Starting...\nServing HTTP on 0.0.0.0 po", b"rt 8000\n", pattern=r"port \d+").view()
    assert view.match == "port 8000"
    assert fed(HEADER + b"nothing\n", pattern="^ready$").view().match is None
    big = fed(HEADER + b"x" * (3 * TAIL_LIMIT) + b"END").view()
    assert big.tail.endswith("END") and len(big.tail.encode()) == TAIL_LIMIT
    assert big.omitted == 3 * TAIL_LIMIT + 3 - TAIL_LIMIT


def invocation(args: dict, folder: str = "/term") -> Invocation:
    env = ToolEnv(request_context=agent.RequestContext(env=agent.RequestContextEnv(terminals_folder=folder)))
    return Invocation("c1", "AwaitShell", "mc", AWAIT_SHELL.parse(args), env)


def test_arguments() -> None:
    assert AWAIT_SHELL.parse({"shell_id": 7, "pattern": "ok"}) == {
        "shell_id": "7",
        "block_until_ms": 30_000,
        "pattern": "ok",
    }
    assert AWAIT_SHELL.parse({"block_until_ms": 10**9})["block_until_ms"] == 600_000
    for bad, problem in [
        ({"block_until_ms": 0}, "shell_id is required"),
        ({"shell_id": "../etc/passwd"}, "not a shell id"),
        ({"shell_id": "3", "pattern": "("}, "not a valid regular expression"),
        ({"pattern": "x"}, "needs the shell_id"),
    ]:
        with pytest.raises(ToolArgError, match=problem):
            AWAIT_SHELL.parse(bad)


def test_the_call_asks_for_the_file_and_reports_what_the_wait_saw() -> None:
    execution = AWAIT_SHELL.execute(invocation({"shell_id": "3", "block_until_ms": 5000, "pattern": "ready"}))
    (work,) = execution.start()
    assert isinstance(work, StartWork) and work.work == TerminalWait("/term/3.txt", 5000, "ready")
    seen = TerminalWaited(waited_ms=120, output_length=12, tail="booting\nready", match="ready")
    (finish,) = execution.on_work(seen)
    assert isinstance(finish, Finish) and not finish.outcome.is_error
    assert "still running" in finish.outcome.content and "matched: 'ready'" in finish.outcome.content
    card = finish.outcome.ui.await_tool_call
    assert card.args.task_id == "3" and card.args.regex == "ready"
    running = card.result.success.still_running
    assert (running.output_file_path, running.regex_match, running.output_length) == (
        "/term/3.txt",
        "ready",
        12,
    )

    done = AWAIT_SHELL.execute(invocation({"shell_id": "3"}))
    done.start()
    (finish,) = done.on_work(
        TerminalWaited(waited_ms=10, output_length=3, tail="ok\n", ended=True, exit_code=0)
    )
    assert "finished with exit code 0" in finish.outcome.content
    assert finish.outcome.ui.await_tool_call.result.success.complete.exit_code == 0


def test_a_missing_file_or_folder_is_an_error_card() -> None:
    execution = AWAIT_SHELL.execute(invocation({"shell_id": "9"}))
    execution.start()
    (finish,) = execution.on_work(TerminalWaited(waited_ms=0, missing=True))
    assert finish.outcome.is_error and "no terminal file" in finish.outcome.content
    assert finish.outcome.ui.await_tool_call.result.error.error in finish.outcome.content
    (finish,) = AWAIT_SHELL.execute(invocation({"shell_id": "9"}, folder="")).start()
    assert finish.outcome.is_error and "terminals folder" in finish.outcome.content


# --- the wait, under a mock clock ------------------------------------------------------------


async def test_a_wait_without_a_shell_only_waits(autojump_clock: trio.testing.MockClock) -> None:
    start = trio.current_time()
    result = await wait_for_terminal(TerminalWait("", 2500))
    assert result == TerminalWaited(waited_ms=2500)
    assert trio.current_time() - start == pytest.approx(2.5)


async def test_the_wait_ends_when_the_pattern_appears(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = tmp_path / "3.txt"
    path.write_bytes(HEADER + b"starting\n")

    async def server() -> None:
        await trio.sleep(4)
        with path.open("ab") as f:
            f.write(b"Serving on port 8000\n")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(server)
        result = await wait_for_terminal(TerminalWait(str(path), 30_000, r"port \d+"))
    assert result.match == "port 8000" and not result.ended
    assert 4000 <= result.waited_ms <= 4600  # the next poll after the write (polls back off to 0.5 s)
    assert result.tail == "starting\nServing on port 8000\n"


async def test_the_wait_ends_when_the_command_ends(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = tmp_path / "4.txt"

    async def command() -> None:
        await trio.sleep(1)
        path.write_bytes(HEADER + b"building")  # the file appears after the wait began
        await trio.sleep(2)
        with path.open("ab") as f:
            f.write(b" done" + FOOTER)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(command)
        result = await wait_for_terminal(TerminalWait(str(path), 10_000))
    assert result.ended and result.exit_code == 3 and result.tail == "building done"
    assert 3000 <= result.waited_ms <= 3600


async def test_the_wait_is_up_at_its_deadline(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    path = tmp_path / "5.txt"
    path.write_bytes(HEADER + b"still going\n")
    start = trio.current_time()
    result = await wait_for_terminal(TerminalWait(str(path), 7000, "never"))
    assert trio.current_time() - start == pytest.approx(7.0)
    assert (result.waited_ms, result.match, result.ended) == (7000, None, False)
    missing = await wait_for_terminal(TerminalWait(str(tmp_path / "6.txt"), 1000))
    assert missing.missing and missing.waited_ms == 1000
