"""One Cursor agent turn end to end: real daemon, real SQLite, fake provider, simulated Cursor."""

from __future__ import annotations

import gc
import hashlib
import json
from functools import partial

import pytest
import trio

from byok.devtools.cursor_sim import Transcript, user_turn
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from byok.run.runner import Run
from byok.store import SQLiteStore
from tests.integration.conftest import Daemon
from tests.support.fake_provider import chat_text_script, error_script
from tests.support.run_driver import RunDriver, wait_run_ended

TAIL = [
    "interaction_update.turn_ended",
    "conversation_checkpoint",
    "conversation_checkpoint",
    "conversation_checkpoint",
]


def turn(text: str, conv: str = "conv-1", msg: str = "m1", model: str = "byok-demo") -> agent.AgentRunRequest:
    return user_turn(text, conversation_id=conv, model_id=model, message_id=msg)


def referenced_blobs(state: agent.ConversationStateStructure, blobs: dict[bytes, bytes]) -> set[bytes]:
    """Every blob id a checkpoint reaches: roots, turns, todos, and each turn's user message and
    steps."""
    out = set(state.root_prompt_messages_json) | set(state.turns) | set(state.todos)
    for turn_id in state.turns:
        structure = agent.ConversationTurnStructure.parse(blobs[turn_id]).agent_conversation_turn
        assert structure is not None
        out.add(structure.user_message)
        out.update(structure.steps)
    return out


def assert_checkpoints_reference_only_acked(
    tr: Transcript, blobs: dict[bytes, bytes], held: frozenset[bytes] = frozenset()
) -> None:
    """Each checkpoint frame references only blobs whose ACK the client had posted before the
    frame was read (Recorded.acked_before; CursorSim reads RunSSE in its own task, so a
    checkpoint the daemon sent without waiting for the ACKs arrives stamped without them), or
    ``held``: blobs the client held before the run (an earlier turn's)."""
    for rec in tr.frames:
        if rec.kind == "conversation_checkpoint":
            state = rec.message.conversation_checkpoint_update
            missing = referenced_blobs(state, blobs) - rec.acked_before - held
            assert not missing, f"checkpoint references {len(missing)} blob(s) not ACKed before it"


async def test_text_turn_frame_order_and_checkpoints(daemon: Daemon) -> None:
    daemon.provider.enqueue(chat_text_script(["Hello", ", world"], usage=(120, 7)))
    tr = await daemon.sim.run("req-1", turn("say hello"))

    assert tr.end_stream == {}
    kinds = tr.kinds()
    assert kinds[:3] == [
        "interaction_update.text_delta",
        "interaction_update.text_delta",
        "interaction_update.token_delta",
    ]
    sets = [k for k in kinds[3:-4]]
    assert sets and all(k == "kv_server_message.set_blob_args" for k in sets)
    assert kinds[-4:] == TAIL
    assert tr.text() == "Hello, world"

    # Every blob SET carried data whose SHA-256 is its id (the simulator verifies and stores).
    for rec in tr.frames:
        if rec.kind == "kv_server_message.set_blob_args":
            args = rec.message.kv_server_message.set_blob_args
            assert hashlib.sha256(args.blob_data).digest() == args.blob_id
    assert_checkpoints_reference_only_acked(tr, daemon.sim.blobs)

    ended = next(f for f in tr.frames if f.kind == "interaction_update.turn_ended")
    te = ended.message.interaction_update.turn_ended
    assert (te.input_tokens, te.output_tokens) == (120, 7)
    token_delta = next(f for f in tr.frames if f.kind == "interaction_update.token_delta")
    assert token_delta.message.interaction_update.token_delta.tokens == 7

    staged, settled, again = tr.checkpoints()
    assert len(staged.pending_tool_calls) == 1
    assert json.loads(staged.pending_tool_calls[0])["role"] == "assistant"
    assert settled.pending_tool_calls == []
    assert bytes(settled) == bytes(again)
    assert len(settled.root_prompt_messages_json) == len(staged.root_prompt_messages_json) + 1
    # roots: system prompt, runtime user message, assistant answer
    roots = [json.loads(daemon.sim.blobs[r]) for r in settled.root_prompt_messages_json]
    assert [r["role"] for r in roots] == ["system", "user", "assistant"]
    assert "say hello" in roots[1]["content"]
    assert roots[2]["content"] == [{"type": "text", "text": "Hello, world"}]
    details = settled.token_details
    assert details.used_tokens == 127 and details.max_tokens == 128000
    assert details.breakdown is not None
    assert sum(c.estimated_tokens for c in details.breakdown.categories) == 127
    assert len(settled.turns) == 1
    structure = agent.ConversationTurnStructure.parse(daemon.sim.blobs[settled.turns[0]])
    steps = structure.agent_conversation_turn.steps
    assert len(steps) == 1
    step = agent.ConversationStep.parse(daemon.sim.blobs[steps[0]])
    assert step.assistant_message.text == "Hello, world"
    user = agent.UserMessage.parse(daemon.sim.blobs[structure.agent_conversation_turn.user_message])
    assert user.text == "say hello" and user.message_id == "m1"

    # The provider got a streaming Chat request with usage included and the user's text.
    (req,) = daemon.provider.requests
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == "Bearer sk-test"
    assert req.json["stream"] is True and req.json["stream_options"] == {"include_usage": True}
    assert req.json["messages"][0]["role"] == "system"
    assert "say hello" in req.json["messages"][1]["content"]

    # Persisted: runtime message + assistant message, run success with usage. EndStream goes out
    # before the run's terminal state and its call record are written: wait for both.
    run = await wait_run_ended(daemon.data_dir, "req-1")
    assert run.status == "success"
    assert run.usage is not None and run.usage.input_tokens == 120
    with SQLiteStore.open_in(daemon.data_dir) as store:
        head = store.head("conv-1")
        assert [m.role for m in head.messages] == ["user", "assistant"]
        assert head.messages[0].origin == "runtime"
        assert head.messages[1].text == "Hello, world"
        with trio.fail_after(5):
            while not store.llm_calls("req-1"):
                await trio.sleep(0.01)
        (call,) = store.llm_calls("req-1")
        assert call.status == "ok" and call.http_status == 200
        assert call.request_sha256 == hashlib.sha256(req.body).hexdigest()


