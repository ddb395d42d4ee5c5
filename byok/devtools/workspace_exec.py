"""Run Exec requests against a real workspace folder, the way Cursor's client does.

The Cursor simulator hands every ExecServerMessage to a ``WorkspaceExecutor`` so integration
tests exercise tool rounds end to end: real files under ``root``, a real ``/bin/sh`` for shell
execs. Nothing outside ``root`` is read, written or deleted (symlinks are resolved first).

Client message sequences (every ExecClientMessage carries the exec's id and exec_id):
  read / write / delete / grep / diagnostics: one ``*_result``, then control ``stream_close``.
  shell_stream_args: ``start``, ``stdout``/``stderr`` as output arrives, then ``exit`` (or
    ``backgrounded`` past the timeout with BACKGROUND), then ``stream_close``.
  anything else: control ``throw``.
"""

from __future__ import annotations

import bisect
import codecs
import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import betterproto2
import trio

from byok.pb.agent import v1 as agent

Reply = Callable[[agent.AgentClientMessage], Awaitable[None]]
Events = tuple[str, str]  # ("stdout" | "stderr", decoded text)


def exec_result(msg: agent.ExecServerMessage, **result: object) -> agent.AgentClientMessage:
    inner = agent.ExecClientMessage(id=msg.id, exec_id=msg.exec_id, **result)  # type: ignore[arg-type]
    return agent.AgentClientMessage(exec_client_message=inner)


def stream_close(exec_id: int) -> agent.AgentClientMessage:
    control = agent.ExecClientControlMessage(stream_close=agent.ExecClientStreamClose(id=exec_id))
    return agent.AgentClientMessage(exec_client_control_message=control)


def throw(exec_id: int, error: str) -> agent.AgentClientMessage:
    control = agent.ExecClientControlMessage(throw=agent.ExecClientThrow(id=exec_id, error=error))
    return agent.AgentClientMessage(exec_client_control_message=control)


@attrs.define(eq=False)
class _Pending:
    """One exec in flight, so an abort can find it by id."""

    aborted: bool = False
    scope: trio.CancelScope | None = None

    def abort(self) -> None:
        self.aborted = True
        if self.scope is not None:
            self.scope.cancel()


@attrs.define(eq=False)
class Shell:
    """A running command. Its pumps queue output for the exec streaming it or, once it is
    backgrounded, keep it in ``output`` (Cursor writes it to a terminal file)."""

    command: str
    cwd: Path
    process: trio.Process
    backgrounded: bool = False
    output: list[Events] = attrs.Factory(list)

    def emit(self, events: trio.MemorySendChannel[Events], kind: str, text: str) -> None:
        if not text:
            return
        try:
            if not self.backgrounded:
                events.send_nowait((kind, text))
                return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the exec stopped listening (it was cancelled)
        self.output.append((kind, text))

    def kill(self) -> None:
        # The command leads its own session: killing the group also stops its children, which
        # would otherwise keep the pipes open.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)


async def _pump(
    shell: Shell, stream: trio.abc.ReceiveStream, kind: str, events: trio.MemorySendChannel[Events]
) -> None:
    # Runs as a system task: a backgrounded shell outlives the exec and the run that started
    # it, so neither one's nursery can own the drain. Ends at EOF or when trio.run ends.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    try:
        while data := await stream.receive_some(65536):
            shell.emit(events, kind, decoder.decode(data))
        shell.emit(events, kind, decoder.decode(b"", final=True))
    except (trio.ClosedResourceError, trio.BrokenResourceError, OSError):
        pass
    finally:
        events.close()


