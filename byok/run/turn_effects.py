"""What the turn machine's commands do in the world: the store, the client's KV, its tools, the
provider, the frames.

Every frame is sent in ``perform``, synchronously, so the frames a run sends follow from its
inputs alone (run/replay.py relies on it). What takes time runs as a task of the run's nursery
(``_spawn``) that only waits (the store, the client's ACKs, the provider) and submits its
result to the driver as an input.

The pipelining lives here, behind the commands: a commit's ``ahead`` blobs are SET before the
store writes, so the client ACKs them meanwhile; a gated provider call's output waits for the
settled checkpoint's frame (``_gate``), while its request is already on its way.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import attrs
import trio

from byok.config import ConfigError
from byok.cursor import encode, tool_frames
from byok.cursor.agent_modes import mode_value
from byok.cursor.checkpoint import (
    Blob,
    Checkpoint,
)
from byok.cursor.compaction_carry import carried
from byok.cursor.exec_router import dispatch
from byok.cursor.prompting import ModeAssets
from byok.cursor.todos import TOOL_NAME as TODO_TOOL
from byok.cursor.token_details import token_details
from byok.cursor.tools.base import ArgsStream, ToolOutcome
from byok.cursor.tools.modes import ModeSwitch
from byok.cursor.tools.registry import placeholder_card
from byok.cursor.user_shell import execution as user_shell_execution
from byok.cursor.user_shell import shell_turn, user_command
from byok.loop import emits as em
from byok.loop.compaction import first_call_on_summary, heading_summary, kept_tail
from byok.loop.turn_values import (
    Ahead,
    CallModel,
    CallUsage,
    Command,
    Commit,
    Committed,
    End,
    Failed,
    FailedError,
    Fault,
    FinalCheckpoints,
    Input,
    ModelEnded,
    ModelEvents,
    ModelFailed,
    ModeSwitched,
    Publish,
    Published,
    ResultBlobs,
    Reveal,
    RunShellCommand,
    RunTools,
    SettledCheckpoint,
    Show,
    ShowToolDone,
    StagedCheckpoint,
    Succeeded,
    ToolDone,
    UseMode,
)
from byok.model import events as ev
from byok.model.messages import Message
from byok.model.request import ModelRequest
from byok.run.context import RunContext
from byok.run.crash import crash_point
from byok.run.driver import Driver
from byok.run.failover import OutputWatch, call_alias
from byok.run.kv import KvFailure
from byok.run.provider_call import model_settings, run_call_context, stream_model
from byok.run.start_point import changed_under_run
from byok.run.turn_checkpoints import TurnCheckpoints
from byok.store import StaleRevision, StoreError

log = logging.getLogger("byok.run")


class TurnEffects:
    def __init__(self, ctx: RunContext, nursery: trio.Nursery) -> None:
        self.ctx = ctx
        self.nursery = nursery
        self.driver: Driver | None = None  # set by the run, which makes both
        self.ended = trio.Event()
        self._prepared: tuple[Ahead, tuple[Checkpoint, ...]] | None = None  # built ahead of a commit
        self._revealing: tuple[object, tuple[Checkpoint, ...]] = (None, ())  # published, to be sent
        self.checkpoints = TurnCheckpoints(ctx)
        self._gate = trio.Event()  # the last settled checkpoint's frame is queued (a gated call waits)
        self._streams: dict[str, ArgsStream] = {}  # call id -> its live arguments view
        self.on_request: Callable[[bytes], None] | None = None  # each provider request's body (a run's log)
        self.on_retarget: Callable[[], None] | None = None  # an alias moved to its next target (the log)

    # --- the driver's side ---------------------------------------------------------------
    def perform(self, command: Command) -> None:
        match command:
            case Show(emits=emits):
                for emit in emits:
                    self._show(emit)
                    crash_point("provider_mid_stream")
            case CallModel():
                self._streams = {}
                self._spawn(self._call_model, command)
            case Commit(ahead=ahead):
                if ahead is not None:
                    self._send_ahead(ahead)
                self._spawn(self._commit, command)
            case Publish(checkpoint=checkpoint):
                if isinstance(checkpoint, SettledCheckpoint):
                    self._gate = trio.Event()
                self._revealing = (checkpoint, self._to_publish(checkpoint))
                self.ctx.kv.offer(blob for c in self._revealing[1] for blob in c.blobs)
                self._spawn(self._publish, command)
            case Reveal(kind=kind):
                self._reveal(kind)
            case RunTools():
                self._run_tools(command)
            case RunShellCommand():
                c = self.ctx
                cmd = user_command(c.start.event_action, c.start.request_id)
                c.router.begin(cmd.exec_id, "", user_shell_execution(cmd, c.tool_env))
            case UseMode(mode=mode):
                c = self.ctx
                c.mode, c.agent_mode, c.tool_env.mode = mode, mode_value(mode), mode
                c.assets = c.deps.prompts[mode]
                c.tool_specs = c.dynamic.offered(c.deps.tools.specs_by_mode.get(mode, ()))
            case ShowToolDone(call_id=call_id, result=result, model_call_id=mcid):
                assert isinstance(result, ToolOutcome)
                self.ctx.slot.send(encode.tool_call_completed(call_id, result.ui_bytes(), mcid))
            case CallUsage(usage=usage):
                c = self.ctx
                c.details = token_details(
                    usage,
                    system_prompt=c.assets.system,
                    tool_specs=c.tool_specs,
                    request_context=c.start.request_context,
                    context_tokens=c.model.context_tokens,
                )
            case End():
                self._end(command)
            case _:
                raise AssertionError(f"no effect for {command!r}")

    async def flush(self) -> None:
        await self.ctx.slot.flushed()

    def _spawn(self, work: Callable[[Command], Awaitable[Input | None]], command: Command) -> None:
        self.nursery.start_soon(self._report, work, command)

    async def _report(self, work: Callable[[Command], Awaitable[Input | None]], command: Command) -> None:
        """Run one effect; its result, or its failure, is the machine's next input."""
        try:
            inp = await work(command)
        except StaleRevision as e:
            inp = Fault(changed_under_run(e))
        except KvFailure as e:
            inp = Fault(Failed("internal", f"checkpoint not published: {e}"))
        except StoreError as e:  # the machine's fault (disk full, read-only), not byok's
            inp = Fault(Failed("internal", f"byok's database failed: {e}"))
        except Exception as e:  # a bug, not a peer error: still one clean terminal state
            log.exception("run %s failed internally", self.ctx.start.request_id)
            inp = Fault(Failed("internal", f"internal error: {type(e).__name__}: {e}"))
        if inp is not None:
            assert self.driver is not None
            await self.driver.feed(inp)

    # --- frames ------------------------------------------------------------------------------
    def _show(self, emit: em.Emit) -> None:
        send, registry = self.ctx.slot.send, self.ctx.registry
        match emit:
            case em.ToolCallOpened(call_id=cid, name=name, model_call_id=mcid):
                # Every call gets its placeholder: a tool byok does not know its generic card.
                tool = registry.get(name)
                send(tool_frames.partial(cid, placeholder_card(tool, name), mcid))
                if tool is not None and tool.args_stream is not None:
                    self._streams[cid] = tool.args_stream()
            case em.ToolArgsOut(call_id=cid, name=name, delta=delta, model_call_id=mcid):
                send(tool_frames.partial(cid, placeholder_card(registry.get(name), name), mcid, delta))
                stream = self._streams.get(cid)
                if stream is not None:
                    for d in stream.feed(delta):
                        send(tool_frames.delta(cid, d, mcid))
            case _:
                send(encode.encode_emit(emit))

    def _end(self, end: End) -> None:
        c = self.ctx
        c.outcome = end.outcome
        if not isinstance(end.outcome, Succeeded):
            c.router.abort_all()
        c.slot.close(end.outcome)
        self.ended.set()

    # --- the provider ----------------------------------------------------------------------------
    async def _call_model(self, command: Command) -> Input | None:
        assert isinstance(command, CallModel) and self.driver is not None
        gate = self._gate if command.gated else None  # Publish(settled) made it, just before
        crash_point("provider_call_planned")
        if self.ctx.alias is not None:  # its targets in order, before any output (run/failover.py)
            return await call_alias(self.ctx, lambda w: self._call_once(command, gate, w), self.on_retarget)
        return await self._call_once(command, gate)

    async def _call_once(
        self, command: CallModel, gate: trio.Event | None, watch: OutputWatch | None = None
    ) -> Input | None:
        """One provider call on the run's current model; ``watch`` hears of its first events."""
        assert self.driver is not None
        driver, c = self.driver, self.ctx
        try:
            api_key = c.provider.api_key()
        except ConfigError as e:  # api_key_env unset where the daemon runs (a service's own env)
            return Fault(Failed("failed_precondition", f"no API key for provider {c.provider.id!r}: {e}"))
        template = ModelRequest(
            system=c.assets.system,
            tools=c.tool_specs,
            history=(),
            settings=model_settings(c.model, c.provider, c.start.conversation_id),
        )
        messages = c.head.messages
        if command.compact:
            # The history as it stands, then the instruction: the same system prompt and tools
            # keep the provider's prompt cache for the whole history (the summary call reads it).
            summarized = messages[: kept_tail(messages)]
            messages = (*summarized, compaction_instruction(c.deps.prompts))
        request = await c.deps.renders.request(
            c.deps.store, c.start.conversation_id, messages, c.provider.kind, template
        )
        call = run_call_context(
            request_id=c.start.request_id,
            conversation_id=c.start.conversation_id,
            provider=c.provider,
            model=c.model,
            api_key=api_key,
            deps=c.deps,
            alias_id=None if c.alias is None else c.alias.id,
        )
        summary = heading_summary(c.head.messages)
        if summary and summary not in c.memory.summaries_called:
            # The first call on a compacted history starts a new prefix on purpose. A daemon
            # that restarted (or evicted the conversation's memory) knows a summary it called
            # on before by an answer after it; without one, the meter records a call that
            # extends the previous one as such (call_log).
            c.memory.summaries_called.add(summary)
            call = attrs.evolve(call, new_prefix=first_call_on_summary(c.head.messages))

        async def on_events(events: list[ev.ModelEvent]) -> None:
            if watch is not None:
                watch.output()
            if gate is not None:
                await gate.wait()
            now = trio.current_time()
            if c.first_output_at is None:
                c.first_output_at = now
            await driver.feed(ModelEvents(tuple(events), now))

        async def on_end() -> None:
            if gate is not None:
                await gate.wait()
            await driver.feed(ModelEnded())

        try:
            with c.deps.activity.provider_call():  # the store is idle meanwhile (upkeep.py)
                on_request = self.on_request
                await stream_model(
                    call,
                    request,
                    on_events,
                    on_end,
                    None if on_request is None else lambda r: on_request(r.body),
                )
        except FailedError as e:
            return ModelFailed(e.failure)
        return None

    # --- the store and the client's KV -----------------------------------------------------------
    def _send_ahead(self, ahead: Ahead) -> None:
        """SET, before the commit, the blobs the checkpoint after it will reference: the client
        ACKs them while SQLite writes (a checkpoint depends on the messages' content only)."""
        c = self.ctx
        if isinstance(ahead, StagedCheckpoint):
            # Built on the head before the commit: the assistant travels inline.
            staged = self.checkpoints.checkpoint(c.head.messages, [ahead.assistant], ahead.steps)
            self._prepared = (ahead, (staged,))
        elif isinstance(ahead, FinalCheckpoints):
            self._prepared = (ahead, self.checkpoints.final(ahead))
        else:
            self._prepared = None
            c.kv.offer(self._result_blobs(ahead))
            return
        c.kv.offer(blob for checkpoint in self._prepared[1] for blob in checkpoint.blobs)

    def _result_blobs(self, ahead: ResultBlobs) -> list[Blob]:
        """The settled checkpoint will reference this result's root and (for a tool with a card)
        its step: they go now, so their ACKs come back while the result is committed and other
        tools run. With the last result goes the turn's structure, so the settled checkpoint
        waits for no ACK round trip of its own (the client answers SETs one at a time). Blobs
        are content-addressed: a SET of a result whose commit then fails leaves the client an
        unreferenced blob, nothing more."""
        blobs = [self.ctx.memory.root_of(ahead.message, with_data=True)]
        if ahead.step is not None:
            blobs.append(self.checkpoints.step_blob(ahead.step))
        if ahead.settled_steps is not None:
            blobs.append(self.checkpoints.turn_of(ahead.settled_steps).structure())
        if ahead.message.tool_name == TODO_TOOL and not ahead.message.is_error:
            todos = self.ctx.memory.todos
            blobs += todos.blobs(todos.todos(self.ctx.head.messages, (ahead.message,)))
        return blobs

    async def _commit(self, command: Command) -> Input:
        assert isinstance(command, Commit)
        c = self.ctx
        messages = list(command.messages)
        if command.rebase:  # the summary, then the part of the history it did not summarize
            messages = rebased(messages[0], c.head.messages)
        c.head = await c.deps.store.append(
            c.start.conversation_id, c.head.version, messages, c.deps.wall_ms(), rebase=command.rebase
        )
        if command.rebase:
            crash_point("summary_committed")
        if isinstance(command.ahead, ResultBlobs):
            crash_point("tool_result_committed")
        return Committed()

    def _to_publish(
        self, checkpoint: StagedCheckpoint | SettledCheckpoint | FinalCheckpoints
    ) -> tuple[Checkpoint, ...]:
        if isinstance(checkpoint, SettledCheckpoint):
            return (self.checkpoints.checkpoint(self.ctx.head.messages, [], checkpoint.steps),)
        if isinstance(checkpoint, FinalCheckpoints) and checkpoint.shell is not None:
            # A user's shell command: the checkpoint listing its turn, the same three times.
            assert isinstance(checkpoint.shell, ToolOutcome)
            cmd = user_command(self.ctx.start.event_action, self.ctx.start.request_id)
            turn = shell_turn(cmd, checkpoint.shell)
            shell = self.checkpoints.checkpoint(self.ctx.head.messages, [], (), turn)
            return shell, shell
        if isinstance(checkpoint, FinalCheckpoints) and checkpoint.compacted:
            # A compaction run's end: the compacted history's checkpoint, the same three times.
            compacted = self.checkpoints.checkpoint(self.ctx.head.messages, [], checkpoint.steps)
            return compacted, compacted
        prepared, self._prepared = self._prepared, None
        if prepared is not None and prepared[0] is checkpoint:
            return prepared[1]
        assert isinstance(checkpoint, FinalCheckpoints) and checkpoint.answer is None, (
            "published before its commit"
        )
        return self.checkpoints.final(checkpoint)  # a resume after the answer: it is committed already

    async def _publish(self, command: Command) -> Input:
        assert isinstance(command, Publish)
        c = self.ctx
        checkpoint, checkpoints = command.checkpoint, self._revealing[1]
        # Offered when the command was performed: this only waits (no frame leaves a task).
        await c.kv.settle(
            [blob for cp in checkpoints for blob in cp.blobs], timeout_s=c.deps.config.server.kv_ack_timeout_s
        )
        if isinstance(checkpoint, StagedCheckpoint):
            return Published("staged")
        if isinstance(checkpoint, SettledCheckpoint):
            return Published("settled")
        c.memory.drop_acked_roots()  # an idle conversation keeps root ids, not their bytes
        turn_id = checkpoints[1].turn_id
        assert turn_id is not None
        await c.deps.store.save_turns(c.start.conversation_id, c.head.revision_id, (*c.prior_turns, turn_id))
        return Published("final")

    def _reveal(self, kind: str) -> None:
        c = self.ctx
        checkpoint, checkpoints = self._revealing
        if kind == "staged":
            crash_point("blobs_acked")
            c.slot.send(encode.checkpoint(checkpoints[0].state))
        elif kind == "settled":
            c.slot.send(encode.checkpoint(checkpoints[0].state))
            crash_point("settled_checkpoint_sent")
            self._gate.set()
        else:
            assert isinstance(checkpoint, FinalCheckpoints)
            staged, settled = checkpoints
            c.slot.send(
                encode.turn_ended(checkpoint.usage) if checkpoint.usage else encode.turn_ended_empty()
            )
            crash_point("turn_ended_sent")
            c.slot.send(encode.checkpoint(staged.state))
            c.slot.send(encode.checkpoint(settled.state))
            c.slot.send(encode.checkpoint(settled.state))

    # --- tools ---------------------------------------------------------------------------------------
    def _run_tools(self, command: RunTools) -> None:
        c = self.ctx
        c.tool_env.messages = c.head.messages
        dispatch(
            c.router,
            c.registry,
            c.slot.send,
            command.model_call_id,
            command.calls,
            dict(command.refused),
            c.tool_env,
        )
        # The settled checkpoint lists the assistant as a root (the staged one held it inline):
        # its SET and ACK go while the tools run.
        assistant = c.head.messages[-1] if c.head.messages else None
        if assistant is not None and assistant.tool_calls:
            c.kv.offer([c.memory.root_of(assistant, with_data=True)])


def rebased(summary: Message, history: tuple[Message, ...]) -> list[Message]:
    """A compaction's new history: the summary, carrying the todo list and the plan of what it
    summarizes, then the part it did not summarize (the user's new message)."""
    cut = kept_tail(history)
    return [carried(summary, history[:cut]), *history[cut:]]


def compaction_instruction(prompts: dict[str, ModeAssets]) -> Message:
    """The request a compaction call ends with (not committed: the summary replaces it all)."""
    return Message(role="user", origin="runtime", text=prompts["compaction"].system)


def tool_done(call_id: str, outcome: ToolOutcome) -> ToolDone:
    return ToolDone(call_id, outcome.content, outcome.is_error, outcome, outcome.images)


def tool_note(note: object, ctx: RunContext) -> ModeSwitched:
    """The turn input a tool's note stands for."""
    if isinstance(note, ModeSwitch):
        specs = ctx.dynamic.offered(ctx.deps.tools.specs_by_mode.get(note.mode, ()))
        return ModeSwitched(note.mode, frozenset(s.name for s in specs))
    raise AssertionError(f"no turn input for the tool note {note!r}")
