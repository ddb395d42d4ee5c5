"""One agent Run: its start point, then the turn machine driven to one outcome, written once.

What the turn decides is loop/turn.py's (the table); run/driver.py feeds it and hands its
commands to run/turn_effects.py. This module owns the run's nursery: the inbox pump, the start
point, and every effect's task live in it, and the run's cancel scope (preemption, a client's
cancel, the reconnect grace running out, shutdown) ends them all.
"""

from __future__ import annotations

import logging

import trio

from byok.cursor.client_messages import ClientMessage
from byok.cursor.exec_router import ExecRouter
from byok.cursor.request import RunStart
from byok.cursor.start_plan import first_step
from byok.cursor.token_details import unmeasured
from byok.cursor.tools.base import ToolOutcome
from byok.cursor.tools.env import ToolEnv
from byok.cursor.tools.mcp_dynamic import run_tools
from byok.cursor.tools.modes import ModeSwitch
from byok.cursor.tools.subagent_tools import UPDATE_CURRENT_STEP
from byok.loop import compaction
from byok.loop.turn_values import (
    Begin,
    Cancel,
    Canceled,
    Failed,
    FailedError,
    Fault,
    Input,
    Outcome,
    Succeeded,
)
from byok.run.context import RunContext
from byok.run.conversation import ConversationSupervisor
from byok.run.deps import RunDeps
from byok.run.driver import Driver
from byok.run.end_line import end_level, end_line
from byok.run.inbox_pump import pump_inbox
from byok.run.kv import KvLink
from byok.run.run_log import RunLog, run_log_path
from byok.run.slot import RunSlot
from byok.run.start_point import begin, runtime_message, start_point
from byok.run.tool_work import perform
from byok.run.turn_effects import TurnEffects, tool_done, tool_note
from byok.run.user_images import user_images
from byok.store import RunExists, StoreError

log = logging.getLogger("byok.run")


