"""`byok simulate`: one agent turn against a running daemon, as Cursor would drive it."""

from __future__ import annotations

import argparse
import sys
import uuid

import trio

from byok.exception_groups import sole


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
