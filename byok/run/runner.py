"""One agent Run: compile, call the provider, commit, publish checkpoints, end the stream.

This is the only place a turn touches I/O. Everything it decides comes from the sans-IO
layers: cursor/ (request, prompting, checkpoint graph, encoding), loop/ (model call
assembly), model/ (projection) and providers/ (request bytes, stream parsing).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable

import attrs
import betterproto2
import httpx
import trio

from byok.config import Config, ModelConfig, ProviderConfig
from byok.cursor import encode
from byok.cursor.checkpoint import (
    Blob,
    TurnRecord,
    assistant_step,
    build_checkpoint,
    root_blob,
    thinking_step,
)
from byok.cursor.prompting import ModeAssets, build_runtime_message, mode_name, request_context_sections
from byok.cursor.request import RunStart
from byok.cursor.token_breakdown import BreakdownInput, breakdown, to_proto
from byok.http.connect_envelope import ConnectError, end_stream_error, end_stream_ok, provider_error_details
from byok.loop.model_call import ModelCall, ModelCallResult, ModelProtocolError
from byok.model import events as ev
from byok.model.messages import Message, canonical_json
from byok.model.projection import project
from byok.model.request import ModelRequest, ModelSettings
from byok.model.usage import Usage
from byok.pb.agent import v1 as agent
from byok.providers import openai_chat
from byok.providers.runner import CallStats, Endpoint, stream_call
from byok.run.conversation import ConversationMemory, ConversationSupervisor
from byok.run.kv import KvFailure, KvLink
from byok.run.slot import RunSlot
from byok.store import AsyncStore, LlmCallRecord, StaleRevision
from byok.store.records import Head

log = logging.getLogger("byok.run")


@attrs.frozen
class RunDeps:
    config: Config
    store: AsyncStore
    prompts: dict[str, ModeAssets]
    http: httpx.AsyncClient
    wall_ms: Callable[[], int] = attrs.field(default=lambda: int(time.time() * 1000))


def iso_utc(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="seconds")


class RunFailed(Exception):
    def __init__(self, error: ConnectError) -> None:
        super().__init__(str(error))
        self.error = error


class Run:
    def __init__(self, slot: RunSlot, start: RunStart, deps: RunDeps, sup: ConversationSupervisor) -> None:
        self.slot = slot
        self.start = start
        self.deps = deps
        self.sup = sup
        self.memory: ConversationMemory = sup.memory
        self.kv = KvLink(slot.send, self.memory.acked)
        self.usage: Usage | None = None
        model = deps.config.model(start.model_id)
        assert model is not None, "caller checks the model before starting a run"
        self.model: ModelConfig = model
        provider = deps.config.provider(model.provider)
        assert provider is not None, "config validation guarantees the provider"
        self.provider: ProviderConfig = provider
        self.assets = deps.prompts[mode_name(start.mode)]

    # --- lifecycle ------------------------------------------------------------------
    async def run(self, scope: trio.CancelScope) -> None:
        """Run to one terminal state: success, error or canceled — written once, EndStream last."""
        st = self.start
        await self.deps.store.start_run(st.request_id, st.conversation_id, st.model_id, self.deps.wall_ms())
        error: ConnectError | None = None
        with scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump_inbox, scope)
                try:
                    await self._turn()
                except RunFailed as e:
                    error = e.error
                except Exception as e:  # a bug, not a peer error: still one clean terminal state
                    log.exception("run %s failed internally", st.request_id)
                    error = ConnectError("internal", f"internal error: {type(e).__name__}: {e}")
                nursery.cancel_scope.cancel()
        if scope.cancelled_caught:
            self.slot.close(end_stream_error(ConnectError("canceled", "run was cancelled")))
            await self._finish("canceled")
        elif error is not None:
            log.error("run %s ended with %s", st.request_id, error)
            self.slot.close(end_stream_error(error))
            await self._finish("error", error)
        else:
            await self._finish("success")

    async def _finish(self, status: str, error: ConnectError | None = None) -> None:
        with trio.CancelScope(shield=True):
            await self.deps.store.finish_run(
                self.start.request_id,
                status,
                self.deps.wall_ms(),
                error_code=error.code if error else None,
                error_message=error.message if error else None,
                usage=self.usage,
            )

    async def _pump_inbox(self, run_scope: trio.CancelScope) -> None:
        async for msg in self.slot.inbox:
            name, value = betterproto2.which_one_of(msg, "message")
            if name == "client_heartbeat":
                self.slot.send(encode.heartbeat())
            elif name == "kv_client_message":
                if not self.kv.on_client(value):
                    log.info("run %s: ignoring late/unknown kv answer id=%s", self.start.request_id, value.id)
            elif name == "conversation_action" and value.cancel_action is not None:
                log.info("run %s: cancelled by client", self.start.request_id)
                run_scope.cancel()
            else:
                log.warning("run %s: ignoring client message %s", self.start.request_id, name)

    # --- one turn ------------------------------------------------------------------
    async def _turn(self) -> None:
        st = self.start
        store = self.deps.store
        head = await store.head(st.conversation_id)
        event_id = f"run-request:{st.request_id}"
        if await store.runtime_event_message(st.conversation_id, event_id) is None:
            assert st.user_message is not None
            runtime = build_runtime_message(
                self.assets.runtime_template,
                request_id=st.request_id,
                user_message=st.user_message,
                request_context=st.request_context,
                now_iso=iso_utc(self.deps.wall_ms()),
                time_zone=None,
            )
            head = await self._append(head, [runtime], event_id=event_id, input_id=st.user_message.message_id)

        result = await self._call_model(head)
        self.usage = result.usage if self.usage is None else self.usage + result.usage
        head = await self._append(head, [result.message])

        turn = TurnRecord(st.request_id, bytes(st.user_message or agent.UserMessage()))
        if result.message.thinking:
            turn = turn.with_step(thinking_step(result.message.thinking, result.thinking_duration_ms))
        if result.message.text:
            turn = turn.with_step(assistant_step(result.message.text))
        details = self._token_details(result.usage)
        common = {
            "system_prompt": self.assets.system,
            "prior_turns": self.memory.turns,
            "turn": turn,
            "token_details": details,
            "mode": st.mode,
            "root_of": self._root_of,
        }
        staged = build_checkpoint(stable=head.messages[:-1], pending=[result.message], **common)
        settled = build_checkpoint(stable=head.messages, **common)
        try:
            await self.kv.put(
                [*staged.blobs, *settled.blobs], timeout_s=self.deps.config.server.kv_ack_timeout_s
            )
        except KvFailure as e:
            raise RunFailed(ConnectError("internal", f"checkpoint not published: {e}")) from None
        assert self.usage is not None
        self.slot.send(encode.turn_ended(self.usage))
        self.slot.send(encode.checkpoint(staged.state))
        self.slot.send(encode.checkpoint(settled.state))
        self.slot.send(encode.checkpoint(settled.state))
        assert settled.turn_id is not None
        self.memory.turns = (*self.memory.turns, settled.turn_id)
        self.slot.close(end_stream_ok())

    def _root_of(self, message: Message) -> Blob:
        key = message.id
        blob = self.memory.roots.get(key)
        if blob is None:
            blob = self.memory.roots[key] = root_blob(message)
        return blob

    def _token_details(self, last: Usage) -> agent.ConversationTokenDetails:
        used = last.input_tokens + last.output_tokens
        sections = request_context_sections(self.start.request_context)
        parts = breakdown(
            BreakdownInput(
                system_prompt=self.assets.system,
                tools_json="",
                rules=sections.rules,
                skills=sections.agent_skills,
                mcp=sections.mcp_instructions,
                subagents=sections.subagents,
                summarized="",
            ),
            used,
        )
        return to_proto(parts, used, self.model.context_tokens)

    async def _append(self, head: Head, messages: list[Message], **kw: str) -> Head:
        try:
            return await self.deps.store.append(
                self.start.conversation_id, head.version, messages, self.deps.wall_ms(), **kw
            )
        except StaleRevision as e:
            # The supervisor serializes runs, so only an outside writer can move the head.
            raise RunFailed(ConnectError("aborted", f"conversation changed under this run: {e}")) from None

    # --- the provider call -----------------------------------------------------------
    async def _call_model(self, head: Head) -> ModelCallResult:
        request = ModelRequest(
            system=self.assets.system,
            tools=(),
            history=project(head.messages),
            settings=ModelSettings(
                upstream_model=self.model.upstream_model,
                max_output_tokens=self.model.max_output_tokens,
                replay_reasoning_on_tool_turns=self.model.replay_reasoning,
            ),
        )
        body = openai_chat.build_request(request)
        headers = [("content-type", "application/json")]
        key = self.provider.api_key()
        if key:
            headers.append(("authorization", f"Bearer {key}"))
        endpoint = Endpoint(
            url=self.provider.base_url.rstrip("/") + "/chat/completions", headers=tuple(headers)
        )
        call = ModelCall(model_call_id=str(uuid.uuid4()))
        started_ms = self.deps.wall_ms()
        stats = CallStats()

        async def on_events(events: list[ev.ModelEvent]) -> None:
            now = trio.current_time()
            for event in events:
                for emit in call.handle(event, now):
                    self.slot.send(encode.encode_emit(emit))

        status = "ok"
        failure: ConnectError | None = None
        try:
            await stream_call(
                self.deps.http, endpoint, body, openai_chat.ChatStreamParser(), on_events, stats=stats
            )
            result = call.result()
        except ev.ProviderError as e:
            status, failure = (
                "error",
                ConnectError("unavailable", e.message, provider_error_details(e.message)),
            )
        except ModelProtocolError as e:
            msg = f"provider stream broke protocol: {e}"
            status, failure = "error", ConnectError("unavailable", msg, provider_error_details(msg))
        except trio.Cancelled:
            status = "canceled"
            raise
        finally:
            with trio.CancelScope(shield=True):
                await self._record_call(request, body, started_ms, stats, status, failure, call)
        if failure is not None:
            raise RunFailed(failure)
        return result

    async def _record_call(
        self,
        request: ModelRequest,
        body: bytes,
        started_ms: int,
        stats: CallStats,
        status: str,
        failure: ConnectError | None,
        call: ModelCall,
    ) -> None:
        usage = call.result().usage if status == "ok" else None

        def ms(s: float | None) -> int | None:
            return None if s is None else round(s * 1000)

        messages = json.loads(body).get("messages", [])
        messages_hash = hashlib.sha256(canonical_json(messages)).hexdigest()
        await self.deps.store.record_llm_call(
            LlmCallRecord(
                request_id=self.start.request_id,
                conversation_id=self.start.conversation_id,
                provider_id=self.provider.id,
                model=self.model.upstream_model,
                request_body=body,
                request_sha256=hashlib.sha256(body).hexdigest(),
                messages_sha256=messages_hash,
                status=status,
                started_at_ms=started_ms,
                duration_ms=ms(stats.duration_s),
                error=failure.message if failure else None,
                http_status=stats.status,
                ttfb_ms=ms(stats.ttfb_s),
                ttft_ms=ms(stats.ttft_s),
                event_count=stats.events,
                byte_count=stats.bytes,
                usage=usage,
            )
        )
