"""WorkspaceExecutor against a real tmp workspace (files, /bin/sh), and the simulator's exec tasks."""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import betterproto2
import httpx
import pytest
import trio

from byok.cursor.tools.terminal_file import TerminalTail
from byok.devtools.cursor_sim import BIDI_APPEND, RUN_SSE, CursorSim, user_turn
from byok.devtools.workspace_exec import WorkspaceExecutor
from byok.http.connect_envelope import FLAG_END_STREAM, encode_frame
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver

Msgs = list[agent.AgentClientMessage]


@pytest.fixture
async def ws(tmp_path: Path) -> AsyncIterator[WorkspaceExecutor]:
    root = tmp_path / "ws"
    root.mkdir()
    ex = WorkspaceExecutor(root, shell_timeout_cap_s=5.0)
    yield ex
    await ex.aclose()


async def run(ex: WorkspaceExecutor, exec_id: int = 7, *, delay: float = 0.0, **args: object) -> Msgs:
    out: Msgs = []

    async def reply(m: agent.AgentClientMessage) -> None:
        out.append(m)

    await ex.run(agent.ExecServerMessage(id=exec_id, exec_id=f"call-{exec_id}", **args), reply, delay=delay)  # type: ignore[arg-type]
    return out


def kinds(msgs: Msgs) -> list[str]:
    """'read_result.success', 'shell_stream.stdout', 'stream_close', 'throw', ..."""
    out = []
    for m in msgs:
        if (c := m.exec_client_control_message) is not None:
            out.append(betterproto2.which_one_of(c, "message")[0])
            continue
        assert m.exec_client_message is not None
        field, value = betterproto2.which_one_of(m.exec_client_message, "message")
        group = "event" if field == "shell_stream" else "result"
        out.append(f"{field}.{betterproto2.which_one_of(value, group)[0]}")
    return out


def result(msgs: Msgs, field: str) -> object:
    """The inner variant of the first result, e.g. ReadSuccess."""
    value = getattr(msgs[0].exec_client_message, field)
    return betterproto2.which_one_of(value, "result")[1]


def shell_text(msgs: Msgs, kind: str) -> str:
    return "".join(
        getattr(m.exec_client_message.shell_stream, kind).data
        for m in msgs
        if m.exec_client_message is not None and getattr(m.exec_client_message.shell_stream, kind) is not None
    )


def shell_exit(msgs: Msgs) -> agent.ShellStreamExit:
    exits = [m.exec_client_message.shell_stream.exit for m in msgs if m.exec_client_message is not None]
    found = [e for e in exits if e is not None]
    assert len(found) == 1
    return found[0]


def shell(command: str, **kw: object) -> dict[str, object]:
    return {"shell_stream_args": agent.ShellArgs(command=command, **kw)}  # type: ignore[arg-type]


# --- files ------------------------------------------------------------------------------------


async def test_read_whole_range_missing_and_directory(ws: WorkspaceExecutor) -> None:
    (ws.root / "a.txt").write_text("one\ntwo\nthree\nfour\n")
    (ws.root / "dir").mkdir()

    msgs = await run(ws, read_args=agent.ReadArgs(path="a.txt"))
    assert kinds(msgs) == ["read_result.success", "stream_close"]
    assert msgs[0].exec_client_message.id == 7 and msgs[0].exec_client_message.exec_id == "call-7"
    assert msgs[1].exec_client_control_message.stream_close.id == 7
    ok = result(msgs, "read_result")
    assert (ok.content, ok.total_lines, ok.file_size, ok.range_applied) == (
        "one\ntwo\nthree\nfour\n",
        4,
        19,
        False,
    )

    ok = result(
        await run(ws, read_args=agent.ReadArgs(path=str(ws.root / "a.txt"), offset=2, limit=2)), "read_result"
    )
    assert (ok.content, ok.total_lines, ok.range_applied) == ("two\nthree\n", 4, True)

    assert kinds(await run(ws, read_args=agent.ReadArgs(path="nope.txt")))[0] == "read_result.file_not_found"
    assert kinds(await run(ws, read_args=agent.ReadArgs(path="dir")))[0] == "read_result.invalid_file"


