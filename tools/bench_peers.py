"""`make bench-peers`: byok against a peer, LiteLLM's proxy, in one run on one machine.

Both stand in front of the same fake provider (tests/bench's TimedProvider, which timestamps every
chunk it sends), and both are measured against a direct request to it, alternating sample by
sample so the VM's drift hits both alike. Printed, for the TTFT and concurrency benchmarks:
byok's added latency, LiteLLM's, and their ratio; and for each, the highest load (runs x
deltas/s) at which its p99 added inter-event delay stays within 20 ms. Goals are reported, not
asserted (docs/performance.md).

LiteLLM is installed into a virtualenv of its own (``--venv``, default ``.venv-peers``, git-
ignored), never into the project's. Not part of ``make test`` or ``make bench``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import httpx
import trio

from byok.store import SQLiteStore
from tests.bench.common import measured_turn
from tests.bench.concurrent_runs import concurrent_runs
from tests.bench.driver import (
    Bench,
    TimedProvider,
    child_daemon,
    direct_first_content,
    harness_gc_off,
    percentile,
)
from tests.support.fake_provider import chat_text_script

GOAL_TTFT = 0.25  # byok's added TTFT p50 at most this share of LiteLLM's
GOAL_DELAY = 0.25  # byok's p99 added inter-event delay at most this share of LiteLLM's
DELAY_LIMIT_S = 0.020  # the added delay a load must keep at p99 to count as sustained
GAP_S = 0.02  # the provider's gap between deltas: 50 deltas/s per run
STREAM_TIMEOUT_S = 300.0  # a stream silent this long has failed (the VM may be very busy)
MODEL = "gpt-test"  # the upstream model byok's bench config names; LiteLLM's alias of it
# LiteLLM refuses to start without a strong master key; every request carries it.
MASTER_KEY = "sk-" + "0123456789abcdef" * 4
AUTH = {"authorization": f"Bearer {MASTER_KEY}"}


class PeerUnavailable(Exception):
    """LiteLLM could not be installed or started: said in one line, the run stops."""


# --- LiteLLM's proxy ----------------------------------------------------------------------------


def ensure_litellm(venv: Path) -> Path:
    """The ``litellm`` executable of ``venv``, installing ``litellm[proxy]`` there first if needed."""
    exe = venv / "bin" / "litellm"
    if exe.exists():
        return exe
    print(f"installing litellm[proxy] into {venv} (once; a few minutes)...", flush=True)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--upgrade", "pip"],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "litellm[proxy]"],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
            raise PeerUnavailable(
                f"could not install LiteLLM ({' '.join(step[2:])}): exit {done.returncode}\n{tail}"
            )
    if not exe.exists():
        raise PeerUnavailable(f"litellm[proxy] installed, but {exe} is missing")
    return exe


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def start_litellm(
    exe: Path, provider_url: str, work: Path, nursery: trio.Nursery
) -> tuple[str, trio.Process]:
    """LiteLLM's proxy (one worker, as its docs' single-instance setup) in front of the fake
    provider; its base URL once it answers."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {provider_url}\n"
        "      api_key: sk-test\n"
    )
    port = free_port()
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the cost map from the network
        "LITELLM_TELEMETRY": "False",
        "LITELLM_LOG": "ERROR",
        "LITELLM_MASTER_KEY": MASTER_KEY,
    }
    log = (work / "litellm.log").open("wb")
    cmd = [
        str(exe),
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    proc = await trio.lowlevel.open_process(cmd, stdout=log, stderr=log, env=env)
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as client:
        with trio.move_on_after(120):
            while proc.returncode is None:
                try:
                    if (await client.get(url + "/health/liveliness", headers=AUTH)).status_code == 200:
                        return url, proc
                except httpx.HTTPError:
                    pass
                await trio.sleep(0.25)
    proc.kill()
    tail = "\n".join((work / "litellm.log").read_text(errors="replace").splitlines()[-8:])
    raise PeerUnavailable(f"LiteLLM's proxy did not come up on {url} (log {work / 'litellm.log'}):\n{tail}")


def peer_body(text: str) -> bytes:
    return json.dumps(
        {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": text}]}
    ).encode()


# --- TTFT ---------------------------------------------------------------------------------------


async def ttft(b: Bench, litellm: str, n: int) -> tuple[list[float], list[float]]:
    """Added TTFT samples (seconds) of byok and of LiteLLM, alternating. Each is its first
    content minus a direct request's with the very body it sent the provider."""
    ours: list[float] = []
    theirs: list[float] = []
    with SQLiteStore.open_in(b.data_dir) as db, harness_gc_off():
        for i in range(n + 5):  # the first 5 of each warm up (imports, pools, pages)
            sample = await measured_turn(b, db, f"peer-{i}", f"peer-conv-{i}")
            body = b.provider.requests[sample.provider_index].body  # byok's request, as LiteLLM's input
            b.provider.enqueue(chat_text_script(["Hello", " world"]))
            via = await direct_first_content(b.client, litellm, body, headers=AUTH)
            b.provider.enqueue(chat_text_script(["Hello", " world"]))
            direct = await direct_first_content(b.client, b.provider_url, body)
            if i >= 5:
                ours.append(sample.added)
                theirs.append(via - direct)
    return ours, theirs


# --- concurrency --------------------------------------------------------------------------------


async def litellm_at_load(
    provider: TimedProvider, litellm: str, runs: int, deltas: int, tag: str
) -> tuple[list[float], list[float]]:
    """``litellm_runs``, or one infinite delay when LiteLLM did not deliver every stream (a stream
    silent for STREAM_TIMEOUT_S, an error status): that load is not sustained."""
    try:
        return await litellm_runs(provider, litellm, runs, deltas, tag)
    except (httpx.HTTPError, RuntimeError) as e:
        print(f"    LiteLLM failed at {runs} runs: {type(e).__name__}: {e}", flush=True)
        return [math.inf], [math.inf]


async def litellm_runs(
    provider: TimedProvider, litellm: str, runs: int, deltas: int, tag: str
) -> tuple[list[float], list[float]]:
    """``runs`` simultaneous streams through LiteLLM, ``deltas`` deltas each, ``GAP_S`` apart at
    the provider: per consecutive pair of deltas, client gap - provider gap (as bench 3); and per
    delta, client arrival - provider send (a proxy that buffers a stream shows there)."""
    texts = [f"{j:03d} " for j in range(deltas)]
    provider.drop_unused()
    for _ in range(runs):
        provider.enqueue(chat_text_script(texts, delay_s=GAP_S))
    arrivals: dict[int, list[float]] = {}
    limits = httpx.Limits(max_connections=runs + 10, max_keepalive_connections=runs + 10)
    async with httpx.AsyncClient(timeout=STREAM_TIMEOUT_S, limits=limits) as client:

        async def one(i: int) -> None:
            times: list[float] = []
            body = peer_body(f"{tag} {i:04d}")
            async with client.stream("POST", litellm + "/chat/completions", content=body, headers=AUTH) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")[:300]
                    raise RuntimeError(f"LiteLLM answered stream {i} with {r.status_code}: {text}")
                buf = b""
                async for chunk in r.aiter_bytes():
                    now = time.monotonic()
                    buf += chunk
                    *events, buf = buf.split(b"\n\n")
                    for event in events:
                        if event.startswith(b"data: {"):
                            obj = json.loads(event[6:])
                            if any(c.get("delta", {}).get("content") for c in obj.get("choices") or ()):
                                times.append(now)
            arrivals[i] = times

        with harness_gc_off():
            async with trio.open_nursery() as group:
                for i in range(runs):
                    group.start_soon(one, i)
    added: list[float] = []
    latency: list[float] = []
    seen = 0
    for idx, req in enumerate(provider.requests):
        text = req.body.decode(errors="replace")
        if tag not in text:
            continue
        i = int(text.split(tag + " ", 1)[1][:4])
        sent = provider.chunk_times[idx][1 : 1 + deltas]
        got = arrivals[i]
        if len(got) != deltas:
            raise RuntimeError(f"LiteLLM stream {i} delivered {len(got)} of {deltas} deltas")
        lat = [a - s for a, s in zip(got, sent, strict=True)]
        added += [y - x for x, y in itertools.pairwise(lat)]
        latency += lat
        seen += 1
    if seen != runs:
        raise RuntimeError(f"the provider saw {seen} of LiteLLM's {runs} streams")
    return added, latency


@attrs.frozen
class Load:
    runs: int
    p99: float  # seconds of added inter-event delay

    @property
    def deltas_per_s(self) -> float:
        return self.runs / GAP_S


async def sweep(
    measures: dict[str, Callable[[int], Awaitable[list[float]]]], steps: list[int]
) -> dict[str, list[Load]]:
    """Each load step for every proxy in turn (drift hits both alike); a proxy stops once a step
    is well past the limit (heavier ones only take longer)."""
    out: dict[str, list[Load]] = {name: [] for name in measures}
    for runs in steps:
        for name, measure in measures.items():
            loads = out[name]
            if loads and loads[-1].p99 > 2 * DELAY_LIMIT_S:
                continue
            p99 = percentile(await measure(runs), 99)
            loads.append(Load(runs, p99))
            print(
                f"    {name:8s} {runs:4d} runs x {1 / GAP_S:.0f} deltas/s: p99 added {1e3 * p99:7.1f} ms",
                flush=True,
            )
    return out


def highest_sustained(loads: list[Load]) -> Load | None:
    ok = [load for load in loads if load.p99 <= DELAY_LIMIT_S]
    return max(ok, key=lambda load: load.runs) if ok else None


# --- the run ------------------------------------------------------------------------------------


def ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}" if theirs > 0 else "n/a (LiteLLM added nothing)"


async def main(args: argparse.Namespace) -> None:
    exe = ensure_litellm(args.venv)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)  # request ids are single-use: a fresh data dir
    print(f"bench-peers: byok vs LiteLLM proxy ({exe}), load {os.getloadavg()[0]:.2f}", flush=True)
    async with trio.open_nursery() as nursery:
        async with child_daemon(work / "byok", nursery) as b:
            litellm, proc = await start_litellm(exe, b.provider_url, work / "litellm", nursery)
            try:
                results = await measure_all(b, litellm, args)
            finally:
                proc.kill()
                await proc.wait()
        nursery.cancel_scope.cancel()  # the fake provider
    print_table(args, *results)


