"""A recorded run, run again: its input log (run/run_log.py) through the same turn machine, the
same effects and the same router, with no network, no trio and no database.

The effects are the live ones (``TurnEffects``): every frame is sent synchronously from a
command, so the frames follow from the inputs alone. Only what the live run waited for is
different: a commit lands when the log says ``committed``, a checkpoint is out when it says
``published``, the provider's events are the log's, and a provider request is rendered from the
history where the live run sent it. ``ReplayResult.mismatches`` compares what came out with
what the live run recorded at its end.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import attrs

from byok.cursor import client_messages
from byok.cursor.checkpoint import Blob, TurnRecord
from byok.cursor.exec_router import ExecRouter
from byok.cursor.prompting import ModeAssets
from byok.cursor.request import decode_start
from byok.cursor.token_details import decode_details
from byok.cursor.tools.env import ToolEnv
from byok.cursor.tools.mcp_dynamic import run_tools
from byok.cursor.tools.registry import build_registry
from byok.cursor.tools.work import decode_result
from byok.loop.compaction import kept_tail
from byok.loop.input_codec import decode_input
from byok.loop.model_call import ModelProtocolError
from byok.loop.turn_values import CallModel, Cancel, Command, Commit, Committed, Input, Outcome
from byok.model.messages import Message
from byok.model.projection import project
from byok.model.request import ModelRequest, ModelSettings, ToolSpec
from byok.providers.adapters import adapter_for
from byok.run.context import RunContext
from byok.run.conversation import ConversationMemory
from byok.run.deps import ToolSetup
from byok.run.driver import Driver
from byok.run.inbox_pump import route
from byok.run.kv import KvLink
from byok.run.run_log import FrameDigest, outcome_json
from byok.run.turn_effects import TurnEffects, rebased, tool_done, tool_note
from byok.store.records import Head


class ReplayError(Exception):
    """The log cannot be replayed (not a run log, or cut before its start)."""


class FrameSink:
    """Stands for the run's slot: keeps every message sent, and the outcome."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.frames: list[bytes] = []
        self.digest = FrameDigest()
        self.outcome: Outcome | None = None

    def send(self, message: bytes) -> None:
        if self.outcome is None:
            self.frames.append(message)
            self.digest.add(message)

    def close(self, outcome: Outcome) -> None:
        if self.outcome is None:
            self.outcome = outcome

    async def flushed(self) -> None:
        return None


@attrs.frozen
class _Deps:
    tools: ToolSetup
    prompts: dict[str, ModeAssets]  # the modes the run switched to (its "mode" lines)


@attrs.frozen
class _Model:
    context_tokens: int


class ReplayEffects(TurnEffects):
    """The live effects, with the waiting done by the log."""

    def __init__(self, ctx: RunContext, kind: str, template: ModelRequest, compaction: str = "") -> None:
        super().__init__(ctx, nursery=None)  # type: ignore[arg-type]
        self.kind = kind
        self.template = template
        self.compaction = compaction  # the compaction call's instruction
        self.requests: list[bytes] = []
        self._committing: Commit | None = None
        self._calling: CallModel | None = None

    def retarget(self, line: dict[str, Any]) -> None:
        """An alias's call moved to its next model before any output: the same call again,
        rendered for that model (run/failover.py)."""
        self.kind = line["provider_kind"]
        self.template = attrs.evolve(self.template, settings=_settings(line["settings"]))
        self.ctx.model = _Model(line["context_tokens"])  # type: ignore[assignment]
        if self._calling is None:
            raise ReplayError("the log moves to another target with no call under way")
        self._render(self._calling)

    def _spawn(self, work: Callable[[Command], Awaitable[Input | None]], command: Command) -> None:
        if isinstance(command, CallModel):
            self._calling = command
            self._render(command)
        elif isinstance(command, Commit):
            self._committing = command

    def _render(self, command: CallModel) -> None:
        c = self.ctx  # its mode's prompt and tools: a SwitchMode may have changed them
        messages = c.head.messages
        if command.compact:
            summarized = messages[: kept_tail(messages)]
            messages = (*summarized, Message(role="user", origin="runtime", text=self.compaction))
        request = attrs.evolve(
            self.template, system=c.assets.system, tools=c.tool_specs, history=project(messages)
        )
        self.requests.append(adapter_for(self.kind).render(request).body)

    def land_commit(self) -> None:
        commit, self._committing = self._committing, None
        if commit is None:
            raise ReplayError("the log says committed with no commit under way")
        head = self.ctx.head
        if commit.rebase:  # as TurnEffects._commit
            messages = tuple(rebased(commit.messages[0], head.messages))
        else:
            messages = (*head.messages, *commit.messages)
        self.ctx.head = attrs.evolve(head, version=head.version + 1, messages=messages)


