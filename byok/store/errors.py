"""Errors raised by the conversation store."""

from __future__ import annotations


class StoreError(Exception):
    """The store refused an operation or the database could not serve it."""


class StaleRevision(StoreError):
    """A compare-and-swap on a conversation lost: someone else moved its head first.

    Callers (a superseded Run, a retried request) reload the head and decide again; the store
    never merges, because only the caller knows whether its messages still apply.
    """

    def __init__(self, conversation_id: str, expected_version: int, actual_version: int) -> None:
        super().__init__(
            f"conversation {conversation_id!r} is at version {actual_version}, expected {expected_version}"
        )
        self.conversation_id = conversation_id
        self.expected_version = expected_version
        self.actual_version = actual_version


class RunExists(StoreError):
    """A run row with this request id already exists: request ids are single-use."""

    def __init__(self, request_id: str) -> None:
        super().__init__(f"run {request_id!r} already exists")
        self.request_id = request_id
