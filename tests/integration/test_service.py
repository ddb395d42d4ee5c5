"""`byok service install` / `uninstall` as a user runs them (a home of the test's own, --no-start:
a test must not enable a service on the machine that runs it), and the unit they write checked
by systemd's own `systemd-analyze verify`."""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from byok.service_files import ServiceCommand, launchd_plist, systemd_unit
from tests.integration.conftest import write_config
from tests.support.serve_process import ROOT, command_env

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the systemd unit is Linux's")


def run(*argv: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=command_env(home), timeout=60)


def verify(unit: Path, home: Path) -> None:
    """systemd's own reading of the unit: no error, no warning (an unknown key is a warning)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        if os.environ.get("CI"):
            pytest.fail("systemd-analyze is missing (the Makefile's test target installs Debian's systemd)")
        pytest.skip("systemd-analyze is not installed (make test installs it with apt-get)")
    runtime = home / "runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {**command_env(home), "XDG_RUNTIME_DIR": str(runtime)}
    done = subprocess.run(
        [analyze, "--user", "verify", str(unit)], capture_output=True, text=True, env=env, timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), done.stderr


def test_install_verify_reinstall_uninstall(tmp_path: Path) -> None:
    cfg = tmp_path / "my config.toml"  # a space: quoted in ExecStart
    write_config(
        cfg, provider_url="http://127.0.0.1:9/v1", data_dir=tmp_path / "data", provider_extra="", extra=""
    )
    cfg.write_text(cfg.read_text().replace('api_key = "sk-test"', 'api_key_env = "FAKE_KEY"'))
    unit = tmp_path / ".config" / "systemd" / "user" / "byok.service"
    keys = tmp_path / ".config" / "byok" / "env"

    done = run(
        sys.executable,
        "-m",
        "byok",
        "service",
        "install",
        "--user",
        "--no-start",
        "--config",
        str(cfg),
        home=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"wrote {unit}",
        f"  runs: {sys.executable} -m byok serve --config {cfg} --env-file {keys}",
        f"created keys file {keys} (mode 600): put the keys there",
        "not started (--no-start); to start it now:",
        "  systemctl --user daemon-reload",
        "  systemctl --user enable --now byok.service",
        "logs: journalctl --user -u byok -f; reload: systemctl --user reload byok "
        "(after changing the config or the keys file)",
        "undo: byok service uninstall",
    ]
    text = unit.read_text()
    assert f'ExecStart={sys.executable} -m byok serve --config "{cfg}" --env-file {keys}\n' in text
    assert "RestartPreventExitStatus=2\n" in text and "ExecReload=/bin/kill -HUP $MAINPID\n" in text
    # A source checkout found through PYTHONPATH is found the same way by the service.
    found_by_path = str(ROOT) in [
        str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
    ]
    assert (f"Environment=PYTHONPATH={ROOT}\n" in text) == found_by_path
    assert keys.stat().st_mode & 0o777 == 0o600 and "# FAKE_KEY=\n" in keys.read_text()
    verify(unit, tmp_path)

    # Installed with the console script: the unit runs that script, not one found on a PATH.
    script = Path(sys.executable).parent / "byok"
    if script.exists():
        again = run(str(script), "service", "install", "--no-start", "--config", str(cfg), home=tmp_path)
        assert again.returncode == 0, again.stderr
        lines = again.stdout.splitlines()
        assert lines[0] == f"replaced {unit}" and lines[2] == f"keys file {keys} (kept as it is)"
        assert f"ExecStart={script} serve --config" in unit.read_text()
        verify(unit, tmp_path)

    gone = run(sys.executable, "-m", "byok", "service", "uninstall", "--no-stop", home=tmp_path)
    assert gone.returncode == 0 and not unit.exists()
    assert gone.stdout.splitlines() == [
        "not stopped (--no-stop): systemctl --user disable --now byok.service",
        f"removed {unit}",
        "kept: the config, the keys file and the data dir (your conversations)",
    ]
    assert keys.exists() and cfg.exists()
    nothing = run(sys.executable, "-m", "byok", "service", "uninstall", home=tmp_path)
    assert nothing.stdout == f"no byok service installed ({unit} does not exist)\n"


def test_install_refuses_a_bad_config_in_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[server]\nport = -1\n")
    done = run(
        sys.executable, "-m", "byok", "service", "install", "--no-start", "--config", str(cfg), home=tmp_path
    )
    assert done.returncode == 2 and done.stderr.startswith(f"byok: {cfg}: server.port") and done.stdout == ""
    assert not (tmp_path / ".config" / "systemd").exists()


def test_unit_and_agent_texts() -> None:
    command = ServiceCommand(("/opt/by k/bin/byok", "serve", "--env-file", "/h/100%/env"), pythonpath="/src")
    unit = systemd_unit(command)
    assert 'ExecStart="/opt/by k/bin/byok" serve --env-file /h/100%%/env\n' in unit
    assert "Environment=PYTHONPATH=/src\n" in unit
    agent = plistlib.loads(launchd_plist(command, Path("/Users/u/Library/Logs/byok/byok.log")))
    assert agent["Label"] == "dev.byok" and agent["ProgramArguments"] == list(command.argv)
    assert agent["StandardErrorPath"] == agent["StandardOutPath"] == "/Users/u/Library/Logs/byok/byok.log"
    assert agent["KeepAlive"] == {"SuccessfulExit": False} and agent["RunAtLoad"] is True
    assert agent["EnvironmentVariables"] == {"PYTHONPATH": "/src"}


def _example(home: str) -> ServiceCommand:
    config, keys = f"{home}/.config/byok/config.toml", f"{home}/.config/byok/env"
    return ServiceCommand((f"{home}/.local/bin/byok", "serve", "--config", config, "--env-file", keys))


def test_docs_deploy_is_what_install_writes() -> None:
    """docs/deploy/ shows the files `byok service install` writes, for a byok in ~/.local/bin."""
    deploy = ROOT / "docs" / "deploy"
    assert (deploy / "byok.service").read_text() == systemd_unit(_example("/home/you"))
    plist = launchd_plist(_example("/Users/you"), Path("/Users/you/Library/Logs/byok/byok.log"))
    assert (deploy / "dev.byok.plist").read_bytes() == plist
