"""What the daemon says about itself: log levels, the keys file, a run's end line, the summary."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from byok.config_load import load_config
from byok.config_reload import reload_plan
from byok.env_file import EnvFile, EnvFileError, parse_env
from byok.log_setup import LogLevelError, parse_level
from byok.loop.turn_values import Canceled, Failed, Succeeded
from byok.model.usage import Usage
from byok.run.end_line import end_level, end_line
from byok.run.service import not_served
from byok.startup_summary import summary


@pytest.mark.parametrize(
    ("text", "level"),
    [
        ("debug", logging.DEBUG),
        ("INFO", logging.INFO),
        (" Warn ", logging.WARNING),
        ("critical", logging.ERROR),
    ],
)
def test_log_levels_in_any_case(text: str, level: int) -> None:
    assert parse_level(text, "X") == level


def test_an_unknown_log_level_names_the_known_ones() -> None:
    with pytest.raises(LogLevelError, match=r"^X: unknown log level 'trace' \(expected one of: debug, info"):
        parse_level("trace", "X")


def test_env_file_syntax() -> None:
    text = "# keys\n\nexport A=1\nB = 'two words'\nC=\"x=y\"\n; old\nD=\n"
    assert parse_env(text, "f") == {"A": "1", "B": "two words", "C": "x=y", "D": ""}
    with pytest.raises(EnvFileError, match=r"^f: line 2: expected NAME=value$"):
        parse_env("A=1\nnot a line\n", "f")
    with pytest.raises(EnvFileError, match=r"^f: line 1: expected NAME=value$"):
        parse_env("1A=x\n", "f")


def test_env_file_rotation_and_removal(tmp_path: Path) -> None:
    path = tmp_path / "env"
    environ = {"KEEP": "k", "A": "shell"}
    env = EnvFile(path, environ)
    path.write_text("A=one\nB=two\n")
    assert env.apply() == ["A", "B"]
    assert environ == {"KEEP": "k", "A": "one", "B": "two"}
    path.write_text("A=rotated\n")
    assert env.apply() == ["A", "B"]  # B left the file: it leaves the environment
    assert environ == {"KEEP": "k", "A": "rotated"}
    path.write_text("A=rotated\nbroken\n")
    with pytest.raises(EnvFileError):
        env.apply()
    assert environ == {"KEEP": "k", "A": "rotated"}  # a bad file changes nothing
    path.unlink()
    with pytest.raises(EnvFileError, match="cannot read: No such file"):
        env.apply()


def test_end_line() -> None:
    usage = Usage(12_000, 340, cache_read_tokens=9_000)
    line = end_line("r1", "c1", "m", Succeeded(), usage, 0.4049, 3.2)
    assert (
        line
        == "run r1 (conversation c1, model m): ok; tokens in 12,000 (75% cached), out 340; TTFT 0.40s; 3.20s"
    )
    line = end_line("r2", "c1", "m", Failed("unavailable", "HTTP 503"), None, None, 0.5)
    assert (
        line == "run r2 (conversation c1, model m): failed unavailable: HTTP 503; no usage reported; "
        "no output; 0.50s"
    )
    assert end_line("r3", "c", "m", Canceled(), Usage(10, 0), None, 1).endswith(
        ": canceled; tokens in 10, out 0; no output; 1.00s"
    )
    assert [
        end_level(o) for o in (Succeeded(), Canceled(), Failed("unavailable", ""), Failed("internal", ""))
    ] == [
        logging.INFO,
        logging.INFO,
        logging.WARNING,
        logging.ERROR,
    ]


CONFIG = """
[[providers]]
id = "p"
kind = "openai_chat"
base_url = "http://127.0.0.1:9/v1"

[[models]]
id = "a"
provider = "p"
upstream_model = "gpt-a"
context_tokens = 1000

[[models]]
id = "hidden"
provider = "p"
upstream_model = "gpt-h"
context_tokens = 1000
enabled = false
"""


def test_not_served_names_the_served_ids(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    config = load_config(path)
    assert not_served(config, "gpt-5") == "model 'gpt-5' is not configured in byok; it serves: 'a'"
    assert (
        not_served(config, "hidden") == "model 'hidden' is disabled (enabled = false) in byok; it serves: 'a'"
    )
    assert not_served(load_config(None), "x").endswith("it serves: none: no model is configured")


def test_summary(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    config = load_config(path, overrides={"data_dir": str(tmp_path / "d")})
    text = summary(
        config, "http://127.0.0.1:8790", pid=7, version="1.2", proxy="http://127.0.0.1:8791 (CA x)"
    )
    assert text.splitlines() == [
        "byok listening on http://127.0.0.1:8790 (version 1.2, pid 7)",
        f"  config: {path}",
        "  providers: p (openai_chat, http://127.0.0.1:9/v1)",
        "  models: a (p/gpt-a)",
        "  disabled (relayed to Cursor's backend): hidden",
        f"  data dir: {tmp_path / 'd'}",
        "  HTTPS proxy: http://127.0.0.1:8791 (CA x)",
    ]


def test_reload_plan(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    old = load_config(path, overrides={"data_dir": str(tmp_path / "d")})
    changed = CONFIG.replace('upstream_model = "gpt-a"', 'upstream_model = "gpt-a2"').replace(
        'id = "hidden"', 'id = "new"'
    )
    path.write_text("[server]\nport = 9999\nheartbeat_s = 1.0\n[logging]\ndetailed = true\n" + changed)
    new = load_config(path, overrides={"data_dir": str(tmp_path / "d")})
    effective, lines = reload_plan(old, new)
    assert lines == [
        "models: added new; removed hidden; changed a",
        "[logging] changed",
        "kept until a restart: [server] port, [server] heartbeat_s changed",
    ]
    assert effective.server == old.server and effective.models == new.models and effective.logging.detailed
    assert reload_plan(old, old) == (old, [])
