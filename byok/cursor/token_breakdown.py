"""The eight-way context breakdown behind Cursor's context meter.

The total is authoritative: ``used_tokens`` is the last provider call's input + output tokens.
The seven non-conversation categories are local estimates of fixed prompt parts (they stay put
from checkpoint to checkpoint), and ``conversation`` takes whatever remains, so the parts always
sum exactly to the provider's number instead of spreading it proportionally. Estimates only shape
the distribution; they never change the total.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from byok.pb.agent import v1 as agent

# (id, label) in the order Cursor lists them.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("system_prompt", "System prompt"),
    ("tools", "Tool definitions"),
    ("rules", "Rules"),
    ("skills", "Skills"),
    ("mcp", "MCP & dynamic tools"),
    ("subagents", "Subagent definitions"),
    ("summarized_conversation", "Summarized conversation"),
    ("conversation", "Conversation"),
)

# Tokens per 1000 UTF-16 code units, kept integral so estimates are exact and platform-independent.
_ASCII_PER_MILLE = 273
_NON_ASCII_PER_MILLE = 550


def utf16_length(text: str) -> int:
    # Cursor measures in JavaScript string length: characters beyond the BMP count twice.
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def estimate_tokens(text: str) -> int:
    if text.isascii():  # the common case (code, JSON schemas), without a per-character loop
        return len(text) * _ASCII_PER_MILLE // 1000
    ascii_units = sum(1 for ch in text if ch < "\x80")
    other_units = utf16_length(text) - ascii_units
    return (ascii_units * _ASCII_PER_MILLE + other_units * _NON_ASCII_PER_MILLE) // 1000


@attrs.frozen
class BreakdownInput:
    """The projected text of each fixed prompt part, exactly as sent to the model."""

    system_prompt: str
    tools_json: str
    rules: str
    skills: str
    mcp: str
    subagents: str
    summarized: str
    # Size of the ordinary user/assistant/tool content, for display only; None leaves it unreported.
    conversation_chars: int | None = None


@attrs.frozen
class Category:
    id: str
    label: str
    character_count: int | None
    tokens: int


def _largest_remainder(weights: Sequence[int], total: int) -> list[int]:
    """Scale non-negative ``weights`` to integers summing exactly to ``total``.

    Floors of the exact quotas first; the leftover units go to the largest fractional remainders,
    ties to the earlier category so the result is deterministic.
    """
    whole = sum(weights)
    if whole == 0:
        return [0] * len(weights)
    shares = [w * total // whole for w in weights]
    remainders = [w * total % whole for w in weights]
    leftover = total - sum(shares)
    for i in sorted(range(len(weights)), key=lambda i: (-remainders[i], i))[:leftover]:
        shares[i] += 1
    return shares


def breakdown(inp: BreakdownInput, used_tokens: int) -> list[Category]:
    if used_tokens < 0:
        raise ValueError(f"used_tokens must be non-negative, got {used_tokens}")
    texts = (inp.system_prompt, inp.tools_json, inp.rules, inp.skills, inp.mcp, inp.subagents, inp.summarized)
    chars = [utf16_length(t) for t in texts]
    estimates = [estimate_tokens(t) for t in texts]
    if sum(estimates) > used_tokens:
        # Only an anomaly (e.g. a provider that under-reports) gets here; squeeze the fixed parts
        # rather than letting conversation go negative.
        estimates = _largest_remainder(estimates, used_tokens)
    conversation = used_tokens - sum(estimates)
    counts: list[int | None] = [*chars, inp.conversation_chars]
    return [
        Category(id=cid, label=label, character_count=count, tokens=tokens)
        for (cid, label), count, tokens in zip(CATEGORIES, counts, [*estimates, conversation], strict=True)
    ]


def to_proto(
    categories: Sequence[Category], used_tokens: int, max_tokens: int
) -> agent.ConversationTokenDetails:
    if sum(c.tokens for c in categories) != used_tokens:
        # The meter would disagree with its own total; this is a caller bug, not a display detail.
        raise ValueError("breakdown categories do not sum to used_tokens")
    return agent.ConversationTokenDetails(
        used_tokens=used_tokens,
        max_tokens=max_tokens,
        breakdown=agent.PromptTokenBreakdownSnapshot(
            total_used_tokens=used_tokens,
            max_tokens=max_tokens,
            categories=[
                agent.PromptTokenBreakdownCategory(
                    id=c.id, label=c.label, estimated_tokens=c.tokens, character_count=c.character_count
                )
                for c in categories
            ],
        ),
    )
