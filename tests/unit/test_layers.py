"""The layers' import rules (docs/architecture.md): the sans-IO core imports no trio and no HTTP
layer; run/ owns tasks but neither frames (http/) nor reads protobuf (pb/)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "byok"


def imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def offenders(layer: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in (PACKAGE / layer).rglob("*.py")
        for name in imports(path)
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    )


@pytest.mark.parametrize("layer", ["loop", "model"])
def test_the_core_does_no_io(layer: str) -> None:
    assert offenders(layer, ("trio", "httpx", "byok.http", "byok.run", "byok.store")) == []


def test_cursor_imports_no_trio_and_no_run_layer() -> None:
    assert offenders("cursor", ("trio", "byok.http", "byok.run")) == []


def test_run_neither_frames_nor_reads_protobuf() -> None:
    assert offenders("run", ("byok.http", "byok.pb")) == []
