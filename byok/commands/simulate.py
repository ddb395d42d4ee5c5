"""`byok simulate`: one agent turn against a running daemon, driven as Cursor would drive it,
with its tools run in a workspace folder."""

from __future__ import annotations

import argparse
import os
import platform
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

import trio

from byok.commands.config_args import load_from_args
from byok.config import ConfigError
from byok.exception_groups import sole

# Imported by the parser (byok/cli.py): what this module imports at its top is loaded before
# `byok serve` tunes the allocator, so the rest is imported in cmd_simulate.
MODES = ("agent", "ask", "plan", "debug")
EXIT_INTERRUPTED = 130  # as a shell reports a command ended by SIGINT


def _workspace(arg: str | None) -> tuple[Path, str]:
    if arg:
        root = Path(arg).expanduser().resolve()
        if not root.is_dir():
            raise NotADirectoryError(f"--workspace {arg}: not a directory")
        return root, f"workspace {root}"
    root = Path(tempfile.mkdtemp(prefix="byok-simulate-"))
    return root, f"workspace {root} (a new temporary folder; --workspace DIR runs the tools in yours)"


def _request_context(root: Path):  # type: ignore[no-untyped-def]
    """What Cursor tells the agent about the machine: the workspace is where its tools run."""
    from byok.pb.agent import v1 as agent

    return agent.RequestContext(
        env=agent.RequestContextEnv(
            os_version=f"{platform.system()} {platform.release()}",
            workspace_paths=[str(root)],
            shell=os.environ.get("SHELL", "/bin/sh"),
            process_working_directory=str(root),
            project_folder=str(root),
            time_zone=time.strftime("%Z"),
        )
    )


def cmd_simulate(args: argparse.Namespace) -> int:
    import httpx

    from byok.commands.daemon_address import NoDaemon, daemon_address
    from byok.devtools.cursor_sim import CursorSim, Transcript, user_turn
    from byok.devtools.turn_display import ShownWorkspace, TurnDisplay
    from byok.pb.agent import v1 as agent

    try:
        config = load_from_args(args)
        root, where = _workspace(args.workspace)
    except (ConfigError, NotADirectoryError) as e:
        print(f"byok: {e}", file=sys.stderr)
        return 2
    try:
        address = daemon_address(config, args.url)
    except NoDaemon as e:
        print(f"byok: {e}", file=sys.stderr)
        return 1
    url = address.shown
    model = args.model or next((m.id for m in config.enabled_models()), None)
    if model is None:
        print(
            f"byok: no model to run: {config.source} configures none; name one with --model", file=sys.stderr
        )
        return 2
    conversation = args.conversation or str(uuid.uuid4())
    print(
        f"byok simulate: {url}, model {model}, mode {args.mode}, conversation {conversation}\n"
        f"byok simulate: {where}",
        file=sys.stderr,
    )
    display = TurnDisplay(sys.stdout, frames=args.frames)
    interrupted = False

    async def main() -> Transcript | None:
        nonlocal interrupted
        request = user_turn(
            args.prompt,
            conversation_id=conversation,
            model_id=model,
            message_id=str(uuid.uuid4()),
            mode=agent.AgentMode[args.mode.upper()],
        )
        request.action.user_message_action.request_context = _request_context(root)  # type: ignore[union-attr]
        cancel = trio.Event()
        workspace = ShownWorkspace(root, display)
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            async with (
                httpx.AsyncClient(timeout=None, trust_env=False, verify=address.verify) as client,
                trio.open_nursery() as nursery,
            ):

                async def on_signals() -> None:
                    nonlocal interrupted
                    async for _ in signals:
                        if interrupted:  # a second Ctrl-C: stop waiting for the daemon
                            nursery.cancel_scope.cancel()
                            return
                        interrupted = True
                        display.line("^C: cancelling the run (Ctrl-C again to quit at once)")
                        cancel.set()

                nursery.start_soon(on_signals)
                sim = CursorSim(address.base, client, executor=workspace, on_query=display.query)
                try:
                    return await sim.run(
                        str(uuid.uuid4()),
                        request,
                        on_frame=lambda rec, tr: display.frame(rec) or [],
                        cancel=cancel,
                    )
                finally:
                    nursery.cancel_scope.cancel()
                    with trio.CancelScope(shield=True):
                        await workspace.aclose()
        return None  # a second Ctrl-C cancelled the run's task

    try:
        tr = trio.run(main)
    except BaseExceptionGroup as group:  # the simulator's task groups wrap what it raised
        display.end_line()
        unreachable = sole(group, httpx.TransportError)
        refused = sole(group, httpx.HTTPStatusError)
        if unreachable is not None:
            print(f"byok: cannot reach a daemon at {url}: {unreachable}", file=sys.stderr)
        elif refused is not None:
            answer = refused.response.text.strip().replace("\n", " ")[:300]
            print(
                f"byok: the daemon refused a message: HTTP {refused.response.status_code}: {answer}",
                file=sys.stderr,
            )
        else:
            raise
        return 1
    display.end_line()
    if tr is None:  # cancelled by a second Ctrl-C before the run ended
        print("byok: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if tr.error is not None:
        code, message = tr.error.get("code", "unknown"), tr.error.get("message", "")
        print(f"byok: the run ended with {code}: {' '.join(str(message).split())}", file=sys.stderr)
        return EXIT_INTERRUPTED if interrupted and code == "canceled" else 1
    if tr.end_stream is None:
        print("byok: the daemon closed the stream before the run ended", file=sys.stderr)
        return 1
    usage = display.usage
    done = (
        "done"
        if usage is None
        else f"done: tokens in {usage.input_tokens or 0:,}, out {usage.output_tokens or 0:,}"
    )
    print(f"byok simulate: {done}", file=sys.stderr)
    return 0
