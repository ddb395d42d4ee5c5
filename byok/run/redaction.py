"""Keeping API keys out of stored request bodies.

byok's own request bodies never carry keys (they travel in headers, which are never stored);
this is the second line of defence for what ``extra_body`` or a provider's shape might add.
Every string value under a key named like api_key / x-api-key / authorization is replaced, at
any depth, and a cheap pre-check on the JSON text spares walking a 5,000-message body. What
the provider sends back is cleaned of the configured keys themselves where it comes in
(``byok.providers.secrets``, applied by ``runner.stream_call``), with the same marker.
"""

from __future__ import annotations

import json
import re
from typing import Any

from byok.providers.secrets import REDACTED


def secret_key(key: str) -> bool:
    k = key.lower().replace("-", "_")
    return k.endswith("api_key") or k == "apikey" or k.endswith("authorization")


def redact(obj: Any) -> tuple[Any, bool]:
    if isinstance(obj, dict):
        changed = False
        out: dict[str, Any] = {}
        for key, value in obj.items():
            if isinstance(value, str) and isinstance(key, str) and secret_key(key):
                out[key] = REDACTED
                changed = changed or value != REDACTED
            else:
                out[key], sub = redact(value)
                changed = changed or sub
        return out, changed
    if isinstance(obj, list):
        items = [redact(v) for v in obj]
        return [v for v, _ in items], any(c for _, c in items)
    return obj, False


def redact_body(body: bytes) -> bytes | None:
    """``body`` with every string value under a key named like api_key / x-api-key /
    authorization replaced by ``[REDACTED]``, at any depth. Unchanged bytes when there is none
    (so the stored request replays exactly); None when the body is not JSON and so cannot be
    checked. Our request bodies never carry keys: this is a second line of defence."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return _redacted_body(body, obj)


def _redacted_body(body: bytes, obj: Any) -> bytes:
    if not may_hold_secret(body):
        return body  # no key can match: skip walking a 5,000-message request
    redacted, changed = redact(obj)
    if not changed:
        return body
    return json.dumps(redacted, ensure_ascii=False, separators=(",", ":")).encode()


# What a key secret_key accepts looks like in JSON text once lowercased: ending in api_key /
# api-key / authorization or being apikey, then its closing quote and a colon (inside a string a
# quote is escaped, so text that merely mentions api_key does not match). A key could also be
# spelled with \u escapes: any escape but a control character's (the only ones
# ensure_ascii=False writes) may be one.
_KEY_NEEDLES = (b'api_key"', b'api-key"', b'apikey"', b'authorization"')
_SECRET_KEY = re.compile(rb'(?:api[_-]?key|authorization)"[ \t\n\r]*:')
_KEY_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u(?!00[01])")
_KELVIN = "\u212a".encode()  # str.lower() makes it "k"; bytes.lower() does not


def may_hold_secret(data: bytes) -> bool:
    """Whether JSON text ``data`` may have a key secret_key accepts (no false negatives)."""
    if b"\\u" in data and _KEY_ESCAPE.search(data) is not None:
        return True
    low = data.decode("utf-8", "replace").lower().encode() if _KELVIN in data else data.lower()
    return any(needle in low for needle in _KEY_NEEDLES) and _SECRET_KEY.search(low) is not None