async def test_paths_outside_root_are_refused(ws: WorkspaceExecutor, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("keep out")
    (ws.root / "link").symlink_to(secret)

    for path in (str(secret), "../secret.txt", "link"):
        assert kinds(await run(ws, read_args=agent.ReadArgs(path=path)))[0] == "read_result.permission_denied"
        assert (
            kinds(await run(ws, delete_args=agent.DeleteArgs(path=path)))[0]
            == "delete_result.permission_denied"
        )
    msgs = await run(ws, write_args=agent.WriteArgs(path="../evil.txt", file_text="x"))
    assert kinds(msgs) == ["write_result.permission_denied", "stream_close"]
    assert not (tmp_path / "evil.txt").exists() and secret.read_text() == "keep out"
    grep = await run(ws, grep_args=agent.GrepArgs(pattern="keep", path=str(tmp_path)))
    assert kinds(grep)[0] == "grep_result.error"
    assert kinds(await run(ws, **shell("pwd", working_directory="/")))[0] == "shell_stream.permission_denied"


async def test_write_creates_parents_and_delete(ws: WorkspaceExecutor) -> None:
    msgs = await run(ws, write_args=agent.WriteArgs(path="deep/er/new.py", file_text="print('é')\nx = 1\n"))
    assert kinds(msgs) == ["write_result.success", "stream_close"]
    ok = result(msgs, "write_result")
    assert (ok.path, ok.lines_created, ok.file_size) == ("deep/er/new.py", 2, 18)
    assert (ws.root / "deep/er/new.py").read_text(encoding="utf-8") == "print('é')\nx = 1\n"

    msgs = await run(ws, delete_args=agent.DeleteArgs(path="deep/er/new.py"))
    assert kinds(msgs) == ["delete_result.success", "stream_close"]
    assert result(msgs, "delete_result").prev_content == "print('é')\nx = 1\n"
    assert not (ws.root / "deep/er/new.py").exists()
    assert (
        kinds(await run(ws, delete_args=agent.DeleteArgs(path="deep/er/new.py")))[0]
        == "delete_result.file_not_found"
    )
    assert kinds(await run(ws, delete_args=agent.DeleteArgs(path="deep")))[0] == "delete_result.not_file"


async def test_diagnostics_and_unsupported(ws: WorkspaceExecutor) -> None:
    (ws.root / "m.py").write_text("x = 1\n")
    msgs = await run(ws, diagnostics_args=agent.DiagnosticsArgs(path="m.py"))
    assert kinds(msgs) == ["diagnostics_result.success", "stream_close"]
    assert result(msgs, "diagnostics_result").diagnostics == []

    msgs = await run(ws, ls_args=agent.LsArgs(path="."))
    assert kinds(msgs) == ["throw"]
    assert msgs[0].exec_client_control_message.throw.id == 7
    assert "unsupported exec ls_args" in msgs[0].exec_client_control_message.throw.error


# --- grep / glob ------------------------------------------------------------------------------


def make_tree(root: Path) -> None:
    (root / "src/pkg").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "src/app.py").write_text("import os\n\ndef main():\n    return TODO\n")
    (root / "src/pkg/util.py").write_text("# todo: one\n# TODO: two\nvalue = 3\n")
    (root / "src/pkg/ui.ts").write_text("// TODO ts\n")
    (root / "README.md").write_text("TODO readme\n")
    (root / ".git/config").write_text("TODO git\n")
    (root / "blob.bin").write_bytes(b"TODO\0binary")


def union(msgs: Msgs, ws: WorkspaceExecutor) -> agent.GrepUnionResult:
    ok = result(msgs, "grep_result")
    assert list(ok.workspace_results) == [str(ws.root)]
    return ok.workspace_results[str(ws.root)]