class Run:
    def __init__(self, slot: RunSlot, start: RunStart, deps: RunDeps, sup: ConversationSupervisor) -> None:
        # The model, or an alias's targets, as the catalog has them now: a console change applies
        # from the next run on, never in the middle of one.
        targets = deps.catalog.targets(start.model_id)
        assert targets, "the run service checks the model before starting a run"
        alias = deps.catalog.alias(start.model_id)
        if alias is not None:  # the first target not cooling down (run/failover.py)
            targets = deps.cooldowns.order(targets, trio.current_time())
        model, provider = targets[0].model, targets[0].provider
        mode = start.mode_dir
        registry, dynamic = run_tools(start, deps.tools.registry)
        self.driver: Driver | None = None
        memory = sup.memory
        self.ctx = RunContext(
            start=start,
            deps=deps,
            slot=slot,
            memory=memory,
            kv=KvLink(slot.send, memory.acked),
            router=ExecRouter(
                slot.send, start.request_id, self._tool_done, on_note=self._tool_note, on_work=self._tool_work
            ),
            model=model,
            provider=provider,
            mode=mode,
            assets=deps.prompts[mode],
            tool_specs=dynamic.offered(
                tuple(
                    spec
                    for spec in deps.tools.specs_by_mode.get(mode, ())
                    if not (start.no_progress_tool and spec.name == UPDATE_CURRENT_STEP)
                )
            ),
            details=unmeasured(model.context_tokens),
            tool_env=ToolEnv(
                request_id=start.request_id,
                conversation_id=start.conversation_id,
                root_conversation_id=start.conversation_group_id or start.conversation_id,
                mode=mode,
                model_id=start.model_id,
                subagent_model_overrides=start.subagent_model_overrides,
                request_context=start.request_context,
                backends=deps.tools.backends,
                todos=memory.todos,
                vision=model.vision,
            ),
            agent_mode=start.mode,
            registry=registry,
            dynamic=dynamic,
            alias=alias,
            targets=targets,
        )
        slot.on_reattach = self._resend_after_reconnect
        # "mine": the start point's first store trip wrote the run's row; "foreign": an earlier
        # run owns this request id, so this one writes nothing.
        self._row = "unwritten"
        self.effects: TurnEffects | None = None
        self.log: RunLog | None = None  # the run's input log, from its Begin on (record_runs)
        self._started_at = 0.0  # trio time run() began

    def _open_log(self) -> None:
        """From here on every input, client message and frame is logged (run/run_log.py)."""
        c = self.ctx
        assert self.driver is not None and self.effects is not None
        self.log = log = RunLog(run_log_path(c.deps.config.server.data_dir, c.start.request_id))
        log.start(c, c.kv.next_id)
        self.driver.record = log.input
        self.driver.on_flushed = log.flushed
        self.effects.on_request = log.request
        self.effects.on_retarget = lambda: log.target(self.ctx)
        c.slot.tap = log.frames.add

    def _tool_done(self, call_id: str, outcome: ToolOutcome) -> None:
        assert self.driver is not None
        self.driver.submit(tool_done(call_id, outcome), derived=True)

    def _tool_note(self, call_id: str, note: object) -> None:
        assert self.driver is not None
        deps = self.ctx.deps
        if self.log is not None and isinstance(note, ModeSwitch):  # a replay needs the new mode's assets
            self.log.mode(
                note.mode, deps.prompts[note.mode].system, deps.tools.specs_by_mode.get(note.mode, ())
            )
        self.driver.submit(tool_note(note, self.ctx), derived=True)

    def _tool_work(self, call_id: str, work: object) -> None:
        assert self.effects is not None
        self.effects.nursery.start_soon(self._perform_work, call_id, work)

    async def _perform_work(self, call_id: str, work: object) -> None:
        """A tool's server work, as a task of the run: its result goes to the log, then the tool."""
        assert self.driver is not None
        result = await perform(work, self.ctx.deps.config, self.ctx.deps.http)  # type: ignore[arg-type]
        if self.log is not None:
            self.log.work(call_id, result)
        self.ctx.router.work_done(call_id, result)
        await self.driver.drain()

    # --- lifecycle ------------------------------------------------------------------------
    async def run(self, scope: trio.CancelScope) -> None:
        """Run to one terminal state: success, error or canceled — written once, EndStream last."""
        c = self.ctx
        self._started_at = trio.current_time()
        with scope:
            try:
                async with trio.open_nursery() as nursery:
                    self.effects = effects = TurnEffects(c, nursery)
                    self.driver = effects.driver = Driver(effects)
                    log_client = self._log_client if c.deps.config.logging.record_runs else None
                    nursery.start_soon(pump_inbox, c.slot, c.kv, c.router, self.driver, log_client)
                    nursery.start_soon(self._start)
                    await effects.ended.wait()
                    nursery.cancel_scope.cancel()
            except Exception as e:  # a bug, not a peer error: still one clean terminal state
                log.exception("run %s failed internally", c.start.request_id)
                if self.driver is not None:
                    self.driver.end_now(Fault(Failed("internal", f"internal error: {type(e).__name__}: {e}")))
        if self.driver is not None and not self.driver.ended:
            # Cancelled from outside (preemption, the reconnect grace, shutdown). A cancel that
            # lands after the end was decided records nothing else: the client has that end.
            self.driver.end_now(Cancel())
        outcome = c.outcome if c.outcome is not None else Canceled()
        await self._finish(outcome)

    def _log_client(self, msg: ClientMessage) -> None:
        if self.log is not None:
            self.log.client(bytes(msg))

    def _resend_after_reconnect(self) -> None:
        if self.log is not None:
            self.log.reattach()
        n = self.ctx.kv.resend_unacked()
        if n:
            log.info(
                "run %s: RunSSE reconnected, re-sent %d unanswered blob SET/GET(s)",
                self.ctx.start.request_id,
                n,
            )

    async def _finish(self, outcome: Outcome) -> None:
        """Record the terminal state. The client already has it; a database that cannot take it
        (disk full) costs the record, never the daemon: the row stays 'running' and the next
        start marks it interrupted."""
        status = (
            "success"
            if isinstance(outcome, Succeeded)
            else "canceled"
            if isinstance(outcome, Canceled)
            else "error"
        )
        self._log_end(outcome)
        with trio.CancelScope(shield=True):
            if self._row == "foreign":
                return
            try:
                await self._record_end(status, outcome if isinstance(outcome, Failed) else None)
            except StoreError as e:
                log.error(
                    "run %s: its end (%s) could not be recorded: %s", self.ctx.start.request_id, status, e
                )
        if self.log is not None:
            self.log.end(outcome)
        # The slot lingers for a reconnecting RunSSE: it must not keep the finished run (its
        # history, its turn's cards) alive through these hooks.
        self.ctx.slot.on_reattach = self.ctx.slot.tap = None

    def _log_end(self, outcome: Outcome) -> None:
        c, now = self.ctx, trio.current_time()
        st, usage = c.start, self.driver.state.usage if self.driver is not None else None
        ttft = None if c.first_output_at is None else c.first_output_at - self._started_at
        line = end_line(
            st.request_id, st.conversation_id, st.model_id, outcome, usage, ttft, now - self._started_at
        )
        log.log(end_level(outcome), "%s", line)

    async def _record_end(self, status: str, error: Failed | None) -> None:
        c, store = self.ctx, self.ctx.deps.store
        st = c.start
        if self._row == "unwritten":  # the run ended before its start point wrote the row
            await store.start_run(st.request_id, st.conversation_id, st.model_id, c.deps.wall_ms())
        root_ids = list(c.memory.unsaved.items())
        usage = self.driver.state.usage if self.driver is not None else None
        await store.finish_run(
            st.request_id,
            status,
            c.deps.wall_ms(),
            error_code=error.code if error else None,
            error_message=error.message if error else None,
            usage=usage,
            root_ids=root_ids,
        )
        c.memory.saved(root_ids)

    # --- the start point ------------------------------------------------------------------
    async def _start(self) -> None:
        assert self.driver is not None
        try:
            inp = await self._start_point()
            # A run that ended before its Begin (a cancel during the start point) has nothing to replay.
            if isinstance(inp, Begin) and self.ctx.deps.config.logging.record_runs and not self.driver.ended:
                self._open_log()
        except FailedError as e:
            inp = Fault(e.failure)
        except StoreError as e:  # the machine's fault (disk full, read-only), not byok's
            inp = Fault(Failed("internal", f"byok's database failed: {e}"))
        except Exception as e:
            log.exception("run %s failed internally", self.ctx.start.request_id)
            inp = Fault(Failed("internal", f"internal error: {type(e).__name__}: {e}"))
        await self.driver.feed(inp)

    async def _start_point(self) -> Input:
        """Load or import the history, move the head for an edit or a resume, append the run's
        runtime message(s) exactly once; the machine's Begin says what the run does first."""
        c = self.ctx
        st, wall_ms = c.start, c.deps.wall_ms
        runtime = None
        if st.user_turn:
            images = await user_images(c.kv, st, c.deps.config.server.kv_ack_timeout_s)
            runtime = runtime_message(c.assets, st, wall_ms(), images)
        try:
            begun = await begin(c.deps.store, st, runtime, wall_ms())
        except RunExists as e:
            self._row = "foreign"
            return Fault(Failed("already_exists", f"request id already used by an earlier run: {e}"))
        self._row = "mine"
        point = await start_point(
            c.deps.store,
            c.kv,
            c.memory,
            st,
            begun,
            runtime,
            wall_ms=wall_ms,
            timeout_s=c.deps.config.server.kv_ack_timeout_s,
            runtime_template=c.assets.runtime_template,
        )
        c.head, c.prior_turns, c.turn = point.head, point.prior_turns, point.turn
        if point.token_details is not None:
            c.details = point.token_details
        if c.memory.needs_recall(c.head.messages):
            # After a restart, the saved root ids instead of encoding thousands of messages again
            # (once per conversation: later checkpoints of the run need no store trip).
            c.memory.recall(await c.deps.store.root_ids_at(c.head.revision_id))
        start = first_step(st.action, point.staged, c.head.messages, repeated=point.repeated)
        if start == "compact" and not compaction.kept_tail(c.head.messages):
            # Nothing, or only an unanswered message (kept as it is after a summary): a summary
            # of nothing would head the history and tell the model nothing.
            return Fault(Failed("failed_precondition", "the conversation has no history to summarize"))
        if start == "final" and not c.head.messages:
            return Fault(Failed("failed_precondition", f"{st.action}: the conversation has no history"))
        offered = frozenset(s.name for s in c.tool_specs)
        known = frozenset(c.registry)
        limit = compaction.context_limit(c.model.context_tokens, c.model.max_output_tokens)
        # The first request: the last one the client measured, and what this run appended.
        estimate = c.details.used_tokens + (compaction.tokens_of(runtime.text) if runtime is not None else 0)
        return Begin(
            request_id=st.request_id,
            mode=c.mode,
            start=start,
            offered=offered,
            known=known,
            staged=point.staged,
            context_limit=limit,
            estimate=estimate,
            summaries=compaction.summary_count(c.head.messages),
            summarizable=compaction.worth_compacting(c.head.messages, limit),
        )
