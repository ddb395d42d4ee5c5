"""One agent Run: compile, loop provider calls and tool rounds, publish checkpoints, end the stream.

The turn's I/O lives in run/ (this module, start_point, history, provider_call, tool_round);
what it decides comes from the sans-IO layers: cursor/ (request, prompting, checkpoint graph,
encoding, tools), loop/ (model call assembly), model/ (projection) and providers/ (request
bytes, stream parsing).

Frame orders (seeds 000 §19, §21, §22.3):
  tool round: assistant committed -> staged checkpoint (pending = the assistant) -> Execs ->
              each result committed -> all settled -> settled checkpoint -> next provider call
  turn end:   final assistant committed -> blobs ACKed -> turn_ended -> staged -> settled ->
              settled again -> EndStream {}
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable

import attrs
import trio

from byok.config import ConfigError, ModelConfig, ProviderConfig
from byok.cursor import encode
from byok.cursor.checkpoint import (
    Blob,
    Checkpoint,
    TurnRecord,
    assistant_step,
    build_checkpoint,
    thinking_step,
)
from byok.cursor.prompting import mode_name
from byok.cursor.request import RunStart
from byok.cursor.tools.base import ToolOutcome
from byok.exception_groups import first_except
from byok.http.connect_envelope import ConnectError, end_stream_error, end_stream_ok
from byok.loop.model_call import ModelCallResult
from byok.model.messages import Message
from byok.model.request import ModelRequest
from byok.model.usage import Usage
from byok.pb.agent import v1 as agent
from byok.run.conversation import ConversationMemory, ConversationSupervisor
from byok.run.crash import crash_point
from byok.run.deps import RunDeps
from byok.run.history import StartFailed
from byok.run.inbox_pump import pump_inbox
from byok.run.kv import KvFailure, KvLink
from byok.run.provider_call import ProviderCallFailed, call_model, model_settings, run_call_context
from byok.run.slot import RunSlot
from byok.run.start_point import begin, changed_under_run, ends_with_answer, runtime_message, start_point
from byok.run.token_details import token_details
from byok.run.tool_round import ExecRouter, ToolRound
from byok.store import RunExists, StaleRevision, StoreError
from byok.store.records import Head

log = logging.getLogger("byok.run")


class RunFailed(Exception):
    def __init__(self, error: ConnectError) -> None:
        super().__init__(str(error))
        self.error = error


class Run:
    def __init__(self, slot: RunSlot, start: RunStart, deps: RunDeps, sup: ConversationSupervisor) -> None:
        self.slot = slot
        self.start = start
        self.deps = deps
        self.memory: ConversationMemory = sup.memory
        self.kv = KvLink(slot.send, self.memory.acked)
        slot.on_reattach = self._resend_after_reconnect
        self.router = ExecRouter(slot.send, start.request_id)
        self.usage: Usage | None = None
        model = deps.config.model(start.model_id)
        assert model is not None, "caller checks the model before starting a run"
        self.model: ModelConfig = model
        provider = deps.config.provider(model.provider)
        assert provider is not None, "config validation guarantees the provider"
        self.provider: ProviderConfig = provider
        self.mode = mode_name(start.mode)
        self.assets = deps.prompts[self.mode]
        self.tool_specs = deps.tools.specs_by_mode.get(self.mode, ())
        self.head: Head | None = None
        self._row = "unwritten"  # "mine": the start point's first store trip wrote it; "foreign":
        # an earlier run owns this request id, so this one writes nothing
        self.prior_turns: tuple[bytes, ...] = ()
        self.details = agent.ConversationTokenDetails(max_tokens=self.model.context_tokens)

    # --- lifecycle ------------------------------------------------------------------
    async def run(self, scope: trio.CancelScope) -> None:
        """Run to one terminal state: success, error or canceled — written once, EndStream last."""
        st = self.start
        error: ConnectError | None = None
        ended_ok = False  # the ok end-stream is queued: the outcome the client gets is decided
        with scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump_inbox, self.slot, self.kv, self.router, scope)
                try:
                    await self._turn()
                    ended_ok = True
                except RunFailed as e:
                    error = e.error
                except StoreError as e:  # the machine's fault (disk full, read-only), not byok's
                    error = ConnectError("internal", f"byok's database failed: {e}")
                except Exception as e:  # a bug, not a peer error: still one clean terminal state
                    log.exception("run %s failed internally", st.request_id)
                    error = ConnectError("internal", f"internal error: {type(e).__name__}: {e}")
                nursery.cancel_scope.cancel()
        if ended_ok:
            # A cancel (or preemption, or grace expiry) that lands after this point is late: it
            # can only strike at the nursery's exit, and must not record another outcome.
            await self._finish("success")
        elif scope.cancelled_caught:
            self.router.abort_all()
            self.slot.close(end_stream_error(ConnectError("canceled", "run was cancelled")))
            await self._finish("canceled")
        elif error is not None:
            log.error("run %s ended with %s", st.request_id, error)
            self.router.abort_all()
            self.slot.close(end_stream_error(error))
            await self._finish("error", error)

    def _resend_after_reconnect(self) -> None:
        n = self.kv.resend_unacked()
        if n:
            log.info(
                "run %s: RunSSE reconnected, re-sent %d unanswered blob SET/GET(s)", self.start.request_id, n
            )

    async def _finish(self, status: str, error: ConnectError | None = None) -> None:
        """Record the terminal state. The client already has it; a database that cannot take it
        (disk full) costs the record, never the daemon: the row stays 'running' and the next
        start marks it interrupted."""
        with trio.CancelScope(shield=True):
            if self._row == "foreign":
                return
            try:
                await self._record_end(status, error)
            except StoreError as e:
                log.error("run %s: its end (%s) could not be recorded: %s", self.start.request_id, status, e)

    async def _record_end(self, status: str, error: ConnectError | None) -> None:
        if self._row == "unwritten":  # the run ended before its start point wrote the row
            st = self.start
            await self.deps.store.start_run(
                st.request_id, st.conversation_id, st.model_id, self.deps.wall_ms()
            )
        root_ids = list(self.memory.unsaved.items())
        await self.deps.store.finish_run(
            self.start.request_id,
            status,
            self.deps.wall_ms(),
            error_code=error.code if error else None,
            error_message=error.message if error else None,
            usage=self.usage,
            root_ids=root_ids,
        )
        self.memory.saved(root_ids)

    # --- the turn ----------------------------------------------------------------------
    async def _turn(self) -> None:
        try:
            turn, staged = await self._start_point()
        except StartFailed as e:
            raise RunFailed(e.error) from None
        settled: Checkpoint | None = None  # a round's checkpoint, published during the next call
        if staged is not None:
            # Resume of a staged round: run its tools again, without calling the provider again.
            turn, settled = await self._execute_round(turn, staged)
        elif self.start.action == "resume_action" and ends_with_answer(self._current_head().messages):
            # The client resumed from the turn-end staged checkpoint: the answer is committed,
            # only the final checkpoints are missing.
            await self._publish_final(turn)
            return
        while True:
            crash_point("provider_call_planned")
            result = await self._call_model(settled)
            self.usage = result.usage if self.usage is None else self.usage + result.usage
            self.details = token_details(
                result.usage,
                system_prompt=self.assets.system,
                tool_specs=self.tool_specs,
                request_context=self.start.request_context,
                context_tokens=self.model.context_tokens,
            )
            if result.message.thinking:
                turn = turn.with_step(thinking_step(result.message.thinking, result.thinking_duration_ms))
            if result.message.text:
                turn = turn.with_step(assistant_step(result.message.text))
            if result.reason == "stop":
                await self._publish_final(turn, result.message)
                return
            turn, settled = await self._tool_round(turn, result)

    async def _start_point(self) -> tuple[TurnRecord, Message | None]:
        """Load or import the history, move the head for an edit or a resume, append the run's
        runtime message(s) exactly once; return the turn to build and any staged round to re-run."""
        st = self.start
        wall_ms = self.deps.wall_ms
        runtime = runtime_message(self.assets, st, wall_ms()) if st.action == "user_message_action" else None
        try:
            begun = await begin(self.deps.store, st, runtime, wall_ms())
        except RunExists as e:
            self._row = "foreign"
            raise RunFailed(
                ConnectError("already_exists", f"request id already used by an earlier run: {e}")
            ) from None
        self._row = "mine"
        timeout_s = self.deps.config.server.kv_ack_timeout_s
        point = await start_point(
            self.deps.store,
            self.kv,
            self.memory,
            st,
            begun,
            runtime,
            wall_ms=wall_ms,
            timeout_s=timeout_s,
        )
        self.head, self.prior_turns = point.head, point.prior_turns
        if point.token_details is not None:
            self.details = point.token_details
        return point.turn, point.staged

    async def _tool_round(self, turn: TurnRecord, result: ModelCallResult) -> tuple[TurnRecord, Checkpoint]:
        assistant = attrs.evolve(result.message, tool_round_id=str(uuid.uuid4()))
        await self._recall_root_ids()
        # Built on the head before the commit (the assistant travels inline): its SETs go out
        # first, so the client ACKs them while SQLite commits the round.
        staged = self._checkpoint(self._current_head().messages, [assistant], turn)
        self.kv.offer(staged.blobs)
        await self._append([assistant])
        await self._put_blobs(staged.blobs)
        crash_point("blobs_acked")
        self.slot.send(encode.checkpoint(staged.state))
        return await self._execute_round(turn, assistant)

    async def _execute_round(self, turn: TurnRecord, assistant: Message) -> tuple[TurnRecord, Checkpoint]:
        """Run the round's tools and commit their results; returns the turn and the round's
        settled checkpoint, which the next call publishes (``_call_model``)."""
        calls = assistant.tool_calls
        registry = self.deps.tools.registry
        steps: dict[str, Blob] = {}  # call id -> its step (a known tool's card)
        published_ids: set[str] = set()
        call_ids = {c.call_id for c in calls}
        settled_turn: list[TurnRecord] = []

        async def commit(message: Message) -> None:
            await self._append([message])
            crash_point("tool_result_committed")

        def published(message: Message, outcome: ToolOutcome) -> None:
            # The settled checkpoint will reference this result's root and (for a known tool) its
            # step: SET them now, so their ACKs come back while the result is committed and other
            # tools run. With the last result goes the turn's structure, so the settled checkpoint
            # waits for no ACK round trip of its own (the client answers SETs one at a time).
            # Blobs are content-addressed: a SET of a result whose commit then fails leaves the
            # client an unreferenced blob, nothing more.
            blobs = [self.memory.root_of(message, with_data=True)]
            if message.tool_name in registry:
                step = steps[message.tool_call_id] = Blob.of(encode.tool_step(outcome.ui_bytes()))
                blobs.append(step)
            published_ids.add(message.tool_call_id)
            if len(published_ids) == len(call_ids):
                # The round's steps in the model's call order (the results came in completion
                # order); a call without a step (an unknown tool) adds none.
                settled_turn.append(turn.with_steps([steps[c.call_id] for c in calls if c.call_id in steps]))
                blobs.append(settled_turn[0].structure())
            self.kv.offer(blobs)

        def assistant_root_out() -> None:
            # The settled checkpoint lists the assistant as a root (the staged one held it
            # inline): its SET and ACK go while the tools run.
            self.kv.offer([self.memory.root_of(assistant, with_data=True)])

        await ToolRound(
            router=self.router,
            registry=registry,
            send=self.slot.send,
            flushed=self.slot.flushed,
            commit=commit,
            published=published,
            dispatched=assistant_root_out,
            round_id=assistant.tool_round_id,
            model_call_id=assistant.model_call_id,
        ).run(calls)
        if settled_turn:  # ToolRound.run returns once every call is published
            turn = settled_turn[0]
        await self._recall_root_ids()
        return turn, self._checkpoint(self._current_head().messages, [], turn)

    async def _publish_settled(self, settled: Checkpoint, out: trio.Event) -> None:
        await self._put_blobs(settled.blobs)
        self.slot.send(encode.checkpoint(settled.state))
        crash_point("settled_checkpoint_sent")
        out.set()

    async def _publish_final(self, turn: TurnRecord, answer: Message | None = None) -> None:
        """The turn's end: ``answer`` is committed first (None: it already is, a resume)."""
        await self._recall_root_ids()
        messages = self._current_head().messages
        if answer is not None:
            messages = (*messages, answer)
        staged = self._checkpoint(messages[:-1], [messages[-1]], turn)
        settled = self._checkpoint(messages, [], turn)
        if answer is not None:
            # The final checkpoints' SETs go out before the answer's commit: the client ACKs
            # them while SQLite writes (a checkpoint depends on the messages' content only).
            self.kv.offer([*staged.blobs, *settled.blobs])
            await self._append([answer])
        head = self._current_head()
        await self._put_blobs([*staged.blobs, *settled.blobs])
        self.memory.drop_acked_roots()  # an idle conversation keeps root ids, not their bytes
        assert settled.turn_id is not None
        await self.deps.store.save_turns(
            self.start.conversation_id, head.revision_id, (*self.prior_turns, settled.turn_id)
        )
        self.slot.send(encode.turn_ended(self.usage) if self.usage else encode.turn_ended_empty())
        crash_point("turn_ended_sent")
        self.slot.send(encode.checkpoint(staged.state))
        self.slot.send(encode.checkpoint(settled.state))
        self.slot.send(encode.checkpoint(settled.state))
        self.slot.close(end_stream_ok())

    # --- pieces -------------------------------------------------------------------------
    def _current_head(self) -> Head:
        assert self.head is not None
        return self.head

    def _checkpoint(
        self, stable: tuple[Message, ...], pending: list[Message], turn: TurnRecord
    ) -> Checkpoint:
        return build_checkpoint(
            system_prompt=self.assets.system,
            stable=stable,
            pending=pending,
            prior_turns=self.prior_turns,
            turn=turn,
            token_details=self.details,
            mode=self.start.mode,
            root_of=self.memory.root_of,
            roots=self.memory.root_list,
        )

    async def _put_blobs(self, blobs: list[Blob] | tuple[Blob, ...]) -> None:
        try:
            await self.kv.put(blobs, timeout_s=self.deps.config.server.kv_ack_timeout_s)
        except KvFailure as e:
            raise RunFailed(ConnectError("internal", f"checkpoint not published: {e}")) from None

    async def _recall_root_ids(self) -> None:
        """Before a checkpoint lists every root: after a restart, read the saved root ids back
        instead of encoding thousands of messages again."""
        head = self._current_head()
        if self.memory.needs_recall(head.messages):
            self.memory.recall(await self.deps.store.root_ids_at(head.revision_id))

    async def _append(self, messages: list[Message]) -> None:
        head = self._current_head()
        try:
            self.head = await self.deps.store.append(
                self.start.conversation_id, head.version, messages, self.deps.wall_ms()
            )
        except StaleRevision as e:
            raise RunFailed(changed_under_run(e)) from None

    async def _call_model(self, settled: Checkpoint | None) -> ModelCallResult:
        """The next provider call. With ``settled``, the last round's checkpoint is published
        meanwhile: the request goes out while the client answers the checkpoint's blob SETs, one
        round trip each, and the call's output waits until the checkpoint is queued, as the
        settled checkpoint precedes the next model interaction. A failed call still publishes it
        (its results are committed); a failed publish ends the call."""
        if settled is None:
            return await self._call_provider(None)
        out = trio.Event()
        failed: RunFailed | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._publish_settled, settled, out)
                try:
                    result = await self._call_provider(out.wait)
                except RunFailed as e:
                    failed = e
        except BaseExceptionGroup as group:
            # The failure raised as itself, as when the two were sequential. A cancellation that
            # came with it needs no carrying: the run's cancelled scope raises it again.
            failure = first_except(group, trio.Cancelled)
            if failure is None:
                raise
            raise failure from None
        if failed is not None:
            raise failed
        return result

    async def _call_provider(self, before_output: Callable[[], Awaitable[None]] | None) -> ModelCallResult:
        try:
            api_key = self.provider.api_key()
        except ConfigError as e:  # api_key_env unset where the daemon runs (a service's own env)
            raise RunFailed(
                ConnectError("failed_precondition", f"no API key for provider {self.provider.id!r}: {e}")
            ) from None
        template = ModelRequest(
            system=self.assets.system,
            tools=self.tool_specs,
            history=(),
            settings=model_settings(self.model, self.provider, self.start.conversation_id),
        )
        request = await self.deps.renders.request(
            self.deps.store,
            self.start.conversation_id,
            self._current_head().messages,
            self.provider.kind,
            template,
        )
        ctx = run_call_context(
            request_id=self.start.request_id,
            conversation_id=self.start.conversation_id,
            provider=self.provider,
            model=self.model,
            api_key=api_key,
            deps=self.deps,
            slot=self.slot,
            before_output=before_output,
        )
        try:
            with self.deps.activity.provider_call():  # the store is idle meanwhile (upkeep.py)
                return await call_model(ctx, request)
        except ProviderCallFailed as e:
            raise RunFailed(e.error) from None