async def test_grep_files_with_matches_count_and_head_limit(ws: WorkspaceExecutor) -> None:
    make_tree(ws.root)
    msgs = await run(ws, grep_args=agent.GrepArgs(pattern="TODO"))
    assert kinds(msgs) == ["grep_result.success", "stream_close"]
    files = union(msgs, ws).files
    assert files.files == [
        "README.md",
        "src/app.py",
        "src/pkg/ui.ts",
        "src/pkg/util.py",
    ]  # no .git, no binary
    assert files.total_files == 4 and not files.client_truncated

    files = union(await run(ws, grep_args=agent.GrepArgs(pattern="TODO", path="src", head_limit=2)), ws).files
    assert (files.files, files.total_files, files.client_truncated) == (
        ["src/app.py", "src/pkg/ui.ts"],
        3,
        True,
    )

    count = union(
        await run(
            ws,
            grep_args=agent.GrepArgs(pattern="todo", case_insensitive=True, output_mode="count", glob="*.py"),
        ),
        ws,
    ).count
    assert [(c.file, c.count) for c in count.counts] == [("src/app.py", 1), ("src/pkg/util.py", 2)]
    assert (count.total_files, count.total_matches) == (2, 3)


async def test_grep_content_with_context(ws: WorkspaceExecutor) -> None:
    make_tree(ws.root)
    args = agent.GrepArgs(pattern=r"TODO", output_mode="content", path="src", type="py", context_before=1)
    content = union(await run(ws, grep_args=args), ws).content
    got = [
        (fm.file, [(m.line_number, m.content, m.is_context_line) for m in fm.matches])
        for fm in content.matches
    ]
    assert got == [
        ("src/app.py", [(3, "def main():", True), (4, "    return TODO", False)]),
        ("src/pkg/util.py", [(1, "# todo: one", True), (2, "# TODO: two", False)]),
    ]
    assert (content.total_lines, content.total_matched_lines) == (4, 2)

    bad = await run(ws, grep_args=agent.GrepArgs(pattern="(unclosed"))
    assert kinds(bad) == ["grep_result.error", "stream_close"]


async def test_glob_is_grep_with_empty_pattern(ws: WorkspaceExecutor) -> None:
    make_tree(ws.root)

    async def glob(pattern: str, path: str = "") -> list[str]:
        args = agent.GrepArgs(pattern="", glob=pattern, path=path, output_mode="files_with_matches")
        return union(await run(ws, grep_args=args), ws).files.files

    assert await glob("**/*.py") == ["src/app.py", "src/pkg/util.py"]
    assert await glob("*.{md,ts}") == ["README.md", "src/pkg/ui.ts"]
    assert await glob("src/**/u*") == ["src/pkg/ui.ts", "src/pkg/util.py"]
    assert await glob("*.bin") == ["blob.bin"]  # listing doesn't read files: binaries included
    assert await glob("**", path="src/pkg") == ["src/pkg/ui.ts", "src/pkg/util.py"]


# --- shell ------------------------------------------------------------------------------------


async def test_shell_streams_stdout_stderr_and_exit_code(ws: WorkspaceExecutor) -> None:
    (ws.root / "sub").mkdir()
    cmd = "printf 'caf\\303'; sleep 0.05; printf '\\251\\n'; echo oops >&2; pwd; exit 3"
    msgs = await run(ws, **shell(cmd, working_directory="sub", timeout=5000))
    k = kinds(msgs)
    assert k[0] == "shell_stream.start" and k[-2:] == ["shell_stream.exit", "stream_close"]
    assert set(k[1:-2]) == {"shell_stream.stdout", "shell_stream.stderr"}
    assert shell_text(msgs, "stdout") == f"café\n{ws.root / 'sub'}\n"  # a UTF-8 char split across reads
    assert shell_text(msgs, "stderr") == "oops\n"
    ex = shell_exit(msgs)
    assert (ex.code, ex.cwd, ex.aborted) == (3, str(ws.root / "sub"), False)

    ok = await run(ws, **shell("cat; echo done"))  # stdin is closed: cat sees EOF at once
    assert shell_text(ok, "stdout") == "done\n" and shell_exit(ok).code == 0


async def test_shell_past_timeout_is_backgrounded_then_killed_by_aclose(ws: WorkspaceExecutor) -> None:
    started = time.monotonic()
    msgs = await run(
        ws,
        **shell(
            "echo early; sleep 30; echo late", timeout=200, timeout_behavior=agent.TimeoutBehavior.BACKGROUND
        ),
    )
    assert time.monotonic() - started < 1
    assert kinds(msgs) == [
        "shell_stream.start",
        "shell_stream.stdout",
        "shell_stream.backgrounded",
        "stream_close",
    ]
    bg = msgs[2].exec_client_message.shell_stream.backgrounded
    assert bg.command.startswith("echo early") and bg.working_directory == str(ws.root) and bg.pid
    assert ws.background[bg.shell_id].process.returncode is None
    os.kill(bg.pid, 0)  # still running

    await ws.aclose()
    assert ws.background == {}
    with pytest.raises(ProcessLookupError):
        os.kill(bg.pid, 0)


