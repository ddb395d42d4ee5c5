"""Subagents in the fault injection (tests/integration/test_fault_injection.py): a parent run whose
Task the client answers by running the child as a run of its own (as Cursor does, and as
devtools/sim_subagent does for the simulator), with a fault in the child: its provider failing,
its run cancelled, its stream gone past the grace, the parent cancelled under it, the daemon
stopping; and a background child whose completion the client sends twice.

The client answers the parent's subagent_args Exec once the child's run has ended: with the
child's answer, or with the error its run ended with. Whatever happens to the child, the
parent's Task must end with a result and the parent's turn must go on (or end when the parent
itself was cancelled); nothing may hang.
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from byok.devtools.exec_client import exec_result, stream_close
from byok.pb.agent import v1 as agent
from tests.support.fake_provider import Script, error_script
from tests.support.fault_harness import (
    GRACE_S,
    MAX_TRIES,
    OK,
    Client,
    Expect,
    Harness,
    cancel_message,
    drive,
    outcome,
)
from tests.support.fault_kinds import Kind

Reply = Callable[[agent.AgentClientMessage], Awaitable[None]]


@attrs.define(eq=False)
class Children:
    """The client's side of Task: each subagent_args Exec becomes a child run in ``nursery`` (it
    outlives the parent's Exec tasks, so a cancelled parent does not cut its child's stream).
    ``drive_child`` drives a child's request; ``hold`` delays background children."""

    h: Harness
    nursery: trio.Nursery
    drive_child: Callable[[Client, agent.AgentRunRequest], Awaitable[None]]
    hold: trio.Event = attrs.Factory(trio.Event)
    clients: list[Client] = attrs.Factory(list)
    answers: dict[str, str] = attrs.Factory(dict)  # child request id -> its answer, when it succeeds
    running: dict[int, Client] = attrs.Factory(dict)  # the parent's exec id -> its child
    done: dict[str, trio.Event] = attrs.Factory(dict)

    def __attrs_post_init__(self) -> None:
        self.hold.set()

    async def answer(self, parent: Client, msg: agent.ExecServerMessage, reply: Reply) -> None:
        args = msg.subagent_args
        assert args is not None
        agent_id = f"agent-{args.tool_call_id}"
        child = Client(self.h, f"{parent.rid}-child", dup=parent.dup, reorder=parent.reorder)
        child.headers = {"x-parent-request-id": parent.rid, "x-parent-agent-tool-call-id": args.tool_call_id}
        child.conv = agent_id
        request = agent.AgentRunRequest(
            conversation_state=agent.ConversationStateStructure(),
            action=agent.ConversationAction(
                user_message_action=agent.UserMessageAction(
                    user_message=agent.UserMessage(text=args.prompt, message_id=f"{agent_id}-prompt"),
                    request_context=agent.RequestContext(),
                )
            ),
            requested_model=agent.RequestedModel(model_id=args.model_id),
            conversation_id=agent_id,
            conversation_group_id=args.root_parent_conversation_id,
            subagent_type_name=args.subagent_type,
        )
        self.clients.append(child)
        self.running[msg.id] = child
        done = self.done[child.rid] = trio.Event()

        async def run() -> None:
            try:
                if args.run_in_background:
                    await self.hold.wait()
                await self.drive_child(child, request)
            finally:
                done.set()

        self.nursery.start_soon(run)
        if args.run_in_background:
            success = agent.SubagentSuccess(
                agent_id=agent_id, background_reason=agent.SubagentBackgroundReason.AGENT_REQUEST
            )
            result = agent.SubagentResult(success=success)
        else:
            await done.wait()
            if child.terminals == [{}]:
                final = self.answers.get(child.rid, "")
                result = agent.SubagentResult(
                    success=agent.SubagentSuccess(agent_id=agent_id, final_message=final)
                )
            else:
                error = agent.SubagentError(
                    agent_id=agent_id, error=f"the subagent's run ended with {child.terminals}"
                )
                result = agent.SubagentResult(error=error)
        await reply(exec_result(msg, subagent_result=result))
        await reply(stream_close(msg.id))

    def on_abort(self, exec_id: int) -> None:
        """The parent's Task was aborted (the parent run stopped): the client stops the child."""
        child = self.running.get(exec_id)
        if child is not None and not self.done[child.rid].is_set():
            self.nursery.start_soon(child.send, cancel_message())