@attrs.frozen
class ReplayResult:
    frames: tuple[bytes, ...]
    frames_sha256: str
    requests: tuple[bytes, ...]
    outcome: Outcome | None
    live: dict[str, Any] | None  # the log's end line: what the live run sent

    def mismatches(self) -> list[str]:
        """How the replay differs from the live run (empty: byte for byte the same)."""
        live = self.live
        if live is None:
            return ["the log has no end line (the live run did not finish)"]
        out = []
        if (live["frames"], live["frames_sha256"]) != (len(self.frames), self.frames_sha256):
            out.append(
                f"frames: live {live['frames']} ({live['frames_sha256'][:12]}),"
                f" replay {len(self.frames)} ({self.frames_sha256[:12]})"
            )
        shas = [hashlib.sha256(body).hexdigest() for body in self.requests]
        if live["requests"] != shas:
            out.append(f"provider requests: live {len(live['requests'])}, replay {len(shas)}; they differ")
        if live["outcome"] != outcome_json(self.outcome):
            out.append(f"outcome: live {live['outcome']}, replay {outcome_json(self.outcome)}")
        return out


def _specs(rows: list[list[str]]) -> tuple[ToolSpec, ...]:
    return tuple(ToolSpec(name, description, parameters) for name, description, parameters in rows)


def _with_images(messages: tuple[Message, ...], images: dict[str, str]) -> tuple[Message, ...]:
    for m in messages:
        if m.attachments:
            m.give_image_data(lambda sha256: base64.b64decode(images[sha256]))
    return messages


def _world(start: dict[str, Any], modes: list[dict[str, Any]]) -> tuple[ReplayEffects, Driver, FrameSink]:
    st = decode_start(start["run"])
    backends = frozenset(start.get("backends", ()))
    # What the live run read from its deps when it switched modes, from the log's "mode" lines.
    prompts = {m["mode"]: ModeAssets(m["mode"], m["system"], "") for m in modes}
    base = build_registry()
    setup = ToolSetup(base, {m["mode"]: _specs(m["tools"]) for m in modes}, backends)
    sink = FrameSink(st.request_id)
    memory = ConversationMemory(acked={bytes.fromhex(h) for h in start["acked"]})
    memory.root_ids = {bytes.fromhex(k): Blob(bytes.fromhex(v), b"") for k, v in start["root_ids"].items()}
    memory.recalled = True
    kv = KvLink(sink.send, memory.acked, first_id=start["kv_next_id"])
    driver_box: list[Driver] = []
    router = ExecRouter(
        sink.send,
        st.request_id,
        lambda call_id, outcome: driver_box[0].submit(tool_done(call_id, outcome), derived=True),
        on_work=lambda call_id, work: None,  # its result is the log's "work" line
        on_note=lambda call_id, note: driver_box[0].submit(tool_note(note, ctx), derived=True),
    )
    h = start["head"]
    tools = _specs(start["tools"])
    turn = start["turn"]
    registry, dynamic = run_tools(st, base)  # the announced MCP tools follow from the request
    ctx = RunContext(
        start=st,
        deps=_Deps(setup, prompts),  # type: ignore[arg-type]
        slot=sink,  # type: ignore[arg-type]
        memory=memory,
        kv=kv,
        router=router,
        model=_Model(start["context_tokens"]),  # type: ignore[arg-type]
        provider=None,  # type: ignore[arg-type]
        mode=start["mode"],
        assets=ModeAssets(start["mode"], start["system"], ""),
        tool_specs=tools,
        details=decode_details(bytes.fromhex(start["details"])),
        tool_env=ToolEnv(
            request_id=st.request_id,
            conversation_id=st.conversation_id,
            root_conversation_id=st.conversation_group_id or st.conversation_id,
            mode=start["mode"],
            model_id=st.model_id,
            subagent_model_overrides=st.subagent_model_overrides,
            request_context=st.request_context,
            backends=backends,
            vision=start["settings"].get("vision", True),
        ),
        agent_mode=st.mode,
        head=Head(
            h["conversation_id"],
            h["revision_id"],
            h["version"],
            _with_images(tuple(Message.decode(m.encode()) for m in h["messages"]), h.get("images", {})),
        ),
        prior_turns=tuple(bytes.fromhex(t) for t in start["prior_turns"]),
        turn=TurnRecord(
            turn["request_id"],
            bytes.fromhex(turn["user_message"]),
            tuple(bytes.fromhex(s) for s in turn["steps"]),
        ),
        registry=registry,
        dynamic=dynamic,
    )
    settings = _settings(start["settings"])
    template = ModelRequest(system=start["system"], tools=tools, history=(), settings=settings)
    effects = ReplayEffects(ctx, start["provider_kind"], template, start.get("compaction", ""))
    driver = Driver(effects)
    effects.driver = driver
    driver_box.append(driver)
    return effects, driver, sink


