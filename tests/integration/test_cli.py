"""The command line as users and service managers run it: real subprocesses."""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import trio

from tests.integration.conftest import write_config
from tests.support.fake_provider import FakeProvider, chat_text_script
from tests.support.serve_process import byok_cmd, serve_process

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
    lines = result.stderr.splitlines()
    assert lines[-1].startswith("byok: cannot reach a daemon at http://127.0.0.1:9: "), result.stderr
    assert "Traceback" not in result.stderr and len(lines) == 3  # after what it was about to do


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
        simulate = [
            sys.executable,
            "-m",
            "byok",
            "simulate",
            "--url",
            base,
            "--model",
            "byok-demo",
            "say hello",
        ]
        sim = await trio.run_process(simulate, cwd=ROOT, capture_stdout=True, check=False)
        assert sim.returncode == 0 and sim.stdout.decode() == "Hello from the fake model\n"
        provider.enqueue(chat_text_script(["Hello again"]))
        sim = await trio.run_process([*simulate, "--frames"], cwd=ROOT, capture_stdout=True, check=False)
        frames = sim.stdout.decode().splitlines()
        assert sim.returncode == 0 and "frame: interaction_update.text_delta 'Hello again'" in frames
        assert "frame: interaction_update.turn_ended" in frames and "frame: conversation_checkpoint" in frames
    finally:
        daemon.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            code = await daemon.wait()
    assert code == 0
    assert (tmp_path / "data" / "byok.sqlite3").exists()
    # The service's log at its default level: the start, a line per run and the stop, not a
    # line per request.
    text = log.read_text()
    assert text.count("listening on") == 1 and "Running on" not in text, text
    assert f"byok listening on http://127.0.0.1:{port} (version " in text
    assert f"config: {cfg}" in text and "models: byok-demo (fake/gpt-test)" in text
    assert f"data dir: {tmp_path / 'data'}" in text and "no model to serve" not in text
    assert "HTTP Request" not in text and url not in text.split("providers: ")[1].split("\n", 1)[1], text
    end = re.search(r"INFO byok.run: run (\S+) \(conversation \S+, model byok-demo\): ok; (.*)", text)
    assert end is not None, text
    assert re.fullmatch(r"tokens in [\d,]+ \(\d+% cached\), out [\d,]+; TTFT \d+\.\d\ds; \d+\.\d\ds", end[2])


def test_version() -> None:
    from byok.version import byok_version

    result = byok("--version")
    assert result.returncode == 0 and result.stdout == f"byok {byok_version()}\n"
    assert byok_version()[0].isdigit()


def test_every_flag_has_help() -> None:
    from byok.cli import build_parser

    def walk(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from ((f"{name} {n}", a) for n, a in walk(sub))
            else:
                yield parser.prog, action

    missing = [f"{where}: {a.option_strings or a.dest}" for where, a in walk(build_parser()) if not a.help]
    assert not missing


def test_a_bad_log_level_is_one_line(tmp_path: Path) -> None:
    for args, env, where in [
        (["--log-level", "loud"], {}, "--log-level: unknown log level 'loud'"),
        ([], {"BYOK_LOG_LEVEL": "verbose"}, "BYOK_LOG_LEVEL: unknown log level 'verbose'"),
    ]:
        result = byok_cmd(
            "serve", "--data-dir", str(tmp_path / "d"), "--port", "0", *args, home=tmp_path, **env
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr == f"byok: {where} (expected one of: debug, info, warning, error)\n"


async def test_without_a_config_the_summary_says_what_to_do(tmp_path: Path) -> None:
    """No config anywhere: the daemon still starts (relaying everything), and its summary says so
    and what to do. BYOK_LOG_LEVEL is read in any case."""
    data = tmp_path / "data"
    log = tmp_path / "daemon.log"
    async with serve_process(
        "--data-dir", str(data), "--port", "0", home=tmp_path, log=log, BYOK_LOG_LEVEL="Info"
    ) as served:
        assert await served.stop(signal.SIGINT) == 0
    text = served.text()
    summary = text[text.index("byok listening on") :].splitlines()[:6]
    assert summary[1:] == [
        "  config: no config: built-in defaults",
        "  providers: none",
        "  models: none",
        f"  data dir: {data}",
        "  no model to serve: add a [[providers]] and a [[models]] entry to ~/.config/byok/config.toml "
        "(docs/config.md), then `byok doctor` to check it and SIGHUP (or a restart) to load it",
    ], text
    assert "Traceback" not in text
