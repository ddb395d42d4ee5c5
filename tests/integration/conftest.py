"""Integration fixtures: the real daemon (hypercorn, SQLite in tmp), a fake provider, a Cursor simulator."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import httpx
import pytest
import trio

from byok.config_load import load_config
from byok.daemon import run_daemon
from byok.devtools.cursor_sim import CursorSim
from byok.run.replay import read_log, replay
from tests.support.fake_provider import FakeProvider


@attrs.define
class Daemon:
    base_url: str
    provider: FakeProvider
    sim: CursorSim
    client: httpx.AsyncClient
    data_dir: Path
    config_path: Path


def write_config(
    path: Path,
    *,
    provider_url: str,
    data_dir: Path,
    extra: str = "",
    kind: str = "openai_chat",
    upstream: str = "http://127.0.0.1:9",
    server_extra: str = "",
    provider_extra: str = "",
) -> None:
    path.write_text(
        f"""
[server]
host = "127.0.0.1"
port = 0
data_dir = "{data_dir}"
upstream = "{upstream}"
kv_ack_timeout_s = 5.0
provider_retry_base_s = 0.01
{server_extra}

[[providers]]
id = "fake"
kind = "{kind}"
base_url = "{provider_url}"
api_key = "sk-test"
{provider_extra}

[[models]]
id = "byok-demo"
provider = "fake"
upstream_model = "gpt-test"
context_tokens = 128000
{extra}
"""
    )


# Per data dir, when the daemon a test started last on it has stopped: a test that starts a second
# one on the same data dir (a restart) waits for the first to let it go.
_stopped: dict[Path, trio.Event] = {}


@asynccontextmanager
async def start_daemon(
    tmp_path: Path,
    nursery: trio.Nursery,
    kind: str = "openai_chat",
    upstream: str = "http://127.0.0.1:9",
    extra: str = "",
    server_extra: str = "",
    provider_extra: str = "",
) -> AsyncIterator[Daemon]:
    """The real daemon on an ephemeral loopback port, its provider a FakeProvider of ``kind``."""
    provider = FakeProvider()
    provider_url = await provider.start(nursery)
    if kind == "anthropic":
        provider_url = provider_url.removesuffix("/v1")  # Anthropic base URLs carry no /v1
    data_dir = tmp_path / "data"
    config_path = tmp_path / "byok.toml"
    write_config(
        config_path,
        provider_url=provider_url,
        data_dir=data_dir,
        kind=kind,
        upstream=upstream,
        extra=extra,
        server_extra=server_extra,
        provider_extra=provider_extra,
    )
    config = load_config(config_path, overrides={})
    earlier = frozenset((data_dir / "runs").glob("*.jsonl"))
    # Every run keeps its input log (run/run_log.py): tests replay them.
    config = attrs.evolve(config, logging=attrs.evolve(config.logging, record_runs=True))
    if (previous := _stopped.get(data_dir)) is not None:
        with trio.fail_after(30):  # the data dir is one daemon's at a time (daemon_lock.py)
            await previous.wait()
    stopped = _stopped[data_dir] = trio.Event()

    async def serve(task_status: trio.TaskStatus[tuple[str, Callable[[], None]]]) -> None:
        try:
            await run_daemon(config, task_status=task_status)
        finally:
            stopped.set()

    base_url, shutdown = await nursery.start(serve)
    async with httpx.AsyncClient(timeout=30) as client:
        yield Daemon(base_url, provider, CursorSim(base_url, client), client, data_dir, config_path)
    shutdown()
    assert_runs_replay(data_dir, skip=earlier)


def assert_runs_replay(data_dir: Path, skip: frozenset[Path] = frozenset()) -> None:
    """Every run that finished replays from its input log to the frames, provider requests and
    outcome it had (run/replay.py). ``skip``: logs of an earlier daemon on the same data dir."""
    for path in sorted(set((data_dir / "runs").glob("*.jsonl")) - skip):
        lines = read_log(path)
        if not lines or lines[-1].get("k") != "end":
            continue  # the run did not finish (the test stopped the daemon under it)
        problems = replay(lines).mismatches()
        assert not problems, f"{path.name} does not replay: {problems}"


@pytest.fixture
async def daemon(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[Daemon]:
    async with start_daemon(tmp_path, nursery) as d:
        yield d
