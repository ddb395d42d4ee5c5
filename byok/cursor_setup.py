"""Text for ``byok cursor-command`` and ``byok ca install``: how to point Cursor at byok.

Pure functions returning strings; nothing here runs a command or touches the system. ``system``
is ``platform.system()``'s value: ``"Darwin"``, ``"Linux"`` or ``"Windows"`` (anything else is
treated as Linux).
"""

from __future__ import annotations

import ipaddress
import json
import platform
from pathlib import Path

MACOS, LINUX, WINDOWS = "Darwin", "Linux", "Windows"

SETTINGS_PATHS = {
    MACOS: "~/Library/Application Support/Cursor/User/settings.json",
    LINUX: "~/.config/Cursor/User/settings.json",
    WINDOWS: r"%APPDATA%\Cursor\User\settings.json",
}


def _system(system: str | None) -> str:
    s = system or platform.system()
    return s if s in (MACOS, WINDOWS) else LINUX


def _connect_host(host: str) -> str:
    """The address a local client should dial for a listener bound to ``host``."""
    bare = host.strip("[]")
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        return host
    if ip.is_unspecified:
        return "[::1]" if ip.version == 6 else "127.0.0.1"
    return f"[{bare}]" if ip.version == 6 else bare


def local_url(host: str, port: int) -> str:
    """``http://HOST:PORT`` as a client on this machine reaches a listener bound to host:port."""
    return f"http://{_connect_host(host)}:{port}"


def cursor_command(url: str, system: str | None = None) -> str:
    """The one command line that starts Cursor with byok as its backend."""
    flag = f"--test-backend-url={url}"
    s = _system(system)
    if s == MACOS:
        return f"open -a Cursor --args {flag}"
    if s == WINDOWS:
        return f'& "$env:LOCALAPPDATA\\Programs\\cursor\\Cursor.exe" {flag}'
    return f"cursor {flag}"


def cursor_command_text(url: str, system: str | None = None) -> str:
    """What ``byok cursor-command`` prints."""
    s = _system(system)
    flag = f"--test-backend-url={url}"
    lines = [
        "Quit Cursor completely, then start it with byok as its backend:",
        "",
        f"    {cursor_command(url, s)}",
        "",
    ]
    if s == MACOS:
        lines += [
            "(`open` only passes the flag when it launches Cursor; if Cursor was still running,",
            " quit it with Cmd-Q and run the command again. Or run the binary directly:",
            f'    "/Applications/Cursor.app/Contents/MacOS/Cursor" {flag} )',
        ]
    elif s == WINDOWS:
        lines += [
            "(PowerShell. From cmd.exe:",
            f'    "%LOCALAPPDATA%\\Programs\\cursor\\Cursor.exe" {flag} )',
        ]
    else:
        lines += [
            "(`cursor` is the launcher the .deb/.rpm installs; for the AppImage run",
            f"    ./Cursor-*.AppImage {flag} )",
        ]
    lines += [
        "",
        "Start byok first (`byok serve`): it answers the agent and relays every",
        "other backend call to Cursor's real servers.",
    ]
    return "\n".join(lines) + "\n"


def cursor_proxy_settings(proxy_url: str) -> str:
    """The Cursor settings.json entries for proxy mode (JSON members, ready to paste)."""
    settings = {
        "http.proxy": proxy_url,
        "http.proxySupport": "override",
        "cursor.general.disableHttp2": True,
    }
    members = json.dumps(settings, indent=2).splitlines()[1:-1]
    return "\n".join(m.removeprefix("  ") for m in members) + ","


def trust_commands(cert: Path | str, system: str | None = None) -> list[str]:
    """Commands that add byok's CA certificate to the OS trust store (to print, not to run)."""
    s = _system(system)
    pem = str(cert)
    if s == MACOS:
        return [
            f'security add-trusted-cert -r trustRoot -k ~/Library/Keychains/login.keychain-db "{pem}"',
        ]
    if s == WINDOWS:
        return [f'certutil -user -addstore Root "{pem}"']
    return [
        "# Debian/Ubuntu:",
        f'sudo cp "{pem}" /usr/local/share/ca-certificates/byok-ca.crt && sudo update-ca-certificates',
        "# Fedora/RHEL:",
        f'sudo cp "{pem}" /etc/pki/ca-trust/source/anchors/byok-ca.pem && sudo update-ca-trust',
        "# Arch:",
        f'sudo trust anchor "{pem}"',
        "# Cursor (Chromium) on Linux reads the NSS store, not the files above (certutil: libnss3-tools):",
        f'certutil -d sql:$HOME/.pki/nssdb -A -t "C,," -n "byok local CA" -i "{pem}"',
    ]


def untrust_commands(cert: Path | str, system: str | None = None) -> list[str]:
    """The reverse of ``trust_commands``."""
    s = _system(system)
    pem = str(cert)
    if s == MACOS:
        return [f'security remove-trusted-cert "{pem}"', 'security delete-certificate -c "byok local CA"']
    if s == WINDOWS:
        return ['certutil -user -delstore Root "byok local CA"']
    return [
        "sudo rm /usr/local/share/ca-certificates/byok-ca.crt && sudo update-ca-certificates --fresh",
        "sudo rm /etc/pki/ca-trust/source/anchors/byok-ca.pem && sudo update-ca-trust",
        'certutil -d sql:$HOME/.pki/nssdb -D -n "byok local CA"',
    ]


def ca_install_text(cert: Path | str, proxy_url: str, system: str | None = None) -> str:
    """What ``byok ca install`` prints: trust commands, then the Cursor settings."""
    s = _system(system)
    lines = [
        "byok does not change your system: run these yourself to trust byok's local CA.",
        f"Certificate: {cert}",
        "(its key stays in the same folder, readable only by you, and never leaves this machine)",
        "",
    ]
    lines += [f"    {c}" for c in trust_commands(cert, s)]
    lines += [
        "",
        f"Then add to Cursor's settings.json ({SETTINGS_PATHS[s]}):",
        "",
    ]
    lines += [f"    {line}" for line in cursor_proxy_settings(proxy_url).splitlines()]
    lines += [
        "",
        "and restart Cursor, with byok running the proxy (`byok serve --proxy`, or",
        "`[proxy] enabled = true`). HTTP/1.1 mode (disableHttp2, also under",
        "Settings > Network) makes Cursor use the agent routes byok serves over HTTP/1.1.",
        "",
        "To undo: remove those settings, then",
        "",
    ]
    lines += [f"    {c}" for c in untrust_commands(cert, s)]
    return "\n".join(lines) + "\n"
