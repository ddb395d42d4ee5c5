"""Notes tools give the turn about the conversation's mode (sans-IO values)."""

from __future__ import annotations

import attrs


@attrs.frozen
class ModeSwitch:
    """The user approved a switch to ``mode`` (a mode directory name): the turn's next model call
    uses its prompt and tools, and checkpoints record it."""

    mode: str
