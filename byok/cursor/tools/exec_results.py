"""Helpers for mapping a client's typed Exec result to a ToolOutcome, shared by tool modules.

Success or failure is decided only by which oneof variant the client set, never by looking at
text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import betterproto2

from byok.cursor.tools.base import OneShot, ToolOutcome
from byok.pb.agent import v1 as agent

_UINT32_MAX = 2**32 - 1


def typed_one_shot(
    exec_message: agent.ExecServerMessage,
    expected: str,
    on_value: Callable[[Any], ToolOutcome],
    on_failure: Callable[[str], ToolOutcome],
) -> OneShot:
    """A OneShot whose answer must be the ExecClientMessage variant ``expected``.

    Any other variant is a protocol error reported to the model; it is never interpreted.
    """

    def on_result(msg: agent.ExecClientMessage) -> ToolOutcome:
        field, value = betterproto2.which_one_of(msg, "message")
        if field != expected or value is None:
            return on_failure(f"protocol error: expected {expected}, got {field or 'an empty message'}")
        return on_value(value)

    return OneShot(exec_message, on_result, on_failure)


def variant(message: betterproto2.Message, group: str = "result") -> tuple[str, Any]:
    """(field name, value) of a oneof; ("", None) when the client set none."""
    return betterproto2.which_one_of(message, group)


def no_variant(result_field: str) -> str:
    return f"protocol error: {result_field} carries no result"


def with_detail(base: str, detail: str) -> str:
    return f"{base}: {detail}" if detail else f"{base}."


def uint32(value: int) -> int:
    return max(0, min(value, _UINT32_MAX))


def path_of(value: Any, fallback: str) -> str:
    """The path a result variant names, or ``fallback`` when it names none."""
    return getattr(value, "path", "") or fallback
