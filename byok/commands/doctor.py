"""`byok doctor`: is this byok set up to work — its config, its files, each provider, its port —
and how to connect Cursor. One line per check; a failed one says the fix. Exit 0 only when
every check passed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import trio

from byok.commands.config_args import config_path, env_file_path, load_from_args
from byok.commands.daemon_address import NoDaemon, daemon_address
from byok.commands.doctor_checks import Check, config_file, data_dir, port, private_file, tls_key
from byok.config import Config, ConfigError
from byok.env_file import EnvFile, EnvFileError
from byok.startup_summary import config_source, next_step

DEFAULT_TIMEOUT_S = 20.0


def _keys_file(path: Path | None) -> list[Check]:
    """The keys file the service reads: private, readable; applied here so the providers' keys
    are the service's."""
    if path is None:
        return []
    check = private_file("keys file", path, missing_ok=False)
    try:
        EnvFile(path).apply()
    except EnvFileError as e:
        return [Check(False, "keys file", str(e), f"fix {path} (NAME=value lines)")]
    return [check] if check is not None else []


def _config(args: argparse.Namespace) -> tuple[Config | None, Check]:
    try:
        config = load_from_args(args)
    except ConfigError as e:
        where = config_path(args.config)
        return None, Check(
            False, "config", str(e), f"edit {where}" if where else "check --host/--port/--data-dir"
        )
    served = [m.id for m in config.enabled_models()]
    found = (
        f"{config_source(config)}: {len(config.providers)} provider(s), models: {', '.join(served) or 'none'}"
    )
    step = next_step(config)
    if step is not None:
        return config, Check(False, "config", found, step.removeprefix("no model to serve: "))
    return config, Check(True, "config", found)


def cursor_hints(config: Config) -> list[str]:
    from byok.cursor_setup import cursor_command, local_url

    try:
        url = daemon_address(config).shown
    except NoDaemon:  # port 0: the one `byok serve` prints at start
        url = local_url(config.server.host, config.server.port).removesuffix(":0") + ":<port>"
    if config.server.has_auth_token:
        url += "/<token>"
    lines = [
        f"Cursor, backend URL mode: quit Cursor, then start it with `{cursor_command(url)}` "
        "(byok cursor-command)"
    ]
    proxy = local_url(config.proxy.host, config.proxy.port)
    if config.proxy.enabled:
        lines.append(
            f'Cursor, proxy mode: trust byok\'s CA and set "http.proxy": "{proxy}" in Cursor\'s '
            "settings.json (byok ca install prints both)"
        )
    else:
        lines.append(
            "Cursor, proxy mode: set [proxy] enabled = true (or run byok serve --proxy), then "
            "byok ca install prints the CA's trust commands and Cursor's settings"
        )
    return lines


def cmd_doctor(args: argparse.Namespace) -> int:
    from byok.commands.doctor_provider import provider_checks

    checks = _keys_file(env_file_path(args.env_file))
    config, checked = _config(args)
    checks.insert(0, checked)
    for check in checks:
        print(check.line(), flush=True)
    failed = sum(not c.ok for c in checks)
    if config is not None:
        local = [*config_file(config), *tls_key(config), *data_dir(config)]
        local.append(port(config, config.server.host, config.server.port, "port"))
        if config.proxy.enabled:
            local.append(port(config, config.proxy.host, config.proxy.port, "proxy port"))
        for check in local:
            print(check.line(), flush=True)
        remote = trio.run(provider_checks, config, args.timeout)
        for check in remote:
            print(check.line(), flush=True)
        failed += sum(not c.ok for c in [*local, *remote])
        for hint in cursor_hints(config):
            print(f"      {hint}")
    print(
        "all checks passed" if not failed else f"{failed} check(s) failed",
        file=sys.stderr if failed else sys.stdout,
    )
    return 0 if not failed else 1