async def test_shell_past_timeout_without_background_is_killed(ws: WorkspaceExecutor) -> None:
    msgs = await run(ws, **shell("sleep 30", timeout=150, timeout_behavior=agent.TimeoutBehavior.CANCEL))
    assert kinds(msgs) == ["shell_stream.start", "shell_stream.exit", "stream_close"]
    ex = shell_exit(msgs)
    assert ex.aborted and ex.abort_reason == agent.ShellAbortReason.TIMEOUT and ex.code == 128 + 9


async def test_abort_kills_a_running_shell(ws: WorkspaceExecutor) -> None:
    msgs: Msgs = []
    started = trio.Event()

    async def reply(m: agent.AgentClientMessage) -> None:
        msgs.append(m)
        if kinds([m]) == ["shell_stream.stdout"]:
            started.set()

    msg = agent.ExecServerMessage(
        id=4, exec_id="call-4", shell_stream_args=agent.ShellArgs(command="echo up; sleep 30")
    )
    with trio.fail_after(2):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ws.run, msg, reply)
            await started.wait()
            ws.abort(4)
    assert kinds(msgs) == ["shell_stream.start", "shell_stream.stdout", "shell_stream.exit", "stream_close"]
    ex = shell_exit(msgs)
    assert ex.aborted and ex.abort_reason == agent.ShellAbortReason.USER_ABORT


async def test_abort_while_delayed_only_closes(ws: WorkspaceExecutor) -> None:
    (ws.root / "a.txt").write_text("x")
    msgs: Msgs = []

    async def reply(m: agent.AgentClientMessage) -> None:
        msgs.append(m)

    msg = agent.ExecServerMessage(id=9, exec_id="c", read_args=agent.ReadArgs(path="a.txt"))
    with trio.fail_after(1):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: ws.run(msg, reply, delay=30))
            await trio.sleep(0.01)
            ws.abort(9)
    assert kinds(msgs) == ["stream_close"]


# --- the simulator's exec tasks, against a scripted fake server --------------------------------


class FakeServer:
    """Plays the daemon's side over httpx.MockTransport: the test pushes RunSSE frames and
    watches the appends."""

    def __init__(self) -> None:
        self.frames_in, self.frames_out = trio.open_memory_channel[bytes](100)
        self.appends: list[tuple[int, agent.AgentClientMessage]] = []

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == RUN_SSE:
            return httpx.Response(
                200, headers={"content-type": "application/connect+proto"}, content=self._frames()
            )
        assert request.url.path == BIDI_APPEND
        req = aiserver.BidiAppendRequest.parse(await request.aread())
        self.appends.append((req.append_seqno, agent.AgentClientMessage.parse(bytes.fromhex(req.data))))
        return httpx.Response(200, content=b"")

    async def _frames(self) -> AsyncIterator[bytes]:
        async for frame in self.frames_out:
            yield frame

    async def send(self, **message: object) -> None:
        await self.frames_in.send(encode_frame(bytes(agent.AgentServerMessage(**message))))  # type: ignore[arg-type]

    async def end(self) -> None:
        await self.frames_in.send(encode_frame(json.dumps({}).encode(), FLAG_END_STREAM))

    async def wait_for(self, pred: Callable[[list[agent.AgentClientMessage]], bool]) -> None:
        with trio.fail_after(3):
            while not pred([m for _, m in self.appends]):
                await trio.sleep(0.01)


def closes(msgs: Msgs) -> list[int]:
    return [m.exec_client_control_message.stream_close.id for m in msgs if m.exec_client_control_message]


async def drive(sim: CursorSim, server: FakeServer, script: Callable[[], object]) -> object:
    turn = user_turn("go", conversation_id="c", model_id="m", message_id="m1")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(script)
        return await sim.run("req-x", turn)


