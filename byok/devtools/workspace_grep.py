"""Grep execs against the workspace, with ripgrep's semantics in Python: Cursor's Grep and
Glob tools both arrive as ``grep_args`` (a Glob is an empty pattern in files_with_matches mode)."""

from __future__ import annotations

import bisect
import os
import re
from pathlib import Path

from byok.devtools.workspace_files import resolve_in
from byok.pb.agent import v1 as agent

_TYPES = {"py": "*.{py,pyi}", "js": "*.{js,mjs,cjs,jsx}", "ts": "*.{ts,tsx,mts,cts}", "rust": "*.rs"}
_MAX_LINE = 2000  # longer matched lines are cut, as the client does


def grep(root: Path, args: agent.GrepArgs) -> agent.GrepResult:
    try:
        union = _grep(root, resolve_in(root, args.path or ""), args)
    except ValueError as exc:
        return agent.GrepResult(error=agent.GrepError(error=str(exc)))
    success = agent.GrepSuccess(
        pattern=args.pattern,
        path=args.path or "",
        output_mode=args.output_mode or "files_with_matches",
        workspace_results={str(root): union},
    )
    return agent.GrepResult(success=success)


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
