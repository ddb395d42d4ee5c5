"""CacheBudget: one byte budget over every conversation's caches, least recently used first,
never a pinned (running) conversation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from byok.cache_budget import CacheBudget


def test_charges_add_up_per_part_and_replace_the_part_they_name() -> None:
    b = CacheBudget(100)
    b.charge("a", "history", 30)
    b.charge("a", "render", 10)
    b.charge("a", "history", 20)  # the history shrank (an edit): the part is replaced
    assert (b.size_of("a"), b.total) == (30, 30)
    b.charge("a", "render", 0)
    assert (b.size_of("a"), b.total, "a" in b) == (20, 20, True)
    with pytest.raises(ValueError):
        b.charge("a", "history", -1)
    with pytest.raises(ValueError):
        CacheBudget(0)


def test_past_the_budget_the_least_recently_used_go_first() -> None:
    b = CacheBudget(100)
    for owner in "abc":
        b.charge(owner, "history", 30)
    assert b.evict() == []  # 90 of 100
    b.touch("a")  # a was used again: b is now the oldest
    b.charge("d", "history", 30)  # 120
    assert b.evict() == ["b"]
    assert (b.total, b.lru_order()) == (90, ["c", "a", "d"])
    b.charge("c", "render", 5)  # charging c makes it the most recent
    b.charge("e", "history", 50)
    assert b.evict() == ["a", "d"]  # until it fits: 145 - 30 - 30 = 85
    assert b.lru_order() == ["c", "e"]


def test_a_pinned_conversation_is_never_evicted_however_large() -> None:
    b = CacheBudget(100)
    b.charge("idle", "history", 10)
    b.pin("long")
    b.charge("long", "history", 500)  # one long conversation, larger than the whole budget
    assert b.evict() == ["idle"]  # everything else goes; it stays while it runs
    assert b.lru_order() == ["long"] and b.total == 500
    b.pin("long")  # two runs (a preempted one still ending)
    b.unpin("long")
    assert b.evict() == [] and b.pinned("long")
    b.unpin("long")
    assert b.evict() == ["long"] and b.total == 0  # once idle, it cannot fit: it goes


def test_a_thousand_idle_conversations_cost_no_more_than_the_budget() -> None:
    b = CacheBudget(10_000)
    evicted: list[str] = []
    for i in range(1000):
        b.charge(f"c{i}", "history", 97)
        b.charge(f"c{i}", "memory", 3)
        evicted += b.evict()
        assert b.total <= b.max_bytes
    assert len(b) == 100 and evicted == [f"c{i}" for i in range(900)]  # the oldest went, in order


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["charge", "touch", "pin", "unpin", "evict"]),
            st.integers(0, 5),
            st.integers(0, 60),
        ),
        max_size=60,
    )
)
def test_the_total_is_the_sum_of_the_charges_and_evict_keeps_the_bound(
    ops: list[tuple[str, int, int]],
) -> None:
    b = CacheBudget(100)
    pins: dict[str, int] = {}
    for op, n, size in ops:
        owner = f"c{n}"
        if op == "charge":
            b.charge(owner, "part", size)
        elif op == "touch":
            b.touch(owner)
        elif op == "pin":
            b.pin(owner)
            pins[owner] = pins.get(owner, 0) + 1
        elif op == "unpin" and pins.get(owner):
            b.unpin(owner)
            pins[owner] -= 1
        elif op == "evict":
            before = b.lru_order()
            gone = b.evict()
            assert not any(pins.get(o) for o in gone)
            assert gone == [o for o in before if o in gone]  # least recently used first
            pinned_total = sum(b.size_of(o) for o in b.lru_order() if pins.get(o))
            assert b.total <= max(b.max_bytes, pinned_total)
        assert b.total == sum(b.size_of(o) for o in b.lru_order())
