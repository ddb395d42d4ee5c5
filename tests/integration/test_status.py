"""`byok status` and the data dir's lock, through the command line: real daemons in subprocesses."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import httpx
import trio

from byok.devtools.cursor_sim import CursorSim, user_turn
from tests.integration.conftest import write_config
from tests.support.fake_provider import FakeProvider, Script
from tests.support.serve_process import ROOT, byok_cmd, command_env, serve_process


async def byok_async(*args: str, home: Path) -> tuple[int, str, str]:
    """A byok command run while this process serves the fake provider (a blocking run would stall it)."""
    done = await trio.run_process(
        [sys.executable, "-m", "byok", *args],
        cwd=ROOT,
        env=command_env(home),
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_status_of_a_daemon_with_a_run_and_without(tmp_path: Path, nursery: trio.Nursery) -> None:
    provider = FakeProvider()
    url = await provider.start(nursery)
    provider.enqueue(Script(hang_before_headers=True))  # the run stays active until shutdown
    cfg = tmp_path / "byok.toml"
    data = tmp_path / "data"
    write_config(cfg, provider_url=url, data_dir=data, server_extra="shutdown_grace_s = 0.2")

    code, out, err = await byok_async("status", "--config", str(cfg), home=tmp_path)
    assert (code, out, err) == (3, f"byok is not running on data dir {data} (config: {cfg})\n", "")

    async with serve_process("--config", str(cfg), "--port", "0", home=tmp_path, log=tmp_path / "d.log") as d:
        code, out, err = await byok_async("status", "--config", str(cfg), home=tmp_path)
        assert code == 0, err
        lines = out.splitlines()
        assert re.fullmatch(rf"byok \S+ is running: pid {d.proc.pid}, {d.url}, up \d+s", lines[0]), out
        assert lines[1:] == [
            f"  config: {cfg}",
            f"  data dir: {data}",
            "  models: byok-demo",
            "  Cursor's backend: http://127.0.0.1:9 (unreachable)",
            "  active runs: 0",
        ]

        async with httpx.AsyncClient(timeout=30) as client:
            sim = CursorSim(d.url, client)
            turn = user_turn("hi", conversation_id="conv-1", model_id="byok-demo", message_id="m1")
            async with trio.open_nursery() as runs:
                runs.start_soon(sim.run, "req-1", turn)
                with trio.fail_after(20):
                    while not provider.requests:
                        await trio.sleep(0.05)
                code, out, _ = await byok_async("status", "--config", str(cfg), "--json", home=tmp_path)
                assert code == 0
                body = json.loads(out)
                assert body["pid"] == d.proc.pid and body["url"] == d.url and body["models"] == ["byok-demo"]
                [run] = body["active_runs"]
                assert (run["request_id"], run["conversation_id"], run["model"]) == (
                    "req-1",
                    "conv-1",
                    "byok-demo",
                )
                code, out, _ = await byok_async("status", "--config", str(cfg), home=tmp_path)
                assert "  active runs: 1\n    req-1: model byok-demo, conversation conv-1, running " in out
                runs.cancel_scope.cancel()

            # The status names paths and conversations: a page that had its own host name resolve
            # to 127.0.0.1 (DNS rebinding) does not get it.
            refused = await client.get(d.url + "/byok/status", headers={"host": "attacker.example:80"})
            assert refused.status_code == 403
        assert await d.stop() == 0

    code, out, _ = await byok_async("status", "--config", str(cfg), home=tmp_path)
    assert code == 3  # the lock file no longer names the stopped daemon


async def test_a_second_daemon_on_the_same_data_dir_refuses_in_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "byok.toml"
    data = tmp_path / "data"
    write_config(cfg, provider_url="http://127.0.0.1:9/v1", data_dir=data)
    async with serve_process(
        "--config", str(cfg), "--port", "0", home=tmp_path, log=tmp_path / "1.log"
    ) as first:
        second = byok_cmd("serve", "--config", str(cfg), "--port", "0", home=tmp_path)
        assert second.returncode == 1
        assert second.stderr.splitlines()[-1] == (
            f"byok: data dir {data} is in use by another byok (pid {first.proc.pid}, listening on "
            f"{first.url}): stop it first (`byok status` shows it), or give this one another data_dir"
        ), second.stderr
        assert "Traceback" not in second.stderr
        async with httpx.AsyncClient() as client:
            assert (await client.get(first.url + "/byok/healthz")).status_code == 200
        assert await first.stop() == 0
    # Once the first has stopped the data dir is free again (after a kill -9 too: test_crash.py).
    async with serve_process(
        "--config", str(cfg), "--port", "0", home=tmp_path, log=tmp_path / "2.log"
    ) as again:
        assert await again.stop() == 0


async def test_status_of_a_daemon_in_lan_mode(tmp_path: Path) -> None:
    """TLS and a credential (docs/lan.md): `byok status` reaches the daemon with both; a request
    without the credential gets nothing."""
    cfg = tmp_path / "byok.toml"
    token = "t" * 40
    lan = f'auth_token = "{token}"\ntls_names = ["localhost"]'
    write_config(cfg, provider_url="http://127.0.0.1:9/v1", data_dir=tmp_path / "data", server_extra=lan)
    cfg.chmod(0o600)
    async with serve_process("--config", str(cfg), "--port", "0", home=tmp_path, log=tmp_path / "d.log") as d:
        assert d.url.startswith("https://")
        code, out, err = await byok_async("status", "--config", str(cfg), "--json", home=tmp_path)
        assert code == 0, (out, err)
        assert json.loads(out)["url"] == d.url.replace("localhost", "127.0.0.1") and token not in out
        async with httpx.AsyncClient(verify=False) as client:
            assert (await client.get(d.url + "/byok/status")).status_code == 401
        assert await d.stop() == 0
