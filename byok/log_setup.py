"""The daemon's log: its level (``--log-level`` or ``$BYOK_LOG_LEVEL``, any case) and format."""

from __future__ import annotations

import logging
from typing import Final

LEVELS: Final = ("debug", "info", "warning", "error")
DEFAULT_LEVEL: Final = "info"


class LogLevelError(ValueError):
    """A level name byok does not know; the message names the levels it does."""


def parse_level(text: str, where: str) -> int:
    """``text`` as a logging level (``warn`` and ``critical`` too); ``where`` names its source."""
    name = text.strip().lower()
    name = {"warn": "warning", "critical": "error"}.get(name, name)
    if name not in LEVELS:
        raise LogLevelError(f"{where}: unknown log level {text!r} (expected one of: {', '.join(LEVELS)})")
    return int(getattr(logging, name.upper()))


def configure_logging(level: int) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level)
    # httpx logs every request at INFO: each provider call and each request relayed to Cursor's
    # backend (hundreds an hour), with its whole URL. byok logs what goes wrong itself.
    logging.getLogger("httpx").setLevel(logging.NOTSET if level <= logging.DEBUG else logging.WARNING)
