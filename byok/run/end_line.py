"""The one log line a finished run writes: who it was, how it ended, what it cost, how fast."""

from __future__ import annotations

import logging

from byok.loop.turn_values import Canceled, Failed, Outcome
from byok.model.usage import Usage


def outcome_text(outcome: Outcome) -> str:
    if isinstance(outcome, Failed):
        return f"failed {outcome.code}: {outcome.message}"
    return "canceled" if isinstance(outcome, Canceled) else "ok"


def usage_text(usage: Usage | None) -> str:
    if usage is None:
        return "no usage reported"
    text = f"tokens in {usage.input_tokens:,}"
    if usage.cache_read_tokens is not None and usage.input_tokens:
        text += f" ({usage.cache_read_tokens / usage.input_tokens:.0%} cached)"
    return f"{text}, out {usage.output_tokens:,}"


def end_line(
    request_id: str,
    conversation_id: str,
    model_id: str,
    outcome: Outcome,
    usage: Usage | None,
    ttft_s: float | None,
    duration_s: float,
) -> str:
    ttft = "no output" if ttft_s is None else f"TTFT {ttft_s:.2f}s"
    return (
        f"run {request_id} (conversation {conversation_id}, model {model_id}): {outcome_text(outcome)}; "
        f"{usage_text(usage)}; {ttft}; {duration_s:.2f}s"
    )


def end_level(outcome: Outcome) -> int:
    """A provider's or the client's failure is a warning; byok's own is an error."""
    if isinstance(outcome, Failed):
        return logging.ERROR if outcome.code == "internal" else logging.WARNING
    return logging.INFO
