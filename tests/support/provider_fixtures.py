"""Where the provider parser tests find recorded streams, and a whole-stream parse.

Each kind has the project's own small fixtures (tests/fixtures/<kind>) and, when the sessions'
``../shared`` sits beside the repository (or ``BYOK_SHARED_FIXTURES`` names it), the recorded
real streams; those tests skip on a fresh clone without it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from byok.model.events import ModelEvent
from byok.providers.runner import StreamParser

_OWN = Path(__file__).resolve().parents[1] / "fixtures"
_DEFAULT_SHARED = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "providers"


def own_fixtures(kind: str) -> Path:
    return _OWN / kind


def shared_fixtures(kind: str) -> Path:
    return Path(os.environ.get("BYOK_SHARED_FIXTURES", _DEFAULT_SHARED)) / kind


def parse_all(new_parser: Callable[[], StreamParser], chunks: tuple[bytes, ...]) -> list[ModelEvent]:
    """Every event a fresh parser gives for ``chunks``, fed one by one, then its end."""
    parser = new_parser()
    out: list[ModelEvent] = []
    for c in chunks:
        out += parser.feed(c)
    return out + parser.end()