class WorkspaceExecutor:
    def __init__(self, root: Path, *, shell_timeout_cap_s: float = 30.0) -> None:
        self.root = Path(root).resolve()
        self.shell_timeout_cap_s = shell_timeout_cap_s
        self.background: dict[int, Shell] = {}  # shell_id -> backgrounded shell
        self._pending: dict[int, _Pending] = {}
        self._shells: set[Shell] = set()  # every live process, foreground ones included
        self._next_shell_id = 1

    async def run(self, msg: agent.ExecServerMessage, reply: Reply, *, delay: float = 0.0) -> None:
        """Perform one exec and send its answer(s) through ``reply``. ``delay`` postpones the
        work (an abort still lands), so tests can force the order in which execs complete."""
        pending = self._pending[msg.id] = _Pending()
        try:
            if delay > 0:
                with trio.CancelScope() as pending.scope:
                    await trio.sleep(delay)
                pending.scope = None
            name, args = betterproto2.which_one_of(msg, "message")
            if name == "shell_stream_args":
                await self._shell(msg, args, reply, pending)
            elif pending.aborted:
                await reply(stream_close(msg.id))  # aborted before it ran: nothing to report
            elif name not in _ONE_SHOT:
                await reply(throw(msg.id, f"unsupported exec {name or '(none)'}"))
            else:
                field, method = _ONE_SHOT[name]
                try:
                    result = getattr(self, method)(args)
                except Exception as exc:  # a bug here must not hang the run: Cursor would throw
                    await reply(throw(msg.id, f"{type(exc).__name__}: {exc}"))
                    return
                await reply(exec_result(msg, **{field: result}))
                await reply(stream_close(msg.id))
        finally:
            if self._pending.get(msg.id) is pending:
                del self._pending[msg.id]

    def abort(self, exec_id: int) -> None:
        """ExecServerAbort: stop the exec with this id if it is still running."""
        if (pending := self._pending.get(exec_id)) is not None:
            pending.abort()

    async def aclose(self) -> None:
        """Kill every process still running (backgrounded shells included) and reap them."""
        for pending in list(self._pending.values()):
            pending.abort()
        shells = list(self._shells)
        for shell in shells:
            shell.kill()
        with trio.move_on_after(5):
            for shell in shells:
                await shell.process.wait()
                self._shells.discard(shell)
        self.background.clear()

    def resolve(self, path: str) -> Path | None:
        """The real path inside root, or None when it (or a symlink on the way) leaves root."""
        p = Path(path).expanduser() if path else self.root
        real = (p if p.is_absolute() else self.root / p).resolve()
        return real if real.is_relative_to(self.root) else None

    # --- one-shot execs -------------------------------------------------------------------

    def read(self, args: agent.ReadArgs) -> agent.ReadResult:
        path, real = args.path, self.resolve(args.path)
        if real is None:
            return agent.ReadResult(permission_denied=agent.ReadPermissionDenied(path=path))
        if not real.exists():
            return agent.ReadResult(file_not_found=agent.ReadFileNotFound(path=path))
        if not real.is_file():
            return agent.ReadResult(invalid_file=agent.ReadInvalidFile(path=path, reason="not a file"))
        try:
            data = real.read_bytes()
            text = data.decode("utf-8")
        except PermissionError:
            return agent.ReadResult(permission_denied=agent.ReadPermissionDenied(path=path))
        except UnicodeDecodeError:
            return agent.ReadResult(invalid_file=agent.ReadInvalidFile(path=path, reason="not UTF-8 text"))
        except OSError as exc:
            return agent.ReadResult(error=agent.ReadError(path=path, error=str(exc)))
        lines = text.splitlines(keepends=True)
        ranged = args.offset is not None or args.limit is not None
        if ranged:
            offset = args.offset or 1  # 1-based; negative counts from the end
            start = max(len(lines) + offset, 0) if offset < 0 else offset - 1
            text = "".join(lines[start : start + args.limit if args.limit else None])
        success = agent.ReadSuccess(
            path=path, content=text, total_lines=len(lines), file_size=len(data), range_applied=ranged
        )
        return agent.ReadResult(success=success)

    def write(self, args: agent.WriteArgs) -> agent.WriteResult:
        path, real = args.path, self.resolve(args.path)
        if real is None:
            denied = agent.WritePermissionDenied(
                path=path, directory=str(Path(path).parent), operation="write", error="outside the workspace"
            )
            return agent.WriteResult(permission_denied=denied)
        data = args.file_bytes if args.file_bytes and not args.file_text else args.file_text.encode()
        try:
            real.parent.mkdir(parents=True, exist_ok=True)
            real.write_bytes(data)
        except PermissionError as exc:
            denied = agent.WritePermissionDenied(
                path=path, directory=str(real.parent), operation="write", error=str(exc)
            )
            return agent.WriteResult(permission_denied=denied)
        except OSError as exc:
            return agent.WriteResult(error=agent.WriteError(path=path, error=str(exc)))
        text = data.decode("utf-8", errors="replace")
        after = text if args.return_file_content_after_write else None
        success = agent.WriteSuccess(
            path=path,
            lines_created=len(text.splitlines()),
            file_size=len(data),
            file_content_after_write=after,
        )
        return agent.WriteResult(success=success)

    def delete(self, args: agent.DeleteArgs) -> agent.DeleteResult:
        path, real = args.path, self.resolve(args.path)
        if real is None:
            denied = agent.DeletePermissionDenied(path=path, client_visible_error="outside the workspace")
            return agent.DeleteResult(permission_denied=denied)
        if not real.exists():
            return agent.DeleteResult(file_not_found=agent.DeleteFileNotFound(path=path))
        if not real.is_file():
            return agent.DeleteResult(not_file=agent.DeleteNotFile(path=path, actual_type="directory"))
        try:
            data = real.read_bytes()
            real.unlink()
        except PermissionError as exc:
            denied = agent.DeletePermissionDenied(path=path, client_visible_error=str(exc))
            return agent.DeleteResult(permission_denied=denied)
        except OSError as exc:
            return agent.DeleteResult(error=agent.DeleteError(path=path, error=str(exc)))
        prev = data.decode("utf-8", errors="replace")
        success = agent.DeleteSuccess(
            path=path, deleted_file=str(real), file_size=len(data), prev_content=prev
        )
        return agent.DeleteResult(success=success)

    def diagnostics(self, args: agent.DiagnosticsArgs) -> agent.DiagnosticsResult:
        real = self.resolve(args.path)
        if real is None:
            return agent.DiagnosticsResult(
                permission_denied=agent.DiagnosticsPermissionDenied(path=args.path)
            )
        if not real.exists():
            return agent.DiagnosticsResult(file_not_found=agent.DiagnosticsFileNotFound(path=args.path))
        return agent.DiagnosticsResult(success=agent.DiagnosticsSuccess(path=args.path))  # no linters here

    def grep(self, args: agent.GrepArgs) -> agent.GrepResult:
        try:
            union = _grep(self.root, self.resolve(args.path or ""), args)
        except ValueError as exc:
            return agent.GrepResult(error=agent.GrepError(error=str(exc)))
        success = agent.GrepSuccess(
            pattern=args.pattern,
            path=args.path or "",
            output_mode=args.output_mode or "files_with_matches",
            workspace_results={str(self.root): union},
        )
        return agent.GrepResult(success=success)

    # --- shell ----------------------------------------------------------------------------

    async def _shell(
        self, msg: agent.ExecServerMessage, args: agent.ShellArgs, reply: Reply, pending: _Pending
    ) -> None:
        def event(**ev: object) -> agent.AgentClientMessage:
            return exec_result(msg, shell_stream=agent.ShellStream(**ev))  # type: ignore[arg-type]

        async def forward(kind: str, text: str) -> None:
            out = (
                agent.ShellStreamStdout(data=text) if kind == "stdout" else agent.ShellStreamStderr(data=text)
            )
            await reply(event(**{kind: out}))

        cwd = self.resolve(args.working_directory)
        if pending.aborted or cwd is None or not cwd.is_dir():
            if pending.aborted:  # aborted while delayed: it never started
                await reply(event(exit=agent.ShellStreamExit(cwd=str(cwd or self.root), aborted=True)))
            else:
                reason = "outside the workspace" if cwd is None else "no such directory"
                denied = agent.ShellPermissionDenied(
                    command=args.command, working_directory=args.working_directory, error=reason
                )
                await reply(event(permission_denied=denied))
            await reply(stream_close(msg.id))
            return

        await reply(event(start=agent.ShellStreamStart()))
        started = time.monotonic()
        send, receive = trio.open_memory_channel[Events](float("inf"))
        process = await trio.lowlevel.open_process(
            ["/bin/sh", "-c", args.command],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        shell = Shell(args.command, cwd, process)
        self._shells.add(shell)
        assert process.stdout is not None and process.stderr is not None
        # Each pump holds its own clone, so the channel ends when both pipes reach EOF.
        trio.lowlevel.spawn_system_task(_pump, shell, process.stdout, "stdout", send.clone())
        trio.lowlevel.spawn_system_task(_pump, shell, process.stderr, "stderr", send.clone())
        send.close()

        timeout_s = self.shell_timeout_cap_s
        if args.timeout > 0:
            timeout_s = min(args.timeout / 1000, timeout_s)
        try:
            with trio.CancelScope(deadline=trio.current_time() + timeout_s) as scope:
                pending.scope = scope
                if pending.aborted:
                    scope.cancel()
                async for kind, text in receive:
                    # Never cut an append in half: the sim's seqno must match what the server saw.
                    with trio.CancelScope(shield=True):
                        await forward(kind, text)
                await process.wait()
            pending.scope = None
            exit_: agent.ShellStreamExit | None = agent.ShellStreamExit(cwd=str(cwd))
            if not scope.cancelled_caught:
                exit_.code = _exit_code(process.returncode)
            elif not pending.aborted and args.timeout_behavior == agent.TimeoutBehavior.BACKGROUND:
                shell.backgrounded = True  # from now on the pumps keep its output
                for kind, text in _queued(receive):  # output from before the timeout is this exec's
                    await forward(kind, text)
                await reply(event(backgrounded=self._register_background(shell)))
                exit_ = None
            else:
                assert exit_ is not None
                shell.kill()
                with trio.move_on_after(2):  # what it printed before dying, then its status
                    async for kind, text in receive:
                        await forward(kind, text)
                    await process.wait()
                exit_.code, exit_.aborted = _exit_code(process.returncode), True
                exit_.abort_reason = (
                    agent.ShellAbortReason.USER_ABORT if pending.aborted else agent.ShellAbortReason.TIMEOUT
                )
            if exit_ is not None:
                exit_.local_execution_time_ms = int((time.monotonic() - started) * 1000)
                await reply(event(exit=exit_))
            await reply(stream_close(msg.id))
        finally:
            receive.close()
            if not shell.backgrounded:  # done, or cancelled from outside: leave nothing behind
                shell.kill()
                with trio.CancelScope(shield=True), trio.move_on_after(2):
                    await process.wait()
                self._shells.discard(shell)

    def _register_background(self, shell: Shell) -> agent.ShellStreamBackgrounded:
        shell_id = self._next_shell_id
        self._next_shell_id += 1
        self.background[shell_id] = shell
        return agent.ShellStreamBackgrounded(
            shell_id=shell_id,
            command=shell.command,
            working_directory=str(shell.cwd),
            pid=shell.process.pid,
            reason=agent.ShellBackgroundReason.TIMEOUT,
        )


_ONE_SHOT = {  # exec oneof -> (result oneof, WorkspaceExecutor method)
    "read_args": ("read_result", "read"),
    "write_args": ("write_result", "write"),
    "delete_args": ("delete_result", "delete"),
    "grep_args": ("grep_result", "grep"),
    "diagnostics_args": ("diagnostics_result", "diagnostics"),
}


def _exit_code(returncode: int | None) -> int:
    if returncode is None:
        return 0
    return 128 - returncode if returncode < 0 else returncode  # killed by signal N -> 128+N


def _queued(receive: trio.MemoryReceiveChannel[Events]) -> list[Events]:
    out = []
    while True:
        try:
            out.append(receive.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return out


# --- grep (ripgrep semantics, in Python) --------------------------------------------------

_TYPES = {"py": "*.{py,pyi}", "js": "*.{js,mjs,cjs,jsx}", "ts": "*.{ts,tsx,mts,cts}", "rust": "*.rs"}
_MAX_LINE = 2000  # longer matched lines are cut, as the client does


def _glob_regex(glob: str) -> str:
    """Translate a ripgrep-style glob: ``**`` spans directories, ``*``/``?`` don't, plus
    ``[...]`` classes and ``{a,b}`` alternatives."""
    out, i = [], 0
    while i < len(glob):
        c = glob[i]
        if glob.startswith("**", i):
            slash = glob.startswith("**/", i)
            out.append("(?:.*/)?" if slash else ".*")
            i += 3 if slash else 2
        elif c == "[" and (end := glob.find("]", i + 2)) != -1:
            body = glob[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body[0] in "!^" else body).replace("\\", "\\\\") + "]")
            i = end + 1
        elif c == "{" and (end := glob.find("}", i + 1)) != -1:
            out.append("(?:" + "|".join(_glob_regex(alt) for alt in glob[i + 1 : end].split(",")) + ")")
            i = end + 1
        else:
            out.append({"*": "[^/]*", "?": "[^/]"}.get(c, re.escape(c)))
            i += 1
    return "".join(out)


def _files(root: Path, base: Path) -> list[tuple[str, Path]]:
    """(path relative to root, real path) of every file under base, skipping .git, sorted."""
    if base.is_file():
        return [(base.relative_to(root).as_posix(), base)]
    found = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            path = Path(dirpath, name)
            if path.resolve().is_relative_to(root):  # a symlink out of the workspace is not ours
                found.append((path.relative_to(root).as_posix(), path))
    return sorted(found)


def _matched_lines(regex: re.Pattern[str], text: str, lines: list[str], multiline: bool) -> list[int]:
    if not multiline:
        return [i for i, line in enumerate(lines) if regex.search(line)]
    starts = [0, *(m.end() for m in re.finditer("\n", text))]
    hit: set[int] = set()
    for m in regex.finditer(text):
        first = bisect.bisect_right(starts, m.start()) - 1
        last = bisect.bisect_right(starts, max(m.end() - 1, m.start())) - 1
        hit.update(range(first, last + 1))
    return sorted(i for i in hit if i < len(lines))


def _window(items: list, offset: int | None, head_limit: int | None) -> tuple[list, bool]:
    items = items[offset or 0 :]
    if head_limit and len(items) > head_limit:
        return items[:head_limit], True
    return items, False


def _grep(root: Path, base: Path | None, args: agent.GrepArgs) -> agent.GrepUnionResult:
    mode = args.output_mode or "files_with_matches"
    if mode not in ("content", "files_with_matches", "count"):
        raise ValueError(f"unknown output_mode {mode!r}")
    if base is None:
        raise ValueError(f"path is outside the workspace: {args.path}")
    if not base.exists():
        raise ValueError(f"path not found: {args.path}")
    flags = (re.IGNORECASE if args.case_insensitive else 0) | (re.DOTALL if args.multiline else 0)
    try:
        regex = re.compile(args.pattern, flags | re.MULTILINE)
    except re.error as exc:
        raise ValueError(f"invalid regex {args.pattern!r}: {exc}") from exc
    globs = [re.compile(_glob_regex(args.glob.removeprefix("./").lstrip("/")))] if args.glob else []
    of_type = re.compile(_glob_regex(_TYPES.get(args.type, f"*.{args.type}"))) if args.type else None
    before = args.context_before if args.context_before is not None else (args.context or 0)
    after = args.context_after if args.context_after is not None else (args.context or 0)

    per_file: list[tuple[str, list[int], list[str]]] = []  # (file, matched line indexes, lines)
    for rel, path in _files(root, base):
        names = (rel, path.relative_to(base).as_posix() if base.is_dir() else path.name, path.name)
        if globs and not any(g.fullmatch(n) for g in globs for n in names):
            continue
        if of_type is not None and not of_type.fullmatch(path.name):
            continue
        if not args.pattern and mode == "files_with_matches":  # Glob: list files, don't read them
            per_file.append((rel, [0], []))
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if b"\0" in data[:8192]:
            continue  # binary, as ripgrep skips it
        text = data.decode("utf-8", errors="replace")
        lines = text.splitlines()
        if hits := _matched_lines(regex, text, lines, bool(args.multiline)):
            per_file.append((rel, hits, lines))

    if mode == "files_with_matches":
        files, cut = _window([rel for rel, _, _ in per_file], args.offset, args.head_limit)
        return agent.GrepUnionResult(
            files=agent.GrepFilesResult(
                files=files,
                total_files=len(per_file),
                client_truncated=cut,
                head_limit_applied=args.head_limit,
                offset_applied=args.offset,
            )
        )
    if mode == "count":
        counts, cut = _window(
            [agent.GrepFileCount(file=rel, count=len(hits)) for rel, hits, _ in per_file],
            args.offset,
            args.head_limit,
        )
        return agent.GrepUnionResult(
            count=agent.GrepCountResult(
                counts=counts,
                total_files=len(per_file),
                total_matches=sum(len(hits) for _, hits, _ in per_file),
                client_truncated=cut,
                head_limit_applied=args.head_limit,
                offset_applied=args.offset,
            )
        )
    flat: list[tuple[str, agent.GrepContentMatch]] = []
    for rel, hits, lines in per_file:
        shown = sorted({j for i in hits for j in range(max(i - before, 0), min(i + after + 1, len(lines)))})
        matched = set(hits)
        flat.extend(
            (
                rel,
                agent.GrepContentMatch(
                    line_number=i + 1,
                    content=lines[i][:_MAX_LINE],
                    content_truncated=len(lines[i]) > _MAX_LINE,
                    is_context_line=i not in matched,
                ),
            )
            for i in shown
        )
    window, cut = _window(flat, args.offset, args.head_limit)
    grouped: list[agent.GrepFileMatch] = []
    for rel, match in window:
        if not grouped or grouped[-1].file != rel:
            grouped.append(agent.GrepFileMatch(file=rel))
        grouped[-1].matches.append(match)
    return agent.GrepUnionResult(
        content=agent.GrepContentResult(
            matches=grouped,
            total_lines=len(flat),
            total_matched_lines=sum(not m.is_context_line for _, m in flat),
            client_truncated=cut,
            head_limit_applied=args.head_limit,
            offset_applied=args.offset,
        )
    )
