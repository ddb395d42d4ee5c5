"""Keeping configured keys out of what a provider says back.

A provider may echo the key it was sent: a 401 saying ``Incorrect API key provided: <key>``
went, in clear, into the call record (SQLite and its WAL), the daemon's log and the EndStream
Cursor shows. Every configured secret (the api_key, inline or from api_key_env, and every
``[providers.headers]`` value) is replaced by REDACTED in provider text before anything else
sees it: ``runner.stream_call`` applies it to each ProviderError it raises and to the captured
response. Sans-IO: values in, values out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import AnyStr
from urllib.parse import quote

from byok.model.events import ProviderError

REDACTED = "[REDACTED]"
# Shorter values are not credentials (the "none", "EMPTY" or "ollama" keyless local servers
# accept), and replacing every occurrence of a short word would garble the provider's message.
MIN_SECRET_CHARS = 8
# A text cut short (a message truncated at 500 characters, a capture at its cap) may hold the
# start of a key only: a run of this many of its first characters or more is redacted too.
PARTIAL_CHARS = 12


def provider_secrets(api_key: str | None, headers: Iterable[tuple[str, str]] = ()) -> tuple[str, ...]:
    """The forms a provider's configured secrets may take in its text (as sent, JSON-escaped,
    URL-encoded), longest first, so a longer one is replaced before a shorter one inside it."""
    values = [api_key or ""]
    for _, value in headers:
        # "Bearer <token>", "Basic <credentials>": the token may come back alone.
        values += [value, *value.split(None, 1)[1:]]
    forms: set[str] = set()
    for value in values:
        value = value.strip()
        if len(value) < MIN_SECRET_CHARS:
            continue
        escaped = json.dumps(value)[1:-1]
        forms.update((value, escaped, escaped.replace("/", "\\/"), quote(value, safe="")))
    return tuple(sorted(forms, key=lambda s: (-len(s), s)))


def redact_text(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        text = _redact(text, secret, REDACTED)
    return text


def redact_bytes(data: bytes, secrets: tuple[str, ...]) -> bytes:
    marker = REDACTED.encode()
    for secret in secrets:
        data = _redact(data, secret.encode(), marker)
    return data


def redact_error(e: ProviderError, secrets: tuple[str, ...]) -> ProviderError:
    """``e`` with its message redacted, in place (its traceback and cause stay as they were)."""
    if secrets:
        e.message = redact_text(e.message, secrets)
        e.args = (e.message,)
    return e


def _redact(text: AnyStr, secret: AnyStr, marker: AnyStr) -> AnyStr:
    """Every run of ``text`` that is ``secret`` or its first PARTIAL_CHARS characters or more,
    replaced by ``marker``."""
    head = secret[:PARTIAL_CHARS]
    at = text.find(head)
    if at < 0:
        return text  # the usual case: one memchr-speed scan
    parts = []
    done = 0
    while at >= 0:
        end = at + len(head)
        while end - at < len(secret) and end < len(text) and text[end] == secret[end - at]:
            end += 1
        parts += [text[done:at], marker]
        done = end
        at = text.find(head, end)
    parts.append(text[done:])
    return text[:0].join(parts)
