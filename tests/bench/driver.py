"""Instruments for `make bench`: a timed fake provider, a timed Cursor simulator, the real
daemon wired to both, statistics, the results table, the prefix meter and profile summaries.

Everything runs in one process and one trio thread (plus SQLite worker threads), so client,
daemon and provider timestamps all come from the same ``time.monotonic()`` clock and can be
subtracted from each other directly.
"""

from __future__ import annotations

import gc
import json
import math
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import attrs
import betterproto2
import h11
import httpcore
import httpx
import trio

from byok.config_load import load_config
from byok.cursor import proto_decode
from byok.daemon import run_daemon
from byok.devtools.cursor_sim import RUN_SSE, CursorSim
from byok.http.connect_envelope import FrameDecoder, encode_frame
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from byok.store import SQLiteStore
from tests.integration.conftest import write_config
from tests.support.fake_provider import FakeProvider, Script, sse

# --- a provider that timestamps every chunk it sends -------------------------------------------


class TimedProvider(FakeProvider):
    """FakeProvider that records, per request index, when each script chunk left the socket."""

    def __init__(self) -> None:
        super().__init__()
        self.chunk_times: dict[int, list[float]] = {}

    async def _respond(self, conn: h11.Connection, stream: trio.SocketStream, script: Script) -> bool:
        # Runs synchronously up to its first await right after the request was recorded, so the
        # last recorded request is the one being answered (also with concurrent connections).
        times = self.chunk_times.setdefault(len(self.requests) - 1, [])
        if script.hang_before_headers:
            await trio.sleep_forever()
        headers = [*script.headers, ("transfer-encoding", "chunked")]
        await stream.send_all(conn.send(h11.Response(status_code=script.status, headers=headers)))
        for i, chunk in enumerate(script.chunks):
            if i and script.delay_s:
                await trio.sleep(script.delay_s)
            await stream.send_all(conn.send(h11.Data(data=chunk)))
            times.append(time.monotonic())
        await stream.send_all(conn.send(h11.EndOfMessage()))
        return True


# --- a Cursor simulator that timestamps its appends --------------------------------------------


@attrs.frozen
class AppendRecord:
    request_id: str
    seqno: int
    kind: str  # the AgentClientMessage oneof name
    sent_at: float  # monotonic time the POST started (after the client encoded the body)
    done_at: float  # monotonic time the daemon's response arrived
    size: int  # request body bytes
    body: bytes | None = None  # the body itself, kept for appends of 1 MB or more (bench 4 splits it)


