"""`byok doctor` through its command line, against a provider that answers, one that refuses
connections and one that refuses the key."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import trio

from tests.integration.conftest import write_config
from tests.integration.test_cli import free_port
from tests.support.fake_provider import FakeProvider, Script, chat_text_script, error_script
from tests.support.serve_process import ROOT, command_env, serve_process


async def doctor(*args: str, home: Path) -> tuple[int, list[str], str]:
    done = await trio.run_process(
        [sys.executable, "-m", "byok", "doctor", *args],
        cwd=ROOT,
        env=command_env(home),
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    return done.returncode, done.stdout.decode().splitlines(), done.stderr.decode()


def model_list(*ids: str) -> Script:
    body = json.dumps({"object": "list", "data": [{"id": i, "object": "model"} for i in ids]})
    return Script(headers=[("content-type", "application/json")], chunks=[body.encode()])


async def test_doctor_passes_on_a_working_setup(tmp_path: Path, nursery: trio.Nursery) -> None:
    provider = FakeProvider()
    url = await provider.start(nursery)
    cfg = tmp_path / "byok.toml"
    write_config(cfg, provider_url=url, data_dir=tmp_path / "data")
    cfg.chmod(0o600)
    port = str(free_port())

    provider.enqueue(model_list("gpt-test", "other"), chat_text_script(["OK"], finish="length"))
    code, out, err = await doctor("--config", str(cfg), "--port", port, home=tmp_path)
    assert code == 0, (out, err)
    assert out[:5] == [
        f"ok    config: {cfg}: 1 provider(s), models: byok-demo",
        f"ok    config (holds the keys of fake): {cfg} (mode 600)",
        f"ok    data dir: {tmp_path / 'data'} does not exist yet: byok serve creates it (mode 700)",
        f"ok    port 127.0.0.1:{port}: free",
        "ok    provider 'fake': reachable, lists 2 model(s)",
    ]
    assert out[5].startswith("ok    model 'byok-demo' (fake/gpt-test): first token in ")
    assert out[6].startswith(
        "      Cursor, backend URL mode: quit Cursor, then start it with `cursor --test-backend"
    )
    assert out[7].startswith("      Cursor, proxy mode: set [proxy] enabled = true")
    assert out[8:] == ["all checks passed"] and err == ""
    models, call = provider.requests
    assert (models.method, models.path, models.headers["authorization"]) == (
        "GET",
        "/v1/models",
        "Bearer sk-test",
    )
    assert (
        call.path == "/v1/chat/completions" and call.json["max_tokens"] == 1 and call.json["stream"] is True
    )

    # With the daemon running on that port, the port is byok's own.
    async with serve_process(
        "--config", str(cfg), "--port", port, home=tmp_path, log=tmp_path / "d.log"
    ) as d:
        provider.enqueue(model_list("gpt-test"), chat_text_script(["OK"], finish="length"))
        code, out, err = await doctor("--config", str(cfg), "--port", port, home=tmp_path)
        assert code == 0, (out, err)
        assert f"ok    port 127.0.0.1:{port}: held by byok (pid {d.proc.pid}) on this config" in out
        assert await d.stop() == 0


async def test_doctor_names_each_failure_and_its_fix(tmp_path: Path, nursery: trio.Nursery) -> None:
    """A provider nobody listens for, one that refuses the key, and files others can read: each
    one line with its fix, exit status 1."""
    provider = FakeProvider()
    url = await provider.start(nursery)
    provider.enqueue(error_script(401, "Incorrect API key provided"))
    dead = f"http://127.0.0.1:{free_port()}/v1"
    cfg = tmp_path / "byok.toml"
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    keys = tmp_path / ".config" / "byok" / "env"  # the default keys file
    keys.parent.mkdir(parents=True)
    keys.write_text("DEAD_KEY=k\n")
    keys.chmod(0o644)
    write_config(
        cfg,
        provider_url=url,
        data_dir=data,
        extra=f"""
[[providers]]
id = "dead"
kind = "openai_chat"
base_url = "{dead}"
api_key_env = "DEAD_KEY"

[[models]]
id = "dead-model"
provider = "dead"
upstream_model = "m"
context_tokens = 1000
""",
    )
    cfg.chmod(0o644)
    code, out, err = await doctor("--config", str(cfg), "--port", "0", home=tmp_path)
    assert code == 1 and err == "5 check(s) failed\n", (out, err)
    fails = [line for line in out if line.startswith("FAIL")]
    assert fails[:4] == [
        f"FAIL  keys file: {keys} is readable by others (mode 644); fix: chmod 600 {keys}",
        f"FAIL  config (holds the keys of fake): {cfg} is readable by others (mode 644); "
        f"fix: chmod 600 {cfg}",
        f"FAIL  data dir: {data} can be listed by others (mode 755): it holds your conversations; "
        f"fix: chmod 700 {data}",
        "FAIL  provider 'fake': the provider refused the key (HTTP 401: Incorrect API key provided); "
        f"fix: check api_key of provider 'fake' in {cfg}",
    ]
    assert re.fullmatch(
        rf"FAIL  provider 'dead': cannot connect to {dead}/models \(.*\b(connect|refused)\b.*\); "
        rf"fix: is the server running\? check base_url in {cfg}",
        fails[4],
    ), fails
    assert len(fails) == 5
    assert "Traceback" not in err and len(provider.requests) == 1  # no call after a refused key


async def test_doctor_on_a_bad_config(tmp_path: Path) -> None:
    cfg = tmp_path / "byok.toml"
    cfg.write_text("[server]\nport = 70000\n")
    code, out, err = await doctor("--config", str(cfg), home=tmp_path)
    assert (
        code == 1
        and out[0].startswith(f"FAIL  config: {cfg}: server.port: ")
        and out[0].endswith(f"fix: edit {cfg}")
    )
    assert err == "1 check(s) failed\n"
