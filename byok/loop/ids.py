"""Ids a turn derives from its request id, so a run replayed from its inputs names things alike.

They keep the UUID shape Cursor's own backend uses for model call ids (the client shows them
back to us in tool frames). Request ids are single-use (a reused one ends ``already_exists``),
so ``(request id, kind, n)`` never repeats within a conversation.
"""

from __future__ import annotations

import hashlib


def derived_id(request_id: str, kind: str, n: int) -> str:
    h = bytearray(hashlib.sha256(f"{request_id}\x00{kind}\x00{n}".encode()).digest()[:16])
    h[6] = (h[6] & 0x0F) | 0x80  # version 8: a custom (name-derived) UUID, RFC 9562
    h[8] = (h[8] & 0x3F) | 0x80
    x = h.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


def model_call_id(request_id: str, n: int) -> str:
    """The run's ``n``-th provider call (from 1)."""
    return derived_id(request_id, "model-call", n)


def tool_round_id(request_id: str, n: int) -> str:
    """The tool round opened by the run's ``n``-th provider call."""
    return derived_id(request_id, "tool-round", n)
