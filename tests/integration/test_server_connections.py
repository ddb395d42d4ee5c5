"""What the daemon's HTTP server keeps of a connection once the client has closed it."""

from __future__ import annotations

import os

import trio
import trio.testing

from byok.http.serve import serve_app


def _sockets() -> set[str]:
    """The sockets this process holds open (Linux: /proc)."""
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            held.add(target)
    return held


async def _ok(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
    if scope["type"] == "lifespan":
        raise RuntimeError("no lifespan")
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]


async def test_an_idle_connection_the_client_closed_is_released_at_once(nursery: trio.Nursery) -> None:
    """hypercorn 0.18's trio server kept a keep-alive connection the client had closed, its
    socket and tasks, until keep_alive_timeout (300 s here): with a client that opens a
    connection per request, a socket and ~13 KB per request piled up for five minutes (bench 13
    counted one open socket per turn). byok's server lets it go as soon as it reads the EOF."""
    base_url, stop = await serve_app(_ok, host="127.0.0.1", port=0, nursery=nursery)
    port = int(base_url.rsplit(":", 1)[1])
    before = _sockets()
    for _ in range(5):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        got = b""
        while not got.endswith(b"ok"):
            got += await stream.receive_some(4096)
        assert got.startswith(b"HTTP/1.1 200")
        # Until the server has finished the response and waits idle for a next request (the
        # client closing mid-recycle was always released).
        await trio.testing.wait_all_tasks_blocked(0.01)
        await stream.aclose()
    # The server's ends go as soon as it has read each EOF (a few scheduler turns, no timer).
    with trio.fail_after(5):
        while _sockets() - before:
            await trio.sleep(0.01)
    stop()