class TimedSim(CursorSim):
    """CursorSim whose BidiAppends are logged with timestamps (``append_log``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.append_log: list[AppendRecord] = []

    async def append(
        self,
        request_id: str,
        seqno: int,
        msg: agent.AgentClientMessage,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        req = aiserver.BidiAppendRequest(
            data=bytes(msg).hex(),
            request_id=aiserver.BidiRequestId(request_id=request_id),
            append_seqno=seqno,
        )
        body = bytes(req)
        kind, _ = betterproto2.which_one_of(msg, "message")
        sent = time.monotonic()
        resp = await self.client.post(
            self.base_url + "/aiserver.v1.BidiService/BidiAppend",
            content=body,
            headers={"content-type": "application/proto", "connect-protocol-version": "1", **(headers or {})},
        )
        kept = body if len(body) >= 1_000_000 else None
        self.append_log.append(AppendRecord(request_id, seqno, kind, sent, time.monotonic(), len(body), kept))
        return resp

    def run_request_sent(self, request_id: str) -> float:
        return next(a.sent_at for a in self.append_log if a.request_id == request_id and a.seqno == 0)


# --- a light client for the streaming benchmarks -------------------------------------------------


@attrs.define
class LightTranscript:
    deltas: list[float] = attrs.Factory(list)  # arrival time of each text_delta frame
    texts: list[bytes] = attrs.Factory(list)  # and its payload, decoded after the run
    other: int = 0  # frames of any other kind
    end_stream: dict[str, Any] | None = None

    def text(self) -> str:
        return "".join(text_delta(p) or "" for p in self.texts)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    return proto_decode.varint(data, pos, len(data))


def is_text_delta(payload: bytes) -> bool:
    """AgentServerMessage{interaction_update(1){text_delta(1){...}}}, by its first tags."""
    if not payload or payload[0] != 0x0A:
        return False
    _, pos = _varint(payload, 1)
    return pos < len(payload) and payload[pos] == 0x0A


def text_delta(payload: bytes) -> str | None:
    if not is_text_delta(payload):
        return None
    msg = agent.AgentServerMessage.parse(payload)
    return msg.interaction_update.text_delta.text


def _fields(data: bytes, start: int, end: int) -> dict[int, tuple[int, int]]:
    """Field number -> (payload start, end) of the length-delimited fields (varints: (value, -1))
    of one message; enough for the few shapes light_frame reads."""
    out: dict[int, tuple[int, int]] = {}
    pos = start
    while pos < end:
        key, pos = _varint(data, pos)
        if key & 7 == 0:
            value, pos = _varint(data, pos)
            out[key >> 3] = (value, -1)
        elif key & 7 == 2:
            size, pos = _varint(data, pos)
            out[key >> 3] = (pos, pos + size)
            pos += size
        else:
            raise ValueError("light_frame reads only varint and length-delimited fields")
    return out


LIGHT_MIN_BYTES = 64 * 1024


def light_frame(payload: bytes) -> agent.AgentServerMessage:
    """AgentServerMessage.parse for a benchmark client: a large blob SET or tool card keeps only
    what the client acts on (the SET's id, blob id and data; the card's call ids), skipping
    betterproto2's ~8 ms per MB (a real client's protobuf decode is far cheaper). Everything else,
    and every small frame, is parsed in full."""
    if len(payload) < LIGHT_MIN_BYTES:
        return agent.AgentServerMessage.parse(payload)
    top = _fields(payload, 0, len(payload))
    if 4 in top:  # kv_server_message{id(1), set_blob_args(3){blob_id(1), blob_data(2)}}
        kv = _fields(payload, *top[4])
        if 3 in kv:
            args = _fields(payload, *kv[3])
            blob_id = payload[slice(*args[1])] if 1 in args else b""
            data = payload[slice(*args[2])] if 2 in args else b""
            kv_id = kv[1][0] if 1 in kv else 0
            return agent.AgentServerMessage(
                kv_server_message=agent.KvServerMessage(
                    id=kv_id, set_blob_args=agent.SetBlobArgs(blob_id=blob_id, blob_data=data)
                )
            )
    if 1 in top:  # interaction_update{tool_call_completed(3){call_id(1), tool_call(2), model_call_id(3)}}
        update = _fields(payload, *top[1])
        if 3 in update:
            done = _fields(payload, *update[3])
            text = {n: payload[slice(*done[n])].decode() if n in done else "" for n in (1, 3)}
            completed = agent.ToolCallCompletedUpdate(
                call_id=text[1], tool_call=agent.ToolCall(), model_call_id=text[3]
            )
            return agent.AgentServerMessage(
                interaction_update=agent.InteractionUpdate(tool_call_completed=completed)
            )
    return agent.AgentServerMessage.parse(payload)


async def light_run(sim: TimedSim, request_id: str, run_request: agent.AgentRunRequest) -> LightTranscript:
    """CursorSim.run without the per-frame protobuf parse: text_delta frames are recognised by
    their first bytes and only timestamped (their text is decoded afterwards); every other frame
    is parsed and KV SETs are answered as CursorSim does. Keeps the harness's CPU per frame low
    so that it, not the daemon, is never what the streaming benchmarks measure."""
    tr = LightTranscript()
    acked: set[bytes] = set()
    lock = trio.Lock()
    seq = 0

    async def send(msg: agent.AgentClientMessage) -> None:
        nonlocal seq
        async with lock:
            resp = await sim.append(request_id, seq, msg)
            resp.raise_for_status()
            seq += 1

    opened = trio.Event()

    async def read() -> None:
        body = encode_frame(bytes(aiserver.BidiRequestId(request_id=request_id)))
        async with sim.client.stream(
            "POST",
            sim.base_url + RUN_SSE,
            content=body,
            headers={"content-type": "application/connect+proto", "connect-protocol-version": "1"},
        ) as resp:
            opened.set()
            decoder = FrameDecoder()
            async for chunk in resp.aiter_bytes():
                for frame in decoder.feed(chunk):
                    if frame.end_stream:
                        tr.end_stream = json.loads(frame.payload)
                        return
                    if is_text_delta(frame.payload):
                        tr.deltas.append(time.monotonic())
                        tr.texts.append(frame.payload)
                        continue
                    tr.other += 1
                    for reply in sim.auto_reply(agent.AgentServerMessage.parse(frame.payload), acked):
                        await send(reply)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await opened.wait()
        await send(agent.AgentClientMessage(run_request=run_request))
    return tr


@contextmanager
def harness_gc_off() -> Iterator[None]:
    """No cyclic GC in this (harness) process while it times frames: a collection over the
    client's and provider's objects would show up as delivery delay. The daemon, a child
    process, keeps its own GC: that is part of what is measured."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# --- the real daemon wired to both ------------------------------------------------------------