async def measure_all(
    b: Bench, litellm: str, args: argparse.Namespace
) -> tuple[list[float], list[float], dict[str, float], dict[str, list[Load]]]:
    for i in range(3):  # LiteLLM's first streams import and build a lot
        await litellm_at_load(b.provider, litellm, 10, 20, f"peer-warm{i}")
    print(f"  TTFT: {args.ttft} turns each, alternating", flush=True)
    ours, theirs = await ttft(b, litellm, args.ttft)
    print(f"  concurrency: {args.runs} runs x {args.deltas} deltas at {1 / GAP_S:.0f}/s each", flush=True)
    b.provider.drop_unused()
    st = await concurrent_runs(b, args.runs, args.deltas, GAP_S, "peer-conc")
    added, latency = await litellm_at_load(b.provider, litellm, args.runs, args.deltas, "peer-conc-l")
    conc = {
        "byok": percentile(st.added_gap, 99),
        "litellm": percentile(added, 99),
        "byok latency": percentile(st.latency, 99),
        "litellm latency": percentile(latency, 99),
    }
    print(
        f"    byok {1e3 * conc['byok']:.1f} ms, LiteLLM {1e3 * conc['litellm']:.1f} ms (p99 added)",
        flush=True,
    )
    counter = itertools.count()

    async def byok_at(runs: int) -> list[float]:
        b.provider.drop_unused()
        return (await concurrent_runs(b, runs, args.sweep_deltas, GAP_S, f"sw{next(counter)}")).added_gap

    async def litellm_at(runs: int) -> list[float]:
        return (await litellm_at_load(b.provider, litellm, runs, args.sweep_deltas, f"lsw{next(counter)}"))[0]

    print("  load sweep:", flush=True)
    loads = await sweep({"byok": byok_at, "LiteLLM": litellm_at}, [int(s) for s in args.sweep.split(",")])
    return ours, theirs, conc, loads


