"""Bench 6: the prefix meter over the conversations of benchmarks 1, 4 and 5 (run them first)."""

from __future__ import annotations

from tests.bench.common import note
from tests.bench.driver import PREFIX, report


async def test_6_prefix_meter() -> None:
    print("\n[6] prefix meter over the bench conversations with more than one provider request")
    share = 100 * PREFIX.extending / PREFIX.compared if PREFIX.compared else float("nan")
    report(
        "6 prefix",
        f"requests extending the previous one byte for byte ({PREFIX.extending}/{PREFIX.compared})",
        share,
        "%",
        100,
        ">=",
    )
    db_share = 100 * PREFIX.db_extending / PREFIX.db_compared if PREFIX.db_compared else float("nan")
    report(
        "6 prefix",
        f"llm_calls.prefix_extends ({PREFIX.db_extending}/{PREFIX.db_compared})",
        db_share,
        "%",
        100,
        ">=",
    )
    for broken in PREFIX.broken[:5]:
        note(f"6: {broken}")
    assert PREFIX.compared > 0, "no benchmark produced a multi-request conversation"
