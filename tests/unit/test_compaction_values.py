"""The compaction values the run decides with (loop/compaction.py)."""

from __future__ import annotations

from byok.loop import compaction
from byok.model.messages import Message


def user(text: str) -> Message:
    return Message(role="user", origin="runtime", text=text)


def answer(text: str) -> Message:
    return Message(role="assistant", origin="assistant", text=text)


def test_the_limit_leaves_room_for_the_answer_and_the_estimates_error() -> None:
    assert compaction.context_limit(200_000, 16_000) == 164_000
    assert compaction.context_limit(128_000, None) == 115_200 - 8_192
    assert compaction.context_limit(8_000, None) == 0  # a window smaller than the reserve


def test_a_new_message_is_kept_after_the_summary() -> None:
    history = (user("q1"), answer("a1"), user("q2"))
    assert compaction.kept_tail(history) == 2
    assert compaction.kept_tail((*history, answer("a2"))) == 4


def test_compacting_is_worth_it_only_when_the_new_message_fits_alone() -> None:
    assert compaction.worth_compacting((user("q1"), answer("a1"), user("q2")), limit=100)
    assert not compaction.worth_compacting((user("q"),), limit=100)  # nothing before it
    assert not compaction.worth_compacting((user("q1"), answer("a1"), user("y" * 600)), limit=100)


def test_a_summary_carries_its_count_and_its_text_back() -> None:
    summary = compaction.summary_message("  what happened  ", "req-9", 2)
    assert summary.origin == "summary" and summary.role == "user"
    assert compaction.summary_text(summary) == "what happened"
    assert compaction.summary_count((summary, user("next"))) == 2
    assert compaction.summary_count((user("no summary"),)) == 0
