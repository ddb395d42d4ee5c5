"""A control-API client for the tests: the daemon's console token (made anew, the way `byok
console-token` does) in the header, and helpers to wait for what the call log writes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

from byok.console.token import new_token


@asynccontextmanager
async def console_client(base_url: str, data_dir: Path) -> AsyncIterator[httpx.AsyncClient]:
    token = new_token(data_dir)
    headers = {"authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=base_url + "/byok/api", headers=headers, timeout=30) as client:
        yield client


async def wait_calls(api: httpx.AsyncClient, count: int, timeout_s: float = 10.0, **params: Any) -> list[Any]:
    """The newest calls once at least ``count`` match (the call log writes after runs go quiet)."""
    with trio.fail_after(timeout_s):
        while True:
            calls = (await api.get("/calls", params=params)).json()["calls"]
            if len(calls) >= count:
                return calls
            await trio.sleep(0.02)
