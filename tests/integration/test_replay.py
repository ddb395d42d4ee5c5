"""Runs you can replay: a live run's input log, fed through the turn machine with no network, no
trio and no database, gives back the frames and provider requests the live run sent, byte for
byte (their count and SHA-256 are in the log's end line, taken as the live run sent them).

Every integration test's daemon replays its runs at teardown (conftest.assert_runs_replay);
these name the cases the turn machine issue asks for and check more of each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import trio

from byok.devtools.cursor_sim import Recorded, Transcript, frame_kind
from byok.loop.turn_values import Canceled, Failed, Succeeded
from byok.pb.agent import v1 as agent
from byok.run.replay import ReplayResult, read_log, replay
from byok.run.run_log import run_log_path
from tests.integration.conftest import Daemon
from tests.integration.test_lifecycle import CancelAt, Env, assert_canceled, kind_is, turn
from tests.integration.test_lifecycle import env as env  # the fixture
from tests.support.fake_provider import chat_text_script, chat_tool_script, error_script
from tests.support.run_driver import resume_request, wait_run_ended

HEARTBEAT = "interaction_update.heartbeat"


async def replayed(d: Daemon, request_id: str) -> ReplayResult:
    await wait_run_ended(d.data_dir, request_id)
    with trio.fail_after(5):
        while True:  # the end line follows the run's terminal write
            lines = read_log(run_log_path(d.data_dir, request_id))
            if lines and lines[-1]["k"] == "end":
                break
            await trio.sleep(0.01)
    result = replay(lines)
    assert result.mismatches() == []
    return result


def assert_same_as_the_client_got(result: ReplayResult, tr: Transcript, prelude: int = 0) -> None:
    """The replayed frames, frame by frame, are what the client read (the writer's own
    heartbeats aside: they are the stream's, not the run's), after the ``prelude`` frames of
    the start point (a resume's blob GETs)."""
    frames = [f for f in result.frames if kind_of(f) != HEARTBEAT]
    client = [r for r in tr.frames if r.kind != HEARTBEAT][prelude:]
    assert [kind_of(f) for f in frames] == [r.kind for r in client]
    assert [agent.AgentServerMessage.parse(f) for f in frames] == [r.message for r in client]


def kind_of(frame: bytes) -> str:
    return frame_kind(agent.AgentServerMessage.parse(frame))


def provider_bodies(d: Daemon) -> list[bytes]:
    return [r.body for r in d.provider.requests]


async def test_a_text_turn_replays(daemon: Daemon) -> None:
    daemon.provider.enqueue(chat_text_script(["Hel", "lo"], reasoning=["hm", "m"]))
    tr = await daemon.sim.run("req-text", turn("hello", "m1"))
    assert tr.end_stream == {}
    result = await replayed(daemon, "req-text")
    assert result.outcome == Succeeded()
    assert_same_as_the_client_got(result, tr)
    assert list(result.requests) == provider_bodies(daemon)


async def test_a_parallel_tool_round_replays(env: Env) -> None:
    d = env.daemon
    (env.root / "a.txt").write_text("alpha\n")
    d.provider.enqueue(
        chat_tool_script(
            [("c1", "Read", json.dumps({"path": "a.txt"})), ("c2", "Glob", '{"glob_pattern": "*"}')]
        ),
        chat_text_script(["done"]),
    )
    tr = await env.sim.run("req-round", turn("look", "m1"))
    assert tr.end_stream == {}
    result = await replayed(d, "req-round")
    assert_same_as_the_client_got(result, tr)
    assert list(result.requests) == provider_bodies(d)  # the second carries both results
    assert len(result.requests) == 2


async def test_a_resumed_staged_round_replays(env: Env) -> None:
    d = env.daemon
    (env.root / "notes.txt").write_text("resume me\n")
    env.sim.on_exec = lambda m: []  # run 1: the client never answers
    d.provider.enqueue(chat_tool_script([("call_r", "Read", '{"path": "notes.txt"}')]))
    cancel = CancelAt(lambda rec: rec.kind == "conversation_checkpoint"
                      and bool(rec.message.conversation_checkpoint_update.pending_tool_calls))  # fmt: skip
    tr1 = await env.sim.run("req-r1", turn("read the notes", "m1"), on_frame=cancel)
    assert_canceled(tr1, cancel)
    (staged,) = tr1.checkpoints()
    env.sim.on_exec = None
    d.provider.enqueue(chat_text_script(["The notes say resume me."]))
    tr2 = await env.sim.run("req-r2", resume_request(staged, conversation_id="conv-life"))
    assert tr2.end_stream == {}
    first, second = await replayed(d, "req-r1"), await replayed(d, "req-r2")
    assert first.outcome == Canceled() and second.outcome == Succeeded()
    prelude = read_log(run_log_path(d.data_dir, "req-r2"))[0]["prelude_frames"]
    assert prelude > 0  # the resume read the client's copy of the turn first
    assert_same_as_the_client_got(second, tr2, prelude)
    assert list(first.requests + second.requests) == provider_bodies(d)
    assert len(second.requests) == 1  # the round ran again without a provider call


async def test_a_cancel_mid_stream_replays(daemon: Daemon) -> None:
    daemon.provider.enqueue(chat_text_script(["partial ", "answer ", "more"], delay_s=0.15))
    cancel = CancelAt(kind_is("interaction_update.text_delta"))
    tr = await daemon.sim.run("req-cancel", turn("question", "m1"), on_frame=cancel)
    assert_canceled(tr, cancel)
    result = await replayed(daemon, "req-cancel")
    assert result.outcome == Canceled()
    assert_same_as_the_client_got(result, tr)


async def test_a_provider_error_replays(daemon: Daemon) -> None:
    daemon.provider.enqueue(error_script(400, "bad request from the provider"))
    tr = await daemon.sim.run("req-error", turn("question", "m1"))
    assert tr.error is not None and tr.error["code"] == "unavailable"
    result = await replayed(daemon, "req-error")
    assert isinstance(result.outcome, Failed) and result.outcome.provider
    assert "bad request from the provider" in result.outcome.message
    assert_same_as_the_client_got(result, tr)


async def test_a_preempted_run_and_the_one_that_preempts_it_replay(daemon: Daemon) -> None:
    daemon.provider.enqueue(
        chat_text_script(["slow ", "answer ", "never ", "finished"], delay_s=0.2), chat_text_script(["B"])
    )
    streaming = trio.Event()

    def on_a(rec: Recorded, tr: Transcript) -> list:
        if rec.kind == "interaction_update.text_delta":
            streaming.set()
        return []

    got: dict[str, Transcript] = {}

    async def run_a() -> None:
        got["a"] = await daemon.sim.run("req-pa", turn("task A", "mA"), on_frame=on_a)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_a)
            await streaming.wait()
            got["b"] = await daemon.sim.run("req-pb", turn("task B", "mB"))
    a, b = await replayed(daemon, "req-pa"), await replayed(daemon, "req-pb")
    assert a.outcome == Canceled() and b.outcome == Succeeded()
    assert_same_as_the_client_got(a, got["a"])
    assert_same_as_the_client_got(b, got["b"])


