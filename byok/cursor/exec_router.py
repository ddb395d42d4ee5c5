"""A tool round against the client (sans-IO): dispatch each call, route the client's answers by
Exec id and by interaction id.

``ExecRouter`` is per Run: Exec ids and InteractionQuery ids are two uint32 counters for the
whole run (Cursor numbers them per request), answers are matched by id only, and ids of finished
calls are remembered so a late or repeated answer is ignored idempotently. It is fed
synchronously by the run's inbox pump and hands each finished outcome to ``on_done`` (the
turn machine), which commits them in completion order. Server work (``StartWork``) goes to
``on_work`` and comes back through ``work_done``; turn notes go to ``on_note``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping

import betterproto2

from byok.cursor import tool_frames
from byok.cursor.tools.base import (
    Action,
    Execution,
    Finish,
    Invocation,
    Note,
    SendExec,
    SendQuery,
    StartWork,
    ToolArgError,
    ToolDef,
    ToolOutcome,
    Update,
)
from byok.cursor.tools.error_cards import unknown_tool_call, unknown_tool_error, with_error
from byok.cursor.tools.work import backend_missing
from byok.model.messages import ToolCall
from byok.pb.agent import v1 as agent

log = logging.getLogger("byok.tools")


class ExecRouter:
    def __init__(
        self,
        send: Callable[[bytes], None],
        request_id: str,
        on_done: Callable[[str, ToolOutcome], None],
        *,
        on_work: Callable[[str, object], None] | None = None,
        on_note: Callable[[str, object], None] | None = None,
    ) -> None:
        self._send = send
        self._request_id = request_id
        self._next_id = 1
        self._pending: dict[int, tuple[str, Execution]] = {}  # exec id -> (call id, execution)
        self._finished: set[int] = set()
        self._next_query = 1
        self._queries: dict[int, str] = {}  # interaction id -> call id
        self._answered: set[int] = set()
        self._on_done = on_done  # (call id, outcome), in the order calls finish
        self._on_work = on_work  # (call id, work): the run performs it, then calls work_done
        self._on_note = on_note  # (call id, note): the run makes it a turn input
        self._calls: dict[str, tuple[Execution, str]] = {}  # call id -> (execution, model_call_id)
        self._working: set[str] = set()  # call ids whose server work is under way
        self._shells: set[int] = set()  # exec ids of shell streams (the user may background them)
        self._controls: dict[int, str] = {}  # exec id of a force_background_shell_args -> call id

    # --- dispatch -----------------------------------------------------------------------
    def begin(self, call_id: str, model_call_id: str, execution: Execution) -> None:
        self._calls[call_id] = (execution, model_call_id)
        self._perform(call_id, execution.start())

    def finish_now(self, call_id: str, outcome: ToolOutcome) -> None:
        self._on_done(call_id, outcome)

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
                if msg.shell_stream_args is not None:
                    self._shells.add(exec_id)
                self._send(tool_frames.exec_request(msg))
            elif isinstance(action, SendQuery):
                query_id = self._next_query
                self._next_query += 1
                action.query.id = query_id
                self._queries[query_id] = call_id
                self._send(tool_frames.interaction_query(action.query))
            elif isinstance(action, StartWork):
                if self._on_work is None:
                    raise AssertionError("a tool asked for server work the run does not do")
                self._working.add(call_id)
                self._on_work(call_id, action.work)
            elif isinstance(action, Note):
                if self._on_note is not None:
                    self._on_note(call_id, action.note)
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
                for qid, cid in list(self._queries.items()):
                    if cid == call_id:
                        del self._queries[qid]
                        self._answered.add(qid)
                self._working.discard(call_id)
                del self._calls[call_id]
                self._on_done(call_id, action.outcome)

    # --- client messages ------------------------------------------------------------------
    def on_exec_message(self, msg: agent.ExecClientMessage) -> None:
        if msg.id in self._controls:
            self._control_answered(msg.id, msg.force_background_shell_result)
            return
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
        if value.id in self._controls:
            if name == "throw":
                log.warning(
                    "request %s: the client could not move shell call %s to the background: %s",
                    self._request_id,
                    self._controls[value.id],
                    value.error,
                )
            return
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

    def on_interaction(self, response: agent.InteractionResponse) -> None:
        call_id = self._queries.pop(response.id, None)
        if call_id is None:
            what = "repeated" if response.id in self._answered else "unknown"
            log.info("request %s: ignoring %s interaction answer id %s", self._request_id, what, response.id)
            return
        self._answered.add(response.id)
        execution = self._calls[call_id][0]
        self._perform(call_id, execution.on_answer(response))  # type: ignore[attr-defined]

    def work_done(self, call_id: str, result: object) -> None:
        """The server work a call asked for finished (or failed: ``result`` says which)."""
        if call_id not in self._working:
            return  # the call was aborted meanwhile
        self._working.discard(call_id)
        execution = self._calls[call_id][0]
        self._perform(call_id, execution.on_work(result))  # type: ignore[attr-defined]

    def force_background(self, call_id: str) -> bool:
        """The user asked to move the running Shell ``call_id`` to the background
        (``background_shell_action``): Cursor's own control for it goes out on an exec id of its
        own; the shell's stream then ends ``backgrounded`` and finishes the call as usual. False
        when the call is no running shell (it finished, or never was one) or was asked already."""
        if call_id in self._controls.values():
            return False
        if not any(cid == call_id and eid in self._shells for eid, (cid, _) in self._pending.items()):
            return False
        exec_id = self._next_id
        self._next_id += 1
        self._controls[exec_id] = call_id
        args = agent.ForceBackgroundShellArgs(tool_call_id=call_id)
        msg = agent.ExecServerMessage(id=exec_id, exec_id=call_id, force_background_shell_args=args)
        self._send(tool_frames.exec_request(msg))
        return True

    def _control_answered(self, exec_id: int, result: agent.ForceBackgroundShellResult | None) -> None:
        if result is not None and result.status != agent.ForceBackgroundShellStatus.ACCEPTED:
            log.info(
                "request %s: shell call %s was not moved to the background (%s)",
                self._request_id,
                self._controls[exec_id],
                result.status.name,
            )

    def _stale(self, what: str, exec_id: int) -> None:
        log.info(
            "request %s: ignoring %s for unknown or finished exec id %s", self._request_id, what, exec_id
        )

    def abort_all(self) -> None:
        """Tell the client to stop every exec still running (cancel, error, preemption). Open
        queries and server work are dropped: their answers, if any, are ignored."""
        for exec_id in sorted(self._pending):
            self._send(tool_frames.exec_abort(exec_id))
            self._finished.add(exec_id)
        self._pending.clear()
        self._answered.update(self._queries)
        self._queries.clear()
        self._working.clear()
        self._calls.clear()

    @property
    def running(self) -> int:
        return len(self._pending) + len(self._queries) + len(self._working)


def dispatch(
    router: ExecRouter,
    registry: Mapping[str, ToolDef],
    send: Callable[[bytes], None],
    model_call_id: str,
    calls: tuple[ToolCall, ...],
    refused: Mapping[str, str],
    env: object = None,
) -> None:
    """Start every call of a round, in the model's order. Every call gets its started card; a
    refused one (a tool the run did not offer, or one byok does not know) and one with unusable
    arguments finish at once with an error card, never executed."""
    for call in calls:
        reason = refused.get(call.call_id)
        tool = registry.get(call.name)
        if tool is None:
            text = reason or f"Error: unknown tool '{call.name}'; it was not run."
            card = unknown_tool_call(call.name, call.call_id, call.arguments)
            send(tool_frames.started(call.call_id, card, model_call_id))
            card = unknown_tool_error(call.name, call.call_id, call.arguments, text)
            router.finish_now(call.call_id, ToolOutcome(content=text, is_error=True, ui=card))
            continue
        if reason is not None and tool.backend not in (None, *_backends(env)):
            reason = backend_missing(tool.name, tool.backend)  # say why it was not offered
        args, problem = _parsed(tool, call.arguments)
        started = tool.tool_call(tool.placeholder() if args is None else tool.ui(args))
        send(tool_frames.started(call.call_id, started, model_call_id))
        if reason is not None or args is None:
            text = reason or f"Error: {call.name} was not run: {problem}"
            card = with_error(tool.tool_call(tool.placeholder() if args is None else tool.ui(args)), text)
            router.finish_now(call.call_id, ToolOutcome(content=text, is_error=True, ui=card))
            continue
        invocation = Invocation(call.call_id, call.name, model_call_id, args, env)
        router.begin(call.call_id, model_call_id, tool.execute(invocation))


def _parsed(tool: ToolDef, arguments: str) -> tuple[Mapping[str, object] | None, str]:
    """The call's validated arguments, or None and what is wrong with them."""
    try:
        raw = json.loads(arguments or "{}")
        if not isinstance(raw, dict):
            raise ToolArgError("arguments must be a JSON object")
        return tool.parse(raw), ""
    except ValueError as e:
        return None, f"invalid JSON arguments: {e}"
    except ToolArgError as e:
        return None, str(e)


def _backends(env: object) -> frozenset[str]:
    return getattr(env, "backends", frozenset())