def task_call(call_id: str, tag: str, *, background: bool = False) -> tuple[str, str, str]:
    args: dict[str, Any] = {"description": f"{tag} helper", "prompt": f"{tag}: look at a.txt and report."}
    if background:
        args["run_in_background"] = True
    return (call_id, "Task", json.dumps(args))


def report(child: Client, answer: str) -> str:
    """The end of what the parent's model reads as the Task's result for a child that succeeded."""
    return f"Subagent ID: {child.conv}\n\n{answer}"


async def subagent(
    h: Harness,
    rng: random.Random,
    k: Kind,
    index: int,
    conv: str,
    parent: Client,
    expect: Expect,
    append_first: bool,
) -> list[Expect]:
    """A parent's foreground Task whose child meets one fault."""
    tag = f"r{index}"
    p = h.provider
    call = f"{tag}-task"
    child_answer = f"{tag} child found alpha and beta"
    how = rng.choice(["ok", "provider_fails", "cancel", "drop_expire", "parent_cancel", "shutdown"])
    child_outcomes = frozenset({OK})
    child_scripts: list[Script] = []
    kwargs: dict[str, Any] = {}
    words = [f"{tag} child w{i} " for i in range(10)]
    seen = len(p.requests) + 1  # the parent's first call, then the child's
    if how == "ok":
        if rng.random() < 0.5:  # the child runs a tool round of its own first
            child_scripts.append(k.tools([(f"{tag}-cc0", "Read", '{"path":"a.txt"}')]))
        child_scripts.append(k.text([child_answer]))
    elif how == "provider_fails":
        cut = k.text([child_answer, " and more"])
        child_scripts += rng.choice(
            [
                [error_script(400, "injected bad request")],
                [error_script(503, "injected overload") for _ in range(MAX_TRIES)],
                [Script(chunks=cut.chunks, close_after=k.first_output(cut, [child_answer]) + 1)],
            ]
        )
        child_outcomes = frozenset({"unavailable"})
    else:
        slow = 0.06 if how == "drop_expire" else 0.03
        child_scripts.append(k.text(words, delay_s=slow))
        child_answer = "".join(words)
        child_outcomes = frozenset({"canceled", OK})
        if how == "drop_expire":
            kwargs = {"drop_after": 1, "reconnect_after": GRACE_S + 0.25}
    delay = rng.uniform(0.0, 0.1)

    async def child_started() -> None:
        while len(p.requests) <= seen:  # the child's first request
            await p.requested_since(len(p.requests))
        await trio.sleep(delay)

    async with trio.open_nursery() as nursery:
        kids: Children

        async def drive_child(child: Client, request: agent.AgentRunRequest) -> None:
            during = None
            if how == "cancel":

                async def during() -> None:
                    await child_started()
                    await child.send(cancel_message())

            child.server_may_stop = how == "shutdown"
            kids.answers[child.rid] = child_answer
            await drive(
                h, child, child.conv, "", append_first=False, request=request, during=during, **kwargs
            )

        kids = Children(h, nursery, drive_child)
        parent.subagents = kids
        answer = expect.final_text or ""
        p.enqueue(k.tools([task_call(call, tag)]), *child_scripts, k.text([answer]))
        parent_during = None
        if how in ("parent_cancel", "shutdown"):
            expect.outcomes = frozenset({"canceled", OK})
            parent.server_may_stop = how == "shutdown"

            async def parent_during() -> None:
                await child_started()
                if how == "shutdown":
                    await h.restart()
                else:
                    await parent.send(cancel_message())

        await drive(
            h, parent, conv, f"{tag}: subagent {how}", append_first=append_first, during=parent_during
        )
    expects = [expect]
    ends = [outcome(c.terminals[0]) if len(c.terminals) == 1 else "?" for c in (parent, *kids.clients)]
    h.variants[f"subagent {how}: " + "/".join(ends)] += 1
    for child in kids.clients:
        expects.append(Expect(child, child_outcomes, child.conv, child_answer))
    if not kids.clients:
        expect.problems.append("the parent's Task started no child")
    elif parent.terminals == [{}]:
        child = kids.clients[0]
        text = report(child, child_answer) if child.terminals == [{}] else "The subagent failed"
        expect.tool_error = (call, text)
    return expects