async def test_a_changed_log_does_not_replay_and_byok_replay_says_so(daemon: Daemon, tmp_path: Path) -> None:
    daemon.provider.enqueue(chat_text_script(["original ", "text"]))
    tr = await daemon.sim.run("req-cli", turn("question", "m1"))
    assert tr.end_stream == {}
    await replayed(daemon, "req-cli")
    path = run_log_path(daemon.data_dir, "req-cli")
    ok = subprocess.run([sys.executable, "-m", "byok", "replay", str(path)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "the same as the live run" in ok.stdout and "interaction_update.text_delta" in ok.stdout

    changed = tmp_path / "changed.jsonl"
    changed.write_text(path.read_text().replace('"original "', '"changed "'))
    assert replay(read_log(changed)).mismatches()  # a different delta: different frames
    bad = subprocess.run(
        [sys.executable, "-m", "byok", "replay", str(changed)], capture_output=True, text=True
    )
    assert bad.returncode == 1 and "differs from the live run: frames" in bad.stdout


async def test_a_cancel_from_outside_while_the_first_output_flushes_replays(daemon: Daemon) -> None:
    """A preemption's cancel can land while the run waits for its first output to be flushed
    (the fault loop found it): the live run ends at once (end_now), and so must its replay,
    which is paused at that Flush until the log says the run went on."""
    daemon.provider.enqueue(chat_text_script(["Hel", "lo"]))
    tr = await daemon.sim.run("req-flush-cancel", turn("hello", "m1"))
    assert tr.end_stream == {}
    await replayed(daemon, "req-flush-cancel")  # the log is complete
    lines = read_log(run_log_path(daemon.data_dir, "req-flush-cancel"))
    first_output = next(
        i for i, line in enumerate(lines) if line["k"] == "model" and any(e[0] == "t" for e in line["e"])
    )
    result = replay([*lines[: first_output + 1], {"k": "cancel"}])
    assert result.outcome == Canceled()
    assert kind_of(result.frames[-1]) == "interaction_update.text_delta"
