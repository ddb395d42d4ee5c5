"""`byok simulate` as a user runs it: a subprocess against a daemon subprocess, its tools run in
a real workspace folder, stopped with Ctrl-C (SIGINT)."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import sys
from pathlib import Path

import trio

from tests.integration.conftest import write_config
from tests.support.fake_provider import FakeProvider, Script, chat_text_script, chat_tool_script
from tests.support.serve_process import ROOT, command_env, serve_process


async def open_simulate(*args: str, home: Path) -> trio.Process:
    with (home / "sim.out").open("wb") as out, (home / "sim.err").open("wb") as err:
        return await trio.lowlevel.open_process(
            [sys.executable, "-m", "byok", "simulate", *args],
            cwd=ROOT,
            env=command_env(home),
            stdout=out,
            stderr=err,
        )


def outputs(home: Path) -> tuple[str, str]:
    return (home / "sim.out").read_text(), (home / "sim.err").read_text()


async def test_a_tool_round_runs_in_the_workspace(tmp_path: Path, nursery: trio.Nursery) -> None:
    provider = FakeProvider()
    url = await provider.start(nursery)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("first line\nsecond line\n")
    provider.enqueue(
        chat_tool_script(
            [
                ("call_r", "Read", json.dumps({"path": "notes.txt"})),
                ("call_s", "Shell", json.dumps({"command": "echo made > made.txt; wc -l < notes.txt"})),
            ],
            text="Looking.",
        ),
        chat_text_script(["The notes have ", "two lines."], usage=(120, 9)),
    )
    cfg = tmp_path / "byok.toml"
    write_config(cfg, provider_url=url, data_dir=tmp_path / "data")
    async with serve_process("--config", str(cfg), "--port", "0", home=tmp_path, log=tmp_path / "d.log"):
        sim = await open_simulate(
            "--config", str(cfg), "--workspace", str(ws), "what is in notes?", home=tmp_path
        )
        with trio.fail_after(60):
            code = await sim.wait()
    out, err = outputs(tmp_path)
    assert code == 0, (out, err)
    lines = out.splitlines()
    assert lines[0] == "Looking."
    reads = [i for i, line in enumerate(lines) if line.startswith("[tool] read ")]
    shells = [i for i, line in enumerate(lines) if line.startswith("[tool] shell_stream ")]
    assert len(reads) == len(shells) == 1 and '"path": "notes.txt"' in lines[reads[0]], out
    assert "[result] read: success" in lines and "[result] shell exit 0" in lines
    assert "  | 2" in lines  # the shell's stdout, as it came
    assert lines[-1] == "The notes have two lines."
    assert (ws / "made.txt").read_text() == "made\n"
    err_lines = err.splitlines()
    assert re.fullmatch(
        r"byok simulate: http://127\.0\.0\.1:\d+, model byok-demo, mode agent, conversation \S+", err_lines[0]
    )
    assert err_lines[1:] == [f"byok simulate: workspace {ws}", "byok simulate: done: tokens in 130, out 14"]
    # The model saw both results.
    results = [m for m in provider.requests[1].json["messages"] if m["role"] == "tool"]
    assert "second line" in results[0]["content"] and "2" in results[1]["content"]


async def test_ctrl_c_cancels_the_run_and_exits_cleanly(tmp_path: Path, nursery: trio.Nursery) -> None:
    provider = FakeProvider()
    url = await provider.start(nursery)
    provider.enqueue(Script(hang_before_headers=True))
    cfg = tmp_path / "byok.toml"
    data = tmp_path / "data"
    write_config(cfg, provider_url=url, data_dir=data)
    async with serve_process("--config", str(cfg), "--port", "0", home=tmp_path, log=tmp_path / "d.log") as d:
        sim = await open_simulate(
            "--config", str(cfg), "--mode", "ask", "--conversation", "c-1", "hi", home=tmp_path
        )
        with trio.fail_after(30):
            while not provider.requests:
                await trio.sleep(0.05)
            sim.send_signal(signal.SIGINT)
            code = await sim.wait()
        out, err = outputs(tmp_path)
        assert code == 130, (out, err)
        assert out == "^C: cancelling the run (Ctrl-C again to quit at once)\n"
        err_lines = err.splitlines()
        assert err_lines[0].endswith(", model byok-demo, mode ask, conversation c-1")
        workspace = re.fullmatch(
            r"byok simulate: workspace (\S+) "
            r"\(a new temporary folder; --workspace DIR runs the tools in yours\)",
            err_lines[1],
        )
        assert workspace is not None and Path(workspace[1]).is_dir(), err
        assert len(err_lines) == 3 and err_lines[2].startswith("byok: the run ended with canceled"), err
        assert "Traceback" not in err
        await d.wait_for_log(r"run \S+ \(conversation c-1, model byok-demo\): canceled")
    with sqlite3.connect(data / "byok.sqlite3") as db:
        assert db.execute("SELECT status FROM runs").fetchall() == [("canceled",)]


async def test_errors_are_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "byok.toml"
    write_config(cfg, provider_url="http://127.0.0.1:9/v1", data_dir=tmp_path / "data")
    for args, message in [
        (["--url", "http://127.0.0.1:9"], "byok: cannot reach a daemon at http://127.0.0.1:9: "),
        (["--workspace", str(tmp_path / "nope")], f"byok: --workspace {tmp_path / 'nope'}: not a directory"),
        ([], f"byok: no byok is running on data dir {tmp_path / 'data'} ({cfg} has it pick a port at start)"),
    ]:
        done = await trio.run_process(
            [sys.executable, "-m", "byok", "simulate", "--config", str(cfg), *args, "hi"],
            cwd=ROOT,
            env=command_env(tmp_path),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        err = done.stderr.decode()
        assert done.returncode in (1, 2) and err.splitlines()[-1].startswith(message), err
        assert "Traceback" not in err and done.stdout == b""
