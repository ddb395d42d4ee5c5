"""The service files `byok service install` writes: a systemd user unit (Linux) and a launchd
agent (macOS), both starting the byok this process runs, with its config and keys file."""

from __future__ import annotations

import os
import plistlib
import sys
from pathlib import Path

import attrs

import byok

SYSTEMD_UNIT = "byok.service"
LAUNCHD_LABEL = "dev.byok"


@attrs.frozen
class ServiceCommand:
    argv: tuple[str, ...]  # the program and its arguments, `serve ...` included
    # PYTHONPATH, when the running byok was found through it (a source checkout).
    pythonpath: str | None = None


def running_byok() -> tuple[tuple[str, ...], str | None]:
    """How to start the byok that is running now, not one found on some PATH: its console
    script when it was started as one, else this interpreter with ``-m byok``; and the
    PYTHONPATH that found it, when one did."""
    root = str(Path(byok.__file__).resolve().parent.parent)
    entries = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    pythonpath = root if root in entries else None
    script = Path(sys.argv[0])
    if script.name == "byok" and script.is_file() and os.access(script, os.X_OK):
        return (str(script.absolute()),), pythonpath
    return (sys.executable, "-m", "byok"), pythonpath


def serve_command(config: Path | None, env_file: Path) -> ServiceCommand:
    program, pythonpath = running_byok()
    argv = [*program, "serve"]
    if config is not None:
        argv += ["--config", str(config.absolute())]
    argv += ["--env-file", str(env_file.absolute())]
    return ServiceCommand(tuple(argv), pythonpath)


def _systemd_word(word: str) -> str:
    # "%" starts a specifier and "$" a variable in ExecStart: both doubled; quoted when needed.
    word = word.replace("%", "%%").replace("$", "$$")
    if any(c.isspace() or c in "\"'\\;" for c in word) or not word:
        word = '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return word


def systemd_unit(command: ServiceCommand) -> str:
    env = ""
    if command.pythonpath is not None:
        env = f"Environment={_systemd_word('PYTHONPATH=' + command.pythonpath)}\n"
    return f"""# byok's systemd user unit, written by `byok service install` (undo: byok service uninstall).
#   systemctl --user status byok     journalctl --user -u byok -f
#   systemctl --user reload byok     (SIGHUP: the config and the keys file read again)
[Unit]
Description=byok: Cursor agent on your own LLM account
After=network-online.target

[Service]
Type=exec
ExecStart={" ".join(_systemd_word(w) for w in command.argv)}
ExecReload=/bin/kill -HUP $MAINPID
{env}Restart=on-failure
RestartSec=2
# Exit status 2 is a config error: it fails the same way until the file is fixed.
RestartPreventExitStatus=2
# stdout and stderr go to the journal.
SyslogIdentifier=byok

[Install]
WantedBy=default.target
"""


def launchd_plist(command: ServiceCommand, log_file: Path) -> bytes:
    agent: dict[str, object] = {
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": list(command.argv),
        "RunAtLoad": True,
        # Started again when it exits with a failure (launchd has no status to leave alone: a
        # config error is retried every ThrottleInterval until the file is fixed).
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": 10,
        "StandardOutPath": str(log_file),
        "StandardErrorPath": str(log_file),
        "ProcessType": "Background",
    }
    if command.pythonpath is not None:
        agent["EnvironmentVariables"] = {"PYTHONPATH": command.pythonpath}
    return plistlib.dumps(agent)
