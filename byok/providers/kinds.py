"""The provider kinds: what a configured provider's ``kind`` names, and the tag on the replay
state its adapter saves (an adapter sends back only state with its own tag)."""

from __future__ import annotations

from typing import Final

OPENAI_CHAT: Final = "openai_chat"
OPENAI_RESPONSES: Final = "openai_responses"
ANTHROPIC: Final = "anthropic"
