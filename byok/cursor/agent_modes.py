"""Which mode a run runs in: its prompt, runtime template and tools (``prompt/modes/<mode>/``).

``UserMessage.mode`` wins over the restored checkpoint's mode (the user may just have switched);
the checkpoint's mode serves the actions that carry no user message (a resume, a background
completion). A run request naming a subagent type (``subagent_type_name``) runs the subagent
set whatever its message says. Modes byok ships no assets for (TRIAGE, PROJECT, values newer
than this schema) are refused by name: running them as the agent would hand the model tools
and instructions the user did not pick.
"""

from __future__ import annotations

from byok.pb.agent import v1 as agent

# The wire's mode value, for the run layer (which imports no protobuf module).
AgentMode = agent.AgentMode

# Every mode directory the daemon needs; a missing one stops start-up (no fallback between modes).
REQUIRED_MODES = ("agent", "ask", "plan", "debug", "multitask", "subagent", "compaction")
SUBAGENT = "subagent"
COMPACTION = "compaction"

# The modes a user picks in Cursor, by the wire value.
_USER_MODES = {
    agent.AgentMode.UNSPECIFIED: "agent",
    agent.AgentMode.AGENT: "agent",
    agent.AgentMode.ASK: "ask",
    agent.AgentMode.PLAN: "plan",
    agent.AgentMode.DEBUG: "debug",
    agent.AgentMode.MULTITASK: "multitask",
}


class UnknownModeError(ValueError):
    """A mode byok has no assets for; the message names it and the modes byok has."""


def mode_label(mode: agent.AgentMode | int) -> str:
    """The mode as the user would recognise it: its schema name, else its number."""
    name = agent.AgentMode(int(mode)).name  # "" for a value newer than this schema
    return name or f"{int(mode)} (unknown to byok)"


def mode_name(mode: agent.AgentMode) -> str:
    """The asset directory of a wire mode; UnknownModeError for one byok does not run."""
    name = _USER_MODES.get(mode)
    if name is None:
        offered = ", ".join(dict.fromkeys(_USER_MODES.values()))
        raise UnknownModeError(
            f"byok does not run mode {mode_label(mode)}; switch the chat to one of: {offered}"
        )
    return name


def run_mode(mode: agent.AgentMode, subagent_type: str) -> str:
    """The asset directory a run uses: the subagent set for a subagent's run, else its mode's."""
    return SUBAGENT if subagent_type else mode_name(mode)


def mode_value(name: str) -> agent.AgentMode:
    """The AgentMode a checkpoint records for a mode the run switched to by name."""
    for value, mode in _USER_MODES.items():
        if mode == name and value != agent.AgentMode.UNSPECIFIED:
            return value
    raise ValueError(f"no AgentMode for mode {name!r}")
