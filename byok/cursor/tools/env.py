"""What a run offers its tools beyond their arguments (sans-IO, one per run).

The run layer makes it at the run's start and refreshes ``messages`` before each tool round;
tools read it and, for the state the protocol keeps per run (the MCP definition table), write
it. Nothing here outlives the run or touches the store.
"""

from __future__ import annotations

import attrs

from byok.cursor.todos import TodoFold
from byok.model.messages import Message
from byok.pb.agent import v1 as agent


@attrs.define(eq=False)
class ToolEnv:
    request_id: str = ""
    conversation_id: str = ""
    # The conversation group's root (Task's root_parent_conversation_id); the conversation itself
    # when it has no group.
    root_conversation_id: str = ""
    mode: str = "agent"
    model_id: str = ""  # the run's model (a subagent that inherits runs on it)
    # The run request's per-type subagent models (Task resolves its child's model with them).
    subagent_model_overrides: tuple[agent.SubagentModelOverride, ...] = ()
    request_context: agent.RequestContext | None = None
    # The committed history when the round's calls were dispatched: folds such as the todo list
    # read it (the messages are the only source of truth, seeds 000 §24).
    messages: tuple[Message, ...] = ()
    # The conversation's todo fold over those messages (kept across its runs, extended as the
    # history grows): TodoWrite starts from its list.
    todos: TodoFold = attrs.Factory(TodoFold)
    # Server-side backends configured for this daemon ("search", "images").
    backends: frozenset[str] = frozenset()
    # The run's model reads images (its ``vision``): a Read of an image file gives it the image.
    vision: bool = True
    # (server_identifier, tool_name) -> the definition exactly as the client's MCP state gave it;
    # filled only from successful GetMcpTools results of this run (seeds 000 §33.3).
    mcp: dict[tuple[str, str], agent.McpToolDefinition] = attrs.Factory(dict)

    @property
    def terminals_folder(self) -> str:
        env = None if self.request_context is None else self.request_context.env
        return "" if env is None else env.terminals_folder
