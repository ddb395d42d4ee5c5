"""Provider text cleaned of the configured secrets (byok/providers/secrets.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from byok.model.events import ProviderError
from byok.providers.adapters import adapter_for
from byok.providers.secrets import (
    PARTIAL_CHARS,
    REDACTED,
    provider_secrets,
    redact_bytes,
    redact_error,
    redact_text,
)

KEY = "sk-proj-Zq8vN3xK1pLm7Rt2Yw9bCd4Ef6Gh0Ij"
TOKEN = "gw_tok/4f9a+b2c7d1e8a3f6b0c5d"


def test_every_configured_secret_and_its_encoded_forms() -> None:
    secrets = provider_secrets(KEY, [("x-gateway-token", TOKEN), ("authorization", "Bearer abcdefgh12345")])
    text = (
        f"Incorrect API key provided: {KEY}. token {TOKEN}, escaped {TOKEN.replace('/', chr(92) + '/')}, "
        "url-encoded gw_tok%2F4f9a%2Bb2c7d1e8a3f6b0c5d, bearer abcdefgh12345."
    )
    out = redact_text(text, secrets)
    for secret in (KEY, TOKEN, "gw_tok%2F4f9a", "4f9a+b2c7d1e8", "abcdefgh12345"):
        assert secret not in out
    assert out.count(REDACTED) == 5
    assert out.startswith("Incorrect API key provided: [REDACTED]. token [REDACTED]")


def test_short_values_are_not_secrets() -> None:
    # A keyless local server's placeholder key, a header such as "anthropic-version: 1".
    assert provider_secrets("EMPTY", [("x-flag", "1"), ("x-title", "")]) == ()
    assert provider_secrets(None) == ()


def test_a_key_cut_short_is_redacted_from_its_first_characters() -> None:
    secrets = provider_secrets(KEY)
    cut = f"message: {KEY[:PARTIAL_CHARS + 3]}"  # truncated by the provider or by byok
    assert redact_text(cut, secrets) == "message: [REDACTED]"
    # Fewer characters than that are left alone (sk-proj- is every key's public prefix).
    short = f"message: {KEY[: PARTIAL_CHARS - 1]}"
    assert redact_text(short, secrets) == short


def test_bytes_and_errors() -> None:
    secrets = provider_secrets(KEY)
    body = b'{"error":{"message":"Incorrect API key provided: ' + KEY.encode() + b'"}}'
    assert redact_bytes(body, secrets) == b'{"error":{"message":"Incorrect API key provided: [REDACTED]"}}'
    e = ProviderError(f"HTTP 401: bad key {KEY}", status=401)
    assert redact_error(e, secrets) is e
    assert e.message == str(e) == "HTTP 401: bad key [REDACTED]" and e.status == 401


def test_the_endpoint_carries_its_provider_secrets() -> None:
    endpoint = adapter_for("anthropic").endpoint("http://h", KEY, (("x-gateway-token", TOKEN),))
    assert KEY in endpoint.secrets and TOKEN in endpoint.secrets
    assert "2023-06-01" not in endpoint.secrets  # byok's own headers are not secrets


@given(st.text(), st.text())
def test_no_secret_survives(before: str, after: str) -> None:
    secrets = provider_secrets(KEY, [("x-gateway-token", TOKEN)])
    out = redact_text(before + KEY + after + TOKEN, secrets)
    assert KEY not in out and TOKEN not in out
