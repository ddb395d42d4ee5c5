"""`byok service install` / `byok service uninstall`: byok as the user's own service, started at
login — a systemd user unit on Linux, a launchd agent on macOS."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from byok.commands.config_args import DEFAULT_ENV_FILE, config_path, load_from_args
from byok.config import ConfigError
from byok.service_files import (
    LAUNCHD_LABEL,
    SYSTEMD_UNIT,
    launchd_plist,
    serve_command,
    systemd_unit,
)

MACOS_LOG = Path("~/Library/Logs/byok/byok.log")


def _systemd_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def _launchd_file() -> Path:
    return Path.home() / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"


def _env_file(arg: str | None, key_vars: list[str]) -> tuple[Path, str]:
    """The keys file the service reads, created (mode 600) with the variables the config names
    when it does not exist; and what was done."""
    path = Path(arg).expanduser() if arg else DEFAULT_ENV_FILE.expanduser()
    if path.exists():
        return path, f"keys file {path} (kept as it is)"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# Keys for byok's service: NAME=value, one a line (the config's api_key_env names them)."]
    lines += [f"# {name}=" for name in key_vars] or ["# OPENAI_API_KEY="]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path, f"created keys file {path} (mode 600): put the keys there"


def _run(argv: list[str]) -> str | None:
    """Run a service manager command; None when it worked, else why not (one line)."""
    if shutil.which(argv[0]) is None:
        return f"{argv[0]} not found"
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return (
            f"`{' '.join(argv)}` failed: {' '.join((done.stderr or done.stdout).split()) or done.returncode}"
        )
    return None


def _start(commands: list[list[str]], start: bool) -> list[str]:
    """Run ``commands`` (or, with --no-start, print them); the lines to print."""
    shown = [" ".join(c) for c in commands]
    if not start:
        return ["not started (--no-start); to start it now:", *(f"  {c}" for c in shown)]
    for argv in commands:
        problem = _run(argv)
        if problem is not None:
            return [f"not started: {problem}; start it with:", *(f"  {c}" for c in shown)]
    return [f"started: {' && '.join(shown)}"]


def cmd_service_install(args: argparse.Namespace) -> int:
    try:
        config = load_from_args(args)
    except ConfigError as e:
        print(f"byok: {e}", file=sys.stderr)
        return 2
    path = config_path(args.config)
    keys = [p.api_key_env for p in config.providers if p.api_key_env]
    env_file, env_done = _env_file(args.env_file, keys)
    command = serve_command(path.expanduser().absolute() if path is not None else None, env_file)
    lines: list[str] = []
    if sys.platform == "darwin":
        target, log = _launchd_file(), MACOS_LOG.expanduser()
        log.parent.mkdir(parents=True, exist_ok=True)
        existed = target.exists()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(launchd_plist(command, log))
        domain = f"gui/{os.getuid()}"
        start = [["launchctl", "bootstrap", domain, str(target)]]
        if existed:
            start.insert(0, ["launchctl", "bootout", f"{domain}/{LAUNCHD_LABEL}"])
        logs, reload = f"logs: {log}", f"reload: launchctl kill HUP {domain}/{LAUNCHD_LABEL}"
    elif sys.platform.startswith("linux"):
        target = _systemd_dir() / SYSTEMD_UNIT
        existed = target.exists()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(systemd_unit(command))
        start = [
            ["systemctl", "--user", "daemon-reload"],
            ["systemctl", "--user", "enable", "--now", SYSTEMD_UNIT],
        ]
        if existed:  # running already: on the new unit from now
            start.append(["systemctl", "--user", "restart", SYSTEMD_UNIT])
        logs, reload = "logs: journalctl --user -u byok -f", "reload: systemctl --user reload byok"
    else:
        print(f"byok: no service manager byok knows on {sys.platform} (systemd on Linux, launchd on macOS)")
        return 1
    lines.append(f"{'replaced' if existed else 'wrote'} {target}")
    lines.append(f"  runs: {' '.join(command.argv)}")
    lines.append(env_done)
    lines += _start(start, not args.no_start)
    lines += [
        f"{logs}; {reload} (after changing the config or the keys file)",
        "undo: byok service uninstall",
    ]
    print("\n".join(lines))
    return 0


def cmd_service_uninstall(args: argparse.Namespace) -> int:
    if sys.platform == "darwin":
        target = _launchd_file()
        stop = [["launchctl", "bootout", f"gui/{os.getuid()}/{LAUNCHD_LABEL}"]]
    elif sys.platform.startswith("linux"):
        target = _systemd_dir() / SYSTEMD_UNIT
        stop = [["systemctl", "--user", "disable", "--now", SYSTEMD_UNIT]]
    else:
        print(f"byok: no service manager byok knows on {sys.platform}")
        return 1
    if not target.exists():
        print(f"no byok service installed ({target} does not exist)")
        return 0
    lines: list[str] = []
    if args.no_stop:
        lines.append(f"not stopped (--no-stop): {' '.join(stop[0])}")
    else:
        problem = _run(stop[0])
        lines.append(f"stopped: {' '.join(stop[0])}" if problem is None else f"not stopped: {problem}")
    target.unlink()
    lines.append(f"removed {target}")
    if sys.platform.startswith("linux") and not args.no_stop:
        _run(["systemctl", "--user", "daemon-reload"])
    lines.append("kept: the config, the keys file and the data dir (your conversations)")
    print("\n".join(lines))
    return 0
