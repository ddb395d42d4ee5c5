from __future__ import annotations

import json

import pytest

from byok import cursor_setup as cs

PEM = "/home/u/.local/share/byok/ca/byok-ca.pem"


@pytest.mark.parametrize(
    ("host", "port", "url"),
    [
        ("127.0.0.1", 8790, "http://127.0.0.1:8790"),
        ("0.0.0.0", 8790, "http://127.0.0.1:8790"),
        ("::", 9000, "http://[::1]:9000"),
        ("::1", 9000, "http://[::1]:9000"),
        ("[::1]", 9000, "http://[::1]:9000"),
        ("localhost", 1, "http://localhost:1"),
    ],
)
def test_local_url(host: str, port: int, url: str) -> None:
    assert cs.local_url(host, port) == url


def test_cursor_command_per_os() -> None:
    url = "http://127.0.0.1:8790"
    assert (
        cs.cursor_command(url, "Darwin") == "open -a Cursor --args --test-backend-url=http://127.0.0.1:8790"
    )
    assert cs.cursor_command(url, "Linux") == "cursor --test-backend-url=http://127.0.0.1:8790"
    assert cs.cursor_command(url, "FreeBSD") == cs.cursor_command(url, "Linux")
    win = cs.cursor_command(url, "Windows")
    assert win.startswith('& "$env:LOCALAPPDATA\\Programs\\cursor\\Cursor.exe" ')
    assert win.endswith(" --test-backend-url=http://127.0.0.1:8790")


@pytest.mark.parametrize("system", ["Darwin", "Linux", "Windows"])
def test_cursor_command_text(system: str) -> None:
    text = cs.cursor_command_text("http://127.0.0.1:8790", system)
    assert f"    {cs.cursor_command('http://127.0.0.1:8790', system)}\n" in text
    assert "byok serve" in text
    assert text.endswith("\n")


def test_cursor_command_uses_current_os_by_default() -> None:
    assert cs.cursor_command("http://x:1") in {
        cs.cursor_command("http://x:1", s) for s in ("Darwin", "Linux", "Windows")
    }


def test_proxy_settings_are_valid_json_members() -> None:
    members = cs.cursor_proxy_settings("http://127.0.0.1:8791")
    settings = json.loads("{" + members.rstrip(",") + "}")
    assert settings == {
        "http.proxy": "http://127.0.0.1:8791",
        "http.proxySupport": "override",
        "cursor.general.disableHttp2": True,
    }


def test_trust_commands() -> None:
    mac = cs.trust_commands(PEM, "Darwin")
    assert mac == [f'security add-trusted-cert -r trustRoot -k ~/Library/Keychains/login.keychain-db "{PEM}"']
    assert cs.trust_commands(PEM, "Windows") == [f'certutil -user -addstore Root "{PEM}"']
    linux = "\n".join(cs.trust_commands(PEM, "Linux"))
    assert "update-ca-certificates" in linux and "update-ca-trust" in linux
    assert "certutil -d sql:$HOME/.pki/nssdb -A" in linux  # Chromium's store
    for system in ("Darwin", "Linux", "Windows"):
        assert cs.untrust_commands(PEM, system)


@pytest.mark.parametrize("system", ["Darwin", "Linux", "Windows"])
def test_ca_install_text(system: str) -> None:
    text = cs.ca_install_text(PEM, "http://127.0.0.1:8791", system)
    assert f"Certificate: {PEM}" in text
    for command in cs.trust_commands(PEM, system) + cs.untrust_commands(PEM, system):
        assert f"    {command}\n" in text
    assert '"http.proxy": "http://127.0.0.1:8791",' in text
    assert '"cursor.general.disableHttp2": true,' in text
    assert cs.SETTINGS_PATHS[system] in text
    assert "does not change your system" in text
