"""The provider kinds the fault injection runs (tests/integration/test_fault_injection.py): one
fake provider serves them all, a conversation keeps one kind."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs

from tests.support.fake_provider import (
    Script,
    anthropic_text_script,
    anthropic_tool_script,
    chat_text_script,
    chat_tool_script,
    responses_text_script,
    responses_tool_script,
)

Calls = list[tuple[str, str, str]]


@attrs.frozen
class Kind:
    """One provider kind under test: the model that names it, its scripts, and where in a text
    script the first output and the finish are (for cuts before and after them)."""

    name: str
    model: str
    finish_marker: bytes  # in the chunk that finishes a text stream (finish, usage, stop)
    # The same provider and upstream model with a window small enough to compact (SMALL_WINDOW).
    small_model: str = ""

    def text(
        self,
        texts: list[str],
        *,
        delay_s: float = 0.0,
        think: str | None = None,
        usage: tuple[int, int] = (10, 5),
    ) -> Script:
        return _TEXT[self.name](texts, delay_s=delay_s, usage=usage, **self._reasoning(think))

    def tools(
        self,
        calls: Calls,
        *,
        delay_s: float = 0.0,
        think: str | None = None,
        usage: tuple[int, int] = (10, 5),
    ) -> Script:
        # Chat's tool script has no reasoning to give.
        reasoning = self._reasoning(think) if self.name != "openai_chat" else {}
        return _TOOLS[self.name](calls, delay_s=delay_s, usage=usage, **reasoning)

    def _reasoning(self, think: str | None) -> dict[str, Any]:
        """The script arguments of a reasoning ``think`` (with a signature, or encrypted content,
        named after it where the kind replays one)."""
        if think is None:
            return {}
        if self.name == "anthropic":
            return {"thinking": [think], "signature": f"sig-{think}"}
        if self.name == "openai_responses":
            return {"reasoning": [think], "encrypted": f"sig-{think}"}
        return {"reasoning": [think]}

    def first_output(self, script: Script, texts: list[str]) -> int:
        """The index of the chunk carrying ``texts[0]`` first: what comes before it shows nothing."""
        piece = json.dumps(texts[0])[1:-1].encode()
        return next(i for i, chunk in enumerate(script.chunks) if piece in chunk)

    def finish_at(self, script: Script) -> int:
        return next(i for i, chunk in enumerate(script.chunks) if self.finish_marker in chunk)


_TEXT: dict[str, Callable[..., Script]] = {
    "openai_chat": chat_text_script,
    "openai_responses": responses_text_script,
    "anthropic": anthropic_text_script,
}
_TOOLS: dict[str, Callable[..., Script]] = {
    "openai_chat": chat_tool_script,
    "openai_responses": responses_tool_script,
    "anthropic": anthropic_tool_script,
}

# A conversation's kind is fixed: conversation i runs on KINDS[i % 3].
KINDS = (
    Kind("openai_chat", "byok-demo", b'"finish_reason":"stop"', "byok-demo-small"),
    Kind("openai_responses", "byok-responses", b"response.completed", "byok-responses-small"),
    Kind("anthropic", "byok-anthropic", b"message_delta", "byok-anthropic-small"),
)
# The small models' window: 16,000 less a tenth and the 8,192 tokens kept for the answer leaves
# 6,208 (loop/compaction.context_limit). A call reporting BIG_USAGE makes the next request pass
# it; the scripts' default usage (15 tokens) and a runtime message stay far below.
SMALL_WINDOW = 16000
SMALL_LIMIT = 6208
BIG_USAGE = (7000, 10)
MODELS = """
[[providers]]
id = "fake-responses"
kind = "openai_responses"
base_url = "{url}"
api_key = "sk-test"

[[providers]]
id = "fake-anthropic"
kind = "anthropic"
base_url = "{url}"
api_key = "sk-test"

[[models]]
id = "byok-responses"
provider = "fake-responses"
upstream_model = "gpt-test"
context_tokens = 128000

[[models]]
id = "byok-anthropic"
provider = "fake-anthropic"
upstream_model = "claude-test"
context_tokens = 128000

[[models]]
id = "byok-demo-small"
provider = "fake"
upstream_model = "gpt-test"
context_tokens = 16000

[[models]]
id = "byok-responses-small"
provider = "fake-responses"
upstream_model = "gpt-test"
context_tokens = 16000

[[models]]
id = "byok-anthropic-small"
provider = "fake-anthropic"
upstream_model = "claude-test"
context_tokens = 16000
"""


def kind_of(conv: str) -> Kind:
    """A conversation's kind: the loop's conversation i ("fi-conv-i") runs on KINDS[i % 3], any
    other (the pinned tests') on Chat."""
    index = conv.rsplit("-", 1)[-1]
    return KINDS[int(index) % len(KINDS)] if conv.startswith("fi-conv-") and index.isdigit() else KINDS[0]