@attrs.define
class Bench:
    base_url: str
    provider: TimedProvider
    sim: TimedSim
    client: httpx.AsyncClient
    data_dir: Path
    provider_url: str
    pid: int | None = None  # the daemon's own process, when it runs as a child

    def daemon_cpu_s(self) -> float:
        """CPU seconds (user + system) the daemon's process has used so far."""
        assert self.pid is not None, "an in-process daemon shares this process's CPU clock"
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def daemon_rss(self) -> int:
        assert self.pid is not None
        with open(f"/proc/{self.pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _config(root: Path, provider_url: str, cache_bytes: int | None = None) -> tuple[Path, Path]:
    root.mkdir(parents=True, exist_ok=True)
    data_dir = root / "data"
    cfg = root / "byok.toml"
    write_config(cfg, provider_url=provider_url, data_dir=data_dir)
    # Large blobs (a 2.2 MB tool result) and a loaded machine: no spurious KV timeouts.
    server = "kv_ack_timeout_s = 60.0"
    if cache_bytes is not None:
        server += f"\ncache_bytes = {cache_bytes}"
    # A context window no benchmark's history fills (bench 4's 2.2 MB result would be compacted).
    text = cfg.read_text().replace("kv_ack_timeout_s = 5.0", server)
    cfg.write_text(text.replace("context_tokens = 128000", "context_tokens = 10000000"))
    return cfg, data_dir


@contextmanager
def client_reads(size: int) -> Iterator[None]:
    """The harness client reads its HTTP/1.1 responses ``size`` bytes at a time (httpcore reads
    64 KiB; each read costs this Python client a trip through httpcore and h11, which a 2.2 MB
    frame pays ~35 times). Process-wide while it lasts: only the simulated client reads here."""
    default = httpcore.AsyncHTTP11Connection.READ_NUM_BYTES
    httpcore.AsyncHTTP11Connection.READ_NUM_BYTES = size
    try:
        yield
    finally:
        httpcore.AsyncHTTP11Connection.READ_NUM_BYTES = default


def _client() -> httpx.AsyncClient:
    # httpx pools 100 connections by default; 100 concurrent runs need 100 RunSSE + appends.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(timeout=120, limits=limits)


@asynccontextmanager
async def bench_daemon(
    root: Path, nursery: trio.Nursery, *, sim_kwargs: dict[str, Any] | None = None
) -> AsyncIterator[Bench]:
    """The real daemon in this process and trio thread (for profiling), with a TimedProvider.
    Waits for the daemon to stop on exit, so its call log is flushed before the store is read."""
    provider = TimedProvider()
    url = await provider.start(nursery)
    cfg, data_dir = _config(root, url)
    stopped = trio.Event()

    async def serve(task_status: trio.TaskStatus[tuple[str, Callable[[], None]]]) -> None:
        try:
            await run_daemon(load_config(cfg, overrides={}), task_status=task_status)
        finally:
            stopped.set()

    base_url, stop = await nursery.start(serve)
    try:
        async with _client() as client:
            sim = TimedSim(base_url, client, **(sim_kwargs or {}))
            yield Bench(base_url, provider, sim, client, data_dir, url)
    finally:
        stop()
        with trio.move_on_after(30):
            await stopped.wait()


# `byok serve` with another SLOT_LINGER_S (argv[1]). The allocator is tuned before byok.run.service
# is imported, as byok.cli imports nothing that big before `byok serve` tunes it.
_LINGER_SERVE = """
import sys
from byok.allocator import tune_allocator
tune_allocator()
import byok.run.service
byok.run.service.SLOT_LINGER_S = float(sys.argv.pop(1))
from byok.cli import main
sys.argv[0] = "byok"
raise SystemExit(main())
"""


@asynccontextmanager
async def child_daemon(
    root: Path,
    nursery: trio.Nursery,
    *,
    sim_kwargs: dict[str, Any] | None = None,
    cache_bytes: int | None = None,
    slot_linger_s: float | None = None,
) -> AsyncIterator[Bench]:
    """``byok serve`` as a child process (its own interpreter, its own core), the provider and
    the simulated Cursor in this process. CLOCK_MONOTONIC is system-wide, so frame and chunk
    timestamps taken here still compare directly. Stopped with SIGTERM (graceful) on exit.
    ``slot_linger_s``: how long a finished run's slot is kept (the daemon's SLOT_LINGER_S)."""
    provider = TimedProvider()
    url = await provider.start(nursery)
    cfg, data_dir = _config(root, url, cache_bytes)
    log_path = root / "daemon.log"
    env = {**os.environ, "BYOK_LOG_LEVEL": "INFO"}  # the default level: one line per run
    with open(log_path, "wb") as log_file:
        start = ["-m", "byok"] if slot_linger_s is None else ["-c", _LINGER_SERVE, str(slot_linger_s)]
        proc = await trio.lowlevel.open_process(
            [sys.executable, *start, "serve", "--config", str(cfg)],
            stdout=log_file,
            stderr=log_file,
            env=env,
        )
    try:
        base_url = await _wait_listening(proc, log_path)
        async with _client() as client:
            sim = TimedSim(base_url, client, **(sim_kwargs or {}))
            yield Bench(base_url, provider, sim, client, data_dir, url, pid=proc.pid)
    finally:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                with trio.move_on_after(30):
                    await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def _wait_listening(proc: trio.Process, log_path: Path) -> str:
    """The daemon's base URL, from its "byok listening on ..." log line (it binds port 0)."""
    with trio.fail_after(30):
        while True:
            text = log_path.read_text(errors="replace")
            found = re.search(r"byok listening on (http://\S+)", text)
            if found:
                return found.group(1)
            if proc.returncode is not None:
                raise RuntimeError(f"byok serve exited with {proc.returncode}: {text}")
            await trio.sleep(0.05)


# --- provider scripts --------------------------------------------------------------------------


def _chunk(delta: dict[str, Any] | None, finish: str | None = None, usage: Any = None) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": choices, "usage": usage}


def delta_events(texts: Sequence[str]) -> list[bytes]:
    """A Chat Completions stream as a list of SSE events: role, one event per text, finish, usage, [DONE]."""
    usage = {"prompt_tokens": 10, "completion_tokens": len(texts), "total_tokens": 10 + len(texts)}
    events = [sse(_chunk({"role": "assistant", "content": ""}))]
    events += [sse(_chunk({"content": t})) for t in texts]
    events += [sse(_chunk({}, "stop")), sse(_chunk(None, usage=usage)), sse("[DONE]")]
    return events


def batched(events: Sequence[bytes], per_chunk: int) -> list[bytes]:
    return [b"".join(events[i : i + per_chunk]) for i in range(0, len(events), per_chunk)]


# --- direct provider baseline -------------------------------------------------------------------


async def direct_first_content(
    client: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str] | None = None
) -> float:
    """Seconds from starting a streaming POST to the provider until the first chunk carrying a
    non-empty ``content`` delta arrives (the same event the daemon turns into its first text_delta)."""
    start = time.monotonic()
    first: float | None = None
    async with client.stream(
        "POST",
        url + "/chat/completions",
        content=body,
        headers={"content-type": "application/json", "accept": "text/event-stream", **(headers or {})},
    ) as resp:
        buf = b""
        async for chunk in resp.aiter_bytes():
            if first is None:
                buf += chunk
                if _has_content(buf):
                    first = time.monotonic()
    assert first is not None, "the direct stream carried no content"
    return first - start


