"""AppendOrder: BidiAppend messages delivered in append_seqno order, exactly once, bounded."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from byok.run.bidi_order import MAX_BUFFERED, MAX_BUFFERED_BYTES, AppendOrder, OrderBufferFull


def test_in_order_appends_are_delivered_immediately() -> None:
    order: AppendOrder[str] = AppendOrder()
    assert order.offer(0, "a", 1) == ["a"]
    assert order.offer(1, "b", 1) == ["b"]
    assert order.offer(2, "c", 1) == ["c"]
    assert order.next_seqno == 3


def test_numbering_starts_at_zero() -> None:
    order: AppendOrder[str] = AppendOrder()
    assert order.offer(1, "b", 1) == []
    assert order.next_seqno == 0
    assert order.offer(0, "a", 1) == ["a", "b"]


def test_early_appends_are_buffered_and_released_in_seqno_order() -> None:
    order: AppendOrder[str] = AppendOrder()
    assert order.offer(3, "d", 1) == []
    assert order.offer(1, "b", 1) == []
    assert order.offer(0, "a", 1) == ["a", "b"]
    assert order.next_seqno == 2
    assert order.offer(2, "c", 1) == ["c", "d"]
    assert order.next_seqno == 4


def test_duplicate_of_a_delivered_append_is_dropped() -> None:
    order: AppendOrder[str] = AppendOrder()
    order.offer(0, "a", 1)
    assert order.is_duplicate(0)
    assert order.offer(0, "a-again", 1) == []
    assert order.next_seqno == 1
    assert order.offer(1, "b", 1) == ["b"]


def test_duplicate_of_a_buffered_append_is_dropped_and_first_copy_wins() -> None:
    order: AppendOrder[str] = AppendOrder()
    assert order.offer(2, "first", 1) == []
    assert order.is_duplicate(2)
    assert order.offer(2, "second", 1) == []
    assert order.offer(1, "b", 1) == []
    assert order.offer(0, "a", 1) == ["a", "b", "first"]


def test_is_duplicate_is_false_for_unseen_seqnos() -> None:
    order: AppendOrder[str] = AppendOrder()
    assert not order.is_duplicate(0)
    assert not order.is_duplicate(5)
    order.offer(5, "f", 1)
    assert order.is_duplicate(5)
    assert not order.is_duplicate(4)


def test_default_bounds() -> None:
    assert MAX_BUFFERED == 64
    assert MAX_BUFFERED_BYTES == 8 * 1024 * 1024


def test_count_bound_allows_exactly_max_buffered_early_appends() -> None:
    order: AppendOrder[int] = AppendOrder()
    for seqno in range(1, MAX_BUFFERED + 1):
        assert order.offer(seqno, seqno, 1) == []
    with pytest.raises(OrderBufferFull):
        order.offer(MAX_BUFFERED + 1, 0, 1)
    # The in-order append is never refused, and releases the whole buffer.
    assert order.offer(0, 0, 1) == list(range(MAX_BUFFERED + 1))


def test_byte_bound_allows_exactly_max_bytes() -> None:
    order: AppendOrder[str] = AppendOrder()
    half = MAX_BUFFERED_BYTES // 2
    order.offer(1, "b", half)
    order.offer(2, "c", MAX_BUFFERED_BYTES - half)  # exactly at the limit: accepted
    with pytest.raises(OrderBufferFull):
        order.offer(3, "d", 1)


def test_in_order_append_is_not_subject_to_the_byte_bound() -> None:
    order: AppendOrder[str] = AppendOrder(max_bytes=10)
    assert order.offer(0, "big", 1000) == ["big"]


def test_released_appends_free_their_budget() -> None:
    order: AppendOrder[str] = AppendOrder(max_buffered=2, max_bytes=10)
    order.offer(1, "b", 5)
    order.offer(2, "c", 5)
    with pytest.raises(OrderBufferFull):
        order.offer(3, "d", 1)
    assert order.offer(0, "a", 1) == ["a", "b", "c"]
    # Both the count and the byte budget are available again.
    order.offer(4, "e", 5)
    order.offer(5, "f", 5)
    with pytest.raises(OrderBufferFull):
        order.offer(6, "g", 1)


def test_full_buffer_still_drops_duplicates_without_raising() -> None:
    order: AppendOrder[str] = AppendOrder(max_buffered=1)
    order.offer(1, "b", 1)
    assert order.offer(1, "b", 1) == []  # a retry of a buffered append is not "one more"
    assert order.offer(0, "a", 1) == ["a", "b"]
    assert order.offer(0, "a", 1) == []


def test_refused_append_leaves_state_unchanged() -> None:
    order: AppendOrder[str] = AppendOrder(max_buffered=1)
    order.offer(2, "c", 1)
    with pytest.raises(OrderBufferFull):
        order.offer(3, "d", 1)
    assert not order.is_duplicate(3)
    assert order.offer(0, "a", 1) == ["a"]
    assert order.offer(1, "b", 1) == ["b", "c"]
    assert order.offer(3, "d", 1) == ["d"]


def test_clear_drops_buffered_appends_and_frees_budget() -> None:
    order: AppendOrder[str] = AppendOrder(max_buffered=1, max_bytes=10)
    order.offer(0, "a", 1)
    order.offer(2, "c", 10)
    order.clear()
    assert not order.is_duplicate(2)
    assert order.next_seqno == 1  # delivered seqnos stay delivered
    assert order.is_duplicate(0)
    order.offer(3, "d", 10)  # budget is free again
    assert order.offer(1, "b", 1) == ["b"]  # the cleared "c" is not released


@given(
    st.integers(min_value=0, max_value=60).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.permutations(range(n)),
            st.lists(st.tuples(st.integers(0, max(n - 1, 0)), st.integers(0, 2 * n)), max_size=20),
        )
    )
)
def test_any_permutation_with_duplicates_delivers_each_seqno_once_in_order(
    case: tuple[int, list[int], list[tuple[int, int]]],
) -> None:
    n, perm, dups = case
    seqnos = list(perm)
    if n:
        for seqno, position in dups:
            seqnos.insert(min(position, len(seqnos)), seqno)
    order: AppendOrder[str] = AppendOrder()
    delivered: list[str] = []
    for seqno in seqnos:
        delivered += order.offer(seqno, f"item-{seqno}", 10)
    assert delivered == [f"item-{i}" for i in range(n)]
    assert order.next_seqno == n
