"""Every Cursor tool byok can run, by model-visible name."""

from __future__ import annotations

from types import ModuleType

from byok.cursor.tools import (
    ask_question_tool,
    await_shell,
    delete_tool,
    edit_tools,
    mcp_tools,
    notebook_tool,
    plan_tool,
    read_lints_tool,
    read_tool,
    search_tools,
    server_work_tools,
    shell_tool,
    subagent_tools,
    switch_mode_tool,
    todo_tool,
    web_fetch_tool,
)
from byok.cursor.tools.base import ToolDef
from byok.cursor.tools.error_cards import unknown_tool_call
from byok.pb.agent import v1 as agent

# Tool modules, each exporting ``TOOLS: tuple[ToolDef, ...]``.
MODULES: tuple[ModuleType, ...] = (
    read_tool,
    delete_tool,
    read_lints_tool,
    search_tools,
    edit_tools,
    shell_tool,
    await_shell,
    mcp_tools,
    todo_tool,
    notebook_tool,
    ask_question_tool,
    plan_tool,
    switch_mode_tool,
    web_fetch_tool,
    server_work_tools,
    subagent_tools,
)


def build_registry() -> dict[str, ToolDef]:
    registry: dict[str, ToolDef] = {}
    for module in MODULES:
        for tool in module.TOOLS:
            if tool.name in registry:
                raise ValueError(f"tool {tool.name!r} is defined twice ({module.__name__})")
            registry[tool.name] = tool
    return registry


def placeholder_card(tool: ToolDef | None, name: str) -> agent.ToolCall:
    """The card Cursor draws while the model writes a call to ``name`` (``tool`` None: a tool
    byok does not know, drawn as its named error card)."""
    return unknown_tool_call(name) if tool is None else placeholder_call(tool)


def placeholder_call(tool: ToolDef) -> agent.ToolCall:
    """The empty typed card Cursor draws while the model is still writing the call's arguments."""
    return tool.tool_call(tool.placeholder())
