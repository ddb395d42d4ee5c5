"""byok/pb must be exactly what `make proto` generates from proto/."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROTOS = ["agent_v1.proto", "aiserver_v1.proto", "agent_service.proto", "bidi_service.proto"]


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            str(ROOT / "proto"),
            f"--python_betterproto2_out={tmp_path}",
            "--python_betterproto2_opt=client_generation=none",
            *[str(ROOT / "proto" / p) for p in PROTOS],
        ],
        check=True,
        env=env,
        capture_output=True,
    )
    fresh, committed = _tree(tmp_path), _tree(ROOT / "byok" / "pb")
    assert sorted(fresh) == sorted(committed), "byok/pb file set differs: run `make proto`"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"byok/pb is stale ({', '.join(stale)}): run `make proto`"


def test_every_proto_is_compiled() -> None:
    assert sorted(p.name for p in (ROOT / "proto").glob("*.proto")) == sorted(PROTOS)
