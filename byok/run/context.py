"""What one run works with and on: its request, the conversation's memory, its links to the
client (slot, KV, exec router) and the history it appends to. The start point fills in the head
and the turn; the effects move the head as they commit."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from byok.config import ModelConfig, ProviderConfig
from byok.console.catalog import AliasConfig, Target
from byok.cursor.agent_modes import AgentMode
from byok.cursor.checkpoint import TurnRecord
from byok.cursor.exec_router import ExecRouter
from byok.cursor.prompting import ModeAssets
from byok.cursor.request import RunStart
from byok.cursor.token_details import TokenDetails
from byok.cursor.tools.base import ToolDef
from byok.cursor.tools.env import ToolEnv
from byok.cursor.tools.mcp_dynamic import DynamicTools
from byok.loop.turn_values import Outcome
from byok.model.request import ToolSpec
from byok.run.conversation import ConversationMemory
from byok.run.deps import RunDeps
from byok.run.kv import KvLink
from byok.run.slot import RunSlot
from byok.store.records import Head


@attrs.define(eq=False)
class RunContext:
    start: RunStart
    deps: RunDeps
    slot: RunSlot
    memory: ConversationMemory
    kv: KvLink
    router: ExecRouter
    model: ModelConfig
    provider: ProviderConfig
    mode: str
    assets: ModeAssets
    tool_specs: tuple[ToolSpec, ...]
    details: TokenDetails
    tool_env: ToolEnv
    agent_mode: AgentMode  # the mode checkpoints record (a SwitchMode changes it)
    head: Head = attrs.field(default=None)  # set by the start point
    prior_turns: tuple[bytes, ...] = ()
    turn: TurnRecord = attrs.field(default=None)  # the turn as it stood when the run started
    outcome: Outcome | None = None
    # trio time the first provider events reached the turn (the run's end line reports TTFT).
    first_output_at: float | None = None
    # The run's tools by model-visible name: byok's own and the MCP tools the request announced
    # (cursor/tools/mcp_dynamic.py); ``dynamic`` is what a mode switch offers again.
    registry: Mapping[str, ToolDef] = attrs.Factory(dict)
    dynamic: DynamicTools = attrs.Factory(DynamicTools)
    # The alias Cursor picked (None for a model) and what it runs on, in order (run/failover.py):
    # ``model`` and ``provider`` are the target being called.
    alias: AliasConfig | None = None
    targets: tuple[Target, ...] = ()
