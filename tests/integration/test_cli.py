"""The command line as users and service managers run it: real subprocesses."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import trio

from tests.integration.conftest import write_config
from tests.support.fake_provider import FakeProvider, chat_text_script

ROOT = Path(__file__).resolve().parents[2]


def byok(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "byok", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_bad_config_is_one_clear_line(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(
        '[[providers]]\nid = "p"\nkind = "openai_chat"\nbase_url = "http://x"\n'
        '[[models]]\nid = "m"\nprovider = "nope"\nupstream_model = "u"\ncontext_tokens = 1\n'
    )
    result = byok("serve", "--config", str(cfg))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(cfg) in lines[0] and "models[0].provider" in lines[0]
    assert "Traceback" not in result.stderr


def test_unreadable_config_named_by_env_var(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    result = byok("serve", env={"BYOK_CONFIG": str(missing)})
    assert result.returncode == 2
    assert str(missing) in result.stderr and "Traceback" not in result.stderr


def test_a_daemon_that_cannot_start_says_why_in_one_line(tmp_path: Path) -> None:
    """The mistakes a user makes starting a service: the port is taken (byok already runs), the
    data dir cannot be made. One line each, no traceback, exit status 1."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    cases = [
        (tmp_path / "data", f"--port={port}", f"cannot listen on 127.0.0.1:{port}: Address already in use"),
        (not_a_dir / "data", "--port=0", f"cannot use data_dir {not_a_dir / 'data'}: Not a directory"),
    ]
    try:
        for data_dir, port_flag, message in cases:
            cfg = tmp_path / "byok.toml"
            write_config(cfg, provider_url="http://127.0.0.1:9/v1", data_dir=data_dir)
            result = byok("serve", "--config", str(cfg), port_flag)
            assert result.returncode == 1, result.stderr
            lines = result.stderr.strip().splitlines()
            assert lines[-1] == f"byok: {message}", result.stderr
            assert "Traceback" not in result.stderr
    finally:
        taken.close()


def test_simulate_without_a_daemon_says_so_in_one_line() -> None:
    result = byok("simulate", "--url", "http://127.0.0.1:9", "--model", "byok-demo", "hi")
    assert result.returncode == 1
    assert result.stderr.startswith("byok: cannot reach a daemon at http://127.0.0.1:9: "), result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


async def test_serve_and_simulate_as_subprocesses(tmp_path: Path, nursery: trio.Nursery) -> None:
    provider = FakeProvider()
    url = await provider.start(nursery)
    provider.enqueue(chat_text_script(["Hello from ", "the fake model"]))
    cfg = tmp_path / "byok.toml"
    write_config(cfg, provider_url=url, data_dir=tmp_path / "data")
    port = free_port()
    log = tmp_path / "daemon.log"
    with open(log, "wb") as log_file:
        daemon = await trio.lowlevel.open_process(
            [sys.executable, "-m", "byok", "serve", "--config", str(cfg), "--port", str(port)],
            cwd=ROOT,
            stdout=log_file,
            stderr=log_file,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient() as client:
            with trio.fail_after(30):
                while True:
                    try:
                        if (await client.get(base + "/byok/healthz")).status_code == 200:
                            break
                    except httpx.TransportError:
                        await trio.sleep(0.05)
        sim = await trio.run_process(
            [sys.executable, "-m", "byok", "simulate", "--url", base, "--model", "byok-demo", "say hello"],
            cwd=ROOT,
            capture_stdout=True,
            check=False,
        )
        out = sim.stdout.decode()
        assert sim.returncode == 0, out
        assert "text: Hello from the fake model" in out
        assert "end-stream: {}" in out
    finally:
        daemon.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            code = await daemon.wait()
    assert code == 0
    assert (tmp_path / "data" / "byok.sqlite3").exists()
    # The service's log at its default level: the start and the stop, not a line per request.
    text = log.read_text()
    assert f"byok listening on http://127.0.0.1:{port}" in text
    assert "HTTP Request" not in text and url not in text, text