def _has_content(buf: bytes) -> bool:
    for line in buf.split(b"\n"):
        if line.startswith(b"data: {"):
            obj = json.loads(line[6:])
            if any(c.get("delta", {}).get("content") for c in obj.get("choices") or ()):
                return True
    return False


# --- statistics ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def ms(seconds: float) -> float:
    return seconds * 1000


def rss_bytes() -> int:
    """Current resident set size (Linux /proc), not the peak getrusage reports."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def settle_memory() -> None:
    gc.collect()
    gc.collect()


# --- the results table -------------------------------------------------------------------------


@attrs.define
class Row:
    bench: str
    metric: str
    value: float
    unit: str
    target: float | None = None
    op: str = ""  # "<=" or ">=" when there is a target
    note: str = ""

    @property
    def verdict(self) -> str:
        if self.target is None or math.isnan(self.value):
            return "-"
        ok = self.value <= self.target if self.op == "<=" else self.value >= self.target
        return "PASS" if ok else "FAIL"


RESULTS: list[Row] = []
NOTES: list[str] = []


def report(
    bench: str,
    metric: str,
    value: float,
    unit: str,
    target: float | None = None,
    op: str = "<=",
    note: str = "",
) -> None:
    row = Row(bench, metric, value, unit, target, op if target is not None else "", note)
    RESULTS.append(row)
    print(f"  [{bench}] {metric}: {fmt(value)} {unit}" + (f"  ({note})" if note else ""))


def fmt(v: float) -> str:
    if math.isnan(v):
        return "n/a"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def table() -> list[str]:
    head = ("bench", "metric", "measured", "target", "result")
    rows = [
        (
            r.bench,
            r.metric,
            f"{fmt(r.value)} {r.unit}",
            f"{r.op} {fmt(r.target)} {r.unit}" if r.target is not None else "",
            r.verdict,
        )
        for r in RESULTS
    ]
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    out = [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    return out


# --- the prefix meter ----------------------------------------------------------------------------


def messages_span(body: bytes) -> bytes:
    """The raw bytes of the request's ``messages`` array, exactly as sent."""
    key = b'"messages":'
    at = body.index(key) + len(key)
    _, end = json.JSONDecoder().raw_decode(body.decode(), at)  # character offset
    return body.decode()[at:end].encode()


