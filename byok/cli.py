"""Command line: the parser, and the small commands (the others are in byok/commands/)."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import sys
from collections.abc import Callable
from pathlib import Path

from byok.commands.config_args import load_from_args
from byok.commands.serve import EXIT_CONFIG, cmd_serve
from byok.commands.simulate import EXIT_INTERRUPTED, MODES
from byok.config import ConfigError
from byok.log_setup import LEVELS
from byok.version import byok_version


def cmd_cursor_command(args: argparse.Namespace) -> int:
    from byok.cursor_setup import cursor_command_text, local_url

    try:
        config = load_from_args(args)
    except ConfigError as e:
        print(f"byok: {e}", file=sys.stderr)
        return EXIT_CONFIG
    print(cursor_command_text(local_url(config.server.host, config.server.port)), end="")
    return 0


def cmd_ca_install(args: argparse.Namespace) -> int:
    from byok.cursor_setup import ca_install_text, local_url
    from byok.http.ca import LocalCA

    try:
        config = load_from_args(args)
    except ConfigError as e:
        print(f"byok: {e}", file=sys.stderr)
        return EXIT_CONFIG
    ca = LocalCA.load_or_create(config.server.data_dir)
    print(ca_install_text(ca.cert_path, local_url(config.proxy.host, config.proxy.port)), end="")
    return 0


def cmd_console_token(args: argparse.Namespace) -> int:
    """A new console token (the old one stops working at once, even in a running daemon)."""
    from byok.console.token import new_token
    from byok.cursor_setup import local_url

    try:
        config = load_from_args(args)
    except ConfigError as e:
        print(f"byok: {e}", file=sys.stderr)
        return EXIT_CONFIG
    data_dir = config.server.data_dir
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        token = new_token(data_dir)
    except OSError as e:
        print(f"byok: cannot write the token in {data_dir}: {e.strerror or e}", file=sys.stderr)
        return 1
    url = local_url(config.server.host, config.server.port)
    print(f"console: {url}/byok/#token={token}")
    print("(shown once: byok keeps only its hash; the previous token no longer works)")
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
    p.add_argument(
        "--config",
        metavar="FILE",
        help="TOML config file (default: $BYOK_CONFIG, else ~/.config/byok/config.toml when it exists, "
        "else built-in defaults)",
    )
    p.add_argument(
        "--data-dir", metavar="DIR", help="where byok keeps its database (overrides [server] data_dir)"
    )
    if listen:
        p.add_argument("--host", help="listen address (overrides [server] host; loopback only)")
        p.add_argument("--port", type=int, help="listen port (overrides [server] port; 0 picks a free one)")
    else:
        p.set_defaults(host=None, port=None)


def _env_file_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--env-file",
        metavar="FILE",
        help="KEY=value file with the keys api_key_env names, read at start and on SIGHUP "
        "(default: $BYOK_ENV_FILE, else ~/.config/byok/env when it exists)",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="byok", description="Run Cursor's agent on your own LLM account.")
    p.add_argument("--version", action="version", version=f"byok {byok_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser("serve", help="run the daemon")
    _config_flags(serve)
    _env_file_flag(serve)
    serve.add_argument("--proxy", action="store_true", help="also listen as an HTTPS proxy with byok's CA")
    serve.add_argument(
        "--log-level",
        metavar="LEVEL",
        help=f"{', '.join(LEVELS)} (any case; default: $BYOK_LOG_LEVEL, else info)",
    )
    serve.set_defaults(func=cmd_serve)
    st = sub.add_parser("status", help="is a daemon running on this config's data dir: its health, its runs")
    _config_flags(st, listen=False)
    st.add_argument("--json", action="store_true", help="print the daemon's status as JSON")
    st.set_defaults(func=_lazy("status", "cmd_status"))
    calls = sub.add_parser(
        "calls", help="the recent provider calls: time, model, status, tokens, cache hits, TTFT"
    )
    _config_flags(calls, listen=False)
    calls.add_argument("-n", "--limit", type=int, default=20, metavar="N", help="how many calls (default 20)")
    calls.add_argument(
        "--model", metavar="ID", help="only this model's calls (byok's id or the upstream name)"
    )
    calls.add_argument("--json", action="store_true", help="print the calls as JSON, newest first")
    calls.set_defaults(func=_lazy("usage", "cmd_calls"))
    stats = sub.add_parser("stats", help="provider usage per day and model")
    _config_flags(stats, listen=False)
    stats.add_argument(
        "--days", type=int, default=30, metavar="N", help="the last N days, today included (default 30)"
    )
    stats.add_argument("--json", action="store_true", help="print the rows as JSON")
    stats.set_defaults(func=_lazy("usage", "cmd_stats"))
    doc = sub.add_parser(
        "doctor", help="check the config, the files, each provider and the port; say how to connect Cursor"
    )
    _config_flags(doc)
    _env_file_flag(doc)
    doc.add_argument(
        "--timeout",
        type=float,
        default=20.0,
        metavar="SECONDS",
        help="how long each provider check may take (default 20)",
    )
    doc.set_defaults(func=_lazy("doctor", "cmd_doctor"))
    svc = sub.add_parser("service", help="byok as your own service, started at login (systemd, launchd)")
    svc_sub = svc.add_subparsers(dest="service_command", required=True, metavar="COMMAND")
    si = svc_sub.add_parser(
        "install", help="write the systemd user unit (Linux) or launchd agent (macOS) and start it"
    )
    _config_flags(si, listen=False)
    _env_file_flag(si)
    si.add_argument("--user", action="store_true", help="for your user alone (the default and only kind)")
    si.add_argument(
        "--no-start", action="store_true", help="write the files only; print the commands that start it"
    )
    si.set_defaults(func=_lazy("service", "cmd_service_install"))
    su = svc_sub.add_parser(
        "uninstall", help="stop the service and remove its file (config, keys, data stay)"
    )
    su.add_argument("--user", action="store_true", help="for your user alone (the default and only kind)")
    su.add_argument(
        "--no-stop", action="store_true", help="remove the file only; leave a running service alone"
    )
    su.set_defaults(func=_lazy("service", "cmd_service_uninstall"))
    cc = sub.add_parser("cursor-command", help="print the command that starts Cursor with byok as backend")
    _config_flags(cc)
    cc.set_defaults(func=cmd_cursor_command)
    ca = sub.add_parser("ca", help="byok's local certificate authority (proxy mode)")
    ca_sub = ca.add_subparsers(dest="ca_command", required=True, metavar="COMMAND")
    install = ca_sub.add_parser("install", help="print (not run) the commands that trust byok's CA")
    _config_flags(install, listen=False)
    install.set_defaults(func=cmd_ca_install)
    tok = sub.add_parser("console-token", help="make a new console token and print the console's URL with it")
    _config_flags(tok)
    tok.set_defaults(func=cmd_console_token)
    sim = sub.add_parser(
        "simulate", help="drive one agent turn against a running daemon like Cursor would, tools included"
    )
    sim.add_argument("prompt", help="the message to send")
    _config_flags(sim, listen=False)
    sim.add_argument(
        "--url",
        help="the daemon's address (default: the one running on the config's data dir, else its host:port)",
    )
    sim.add_argument("--model", metavar="ID", help="the model id to run (default: the config's first model)")
    sim.add_argument("--mode", choices=MODES, default="agent", help="Cursor's agent mode (default: agent)")
    sim.add_argument("--conversation", metavar="ID", help="continue this conversation (default: a new one)")
    sim.add_argument(
        "--workspace",
        metavar="DIR",
        help="the folder the tools read, write and run in (default: a new temporary one)",
    )
    sim.add_argument(
        "--frames", action="store_true", help="print every frame the daemon sends, one line each"
    )
    sim.set_defaults(func=_lazy("simulate", "cmd_simulate"))
    rp = sub.add_parser(
        "replay", help="run a recorded run again from its input log ([logging] record_runs) and compare"
    )
    rp.add_argument("file", help="a run's log: {data_dir}/runs/<request id>.jsonl")
    rp.add_argument("--bodies", action="store_true", help="also print each provider request's body")
    rp.set_defaults(func=cmd_replay)
    return p


def _lazy(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """A command whose module is imported only when it runs (``byok serve`` tunes the allocator
    before the generated protobuf code and the rest are imported)."""

    def run(args: argparse.Namespace) -> int:
        command: Callable[[argparse.Namespace], int] = getattr(
            importlib.import_module(f"byok.commands.{module}"), name
        )
        return command(args)

    return run


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:  # Ctrl-C where a command does not handle it itself
        print("byok: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
