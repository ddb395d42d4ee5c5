"""Modes through a real daemon: each run's provider request carries its mode's own prompt, runtime
template and tools; a subagent's run the subagent set; a mode byok does not run is refused by
name before anything is written; the checkpoint records the mode."""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path

import pytest
import trio

from byok.cursor.prompting import default_prompt_root, load_prompt_assets
from byok.cursor.tools.catalog import load_tool_catalog, mode_tools
from byok.cursor.tools.registry import build_registry
from byok.devtools.cursor_sim import Transcript, user_turn
from byok.pb.agent import v1 as agent
from byok.run.deps import tool_setup
from byok.store import SQLiteStore
from tests.integration.conftest import Daemon
from tests.support.fake_provider import chat_text_script
from tests.support.run_driver import RunDriver

Mode = agent.AgentMode
ROOT = default_prompt_root()
ASSETS = load_prompt_assets(ROOT)
CATALOG = load_tool_catalog(ROOT)


def tool_names(mode: str) -> list[str]:
    """The mode's manifest as the test daemon offers it: no search or image backend configured."""
    setup = tool_setup(build_registry(), {mode: mode_tools(ROOT, mode, CATALOG)}, frozenset())
    return [t.name for t in setup.specs_by_mode[mode]]


def reminder(mode: str) -> str:
    """The mode's own line of its runtime template (its system reminder)."""
    (line,) = [ln for ln in ASSETS[mode].runtime_template.splitlines() if ln.startswith("<system_reminder>")]
    return line


@pytest.mark.parametrize(
    ("wire_mode", "state_mode", "subagent", "mode"),
    [
        (Mode.AGENT, None, "", "agent"),
        (Mode.ASK, Mode.AGENT, "", "ask"),  # the message's mode wins over the state's
        (Mode.PLAN, None, "", "plan"),
        (Mode.DEBUG, None, "", "debug"),
        (Mode.MULTITASK, None, "", "multitask"),
        (Mode.UNSPECIFIED, Mode.MULTITASK, "", "multitask"),  # no mode on the message: the state's
        (Mode.AGENT, None, "generalPurpose", "subagent"),
    ],
)
async def test_each_mode_sends_its_prompt_and_tools(
    daemon: Daemon, wire_mode: Mode, state_mode: Mode | None, subagent: str, mode: str
) -> None:
    daemon.provider.enqueue(chat_text_script(["done"]))
    req = user_turn(
        "what now", conversation_id="conv-mode", model_id="byok-demo", message_id="m1", mode=wire_mode
    )
    if state_mode is not None:
        req.conversation_state = agent.ConversationStateStructure(mode=state_mode)
    if subagent:
        req.subagent_type_name = subagent
    tr = await daemon.sim.run("req-mode", req)
    assert tr.error is None, tr.error

    (sent,) = daemon.provider.requests
    system, user = sent.json["messages"][:2]
    assert system == {"role": "system", "content": ASSETS[mode].system}
    tools = [t["function"]["name"] for t in sent.json.get("tools", [])]
    assert tools == tool_names(mode) and tools
    if mode == "agent":
        assert "<system_reminder>" not in user["content"]
    else:
        assert reminder(mode) in user["content"]
    assert "<user_query>\nwhat now\n</user_query>" in user["content"]
    # The checkpoint records the mode the run ran in (a subagent's keeps its message's mode).
    recorded = wire_mode if mode == "subagent" else getattr(Mode, mode.upper())
    assert {c.mode for c in tr.checkpoints()} == {recorded}


@pytest.mark.parametrize(
    ("wire_mode", "state_mode", "named"),
    [
        (Mode.TRIAGE, None, "mode TRIAGE"),
        (Mode.PROJECT, None, "mode PROJECT"),
        (Mode.UNSPECIFIED, Mode.TRIAGE, "mode TRIAGE"),
        (57, None, "mode 57 (unknown to byok)"),
    ],
)
async def test_a_mode_byok_does_not_run_ends_the_run_naming_it(
    daemon: Daemon, wire_mode: Mode, state_mode: Mode | None, named: str
) -> None:
    req = user_turn("hi", conversation_id="conv-x", model_id="byok-demo", message_id="m1", mode=wire_mode)
    if state_mode is not None:
        req.conversation_state = agent.ConversationStateStructure(mode=state_mode)
    tr = Transcript()
    driver = RunDriver(daemon.sim, "req-x")
    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(driver.stream, tr))
        answer = await driver.start(req)
    # Both the append carrying the run_request and the run's stream say why.
    assert answer.status_code == 501 and named in answer.json()["message"]
    assert tr.error is not None and tr.error["code"] == "unimplemented"
    assert named in tr.error["message"] and "multitask" in tr.error["message"]
    assert daemon.provider.requests == []  # never run as the agent
    assert [f.kind for f in tr.frames if f.kind != "interaction_update.heartbeat"] == []
    with SQLiteStore(Path(daemon.data_dir) / "byok.sqlite3") as store:
        assert store.head("conv-x").messages == ()  # nothing was appended


async def test_a_mode_switch_between_turns_changes_prompt_and_tools_at_once(daemon: Daemon) -> None:
    """The same conversation in agent, then ask, then multitask: each request is its mode's, and
    the history before it is the previous request's, byte for byte."""
    modes = [(Mode.AGENT, "agent"), (Mode.ASK, "ask"), (Mode.MULTITASK, "multitask")]
    for i, (wire_mode, _mode) in enumerate(modes):
        daemon.provider.enqueue(chat_text_script([f"answer {i}"]))
        req = user_turn(
            f"q{i}", conversation_id="conv-sw", model_id="byok-demo", message_id=f"m{i}", mode=wire_mode
        )
        tr = await daemon.sim.run(f"req-sw-{i}", req)
        assert tr.error is None, tr.error
    requests = [r.json for r in daemon.provider.requests]
    for body, (_wire, mode) in zip(requests, modes, strict=True):
        assert body["messages"][0]["content"] == ASSETS[mode].system
        assert [t["function"]["name"] for t in body["tools"]] == tool_names(mode)
    for earlier, later in itertools.pairwise(requests):
        history = earlier["messages"][1:]
        assert later["messages"][1 : 1 + len(history)] == history
    assert json.dumps(requests[2]["messages"][-2]) == json.dumps({"role": "assistant", "content": "answer 1"})
