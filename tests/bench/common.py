"""Helpers shared by the benchmarks of `make bench`: sizes (BYOK_BENCH_QUICK), notes, a user
turn's request, a measured simple turn (TTFT via byok and direct) and a workspace to Read from."""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import trio

from byok.devtools.cursor_sim import Recorded, Transcript, user_turn
from byok.devtools.workspace_exec import WorkspaceExecutor
from byok.pb.agent import v1 as agent
from byok.store import SQLiteStore
from tests.bench.driver import NOTES, Bench, direct_first_content
from tests.support.fake_provider import chat_text_script

TEXT_DELTA = "interaction_update.text_delta"
MODEL = "byok-demo"
# BYOK_BENCH_QUICK=1: every benchmark at a fraction of its size, to check the harness quickly.
QUICK = os.environ.get("BYOK_BENCH_QUICK") == "1"


def size(full: int, quick: int) -> int:
    return quick if QUICK else full


def note(text: str) -> None:
    NOTES.append(text)
    print(f"  note: {text}")


def loadavg() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def turn_request(
    text: str, conv: str, msg: str, state: agent.ConversationStateStructure | None = None
) -> agent.AgentRunRequest:
    return user_turn(text, conversation_id=conv, model_id=MODEL, message_id=msg, state=state)


def first_text(tr: Transcript) -> Recorded:
    return next(f for f in tr.frames if f.kind == TEXT_DELTA)


async def wait_quiet(db: SQLiteStore, request_id: str) -> None:
    """Until the run's terminal state and its provider-call record are written, so the next
    turn does not queue behind the previous turn's tail on the daemon's one SQLite worker."""
    with trio.fail_after(30):
        while True:
            run = db.run(request_id)
            if run is not None and run.status != "running" and db.llm_calls(request_id):
                break
            await trio.sleep(0.003)
    await trio.sleep(0.01)


# --- a measured simple turn (benchmarks 1, 5, 7, 11) -----------------------------------------


@attrs.frozen
class TurnSample:
    via: float  # run_request append sent -> first text_delta at the client
    direct: float  # direct streaming POST to the provider -> first content chunk
    precall: float  # run_request append sent -> the daemon's request reached the provider
    stream: float  # provider sent the first content chunk -> text_delta at the client
    provider_index: int  # index of the daemon's request in provider.requests
    checkpoint: agent.ConversationStateStructure | None
    ended: float = 0.0  # run_request append sent -> turn_ended at the client

    @property
    def added(self) -> float:
        return self.via - self.direct


async def measured_turn(
    b: Bench, db: SQLiteStore, rid: str, conv: str, state: agent.ConversationStateStructure | None = None
) -> TurnSample:
    b.provider.enqueue(chat_text_script(["Hello", " world"]))
    idx = len(b.provider.requests)
    tr = await b.sim.run(rid, turn_request(f"say hello ({rid})", conv, f"m-{rid}", state))
    assert tr.end_stream == {}, tr.end_stream
    sent = b.sim.run_request_sent(rid)
    first = first_text(tr).at
    req = b.provider.requests[idx]
    first_chunk_sent = b.provider.chunk_times[idx][1]  # [0] is the role chunk, [1] "Hello"
    await wait_quiet(db, rid)
    b.provider.enqueue(chat_text_script(["Hello", " world"]))
    direct = await direct_first_content(b.client, b.provider_url, req.body)
    checkpoints = tr.checkpoints()
    return TurnSample(
        via=first - sent,
        direct=direct,
        precall=req.at - sent,
        stream=first - first_chunk_sent,
        provider_index=idx,
        checkpoint=checkpoints[-1] if checkpoints else None,
        ended=next(f.at for f in tr.frames if f.kind == "interaction_update.turn_ended") - sent,
    )


# --- a workspace the simulated client's Read calls run in (benchmarks 4, 9, 12, 13) ---------


def workspace(root: Path) -> WorkspaceExecutor:
    root.mkdir()
    for k in range(7):
        (root / f"small{k}.py").write_text(
            "".join(f"def f{k}_{i}(x):\n    return x + {i}\n" for i in range(40))
        )
    return WorkspaceExecutor(root, shell_timeout_cap_s=5.0)
