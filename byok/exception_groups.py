"""What a task group raised, when it is all of one kind.

trio's nurseries wrap what their tasks raise in exception groups, nested as deep as the nurseries
are. A command that turns one kind of failure into a one-line message needs that failure
whether it came alone or wrapped, and nothing else mixed in.
"""

from __future__ import annotations

Kinds = type[BaseException] | tuple[type[BaseException], ...]


def sole(e: BaseException, kinds: Kinds) -> BaseException | None:
    """The first exception ``e`` holds (``e`` itself, or the first leaf of its groups) when every
    one of them is one of ``kinds``; else None."""
    leaves = _leaves(e)
    return leaves[0] if leaves and all(isinstance(leaf, kinds) for leaf in leaves) else None


def first_except(e: BaseException, ignored: Kinds) -> BaseException | None:
    """The first exception ``e`` holds (itself, or a leaf of its groups) that is not one of
    ``ignored``; None when there is none."""
    return next((leaf for leaf in _leaves(e) if not isinstance(leaf, ignored)), None)


def _leaves(e: BaseException) -> list[BaseException]:
    if isinstance(e, BaseExceptionGroup):
        return [leaf for inner in e.exceptions for leaf in _leaves(inner)]
    return [e]
