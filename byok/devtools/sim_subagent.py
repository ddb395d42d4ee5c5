"""The client's side of Task, for the simulator: each ``subagent_args`` Exec becomes a child run
of its own (a new request id and conversation, the parent's request id and Task call id in the
x-parent headers), as Cursor opens one (PROTOCOL §4, seeds 000 §33).

A foreground Task is answered once the child run has ended, with its answer as the final
message; a background one at once, with the agent id, while the child runs on. The completions
the client would later send the parent conversation (``background_task_completion_action``)
are kept in ``finished``.
"""

from __future__ import annotations

import attrs
import trio

from byok.devtools.cursor_sim import CursorSim, Reply, Transcript
from byok.devtools.exec_client import exec_result, stream_close
from byok.pb.agent import v1 as agent


@attrs.define(eq=False)
class Child:
    agent_id: str
    request_id: str
    parent_call_id: str
    background: bool
    transcript: Transcript | None = None
    done: trio.Event = attrs.Factory(trio.Event)


class SubagentHost:
    def __init__(self, sim: CursorSim, nursery: trio.Nursery) -> None:
        self.sim = sim
        self.nursery = nursery  # background children run here
        self.children: list[Child] = []
        self.finished: list[agent.BackgroundTaskCompletion] = []
        # Background children start once this is set (tests order the provider's calls by it).
        self.release = trio.Event()
        self.release.set()

    def install(self) -> SubagentHost:
        self.sim.async_exec = self.handle
        return self

    async def handle(self, request_id: str, msg: agent.ExecServerMessage, reply: Reply) -> bool:
        args = msg.subagent_args
        if args is None:
            return False
        agent_id = args.resume_agent_id or f"agent-{args.tool_call_id}"
        child = Child(
            agent_id, f"{agent_id}-run{len(self.children)}", args.tool_call_id, bool(args.run_in_background)
        )
        self.children.append(child)
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
        headers = {"x-parent-request-id": request_id, "x-parent-agent-tool-call-id": args.tool_call_id}

        async def run_child() -> None:
            child.transcript = await self.sim.run(child.request_id, request, headers=headers)
            child.done.set()

        if child.background:
            success = agent.SubagentSuccess(
                agent_id=agent_id, background_reason=agent.SubagentBackgroundReason.AGENT_REQUEST
            )
            await reply(exec_result(msg, subagent_result=agent.SubagentResult(success=success)))
            await reply(stream_close(msg.id))
            self.nursery.start_soon(self._background, child, run_child, args)
            return True
        await run_child()
        assert child.transcript is not None
        if child.transcript.end_stream != {}:
            error = agent.SubagentError(
                agent_id=agent_id, error=f"the subagent's run ended with {child.transcript.end_stream}"
            )
            result = agent.SubagentResult(error=error)
        else:
            success = agent.SubagentSuccess(agent_id=agent_id, final_message=child.transcript.text())
            result = agent.SubagentResult(success=success)
        await reply(exec_result(msg, subagent_result=result))
        await reply(stream_close(msg.id))
        return True

    async def _background(self, child: Child, run_child: object, args: agent.SubagentArgs) -> None:
        await self.release.wait()
        await run_child()  # type: ignore[operator]
        assert child.transcript is not None
        self.finished.append(
            agent.BackgroundTaskCompletion(
                task_id=child.agent_id,
                kind=agent.BackgroundTaskKind.SUBAGENT,
                status=agent.BackgroundTaskStatus.SUCCESS,
                title=args.prompt[:40],
                detail=child.transcript.text(),
                reason=agent.BackgroundTaskCompletionReason.TASK_FINISHED,
            )
        )
