"""Which config file a command uses, and the command line's overrides of it."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from byok.config import Config
from byok.config_load import load_config

DEFAULT_CONFIG = Path("~/.config/byok/config.toml")
DEFAULT_ENV_FILE = Path("~/.config/byok/env")


def config_path(arg: str | None) -> Path | None:
    """``--config``, else ``$BYOK_CONFIG``, else the default file when it exists (None: defaults)."""
    if arg:
        return Path(arg)
    env = os.environ.get("BYOK_CONFIG")
    if env:
        return Path(env)
    default = DEFAULT_CONFIG.expanduser()
    return default if default.exists() else None


def load_from_args(args: argparse.Namespace) -> Config:
    """The config the command line names, with its ``--host``/``--port``/``--data-dir``."""
    flags = {"host": getattr(args, "host", None), "port": getattr(args, "port", None)}
    flags["data_dir"] = getattr(args, "data_dir", None)
    overrides = {k: v for k, v in flags.items() if v is not None}
    return load_config(config_path(getattr(args, "config", None)), overrides=overrides)


def env_file_path(arg: str | None) -> Path | None:
    """``--env-file``, else ``$BYOK_ENV_FILE``, else the default file when it exists."""
    if arg:
        return Path(arg).expanduser()
    env = os.environ.get("BYOK_ENV_FILE")
    if env:
        return Path(env).expanduser()
    default = DEFAULT_ENV_FILE.expanduser()
    return default if default.exists() else None
