"""The byok ASGI app: the two agent RPCs, health, and everything else streamed upstream.

The two RPCs' handlers live in bidi_append.py and run_stream.py; App routes, owns the run
registry, and starts, tracks and shuts down the runs."""

from __future__ import annotations

import logging
from typing import Any

import trio

from byok.config import Config
from byok.cursor.request import RunRequestError, RunStart, parse_run_request
from byok.http import request_guard
from byok.http.asgi import ClientGone, Receive, Scope, Send, respond_json
from byok.http.bidi_append import BidiAppends
from byok.http.connect_envelope import ConnectError, end_stream_error
from byok.http.forwarder import refused_target
from byok.http.model_list import ModelListRoutes
from byok.http.offline import OfflineAnswers, UpstreamHealth
from byok.http.run_stream import RunStreams
from byok.pb.agent import v1 as agent
from byok.run.conversation import ActiveRun, Supervisors
from byok.run.deps import RunDeps
from byok.run.runner import Run
from byok.run.slot import RunRegistry, RunSlot

log = logging.getLogger("byok.http")

RUN_SSE = "/agent.v1.AgentService/RunSSE"
RUN_BIDI = "/agent.v1.AgentService/Run"
BIDI_APPEND = "/aiserver.v1.BidiService/BidiAppend"
HEALTHZ = "/byok/healthz"
# A finished run's slot lingers so late appends (ACKs, heartbeats) are dropped idempotently.
SLOT_LINGER_S = 120.0


class App:
    def __init__(
        self,
        *,
        config: Config,
        deps: RunDeps,
        nursery: trio.Nursery,
        forward: Any,
        model_list: ModelListRoutes | None = None,
        offline: OfflineAnswers | None = None,
        health: UpstreamHealth | None = None,
    ) -> None:
        self.config = config
        self.model_list = model_list
        self.offline = offline
        self.health = health
        self.deps = deps
        self.nursery = nursery
        self.forward = forward
        self.registry = RunRegistry()
        self.supervisors = Supervisors()
        self.accepting = True
        self.appends = BidiAppends(
            config=config,
            registry=self.registry,
            forward=forward,
            start_run=self._start_run,
            refuse_run=self._refuse_run,
        )
        self.run_streams = RunStreams(
            config=config,
            registry=self.registry,
            forward=forward,
            nursery=nursery,
            append=self.appends.append,
        )
        self.active: set[ActiveRun] = set()
        self._idle = trio.Event()
        self._idle.set()
        # What upkeep between runs and the call log wait for (run/upkeep.py).
        # One RunActivity: the runs' starts and ends here, their provider calls in the runner.
        self.activity = deps.activity

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if await refused_target(scope, send):  # before routing: no handler sees a non-path target
            return
        if (refused := request_guard.refusal(scope)) is not None:  # what a web page could send
            await request_guard.refuse(scope, send, refused)
            return
        send = request_guard.without_cors(send)
        path = scope["path"]
        method = scope["method"]
        try:
            if path == RUN_SSE and method == "POST":
                await self.run_streams.run_sse(scope, receive, send)
            elif path == RUN_BIDI and method == "POST":
                await self.run_streams.run_bidi(scope, receive, send)
            elif path == BIDI_APPEND and method == "POST":
                await self.appends.handle(scope, receive, send)
            elif path == HEALTHZ and method == "GET":
                await respond_json(send, 200, {"status": "ok", "models": [m.id for m in self.config.models]})
            elif self.model_list is not None and await self.model_list.handle(scope, receive, send):
                pass
            elif self.offline is not None and self.offline.matches(scope) and not await self._upstream_ok():
                await self.offline.handle(scope, receive, send, upstream_ok=False)
            else:
                await self.forward(scope, receive, send)
        except ClientGone:
            return

    async def _upstream_ok(self) -> bool:
        return self.health is None or await self.health.reachable()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            event = await receive()
            if event["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif event["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    # --- Runs -------------------------------------------------------------------------
    def _start_run(self, slot: RunSlot, req: agent.AgentRunRequest) -> ConnectError | None:
        try:
            if not self.accepting:
                raise RunRequestError("unavailable", "byok is shutting down")
            start = parse_run_request(slot.request_id, req)
            if self.config.model(start.model_id) is None:
                raise RunRequestError("not_found", f"model {start.model_id!r} is not configured in byok")
        except RunRequestError as e:
            err = ConnectError(e.code, e.message)  # type: ignore[arg-type]
            self._refuse_run(slot, err)
            return err
        slot.run_started = True
        self.nursery.start_soon(self._run_task, slot, start)
        return None

    def _refuse_run(self, slot: RunSlot, err: ConnectError) -> None:
        """A run that will not start: its RunSSE, open or still to come, ends with ``err``."""
        slot.close(end_stream_error(err))
        self.nursery.start_soon(self._linger, slot)

    async def _run_task(self, slot: RunSlot, start: RunStart) -> None:
        sup = self.supervisors.get(start.conversation_id)
        me = ActiveRun(start.request_id, trio.CancelScope(), trio.Event())
        old, sup.active = sup.active, me
        slot.cancel_run = me.scope.cancel
        self.active.add(me)
        self.activity.started()
        if self._idle.is_set():
            self._idle = trio.Event()
        try:
            if old is not None:
                log.info("run %s preempts run %s", start.request_id, old.request_id)
                old.scope.cancel()
                await old.done.wait()
            await Run(slot, start, self.deps, sup).run(me.scope)
        finally:
            me.done.set()
            slot.finished.set()
            # The slot lingers for a reconnecting RunSSE: it must not keep the finished run (its
            # history, its turn's cards) alive through these hooks.
            slot.cancel_run = slot.on_reattach = None
            if sup.active is me:
                sup.active = None
            self.active.discard(me)
            self.activity.finished()
            if not self.active:
                self._idle.set()
            self.nursery.start_soon(self._linger, slot)

    async def shutdown(self, grace_s: float) -> None:
        """Stop accepting runs, let active ones finish within ``grace_s``, then cancel the rest."""
        self.accepting = False
        with trio.move_on_after(grace_s):
            await self._idle.wait()
        for run in list(self.active):
            log.info("shutdown: cancelling run %s", run.request_id)
            run.scope.cancel()
        await self._idle.wait()

    async def _linger(self, slot: RunSlot) -> None:
        await trio.sleep(SLOT_LINGER_S)
        self.registry.remove(slot.request_id, slot)
