"""The context meter a checkpoint carries: the last provider call's tokens, split over the fixed
prompt parts this run sent (cursor/token_breakdown.py does the split)."""

from __future__ import annotations

from byok.cursor.prompting import request_context_sections
from byok.cursor.token_breakdown import BreakdownInput, breakdown, to_proto
from byok.model.request import ToolSpec
from byok.model.usage import Usage
from byok.pb.agent import v1 as agent

TokenDetails = agent.ConversationTokenDetails


def decode_details(data: bytes) -> TokenDetails:
    return agent.ConversationTokenDetails().parse(data)


def unmeasured(context_tokens: int) -> TokenDetails:
    """The meter before any provider call of the run has reported."""
    return agent.ConversationTokenDetails(max_tokens=context_tokens)


def token_details(
    last: Usage,
    *,
    system_prompt: str,
    tool_specs: tuple[ToolSpec, ...],
    request_context: agent.RequestContext | None,
    context_tokens: int,
) -> agent.ConversationTokenDetails:
    used = last.input_tokens + last.output_tokens
    sections = request_context_sections(request_context)
    tools_json = "[" + ",".join(s.parameters_json for s in tool_specs) + "]"
    parts = breakdown(
        BreakdownInput(
            system_prompt=system_prompt,
            tools_json=tools_json if tool_specs else "",
            rules=sections.rules,
            skills=sections.agent_skills,
            mcp=sections.mcp_instructions,
            subagents=sections.subagents,
            summarized="",
        ),
        used,
    )
    return to_proto(parts, used, context_tokens)
