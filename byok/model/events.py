"""ModelEvent: what a provider adapter's parser yields, whatever the endpoint.

Failures are never events: a parser raises ``ProviderError``. A stream yields exactly one
``UsageReported`` and ends with exactly one ``Done``.
"""

from __future__ import annotations

from typing import Literal

import attrs

from byok.model.messages import ReplayState
from byok.model.usage import Usage


@attrs.frozen
class Started:
    pass


@attrs.frozen
class TextDelta:
    text: str


@attrs.frozen
class ThinkingDelta:
    text: str


@attrs.frozen
class ThinkingEnded:
    pass


@attrs.frozen
class ToolCallStarted:
    index: int
    call_id: str
    name: str


@attrs.frozen
class ToolCallArgsDelta:
    index: int
    delta: str


@attrs.frozen
class ToolCallEnded:
    index: int
    arguments: str  # the complete argument text


@attrs.frozen
class UsageReported:
    usage: Usage


@attrs.frozen
class Done:
    reason: Literal["stop", "tool_use"]
    # Adapter-owned continuation state to store on the assistant message, if any.
    replay: ReplayState | None = None


ModelEvent = (
    Started
    | TextDelta
    | ThinkingDelta
    | ThinkingEnded
    | ToolCallStarted
    | ToolCallArgsDelta
    | ToolCallEnded
    | UsageReported
    | Done
)


class ProviderError(Exception):
    """A provider call failed: HTTP status, in-stream error, truncation, length, bad JSON...

    ``retryable`` is true only for failures a retry may fix (408/425/429/5xx, connection
    errors) and only matters before any output reached the client.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        retry_after_s: float | None = None,
        output_limit: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        # The answer stopped at the output token limit: a larger max_output_tokens may fix it.
        self.output_limit = output_limit
