"""The file execs (Read, Write, Delete, Diagnostics) against a workspace folder. Nothing outside
``root`` is read, written or deleted: paths are resolved, symlinks included, before use."""

from __future__ import annotations

from pathlib import Path

from byok.model.images import sniff_image_type
from byok.pb.agent import v1 as agent


def resolve_in(root: Path, path: str) -> Path | None:
    """The real path inside root, or None when it (or a symlink on the way) leaves root."""
    p = Path(path).expanduser() if path else root
    real = (p if p.is_absolute() else root / p).resolve()
    return real if real.is_relative_to(root) else None


def read(root: Path, args: agent.ReadArgs) -> agent.ReadResult:
    path, real = args.path, resolve_in(root, args.path)
    if real is None:
        return agent.ReadResult(permission_denied=agent.ReadPermissionDenied(path=path))
    if not real.exists():
        return agent.ReadResult(file_not_found=agent.ReadFileNotFound(path=path))
    if not real.is_file():
        return agent.ReadResult(invalid_file=agent.ReadInvalidFile(path=path, reason="not a file"))
    try:
        data = real.read_bytes()
        if sniff_image_type(data) is not None:
            # Cursor answers a Read of an image with its bytes.
            return agent.ReadResult(success=agent.ReadSuccess(path=path, data=data, file_size=len(data)))
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


def write(root: Path, args: agent.WriteArgs) -> agent.WriteResult:
    path, real = args.path, resolve_in(root, args.path)
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


def delete(root: Path, args: agent.DeleteArgs) -> agent.DeleteResult:
    path, real = args.path, resolve_in(root, args.path)
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
    success = agent.DeleteSuccess(path=path, deleted_file=str(real), file_size=len(data), prev_content=prev)
    return agent.DeleteResult(success=success)


def diagnostics(root: Path, args: agent.DiagnosticsArgs) -> agent.DiagnosticsResult:
    real = resolve_in(root, args.path)
    if real is None:
        return agent.DiagnosticsResult(permission_denied=agent.DiagnosticsPermissionDenied(path=args.path))
    if not real.exists():
        return agent.DiagnosticsResult(file_not_found=agent.DiagnosticsFileNotFound(path=args.path))
    return agent.DiagnosticsResult(success=agent.DiagnosticsSuccess(path=args.path))  # no linters here
