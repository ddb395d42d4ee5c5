"""Token usage as providers report it. Nothing here is estimated."""

from __future__ import annotations

import attrs


@attrs.frozen
class Usage:
    # Total prompt tokens including cached reads and writes (CLARIFICATIONS §6).
    input_tokens: int
    # Output tokens including reasoning tokens.
    output_tokens: int
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None

    def __add__(self, other: Usage) -> Usage:
        def opt(a: int | None, b: int | None) -> int | None:
            return None if a is None and b is None else (a or 0) + (b or 0)

        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            opt(self.cache_read_tokens, other.cache_read_tokens),
            opt(self.cache_write_tokens, other.cache_write_tokens),
            opt(self.reasoning_tokens, other.reasoning_tokens),
        )
