from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from byok.cursor.token_breakdown import (
    CATEGORIES,
    BreakdownInput,
    Category,
    breakdown,
    estimate_tokens,
    to_proto,
    utf16_length,
)
from byok.pb.agent import v1 as agent


def inp(**texts: str) -> BreakdownInput:
    fields = dict.fromkeys(
        ("system_prompt", "tools_json", "rules", "skills", "mcp", "subagents", "summarized"), ""
    )
    return BreakdownInput(**{**fields, **texts})


def test_estimates() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("x" * 1000) == 273
    assert estimate_tokens("é" * 1000) == 550
    assert estimate_tokens("😀" * 500) == 550  # two UTF-16 code units each
    assert estimate_tokens("x" * 500 + "中" * 500) == (500 * 273 + 500 * 550) // 1000
    assert utf16_length("a😀é") == 4


def test_ids_labels_and_remainder_to_conversation() -> None:
    parts = inp(system_prompt="s" * 3372, tools_json="t" * 40174, rules="r" * 100, summarized="é" * 10)
    cats = breakdown(parts, 44492)
    assert [(c.id, c.label) for c in cats] == list(CATEGORIES)
    assert [c.id for c in cats] == [
        "system_prompt",
        "tools",
        "rules",
        "skills",
        "mcp",
        "subagents",
        "summarized_conversation",
        "conversation",
    ]
    by_id = {c.id: c for c in cats}
    assert by_id["system_prompt"] == Category("system_prompt", "System prompt", 3372, 920)
    assert by_id["tools"].tokens == estimate_tokens("t" * 40174)
    assert by_id["summarized_conversation"].character_count == 10
    assert by_id["conversation"].tokens == 44492 - sum(c.tokens for c in cats[:-1])
    assert by_id["conversation"].character_count is None
    assert breakdown(inp(), 10)[-1].tokens == 10  # nothing fixed: all of it is conversation


def test_conversation_chars_reported_when_given() -> None:
    cats = breakdown(BreakdownInput("", "", "", "", "", "", "", conversation_chars=1234), 5)
    assert cats[-1].character_count == 1234


def test_overflow_scales_fixed_parts_by_largest_remainder() -> None:
    # Estimates 273, 273, 2 (sum 548) squeezed into 100: quotas 49.8, 49.8, 0.36 -> 50, 50, 0.
    cats = breakdown(inp(system_prompt="x" * 1000, tools_json="y" * 1000, rules="z" * 10), 100)
    assert [c.tokens for c in cats] == [50, 50, 0, 0, 0, 0, 0, 0]
    assert cats[0].character_count == 1000  # sizes stay true; only token estimates are scaled
    assert [c.tokens for c in breakdown(inp(system_prompt="x" * 1000), 0)] == [0] * 8


def test_negative_total_rejected() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        breakdown(inp(), -1)


texts = st.text(max_size=1500)


@given(
    parts=st.builds(
        BreakdownInput,
        system_prompt=texts,
        tools_json=texts,
        rules=texts,
        skills=texts,
        mcp=texts,
        subagents=texts,
        summarized=texts,
    ),
    used=st.integers(min_value=0, max_value=3000),
)
def test_parts_always_sum_exactly(parts: BreakdownInput, used: int) -> None:
    cats = breakdown(parts, used)
    assert len(cats) == 8
    assert sum(c.tokens for c in cats) == used
    assert all(c.tokens >= 0 for c in cats)
    fixed = [
        estimate_tokens(t)
        for t in (
            parts.system_prompt,
            parts.tools_json,
            parts.rules,
            parts.skills,
            parts.mcp,
            parts.subagents,
            parts.summarized,
        )
    ]
    if sum(fixed) <= used:
        assert [c.tokens for c in cats[:-1]] == fixed
    else:
        assert cats[-1].tokens == 0
        assert all(c.tokens <= f for c, f in zip(cats, fixed, strict=False))
    assert breakdown(parts, used) == cats


def test_proto_round_trip() -> None:
    cats = breakdown(inp(system_prompt="s" * 400, rules="r" * 40), 1000)
    details = to_proto(cats, 1000, 256000)
    decoded = agent.ConversationTokenDetails.parse(bytes(details))
    assert decoded == details
    assert (decoded.used_tokens, decoded.max_tokens) == (1000, 256000)
    snap = decoded.breakdown
    assert snap is not None
    assert (snap.total_used_tokens, snap.max_tokens) == (1000, 256000)
    assert [(c.id, c.label, c.estimated_tokens, c.character_count) for c in snap.categories] == [
        (c.id, c.label, c.tokens, c.character_count) for c in cats
    ]


def test_proto_rejects_inconsistent_total() -> None:
    with pytest.raises(ValueError, match="do not sum"):
        to_proto(breakdown(inp(), 10), 11, 100)
