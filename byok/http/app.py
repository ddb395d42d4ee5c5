"""The byok ASGI app: the agent RPCs, health, the console (``/byok/``), and everything else
streamed upstream.

The agent RPCs' handlers live in bidi_append.py, run_stream.py (RunSSE, Run) and run_poll.py;
App routes, and hands decoded run requests to the run service (run/service.py), which owns the
runs' lifecycle."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import trio

from byok.config import Config
from byok.cursor.request import parse_run_request
from byok.http import request_guard
from byok.http.asgi import ClientGone, Receive, Scope, Send, respond_json
from byok.http.bidi_append import BidiAppends
from byok.http.connect_envelope import ConnectError
from byok.http.console_api import ControlApi
from byok.http.console_http import is_console_path
from byok.http.forwarder import refused_target
from byok.http.model_list import ModelListRoutes
from byok.http.offline import OfflineAnswers, UpstreamHealth
from byok.http.outcomes import failed
from byok.http.run_poll import RunPolls
from byok.http.run_stream import RunStreams
from byok.http.status_route import STATUS, respond_status
from byok.pb.agent import v1 as agent
from byok.run.deps import RunDeps
from byok.run.service import RunService
from byok.run.slot import RunSlot

log = logging.getLogger("byok.http")

RUN_SSE = "/agent.v1.AgentService/RunSSE"
RUN_POLL = "/agent.v1.AgentService/RunPoll"
RUN_BIDI = "/agent.v1.AgentService/Run"
BIDI_APPEND = "/aiserver.v1.BidiService/BidiAppend"
HEALTHZ = "/byok/healthz"


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
        console: ControlApi | None = None,
    ) -> None:
        self.config = config
        self.model_list = model_list
        self.offline = offline
        self.health = health
        self.forward = forward
        self.deps = deps
        self.console = console
        self.service = RunService(config=config, deps=deps, nursery=nursery)
        self.started_ms = deps.wall_ms()
        self.registry = self.service.registry
        self.supervisors = self.service.supervisors
        self.activity = self.service.activity
        self.appends = BidiAppends(
            config=config,
            registry=self.registry,
            forward=forward,
            start_run=self._start_run,
            refuse_run=self._refuse_run,
            catalog=deps.catalog,
        )
        self.run_streams = RunStreams(
            config=config,
            registry=self.registry,
            forward=forward,
            service=self.service,
            append=self.appends.append,
        )
        self.run_polls = RunPolls(self.run_streams)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if await refused_target(scope, send):  # before routing: no handler sees a non-path target
            return
        path = scope["path"]
        if self.console is not None and is_console_path(path):
            # The console's pages and API have rules of their own (console_http.py).
            with contextlib.suppress(ClientGone):
                await self.console(scope, receive, request_guard.without_cors(send))
            return
        if (refused := request_guard.refusal(scope)) is not None:  # what a web page could send
            await request_guard.refuse(scope, send, refused)
            return
        send = request_guard.without_cors(send)
        method = scope["method"]
        try:
            if path == RUN_SSE and method == "POST":
                await self.run_streams.run_sse(scope, receive, send)
            elif path == RUN_POLL and method == "POST":
                await self.run_polls.run_poll(scope, receive, send)
            elif path == RUN_BIDI and method == "POST":
                await self.run_streams.run_bidi(scope, receive, send)
            elif path == BIDI_APPEND and method == "POST":
                await self.appends.handle(scope, receive, send)
            elif path == HEALTHZ and method == "GET":
                served = [m.id for m in self.deps.catalog.enabled_models()]
                await respond_json(send, 200, {"status": "ok", "models": served})
            elif path == STATUS and method == "GET":
                await respond_status(scope, send, self.config, self.service, self.health, self.started_ms)
            elif self.model_list is not None and await self.model_list.handle(scope, receive, send):
                pass
            elif self.offline is not None and self.offline.matches(scope) and not await self._upstream_ok():
                await self.offline.handle(scope, receive, send, upstream_ok=False)
            else:
                await self.forward(scope, receive, send)
        except ClientGone:
            return

    def reconfigure(self, config: Config) -> None:
        """Serve from now on with ``config`` (a reload): routing, model lists and new runs use
        it; a run already going keeps the config it started with."""
        self.config = self.appends.config = self.run_streams.config = config
        self.service.reconfigure(config)
        self.deps.catalog.use_file(config)  # the console's entries stay; the file's are the new ones
        if self.console is not None:
            self.console.config = config
        if self.model_list is not None:
            self.model_list.reconfigure(config)
        if self.offline is not None:
            self.offline.reconfigure(config)

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
        parent = slot.parent or ("", "")
        refused = self.service.start(slot, lambda: parse_run_request(slot.request_id, req, parent))
        return None if refused is None else ConnectError(refused.code, refused.message)  # type: ignore[arg-type]

    def _refuse_run(self, slot: RunSlot, err: ConnectError) -> None:
        """A run that will not start: its RunSSE, open or still to come, ends with ``err``."""
        self.service.refuse(slot, failed(err))

    async def shutdown(self, grace_s: float) -> None:
        await self.service.shutdown(grace_s)