def print_table(
    args: argparse.Namespace,
    ours: list[float],
    theirs: list[float],
    conc: dict[str, float],
    loads: dict[str, list[Load]],
) -> None:
    p50 = (statistics.median(ours), statistics.median(theirs))
    print()
    print("| benchmark | byok added | LiteLLM added | ratio byok/LiteLLM | goal |")
    print("|---|---|---|---|---|")
    print(
        f"| TTFT p50 (n={len(ours)}) | {1e3 * p50[0]:.2f} ms | {1e3 * p50[1]:.2f} ms | "
        f"{ratio(*p50)} | <= {GOAL_TTFT} |"
    )
    p99 = (percentile(ours, 99), percentile(theirs, 99))
    print(f"| TTFT p99 | {1e3 * p99[0]:.2f} ms | {1e3 * p99[1]:.2f} ms | {ratio(*p99)} | |")
    print(
        f"| p99 added inter-event delay, {args.runs} runs x {1 / GAP_S:.0f} deltas/s | "
        f"{1e3 * conc['byok']:.1f} ms | {1e3 * conc['litellm']:.1f} ms | "
        f"{ratio(conc['byok'], conc['litellm'])} | <= {GOAL_DELAY} |"
    )
    lat = (conc["byok latency"], conc["litellm latency"])
    print(
        f"| p99 delivery latency (provider send -> client), same load | {1e3 * lat[0]:.1f} ms | "
        f"{1e3 * lat[1]:.1f} ms | {ratio(*lat)} | |"
    )
    best = [highest_sustained(loads["byok"]), highest_sustained(loads["LiteLLM"])]
    cells = [
        f"{x.runs} runs x {1 / GAP_S:.0f}/s = {x.deltas_per_s:,.0f} deltas/s" if x else "none within it"
        for x in best
    ]
    print(
        f"| highest load with p99 added delay <= {1e3 * DELAY_LIMIT_S:.0f} ms | {cells[0]} | {cells[1]} | | |"
    )
    print(
        "\nadded = via the proxy - direct to the fake provider (TTFT: the same request body, alternating);"
        "\ninter-event delay: per consecutive pair of deltas, client gap - provider send gap (bench 3)."
        "\nAbsolute figures are context only: the VM is shared; the ratios are measured side by side."
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--venv", type=Path, default=Path(".venv-peers"), help="LiteLLM's own virtualenv")
    p.add_argument("--work", default="/tmp/byok-bench-peers", help="data and logs of this run")
    p.add_argument("--ttft", type=int, default=100, help="TTFT samples per proxy")
    p.add_argument("--runs", type=int, default=100, help="simultaneous runs (bench 3's load)")
    p.add_argument("--deltas", type=int, default=250, help="deltas per run at the concurrency load")
    p.add_argument("--sweep", default="1,5,10,25,50,100,150", help="runs per step of the load sweep")
    p.add_argument("--sweep-deltas", type=int, default=100, help="deltas per run in the sweep")
    return p.parse_args(argv)


if __name__ == "__main__":
    try:
        trio.run(main, parse_args(sys.argv[1:]))
    except* PeerUnavailable as group:
        for e in group.exceptions:
            print(f"bench-peers: {e}", file=sys.stderr)
        raise SystemExit(2) from None
