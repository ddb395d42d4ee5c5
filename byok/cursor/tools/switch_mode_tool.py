"""SwitchMode: the model asks the user to move the conversation to another mode
(``switch_mode_request_query``). Approved: the call succeeds and a ``ModeSwitch`` note tells the
turn, whose next model call then uses the new mode's prompt and tools (and checkpoints record
the mode). Rejected: the typed rejection is the result, and the mode stays.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from byok.cursor.tools.base import (
    Action,
    Invocation,
    Note,
    ToolArgError,
    ToolDef,
    ToolOutcome,
    optional_text,
    require_str,
)
from byok.cursor.tools.exec_results import no_variant, variant
from byok.cursor.tools.interaction import Interaction, declined
from byok.cursor.tools.modes import ModeSwitch
from byok.pb.agent import v1 as agent

# The modes a model may ask for (Cursor's switchable ones); each has its own prompt assets.
TARGETS = ("plan", "agent")


def _parse(args: Mapping[str, Any]) -> Mapping[str, Any]:
    target = require_str(args, "target_mode_id").strip().lower()
    if target not in TARGETS:
        raise ToolArgError(f"argument 'target_mode_id' must be one of {', '.join(TARGETS)}, got {target!r}")
    return {"target_mode_id": target, "explanation": optional_text(args, "explanation")}


def _args(args: Mapping[str, Any], call_id: str = "") -> agent.SwitchModeArgs:
    return agent.SwitchModeArgs(
        target_mode_id=args["target_mode_id"], explanation=args["explanation"], tool_call_id=call_id
    )


def _ui(args: Mapping[str, Any]) -> agent.SwitchModeToolCall:
    return agent.SwitchModeToolCall(args=_args(args))


class _Switch(Interaction):
    def __init__(self, inv: Invocation) -> None:
        self._inv = inv
        self._from = getattr(inv.env, "mode", "") or "agent"
        self._to: str = inv.args["target_mode_id"]
        query = agent.InteractionQuery(
            switch_mode_request_query=agent.SwitchModeRequestQuery(_args(inv.args, inv.call_id))
        )
        super().__init__(query, "switch_mode_request_response", self._answered, self._error)

    def start(self) -> list[Action]:
        if self._to == self._from:
            return self.fail(f"The conversation is in {self._to} mode already; nothing was switched.")
        return super().start()

    def _card(self, result: agent.SwitchModeResult) -> agent.ToolCall:
        return agent.ToolCall(
            switch_mode_tool_call=agent.SwitchModeToolCall(_args(self._inv.args, self._inv.call_id), result)
        )

    def _error(self, message: str) -> ToolOutcome:
        return ToolOutcome(
            message, True, self._card(agent.SwitchModeResult(error=agent.SwitchModeError(message)))
        )

    def _answered(self, response: agent.SwitchModeRequestResponse) -> list[Action]:
        name, value = variant(response)
        if name == "approved":
            result = agent.SwitchModeResult(
                success=agent.SwitchModeSuccess(from_mode_id=self._from, to_mode_id=self._to)
            )
            text = f"Switched from {self._from} mode to {self._to} mode. Continue in {self._to} mode."
            return [Note(ModeSwitch(self._to)), *self.finish(ToolOutcome(text, False, self._card(result)))]
        if name == "rejected":
            result = agent.SwitchModeResult(rejected=agent.SwitchModeRejected(reason=value.reason))
            text = declined(f"the switch to {self._to} mode", value.reason) + f" Stay in {self._from} mode."
            return self.finish(ToolOutcome(text, True, self._card(result)))
        return self.fail(no_variant("switch_mode_request_response"))


SWITCH_MODE = ToolDef(
    name="SwitchMode",
    ui_field="switch_mode_tool_call",
    placeholder=agent.SwitchModeToolCall,
    parse=_parse,
    ui=_ui,
    execute=_Switch,
    transport="interaction",
)

TOOLS: tuple[ToolDef, ...] = (SWITCH_MODE,)
