"""Provider keys at start: one from an environment variable the daemon does not have (a service
does not see the user's shell) is a warning at start, a clear error per run, and used as soon as
it is set, without a restart; one in a config file other users can read is a warning."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
import trio

from byok.config_load import load_config
from byok.daemon import run_daemon
from byok.devtools.cursor_sim import CursorSim, user_turn
from tests.integration.conftest import write_config
from tests.support.fake_provider import FakeProvider, chat_text_script

VAR = "BYOK_TEST_UNSET_PROVIDER_KEY"


async def test_an_unset_key_variable_fails_runs_clearly_until_it_is_set(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(VAR, raising=False)
    provider = FakeProvider()
    cfg = tmp_path / "byok.toml"
    write_config(cfg, provider_url=await provider.start(nursery), data_dir=tmp_path / "data")
    cfg.write_text(cfg.read_text().replace('api_key = "sk-test"', f'api_key_env = "{VAR}"'))
    with caplog.at_level(logging.WARNING, logger="byok"):
        base_url, shutdown = await nursery.start(run_daemon, load_config(cfg, overrides={}))
    unset = f"environment variable {VAR} is not set"
    assert f"{unset} (runs on provider 'fake' fail until it is set)" in caplog.text

    async with httpx.AsyncClient(timeout=30) as client:
        sim = CursorSim(base_url, client)
        turn = user_turn("hi", conversation_id="c", model_id="byok-demo", message_id="m1")
        failed = await sim.run("r1", turn)
        assert failed.error is not None and failed.error["code"] == "failed_precondition"
        where = f"{cfg}: providers[0].api_key_env"
        assert failed.error["message"] == f"no API key for provider 'fake': {where}: {unset}"
        assert not provider.requests

        monkeypatch.setenv(VAR, "sk-from-env")
        provider.enqueue(chat_text_script(["hello"]))
        again = await sim.run("r2", turn)  # the same message again: an edit of it (clarification 4)
        assert again.end_stream == {}, again.end_stream
        assert provider.requests[0].headers["authorization"] == "Bearer sk-from-env"
    shutdown()


@pytest.mark.parametrize("mode", [0o644, 0o600])
async def test_a_config_holding_keys_that_others_can_read_is_warned_about(
    tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture, mode: int
) -> None:
    cfg = tmp_path / "byok.toml"
    write_config(cfg, provider_url="http://127.0.0.1:9/v1", data_dir=tmp_path / "data")  # api_key = "sk-test"
    cfg.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="byok"):
        _, shutdown = await nursery.start(run_daemon, load_config(cfg, overrides={}))
    shutdown()
    readable = "other users can read it (mode 0o644)"
    warning = f"{cfg} holds the keys of provider(s) 'fake' and {readable}: chmod 600 {cfg}"
    assert (warning in caplog.text) == (mode == 0o644), caplog.text