async def test_sim_runs_execs_concurrently_out_of_order(ws: WorkspaceExecutor) -> None:
    (ws.root / "a.txt").write_text("alpha\n")
    server = FakeServer()
    async with httpx.AsyncClient(transport=httpx.MockTransport(server.handle)) as client:
        sim = CursorSim(
            "http://byok.test",
            client,
            executor=ws,
            exec_delay=lambda m: 0.3 if m.exec_id == "slow-read" else 0.0,
            on_exec=lambda m: [] if m.exec_id == "ignored" else None,
        )

        async def script() -> None:
            await server.send(
                exec_server_message=agent.ExecServerMessage(
                    id=1, exec_id="slow-read", read_args=agent.ReadArgs(path="a.txt")
                )
            )
            await server.send(
                exec_server_message=agent.ExecServerMessage(
                    id=2, exec_id="write", write_args=agent.WriteArgs(path="b.txt", file_text="beta")
                )
            )
            await server.send(
                exec_server_message=agent.ExecServerMessage(
                    id=3, exec_id="ignored", read_args=agent.ReadArgs(path="a.txt")
                )
            )
            await server.wait_for(lambda msgs: sorted(closes(msgs)) == [1, 2])
            await server.end()

        tr = await drive(sim, server, script)

    assert tr.exec_completion_order() == ["write", "slow-read"]
    assert [(e.id, e.kind) for e in tr.execs] == [(1, "read_args"), (2, "write_args"), (3, "read_args")]
    assert tr.execs[2].appends == []  # on_exec returned []: the client never answers
    assert [seq for seq, _ in server.appends] == list(range(len(server.appends)))  # serialized, in order
    assert [seq for seq, _ in tr.appends] == [seq for seq, _ in server.appends]
    assert (ws.root / "b.txt").read_text() == "beta"


async def test_sim_forwards_abort_to_the_executor(ws: WorkspaceExecutor) -> None:
    server = FakeServer()
    async with httpx.AsyncClient(transport=httpx.MockTransport(server.handle)) as client:
        sim = CursorSim("http://byok.test", client, executor=ws)

        async def script() -> None:
            args = agent.ShellArgs(command="sleep 30", timeout=10_000)
            await server.send(
                exec_server_message=agent.ExecServerMessage(id=5, exec_id="sh", shell_stream_args=args)
            )
            await server.wait_for(lambda msgs: any(m.exec_client_message for m in msgs))
            abort = agent.ExecServerControlMessage(abort=agent.ExecServerAbort(id=5))
            await server.send(exec_server_control_message=abort)
            await server.wait_for(lambda msgs: closes(msgs) == [5])
            await server.end()

        with trio.fail_after(2):
            tr = await drive(sim, server, script)

    (rec,) = tr.execs
    assert rec.aborted
    assert kinds([m for _, m in server.appends][1:]) == [
        "shell_stream.start",
        "shell_stream.exit",
        "stream_close",
    ]
    assert [tr.appends[i][1] for i in rec.appends] == [
        "exec_client_message",
        "exec_client_message",
        "exec_client_control_message",
    ]


async def test_a_backgrounded_shell_writes_its_terminal_file(tmp_path: Path) -> None:
    """As Cursor does: the output so far, the rest as it comes, then a footer with the exit code;
    byok's AwaitShell reads exactly that format."""
    root, folder = tmp_path / "ws", tmp_path / "terminals"
    root.mkdir()
    ex = WorkspaceExecutor(root, shell_timeout_cap_s=5.0, terminals_folder=folder)
    try:
        msgs = await run(
            ex,
            **shell(
                "echo early; sleep 0.3; echo late >&2; exit 3",
                timeout=100,
                timeout_behavior=agent.TimeoutBehavior.BACKGROUND,
            ),
        )
        bg = msgs[-2].exec_client_message.shell_stream.backgrounded
        path = folder / f"{bg.shell_id}.txt"
        assert path.read_text().startswith(f"---\npid: {bg.pid}\n")
        with trio.fail_after(5):
            while "exit_code" not in path.read_text():
                await trio.sleep(0.05)
        tail = TerminalTail(None)
        tail.feed(path.read_bytes())
        view = tail.view()
        assert view.ended and view.exit_code == 3 and view.tail == "early\nlate\n"
    finally:
        await ex.aclose()
