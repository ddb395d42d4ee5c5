"""What a reloaded config (SIGHUP) changes in a running daemon, and what waits for a restart.

Providers, models, ``[models_list]`` and ``[logging]`` take effect for the runs that start
after the reload; a run already going keeps the config it started with. ``[server]`` (the
listen address, the data dir, the limits objects were built with), ``[proxy]``, ``[search]`` and
``[images]`` (the tools each mode offers follow from them) are the process's own: a change there
is reported and applied at the next start.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from byok.config import Config


def _changes(section: str, old: Sequence[object], new: Sequence[object]) -> list[str]:
    by_id_old = {item.id: item for item in old}  # type: ignore[attr-defined]
    by_id_new = {item.id: item for item in new}  # type: ignore[attr-defined]
    added = [i for i in by_id_new if i not in by_id_old]
    removed = [i for i in by_id_old if i not in by_id_new]
    changed = [i for i in by_id_new if i in by_id_old and by_id_old[i] != by_id_new[i]]
    parts = [
        f"{what} {', '.join(ids)}"
        for what, ids in (("added", added), ("removed", removed), ("changed", changed))
        if ids
    ]
    return [f"{section}: {'; '.join(parts)}"] if parts else []


def _restart_needed(old: Config, new: Config) -> list[str]:
    keys = [
        f"[server] {field.name}"
        for field in attrs.fields(type(old.server))
        if getattr(old.server, field.name) != getattr(new.server, field.name)
    ]
    keys += [
        f"[proxy] {field.name}"
        for field in attrs.fields(type(old.proxy))
        if getattr(old.proxy, field.name) != getattr(new.proxy, field.name)
    ]
    # The tools a mode offers follow from which backends exist (daemon.py, at start).
    keys += [f"[{name}]" for name in ("search", "images") if getattr(old, name) != getattr(new, name)]
    return keys


def reload_plan(old: Config, new: Config) -> tuple[Config, list[str]]:
    """The config the daemon runs on from now (``new``, with the running ``[server]``,
    ``[proxy]``, ``[search]`` and ``[images]``), and one line per change for the log."""
    effective = attrs.evolve(new, server=old.server, proxy=old.proxy, search=old.search, images=old.images)
    lines = _changes("providers", old.providers, new.providers) + _changes("models", old.models, new.models)
    if old.models_list != new.models_list:
        lines.append("[models_list] changed")
    if old.logging != new.logging:
        lines.append("[logging] changed")
    later = _restart_needed(old, new)
    if later:
        lines.append(f"kept until a restart: {', '.join(later)} changed")
    return effective, lines
