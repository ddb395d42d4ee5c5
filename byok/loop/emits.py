"""What the loop asks the client to show: provider-neutral UI events.

The Cursor dialect (cursor/encode.py) turns each into an AgentServerMessage.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class TextOut:
    text: str


@attrs.frozen
class ThinkingOut:
    text: str


@attrs.frozen
class ThinkingDone:
    duration_ms: int


@attrs.frozen
class TokensOut:
    tokens: int


@attrs.frozen
class ToolCallOpened:
    """The model started a tool call: the client draws a typed placeholder card."""

    call_id: str
    name: str
    model_call_id: str


@attrs.frozen
class ToolArgsOut:
    call_id: str
    name: str
    delta: str
    model_call_id: str


@attrs.frozen
class SummaryStarted:
    """A compaction's summary begins (it replaces the text deltas while it streams)."""


@attrs.frozen
class SummaryOut:
    text: str


@attrs.frozen
class SummaryDone:
    """The summary is committed: the history now starts with it."""


Emit = (
    TextOut
    | ThinkingOut
    | ThinkingDone
    | TokensOut
    | ToolCallOpened
    | ToolArgsOut
    | SummaryStarted
    | SummaryOut
    | SummaryDone
)