async def test_checkpoints_wait_for_every_ack(daemon: Daemon) -> None:
    """With the client's ACKs held back, neither turn_ended nor any checkpoint goes out; they
    follow once the last ACK is posted."""
    set_kind = "kv_server_message.set_blob_args"
    held_back = {"conversation_checkpoint", "interaction_update.turn_ended"}
    daemon.provider.enqueue(chat_text_script(["Hello"]))
    driver = RunDriver(daemon.sim, "req-held")
    tr = Transcript()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(driver.stream, tr, auto_reply=False))
            (await driver.start(turn("say hello"))).raise_for_status()
            while set_kind not in tr.kinds():
                await trio.sleep(0.01)
            await trio.sleep(0.5)  # the SETs are out; a daemon that did not wait would be done
            sets = [f for f in tr.frames if f.kind == set_kind]
            assert len(sets) >= 2 and not held_back & set(tr.kinds())
            acks = [reply for f in sets for reply in daemon.sim.auto_reply(f.message, driver.acked)]
            for ack in acks[:-1]:
                (await driver.send(ack)).raise_for_status()
            await trio.sleep(0.3)
            assert not held_back & set(tr.kinds()), "a checkpoint went out before its last ACK"
            before_last = len(tr.frames)
            (await driver.send(acks[-1])).raise_for_status()
    assert tr.end_stream == {}
    assert [f.kind for f in tr.frames[before_last:] if f.kind != "interaction_update.heartbeat"] == TAIL
    assert_checkpoints_reference_only_acked(tr, daemon.sim.blobs)


async def test_thinking_is_streamed_and_timed(daemon: Daemon) -> None:
    daemon.provider.enqueue(chat_text_script(["Answer"], reasoning=["Let me ", "think"], usage=(50, 30)))
    tr = await daemon.sim.run("req-t", turn("why?"))
    assert tr.end_stream == {}
    kinds = tr.kinds()
    assert kinds[:4] == [
        "interaction_update.thinking_delta",
        "interaction_update.thinking_delta",
        "interaction_update.thinking_completed",
        "interaction_update.text_delta",
    ]
    done = next(f for f in tr.frames if f.kind == "interaction_update.thinking_completed")
    assert done.message.interaction_update.thinking_completed.thinking_duration_ms >= 1
    settled = tr.checkpoints()[-1]
    structure = agent.ConversationTurnStructure.parse(daemon.sim.blobs[settled.turns[0]])
    steps = [
        agent.ConversationStep.parse(daemon.sim.blobs[s]) for s in structure.agent_conversation_turn.steps
    ]
    assert steps[0].thinking_message.text == "Let me think"
    assert steps[1].assistant_message.text == "Answer"