def _settings(s: dict[str, Any]) -> ModelSettings:
    return ModelSettings(
        upstream_model=s["upstream_model"],
        max_output_tokens=s["max_output_tokens"],
        replay_reasoning_on_tool_turns=s["replay_reasoning_on_tool_turns"],
        extra_body=tuple((k, v) for k, v in s["extra_body"]),
        prompt_cache=s["prompt_cache"],
        eager_input_streaming=s["eager_input_streaming"],
        cache_key=s["cache_key"],
        vision=s.get("vision", True),
    )


def replay(lines: Iterable[dict[str, Any]]) -> ReplayResult:
    lines = list(lines)
    it = iter(lines)
    start = next(it, None)
    if start is None or start.get("k") != "start":
        raise ReplayError("not a run log: it does not begin with a start line")
    effects, driver, sink = _world(start, [obj for obj in lines if obj.get("k") == "mode"])
    live: dict[str, Any] | None = None
    paused = False  # at a Flush: the live run went on only at the log's next "flushed"
    for obj in it:
        kind = obj.get("k")
        if kind == "client":
            msg = client_messages.parse(bytes.fromhex(obj["data"]))
            route(msg, sink, effects.ctx.kv, effects.ctx.router, driver)  # type: ignore[arg-type]
        elif kind == "flushed":
            paused = False
        elif kind == "reattach":
            effects.ctx.kv.resend_unacked()
        elif kind == "work":
            effects.ctx.router.work_done(obj["call_id"], decode_result(obj["result"]))
        elif kind == "mode":
            pass  # read before the replay began
        elif kind == "target":
            effects.retarget(obj)
        elif kind == "end":
            live = obj
            break
        else:
            inp = decode_input(obj)
            if isinstance(inp, Cancel):
                # Only a cancel from outside (preemption, the grace, shutdown) is logged: the live
                # run's end_now, which ends it even while it waits at a Flush.
                driver.end_now(inp)
                continue
            if isinstance(inp, Committed):
                effects.land_commit()
            # A bad event: the live provider task failed its call on it; model_failed follows.
            with contextlib.suppress(ModelProtocolError):
                driver.submit(inp, derived=True)
        if not paused:
            paused = driver.drain_to_flush()
    return ReplayResult(
        tuple(sink.frames), sink.digest.hexdigest(), tuple(effects.requests), sink.outcome, live
    )


def read_log(path: Path) -> list[dict[str, Any]]:
    try:
        with path.open(encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        raise ReplayError(f"{path}: {e}") from None


def replay_file(path: Path) -> ReplayResult:
    return replay(read_log(path))
