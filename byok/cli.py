"""Command line: `byok serve`, `byok simulate`."""

from __future__ import annotations

import argparse
import gc
import hashlib
import logging
import os
import signal
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import attrs
import trio

from byok.allocator import tune_allocator
from byok.config import Config, ConfigError
from byok.config_load import load_config
from byok.exception_groups import sole
from byok.run.upkeep import FULL_COLLECTIONS_OFF

DEFAULT_CONFIG = Path("~/.config/byok/config.toml")


def _config_path(arg: str | None) -> Path | None:
    if arg:
        return Path(arg)
    env = os.environ.get("BYOK_CONFIG")
    if env:
        return Path(env)
    default = DEFAULT_CONFIG.expanduser()
    return default if default.exists() else None


def _load(args: argparse.Namespace) -> Config:
    overrides = {
        k: v
        for k, v in {"host": args.host, "port": args.port, "data_dir": args.data_dir}.items()
        if v is not None
    }
    return load_config(_config_path(args.config), overrides=overrides)


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        config = _load(args)
    except ConfigError as e:
        print(f"byok: {e}", file=sys.stderr)
        return 2
    if args.proxy:
        config = attrs.evolve(config, proxy=attrs.evolve(config.proxy, enabled=True))
    tune_allocator()
    logging.basicConfig(
        level=os.environ.get("BYOK_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if logging.getLogger().level > logging.DEBUG:
        # httpx logs every request at INFO: each provider call and each request relayed to Cursor's
        # backend (hundreds an hour), with its whole URL. byok logs what goes wrong itself.
        logging.getLogger("httpx").setLevel(logging.WARNING)

    async def main() -> None:
        log = logging.getLogger("byok")
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                started = await nursery.start(_daemon_task, config, nursery.cancel_scope)
                stop: Callable[[], None] | None = started[1]
                # Everything loaded so far (modules, thousands of generated protobuf classes,
                # prompts, the server) lives as long as the process: keep the cyclic GC from
                # scanning it again in every full collection (a 57 ms pause mid-turn, measured).
                gc.collect()
                gc.freeze()
                # A full collection scans every tracked object (21-52 ms with a few histories
                # loaded): the daemon runs them between runs instead (run/upkeep.py).
                gc.set_threshold(*FULL_COLLECTIONS_OFF)
                async for signum in signals:
                    if stop is None:
                        log.info("second signal: cancelling now")
                        nursery.cancel_scope.cancel()
                        break
                    log.info("received %s: graceful shutdown", signal.Signals(signum).name)
                    stop()
                    stop = None

    from byok.daemon import StartupError

    try:
        trio.run(main)
    except KeyboardInterrupt:
        return 0
    except BaseExceptionGroup as group:  # the nurseries wrap what the daemon raised
        startup = sole(group, StartupError)
        if startup is None:
            raise
        print(f"byok: {startup}", file=sys.stderr)
        return 1
    return 0


async def _daemon_task(
    config: Config,
    done: trio.CancelScope,
    task_status: trio.TaskStatus[tuple[str, Callable[[], None]]] = trio.TASK_STATUS_IGNORED,
) -> None:
    from byok.daemon import run_daemon

    await run_daemon(config, task_status=task_status)
    done.cancel()  # the daemon has shut down: stop waiting for signals


def cmd_simulate(args: argparse.Namespace) -> int:
    import httpx

    from byok.devtools.cursor_sim import CursorSim, user_turn

    async def main() -> int:
        async with httpx.AsyncClient(timeout=None) as client:
            sim = CursorSim(args.url, client)
            request = user_turn(
                args.prompt,
                conversation_id=args.conversation or str(uuid.uuid4()),
                model_id=args.model,
                message_id=str(uuid.uuid4()),
            )
            tr = await sim.run(str(uuid.uuid4()), request)
        for rec in tr.frames:
            print(rec.kind)
        print("text:", tr.text())
        print("end-stream:", tr.end_stream)
        return 1 if tr.error else 0

    try:
        return trio.run(main)
    except BaseExceptionGroup as group:  # the simulator's task group wraps what it raised
        unreachable = sole(group, httpx.TransportError)
        if unreachable is None:
            raise
        print(f"byok: cannot reach a daemon at {args.url}: {unreachable}", file=sys.stderr)
        return 1


def cmd_cursor_command(args: argparse.Namespace) -> int:
    from byok.cursor_setup import cursor_command_text, local_url

    try:
        config = _load(args)
    except ConfigError as e:
        print(f"byok: {e}", file=sys.stderr)
        return 2
    print(cursor_command_text(local_url(config.server.host, config.server.port)), end="")
    return 0


def cmd_ca_install(args: argparse.Namespace) -> int:
    from byok.cursor_setup import ca_install_text, local_url
    from byok.http.ca import LocalCA

    try:
        config = _load(args)
    except ConfigError as e:
        print(f"byok: {e}", file=sys.stderr)
        return 2
    ca = LocalCA.load_or_create(config.server.data_dir)
    print(ca_install_text(ca.cert_path, local_url(config.proxy.host, config.proxy.port)), end="")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    """Run a recorded run again from its input log and say whether it sent the same bytes."""
    from byok.cursor.client_messages import describe_frame
    from byok.run.replay import ReplayError, replay_file
    from byok.run.run_log import outcome_json

    try:
        result = replay_file(Path(args.file))
    except ReplayError as e:
        print(f"byok: {e}", file=sys.stderr)
        return 2
    for i, frame in enumerate(result.frames, 1):
        print(f"frame {i}: {describe_frame(frame)} ({len(frame)} bytes)")
    for i, body in enumerate(result.requests, 1):
        print(f"provider request {i}: {len(body)} bytes, sha256 {hashlib.sha256(body).hexdigest()}")
        if args.bodies:
            print(body.decode("utf-8", "replace"))
    print(f"outcome: {outcome_json(result.outcome)}")
    problems = result.mismatches()
    for problem in problems:
        print(f"differs from the live run: {problem}")
    if not problems:
        n_frames, n_requests = len(result.frames), len(result.requests)
        print(f"the same as the live run: {n_frames} frames, {n_requests} provider requests")
    return 1 if problems else 0


def _config_flags(p: argparse.ArgumentParser, *, listen: bool = True) -> None:
    p.add_argument("--config", help="TOML config file (default: $BYOK_CONFIG or ~/.config/byok/config.toml)")
    p.add_argument("--data-dir")
    if listen:
        p.add_argument("--host")
        p.add_argument("--port", type=int)
    else:
        p.set_defaults(host=None, port=None)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="byok", description="Run Cursor's agent on your own LLM account.")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the daemon")
    _config_flags(serve)
    serve.add_argument("--proxy", action="store_true", help="also listen as an HTTPS proxy with byok's CA")
    serve.set_defaults(func=cmd_serve)
    cc = sub.add_parser("cursor-command", help="print the command that starts Cursor with byok as backend")
    _config_flags(cc)
    cc.set_defaults(func=cmd_cursor_command)
    ca = sub.add_parser("ca", help="byok's local certificate authority (proxy mode)")
    ca_sub = ca.add_subparsers(dest="ca_command", required=True)
    install = ca_sub.add_parser("install", help="print (not run) the commands that trust byok's CA")
    _config_flags(install, listen=False)
    install.set_defaults(func=cmd_ca_install)
    sim = sub.add_parser("simulate", help="drive one agent turn against a running daemon, like Cursor would")
    sim.add_argument("prompt")
    sim.add_argument("--url", default="http://127.0.0.1:8790")
    sim.add_argument("--model", required=True)
    sim.add_argument("--conversation")
    sim.set_defaults(func=cmd_simulate)
    rp = sub.add_parser(
        "replay", help="run a recorded run again from its input log ([logging] record_runs) and compare"
    )
    rp.add_argument("file", help="a run's log: {data_dir}/runs/<request id>.jsonl")
    rp.add_argument("--bodies", action="store_true", help="also print each provider request's body")
    rp.set_defaults(func=cmd_replay)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))