async def test_second_turn_extends_the_provider_request_byte_for_byte(daemon: Daemon) -> None:
    daemon.provider.enqueue(
        chat_text_script(["First answer"], reasoning=["hmm"], usage=(10, 5)),
        chat_text_script(["Second answer"], usage=(20, 5)),
    )
    tr1 = await daemon.sim.run("req-a", turn("first", msg="m1"))
    # The client sends back its checkpoint; byok must not trust it for history.
    bogus = agent.ConversationStateStructure(root_prompt_messages_json=[b"\x00" * 32])
    req2 = user_turn("second", conversation_id="conv-1", model_id="byok-demo", message_id="m2", state=bogus)
    tr2 = await daemon.sim.run("req-b", req2)
    assert tr1.end_stream == {} and tr2.end_stream == {}
    first, second = (r.json["messages"] for r in daemon.provider.requests)
    assert len(second) == len(first) + 2
    dump = [json.dumps(m, separators=(",", ":"), ensure_ascii=False) for m in second[: len(first)]]
    assert dump == [json.dumps(m, separators=(",", ":"), ensure_ascii=False) for m in first]
    assert second[len(first)] == {"role": "assistant", "content": "First answer"}
    assert "second" in second[len(first) + 1]["content"]
    # Turn totals and history: the second checkpoint carries both turns.
    settled = tr2.checkpoints()[-1]
    assert len(settled.turns) == 2
    assert settled.turns[0] == tr1.checkpoints()[-1].turns[0]
    # Blobs the client already holds are not sent again.
    sent_again = {
        f.message.kv_server_message.set_blob_args.blob_id
        for f in tr2.frames
        if f.kind == "kv_server_message.set_blob_args"
    }
    assert not sent_again & set(tr1.checkpoints()[-1].root_prompt_messages_json)


@pytest.mark.parametrize("status", [400, 500])
async def test_provider_failure_ends_stream_with_error(daemon: Daemon, status: int) -> None:
    # 5xx is retried (4 tries in all) before the failure reaches Cursor; 4xx is not.
    daemon.provider.enqueue(*[error_script(status, "model exploded")] * (4 if status >= 500 else 1))
    tr = await daemon.sim.run("req-f", turn("hi"))
    assert len(daemon.provider.requests) == (4 if status >= 500 else 1)
    assert len({r.body for r in daemon.provider.requests}) == 1
    assert tr.error is not None and tr.error["code"] == "unavailable"
    assert "model exploded" in tr.error["message"]
    (detail,) = tr.error["details"]
    assert detail["type"] == "aiserver.v1.ErrorDetails"
    import base64

    raw = base64.b64decode(detail["value"] + "=" * (-len(detail["value"]) % 4))
    details = aiserver.ErrorDetails.parse(raw)
    assert details.error == aiserver.ErrorDetailsError.PROVIDER_ERROR
    assert "interaction_update.turn_ended" not in tr.kinds()
    assert "conversation_checkpoint" not in tr.kinds()
    with SQLiteStore.open_in(daemon.data_dir) as store:
        # The runtime user message stays committed; no assistant or error text is appended.
        assert [m.role for m in store.head("conv-1").messages] == ["user"]
        # The run writes its terminal state just after EndStream (its store calls may queue
        # behind the call-record writer), so give it a moment.
        with trio.fail_after(5):
            while (run := store.run("req-f")) is not None and run.status == "running":
                await trio.sleep(0.01)
        assert run is not None and run.status == "error" and run.error_code == "unavailable"


async def test_truncated_stream_is_a_failure(daemon: Daemon) -> None:
    daemon.provider.enqueue(chat_text_script(["partial"], done=False, close_after=2))
    tr = await daemon.sim.run("req-x", turn("hi"))
    assert tr.error is not None and tr.error["code"] == "unavailable"
    assert "interaction_update.turn_ended" not in tr.kinds()


async def test_length_finish_is_a_failure(daemon: Daemon) -> None:
    daemon.provider.enqueue(chat_text_script(["cut"], finish="length"))
    tr = await daemon.sim.run("req-l", turn("hi"))
    assert tr.error is not None and tr.error["code"] == "unavailable"


async def test_a_finished_run_is_not_kept_alive_by_its_lingering_slot(daemon: Daemon) -> None:
    """The slot of a finished run stays for a reconnecting RunSSE (SLOT_LINGER_S); the run, and
    with it the conversation's decoded history and the turn's cards, must not stay with it."""
    daemon.provider.enqueue(chat_text_script(["Hello"]))
    tr = await daemon.sim.run("req-gone", turn("say hello"))
    assert tr.end_stream == {}
    await wait_run_ended(daemon.data_dir, "req-gone")
    await trio.sleep(0.05)  # the run task's own tail after the terminal write
    gc.collect()
    assert [r for r in gc.get_objects() if isinstance(r, Run)] == []