def extends(before: bytes, after: bytes) -> bool:
    """``after``'s message array starts with all of ``before``'s elements, byte for byte."""
    if before == after:
        return True
    inner = before[:-1]  # "[m1,...,mk"
    if before == b"[]":
        return True
    return after.startswith(inner) and after[len(inner) : len(inner) + 1] == b","


@attrs.define
class PrefixMeter:
    compared: int = 0
    extending: int = 0
    broken: list[str] = attrs.Factory(list)
    db_compared: int = 0
    db_extending: int = 0

    def add(self, label: str, bodies: Iterable[bytes]) -> None:
        """Consecutive provider request bodies of one conversation."""
        spans = [messages_span(b) for b in bodies]
        for i in range(1, len(spans)):
            self.compared += 1
            if extends(spans[i - 1], spans[i]):
                self.extending += 1
            else:
                self.broken.append(f"{label}: request {i} does not extend request {i - 1}")

    def add_store(self, data_dir: Path, conversation_ids: Iterable[str]) -> None:
        """The daemon's own meter: llm_calls.prefix_extends over the same conversations."""
        with SQLiteStore.open_in(data_dir) as store:
            for cid in conversation_ids:
                compared, extending = store.prefix_stats(cid)
                self.db_compared += compared
                self.db_extending += extending


PREFIX = PrefixMeter()


def bodies_with(provider: FakeProvider, tag: str) -> list[bytes]:
    """Request bodies (in arrival order) whose messages mention ``tag`` (a conversation's marker)."""
    needle = tag.encode()
    return [r.body for r in provider.requests if needle in r.body]


# --- profile summaries -------------------------------------------------------------------------

# Which side of the loopback a sampled stack belongs to, by the files on it. With async_mode
# off a sample is the trio thread's real stack: the run loop, then one task's whole await chain.
_SIDES = (  # in this order: TimedProvider (tests/bench/driver.py) runs under fake_provider.py frames
    ("provider (FakeProvider)", ("tests/support/fake_provider.py",)),
    ("client (CursorSim)", ("byok/devtools/cursor_sim.py", "tests/bench/")),
)


