"""A provider that echoes the key it was sent: the key reaches neither the database (nor its
WAL), nor the daemon's log, nor the EndStream Cursor shows; a redaction marker stands in."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import pytest
import trio

from byok.devtools.cursor_sim import CursorSim, user_turn
from byok.providers.secrets import REDACTED
from byok.store import SQLiteStore
from tests.integration.test_crash import daemon_process
from tests.support.fake_provider import FakeProvider, Script

KEY = "sk-proj-Zq8vN3xK1pLm7Rt2Yw9bCd4Ef6Gh0IjKlMn"
ENV_KEY = "sk-ant-api03-Hx7Qp2Lw9Zr4Tn6Vb1Kc8Md3Fs5Gj0"
GATEWAY_TOKEN = "gwt_9f3a61c2b8d74e05a1f6c3b9"
CONV = "conv-redact"


def echo_401(*secrets: str) -> Script:
    """What OpenAI-compatible gateways answer to a wrong key, the key in clear."""
    message = "Incorrect API key provided: " + " / ".join(secrets) + ". You can find your API key at ..."
    error = {"message": message, "type": "invalid_request_error", "code": "invalid_api_key"}
    body = json.dumps({"error": error})
    return Script(status=401, headers=[("content-type", "application/json")], chunks=[body.encode()])


def config(provider_url: str, data_dir: Path, kind: str, key_line: str) -> str:
    return f"""
[server]
host = "127.0.0.1"
port = 0
data_dir = "{data_dir}"
upstream = "http://127.0.0.1:9"
provider_retry_base_s = 0.01

[logging]
detailed = true

[[providers]]
id = "fake"
kind = "{kind}"
base_url = "{provider_url}"
{key_line}

[providers.headers]
x-gateway-token = "{GATEWAY_TOKEN}"

[[models]]
id = "byok-demo"
provider = "fake"
upstream_model = "gpt-test"
context_tokens = 128000
"""


def files_holding(data_dir: Path, secret: str) -> list[str]:
    """The data dir's files (the database, its WAL and shared memory) that hold ``secret``."""
    return [p.name for p in data_dir.iterdir() if p.is_file() and secret.encode() in p.read_bytes()]


@pytest.mark.parametrize(
    ("kind", "key_line", "key"),
    [
        ("openai_chat", f'api_key = "{KEY}"', KEY),
        ("anthropic", 'api_key_env = "BYOK_TEST_PROVIDER_KEY"', ENV_KEY),
    ],
)
async def test_an_echoed_key_is_redacted_everywhere(
    kind: str, key_line: str, key: str, tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BYOK_TEST_PROVIDER_KEY", ENV_KEY)
    provider = FakeProvider()
    url = await provider.start(nursery)
    if kind == "anthropic":
        url = url.removesuffix("/v1")
    data_dir = tmp_path / "data"
    cfg = tmp_path / "byok.toml"
    cfg.write_text(config(url, data_dir, kind, key_line))
    log = tmp_path / "daemon.log"
    provider.enqueue(echo_401(key, GATEWAY_TOKEN))
    async with httpx.AsyncClient(timeout=15) as client, daemon_process(cfg, client, log) as d:
        sim = CursorSim(d.base_url, client)
        turn = user_turn("hi", conversation_id=CONV, model_id="byok-demo", message_id="m1")
        with trio.fail_after(15):
            tr = await sim.run("req-401", turn)
        sent = provider.requests[0].headers
        assert key in (sent.get("authorization", "") + sent.get("x-api-key", ""))  # the key went out
        assert sent["x-gateway-token"] == GATEWAY_TOKEN
        # What Cursor shows.
        shown = json.dumps(tr.end_stream)
        assert tr.error is not None and "HTTP 401" in shown, shown
        assert key not in shown and GATEWAY_TOKEN not in shown
        assert f"Incorrect API key provided: {REDACTED} / {REDACTED}" in shown
        # SIGTERM: the run's end and the call record are written before the daemon exits.
        d.proc.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            assert await d.proc.wait() == 0
    with SQLiteStore.open_in(data_dir) as store:
        (call,) = store.llm_calls("req-401")
        run = store.run("req-401")
    assert call.error is not None and REDACTED in call.error and key not in call.error
    assert call.response_capture is not None and REDACTED.encode() in call.response_capture
    assert run is not None and run.error_message is not None and REDACTED in run.error_message
    for secret in (key, GATEWAY_TOKEN):
        assert files_holding(data_dir, secret) == []
        assert secret not in log.read_text()
    assert "HTTP 401" in log.read_text()  # the failure itself is logged


async def test_the_database_held_the_key_before(tmp_path: Path) -> None:
    """The check above can see a key: a WAL that holds one is found."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with SQLiteStore.open_in(data_dir) as store:
        store.start_run("r", CONV, "m", 0)
        store.finish_run("r", "error", 1, error_code="unavailable", error_message=f"HTTP 401: {KEY}")
        assert files_holding(data_dir, KEY)
