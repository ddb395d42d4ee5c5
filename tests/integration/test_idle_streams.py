"""RunSSE streams that never get a run_request: a client that leaves is let go at once, and
a daemon at a 256-descriptor limit (macOS's default) still serves after 300 of them."""

from __future__ import annotations

import os
import resource
from contextlib import suppress
from pathlib import Path

import httpx
import trio

from byok.devtools.cursor_sim import CursorSim, user_turn
from byok.http.connect_envelope import encode_frame
from byok.http.run_stream import MAX_UNDECIDED_STREAMS
from byok.pb.aiserver import v1 as aiserver
from tests.integration.conftest import start_daemon, write_config
from tests.integration.test_crash import daemon_process
from tests.support.fake_provider import FakeProvider, chat_text_script

FD_LIMIT = 256


def _low_fd_limit() -> None:  # in the child, before exec: soft and hard, so raising does nothing
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def run_sse_request(request_id: str) -> bytes:
    body = encode_frame(bytes(aiserver.BidiRequestId(request_id=request_id)))
    head = (
        "POST /agent.v1.AgentService/RunSSE HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        "content-type: application/connect+proto\r\nconnect-protocol-version: 1\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def open_undecided(port: int, request_id: str) -> trio.SocketStream:
    """A RunSSE whose response has started (the daemon now waits for its run_request)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(run_sse_request(request_id))
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = await stream.receive_some(4096)
        assert chunk, f"closed before the response started: {got!r}"
        got += chunk
    assert got.startswith(b"HTTP/1.1 200"), got
    return stream


def sockets_of(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with suppress(OSError):  # closed since it was listed
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return count


async def test_idle_run_sse_streams_do_not_exhaust_a_low_fd_limit(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Before: each RunSSE a client closed kept its socket for the decision timeout (5 min);
    300 of them under a 256-descriptor limit made accept fail (EMFILE), the health check time
    out and the next turn fail."""
    provider = FakeProvider()
    cfg = tmp_path / "byok.toml"
    write_config(cfg, provider_url=await provider.start(nursery), data_dir=tmp_path / "data")
    log = tmp_path / "daemon.log"
    async with (
        httpx.AsyncClient(timeout=10) as client,
        daemon_process(cfg, client, log, preexec_fn=_low_fd_limit) as daemon,
    ):
        proc, base = daemon.proc, daemon.base_url
        port = int(base.rsplit(":", 1)[1])
        baseline = sockets_of(proc.pid)
        opened = 0
        with trio.fail_after(60):
            while opened < 300:
                # Batches stay under both the descriptor limit and the cap on undecided streams.
                batch = [await open_undecided(port, f"idle-{opened + i}") for i in range(40)]
                opened += len(batch)
                for stream in batch:
                    await stream.aclose()
        # Every stream's socket goes as its client's does, not after a timeout.
        with trio.fail_after(10):
            while sockets_of(proc.pid) > baseline:
                await trio.sleep(0.05)
        with trio.fail_after(10):
            assert (await client.get(base + "/byok/healthz")).status_code == 200
        provider.enqueue(chat_text_script(["still ", "here"]))
        sim = CursorSim(base, client)
        turn = user_turn("hello", conversation_id="c-fd", model_id="byok-demo", message_id="m1")
        with trio.fail_after(20):
            tr = await sim.run("req-after-idle", turn)
        assert tr.end_stream == {}, tr.end_stream
        assert tr.text() == "still here"
    assert "EMFILE" not in log.read_text() and "Too many open files" not in log.read_text()
    assert f"open file limit: {FD_LIMIT}" in log.read_text()


async def read_to_end(stream: trio.SocketStream) -> bytes:
    got = b""
    while chunk := await stream.receive_some(65536):
        got += chunk
        if got.endswith(b"0\r\n\r\n"):  # the chunked body's last chunk
            break
    return got


async def test_undecided_streams_are_capped(tmp_path: Path, nursery: trio.Nursery) -> None:
    """Past MAX_UNDECIDED_STREAMS streams waiting for their run_request, a RunSSE is answered
    resource_exhausted at once; a slot frees as soon as a waiting client leaves."""
    async with start_daemon(tmp_path, nursery) as d:
        port = int(d.base_url.rsplit(":", 1)[1])
        waiting = [await open_undecided(port, f"wait-{i}") for i in range(MAX_UNDECIDED_STREAMS)]
        with trio.fail_after(5):
            over = await open_undecided(port, "one-too-many")
            answer = await read_to_end(over)
        assert b"resource_exhausted" in answer, answer
        await over.aclose()
        await waiting.pop().aclose()
        # The freed place is taken by the next stream (once the daemon has seen the close).
        with trio.fail_after(5):
            while True:
                stream = await open_undecided(port, "next")
                with trio.move_on_after(0.2):
                    answer = await read_to_end(stream)
                    await stream.aclose()
                    assert b"resource_exhausted" in answer
                    await trio.sleep(0.01)
                    continue
                break
        await stream.aclose()
        for s in waiting:
            await s.aclose()