def _frame(ident: str) -> tuple[str, str]:
    parts = ident.split("\x00")
    return parts[0], parts[1] if len(parts) > 1 else ""


def _classify(paths: Sequence[str]) -> str:
    for side, markers in _SIDES:
        if any(m in path for path in paths for m in markers):
            return side
    if any("/byok/" in path or "/hypercorn/" in path for path in paths):
        return "daemon"
    if any(p.endswith("_io_epoll.py") for p in paths[-2:]):
        return "idle (epoll wait)"
    return "trio scheduler"


def _package(path: str) -> str:
    short = _short(path)
    if short.startswith("byok/"):
        return "/".join(short.split("/")[:2])
    if short.startswith("stdlib/") or path.startswith("<"):
        return "stdlib/builtins"
    return short.split("/")[0]


def summarize_profile(session: Any, top: int = 15) -> list[str]:
    """Shares of sampled time per side (daemon, client, provider, scheduler, idle), and the
    daemon's heaviest functions (self and inclusive) and packages, from a pyinstrument session
    sampled with async_mode off."""
    by_side: dict[str, float] = {}
    self_t: dict[str, float] = {}
    incl: dict[str, float] = {}
    by_pkg: dict[str, float] = {}
    for stack, t in session.frame_records:
        frames = [_frame(ident) for ident in stack]
        paths = [path for _, path in frames]
        side = _classify(paths)
        by_side[side] = by_side.get(side, 0.0) + t
        if side != "daemon":
            continue
        func, path = frames[-1]
        leaf = f"{_short(path)}:{func}"
        self_t[leaf] = self_t.get(leaf, 0.0) + t
        pkg = _package(path)
        by_pkg[pkg] = by_pkg.get(pkg, 0.0) + t
        for key in {f"{_short(p)}:{f}" for f, p in frames if "/byok/" in p}:
            incl[key] = incl.get(key, 0.0) + t
    total = sum(by_side.values()) or 1.0
    daemon = by_side.get("daemon", 0.0) or 1.0
    lines = [f"{session.sample_count} samples, {total:.2f} s on the trio thread:"]
    for side, t in sorted(by_side.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {100 * t / total:5.1f}%  {side}  ({t:.2f} s)")
    lines.append("daemon time by package of the running (leaf) frame, % of daemon time:")
    for pkg, t in sorted(by_pkg.items(), key=lambda kv: -kv[1])[:10]:
        lines.append(f"  {100 * t / daemon:5.1f}%  {pkg}")
    lines.append(f"daemon self time, top {top} functions, % of daemon time:")
    for key, t in sorted(self_t.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {100 * t / daemon:5.1f}%  {key}")
    lines.append(f"daemon inclusive time, top {top} byok functions, % of daemon time:")
    for key, t in sorted(incl.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {100 * t / daemon:5.1f}%  {key}")
    return lines


def _short(path: str) -> str:
    for marker in ("/site-packages/", "/work/main/"):
        if marker in path:
            return path.split(marker, 1)[1]
    if "/lib/python" in path:
        return "stdlib/" + path.rsplit("/", 1)[-1]
    return path or "?"


# --- store-call tracing (profiling only) -----------------------------------------------------


@attrs.frozen
class StoreCall:
    name: str
    start: float  # monotonic time the run asked for the store
    wall: float  # until the answer was back on the trio thread (queueing + thread hop + work)
    work: float  # inside the worker thread


@contextmanager
def trace_store_calls() -> Iterator[list[StoreCall]]:
    """Record every AsyncStore call of an in-process daemon (monkeypatched for the duration)."""
    from byok.store.async_store import AsyncStore

    calls: list[StoreCall] = []
    original = AsyncStore.call

    async def call(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        work = [0.0]

        def job() -> Any:
            t = time.monotonic()
            try:
                return fn(self._store, *args, **kwargs)
            finally:
                work[0] = time.monotonic() - t

        try:
            return await trio.to_thread.run_sync(job, limiter=self._limiter)
        finally:
            calls.append(StoreCall(fn.__name__, start, time.monotonic() - start, work[0]))

    AsyncStore.call = call  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        AsyncStore.call = original  # type: ignore[method-assign]