async def background(
    h: Harness,
    rng: random.Random,
    k: Kind,
    index: int,
    conv: str,
    parent: Client,
    expect: Expect,
    append_first: bool,
) -> list[Expect]:
    """A background Task: the parent's turn ends, the child runs (and succeeds or fails), then the
    client sends its completion to the parent's conversation twice: the report and the follow-up
    are appended once, and the second sending calls no model."""
    tag = f"r{index}"
    p = h.provider
    call = f"{tag}-task"
    child_answer = f"{tag} background child found alpha"
    fails = rng.random() < 0.3
    async with trio.open_nursery() as nursery:

        async def drive_child(child: Client, request: agent.AgentRunRequest) -> None:
            kids.answers[child.rid] = child_answer
            await drive(h, child, child.conv, "", append_first=False, request=request)

        kids = Children(h, nursery, drive_child)
        kids.hold = trio.Event()  # the child starts once the parent's turn is over
        parent.subagents = kids
        p.enqueue(k.tools([task_call(call, tag, background=True)]), k.text([expect.final_text or ""]))
        await drive(h, parent, conv, f"{tag}: background subagent", append_first=append_first)
        p.enqueue(error_script(400, "injected bad request") if fails else k.text([child_answer]))
        kids.hold.set()
    expects = [expect]
    if parent.terminals == [{}]:
        expect.tool_error = (call, "Subagent ID: agent-")
    if len(kids.clients) != 1:
        expect.problems.append(f"{len(kids.clients)} children for one background Task")
        return expects
    child = kids.clients[0]
    h.variants[f"subagent_background {'failing' if fails else 'ok'}"] += 1
    expects.append(Expect(child, frozenset({"unavailable" if fails else OK}), child.conv, child_answer))
    if parent.terminals != [{}]:
        return expects
    status = agent.BackgroundTaskStatus.ERROR if fails else agent.BackgroundTaskStatus.SUCCESS
    completion = agent.BackgroundTaskCompletion(
        task_id=child.conv,
        kind=agent.BackgroundTaskKind.SUBAGENT,
        status=status,
        title=f"{tag} helper",
        detail="injected: the provider failed" if fails else child_answer,
        reason=agent.BackgroundTaskCompletionReason.TASK_FINISHED,
    )
    followed = f"{tag} the background work is done"
    for n in range(2):
        c = Client(h, f"fi-req-{index}b{n}", dup=rng.random() < 0.25, reorder=rng.random() < 0.25)
        request = agent.AgentRunRequest(
            conversation_state=h.states.get(conv) or agent.ConversationStateStructure(),
            action=agent.ConversationAction(
                background_task_completion_action=agent.BackgroundTaskCompletionAction(
                    completions=[completion]
                )
            ),
            requested_model=agent.RequestedModel(model_id=k.model),
            conversation_id=conv,
        )
        if n == 0:
            p.enqueue(k.text([followed]))
        calls = len(p.requests)
        await drive(h, c, conv, "", append_first=rng.random() < 0.2, request=request)
        e = Expect(c, frozenset({OK}), conv, followed if n == 0 else None, runtime=False)
        if n == 1 and len(p.requests) != calls:
            e.problems.append("a completion sent again called the model")
        expects.append(e)
    appended = [m.event_id for m in h.store.head(conv).messages].count(f"subagent-completed:{child.conv}")
    if expects[-2].client.terminals == [{}] and appended != 1:
        expects[-1].problems.append(f"the completion of {child.conv} is in the history {appended} times")
    return expects
