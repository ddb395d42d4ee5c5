"""Executing one ToolRound against the client: dispatch, route results by Exec id, commit.

``ExecRouter`` is per Run: Exec ids are a uint32 counter for the whole run (Cursor numbers
them per request), results are matched by id only, and ids of finished execs are
remembered so a late or repeated result/close/throw is ignored idempotently. It is fed
synchronously by the run's inbox pump; finished outcomes travel to the round task through
a channel so they are committed in real completion order.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping

import attrs
import betterproto2
import trio

from byok.cursor import encode, tool_frames
from byok.cursor.tools.base import (
    Action,
    Execution,
    Finish,
    Invocation,
    SendExec,
    ToolArgError,
    ToolDef,
    ToolOutcome,
    Update,
)
from byok.model.messages import Message, ToolCall
from byok.pb.agent import v1 as agent

log = logging.getLogger("byok.tools")


@attrs.frozen
class Completion:
    call: ToolCall
    outcome: ToolOutcome


class ExecRouter:
    def __init__(self, send: Callable[[bytes], None], request_id: str) -> None:
        self._send = send
        self._request_id = request_id
        self._next_id = 1
        self._pending: dict[int, tuple[str, Execution]] = {}  # exec id -> (call id, execution)
        self._finished: set[int] = set()
        self._done_send, self.done = trio.open_memory_channel[tuple[str, ToolOutcome]](math.inf)
        self._calls: dict[str, tuple[Execution, str]] = {}  # call id -> (execution, model_call_id)

    # --- dispatch -----------------------------------------------------------------------
    def begin(self, call_id: str, model_call_id: str, execution: Execution) -> None:
        self._calls[call_id] = (execution, model_call_id)
        self._perform(call_id, execution.start())

    def finish_now(self, call_id: str, outcome: ToolOutcome) -> None:
        self._done_send.send_nowait((call_id, outcome))

    def _perform(self, call_id: str, actions: list[Action]) -> None:
        execution, model_call_id = self._calls[call_id]
        for action in actions:
            if isinstance(action, SendExec):
                exec_id = self._next_id
                self._next_id += 1
                msg = action.message
                msg.id = exec_id
                msg.exec_id = call_id
                # An Execution has at most one exec in flight: the previous phase is finished.
                for old, (cid, _) in list(self._pending.items()):
                    if cid == call_id:
                        del self._pending[old]
                        self._finished.add(old)
                self._pending[exec_id] = (call_id, execution)
                self._send(tool_frames.exec_request(msg))
            elif isinstance(action, Update):
                u = action.update
                if u.tool_call_delta is not None:
                    u.tool_call_delta.call_id = call_id
                    u.tool_call_delta.model_call_id = model_call_id
                self._send(tool_frames.update(u))
            elif isinstance(action, Finish):
                for old, (cid, _) in list(self._pending.items()):
                    if cid == call_id:
                        del self._pending[old]
                        self._finished.add(old)
                self._done_send.send_nowait((call_id, action.outcome))

    # --- client messages ------------------------------------------------------------------
    def on_exec_message(self, msg: agent.ExecClientMessage) -> None:
        entry = self._pending.get(msg.id)
        if entry is None:
            self._stale("result", msg.id)
            return
        call_id, execution = entry
        self._perform(call_id, execution.on_result(msg))

    def on_control(self, msg: agent.ExecClientControlMessage) -> None:
        name, value = betterproto2.which_one_of(msg, "message")
        if name == "heartbeat" or value is None:
            return  # a heartbeat, or a control message with no variant: nothing to route
        entry = self._pending.get(value.id)
        if entry is None:
            if name == "throw" or value.id not in self._finished:
                self._stale(name, value.id)
            return  # stream_close after a terminal result: the normal tail
        call_id, execution = entry
        if name == "stream_close":
            self._perform(call_id, execution.on_stream_close())
        elif name == "throw":
            self._perform(call_id, execution.on_throw(value.error))

    def _stale(self, what: str, exec_id: int) -> None:
        log.info(
            "request %s: ignoring %s for unknown or finished exec id %s", self._request_id, what, exec_id
        )

    def abort_all(self) -> None:
        """Tell the client to stop every exec still running (cancel, error, preemption)."""
        for exec_id in sorted(self._pending):
            self._send(tool_frames.exec_abort(exec_id))
            self._finished.add(exec_id)
        self._pending.clear()

    @property
    def running(self) -> int:
        return len(self._pending)


class ToolRound:
    """One round: every call dispatched, every outcome committed in completion order."""

    def __init__(
        self,
        *,
        router: ExecRouter,
        registry: Mapping[str, ToolDef],
        send: Callable[[bytes], None],
        flushed: Callable[[], Awaitable[None]],
        commit: Callable[[Message], Awaitable[None]],
        published: Callable[[Message, ToolOutcome], None],
        dispatched: Callable[[], None],
        round_id: str,
        model_call_id: str,
    ) -> None:
        self.router = router
        self.registry = registry
        self.send = send
        self.flushed = flushed  # the frames queued so far are on the wire (RunSlot.flushed)
        self.commit = commit
        self.published = published  # a result is ready: its blobs may go out before its commit
        # Every call is out (after its Exec frames, so the client starts the tools first).
        self.dispatched = dispatched
        self.round_id = round_id
        self.model_call_id = model_call_id

    async def run(self, calls: tuple[ToolCall, ...]) -> list[Completion]:
        by_id = {c.call_id: c for c in calls}
        args_by_id: dict[str, Mapping[str, object]] = {}
        for call in calls:
            tool = self.registry.get(call.name)
            if tool is None:
                self.router.finish_now(call.call_id, _error_outcome(f"unknown tool '{call.name}'"))
                continue
            try:
                raw = json.loads(call.arguments or "{}")
                if not isinstance(raw, dict):
                    raise ToolArgError("arguments must be a JSON object")
                args = tool.parse(raw)
            except (ValueError, ToolArgError) as e:
                problem = f"invalid JSON arguments: {e}" if isinstance(e, ValueError) else str(e)
                outcome = ToolOutcome(
                    content=f"Error: {call.name} was not run: {problem}",
                    is_error=True,
                    ui=tool.tool_call(tool.placeholder()),
                )
                self.router.finish_now(call.call_id, outcome)
                continue
            args_by_id[call.call_id] = args
            self.send(tool_frames.started(call.call_id, tool.tool_call(tool.ui(args)), self.model_call_id))
            invocation = Invocation(call.call_id, call.name, self.model_call_id, args)
            self.router.begin(call.call_id, self.model_call_id, tool.execute(invocation))
        self.dispatched()

        completions: list[Completion] = []
        seq = 0
        # One completion per call id: a round replayed from a history another server wrote may
        # name two calls alike (ModelCall refuses that from a provider), and must still end.
        while len(completions) < len(by_id):
            call_id, outcome = await self.router.done.receive()
            call = by_id.get(call_id)
            if call is None or any(c.call.call_id == call_id for c in completions):
                continue  # an outcome of an earlier round's call: not ours
            seq += 1
            message = Message(
                role="tool",
                origin="tool",
                text=outcome.content,
                tool_call_id=call_id,
                tool_name=call.name,
                is_error=outcome.is_error,
                tool_round_id=self.round_id,
                completion_seq=seq,
            )
            # The blob SETs go out before the commit, so the client reads and ACKs megabytes
            # while SQLite writes them: a blob the client holds is no checkpoint, and one of a
            # result whose commit then fails is merely unreferenced. The card waits for the
            # commit: a completed card means the result is in the history (a cancel after it
            # keeps the result).
            self.published(message, outcome)
            await self.commit(message)
            if call.name in self.registry:
                self.send(encode.tool_call_completed(call_id, outcome.ui_bytes(), self.model_call_id))
            await self.flushed()
            completions.append(Completion(call, outcome))
        return completions


def _error_outcome(text: str) -> ToolOutcome:
    return ToolOutcome(content=f"Error: {text}", is_error=True, ui=agent.ToolCall())
