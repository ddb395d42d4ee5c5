"""Reading an adapter's own replay state back (shared by the adapters that store lists)."""

from __future__ import annotations

import json
from typing import Any

from byok.model.messages import ReplayState


def saved_list(replay: ReplayState | None, kind: str, key: str) -> list[dict[str, Any]] | None:
    """The list of objects ``key`` in ``replay`` when it was written by adapter ``kind``.

    Another adapter's state (after a provider switch) is not ours to send, and a malformed one
    is treated as absent: the turn is then sent from its canonical text and calls."""
    if replay is None or replay.provider_kind != kind:
        return None
    try:
        obj = json.loads(replay.data)
    except ValueError:
        return None
    value = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        return None
    return value
