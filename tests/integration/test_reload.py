"""SIGHUP reloads the config and the keys file of a running `byok serve`, runs in flight
untouched; a bad config is refused in one line and the running one stays."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import trio

from byok.devtools.cursor_sim import CursorSim, Transcript, user_turn
from tests.support.fake_provider import FakeProvider, chat_text_script
from tests.support.serve_process import Served, serve_process


def config_text(provider_url: str, data_dir: Path, models: list[str]) -> str:
    text = f"""
[server]
host = "127.0.0.1"
port = 0
data_dir = "{data_dir}"
upstream = "http://127.0.0.1:9"
provider_retry_base_s = 0.01

[[providers]]
id = "fake"
kind = "openai_chat"
base_url = "{provider_url}"
api_key_env = "FAKE_KEY"
"""
    for model in models:
        text += f'\n[[models]]\nid = "{model}"\nprovider = "fake"\nupstream_model = "up-{model}"\n'
        text += "context_tokens = 1000\n"
    return text


async def hup_and_wait(served: Served, pattern: str) -> str:
    before = len(served.text())
    served.proc.send_signal(signal.SIGHUP)
    with trio.fail_after(20):
        while True:
            new = served.text()[before:]
            if pattern in new:
                return new
            await trio.sleep(0.05)


async def test_sighup_reloads_models_and_keys_without_dropping_runs(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    provider = FakeProvider()
    url = await provider.start(nursery)
    cfg, env_file, data = tmp_path / "byok.toml", tmp_path / "keys.env", tmp_path / "data"
    cfg.write_text(config_text(url, data, ["first"]))
    env_file.write_text("FAKE_KEY=key-1\n")
    env_file.chmod(0o600)
    slow = [f"part {i} " for i in range(8)]
    args = ("--config", str(cfg), "--env-file", str(env_file), "--port", "0")
    async with (
        serve_process(*args, home=tmp_path, log=tmp_path / "d.log") as served,
        httpx.AsyncClient(timeout=30) as client,
    ):
        sim = CursorSim(served.url, client)
        results: dict[str, Transcript] = {}

        async def run(rid: str, model: str, text: str) -> None:
            turn = user_turn(text, conversation_id=f"conv-{rid}", model_id=model, message_id=f"m-{rid}")
            results[rid] = await sim.run(rid, turn)

        async def started(n: int) -> None:
            with trio.fail_after(20):
                while len(provider.requests) < n:
                    await trio.sleep(0.02)

        # A good config while a run streams: a model added, the key rotated in the keys file.
        provider.enqueue(chat_text_script(slow, delay_s=0.15))
        async with trio.open_nursery() as runs:
            runs.start_soon(run, "r1", "first", "one")
            await started(1)
            cfg.write_text(config_text(url, data, ["first", "second"]))
            env_file.write_text("FAKE_KEY=key-2\n")
            reloaded = await hup_and_wait(served, "config reloaded")
        assert f"config reloaded from {cfg}: models: added second" in reloaded
        assert results["r1"].end_stream == {} and results["r1"].text() == "".join(slow)  # not dropped
        assert provider.requests[0].headers["authorization"] == "Bearer key-1"

        provider.enqueue(chat_text_script(["from the second model"]))
        await run("r2", "second", "two")
        assert results["r2"].text() == "from the second model"
        assert provider.requests[1].json["model"] == "up-second"
        assert provider.requests[1].headers["authorization"] == "Bearer key-2"
        assert (await client.get(served.url + "/byok/healthz")).json()["models"] == ["first", "second"]

        # A bad config while a run streams: refused in one line, the running config stays.
        provider.enqueue(chat_text_script(slow, delay_s=0.1))
        async with trio.open_nursery() as runs:
            runs.start_soon(run, "r3", "second", "three")
            await started(3)
            cfg.write_text(
                config_text(url, data, ["first"]) + "\n[server]\nport = 1\n"
            )  # a table twice: bad TOML
            refused = await hup_and_wait(served, "SIGHUP")
        [line] = [line for line in refused.splitlines() if "SIGHUP" in line]
        assert f" ERROR byok: SIGHUP: not reloaded, the running config stays: {cfg}: invalid TOML: " in line
        assert results["r3"].end_stream == {} and results["r3"].text() == "".join(slow)
        provider.enqueue(chat_text_script(["still here"]))
        await run("r4", "second", "four")
        assert results["r4"].text() == "still here"
        assert await served.stop() == 0
    assert "Traceback" not in served.text()
