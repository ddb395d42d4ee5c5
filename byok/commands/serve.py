"""`byok serve`: the daemon as a process — its log, its keys file, its signals."""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import signal
import sys
from collections.abc import Callable

import attrs
import trio

from byok.allocator import tune_allocator
from byok.commands.config_args import env_file_path, load_from_args
from byok.config import Config, ConfigError
from byok.env_file import EnvFile, EnvFileError
from byok.exception_groups import sole
from byok.log_setup import DEFAULT_LEVEL, LogLevelError, configure_logging, parse_level
from byok.run.upkeep import FULL_COLLECTIONS_OFF

log = logging.getLogger("byok")

# Exit statuses: a service manager restarts on 1 (RestartPreventExitStatus=2 keeps it from
# restarting a config that will fail again the same way).
EXIT_STARTUP = 1
EXIT_CONFIG = 2


def log_level(args: argparse.Namespace) -> int:
    if args.log_level is not None:
        return parse_level(args.log_level, "--log-level")
    return parse_level(os.environ.get("BYOK_LOG_LEVEL") or DEFAULT_LEVEL, "BYOK_LOG_LEVEL")


def _read_config(args: argparse.Namespace, env: EnvFile | None) -> tuple[Config, int]:
    """The keys file, the log level and the config, read and checked, and then the keys applied:
    what a start and a SIGHUP do. Raises ConfigError, LogLevelError or EnvFileError, having
    changed nothing."""
    keys = env.read() if env is not None else None
    level = log_level(args)
    config = load_from_args(args)
    if args.proxy:
        config = attrs.evolve(config, proxy=attrs.evolve(config.proxy, enabled=True))
    if env is not None:
        env.apply(keys)
    return config, level


def _reload(args: argparse.Namespace, env: EnvFile | None, reloads: trio.MemorySendChannel[Config]) -> None:
    """SIGHUP: read the keys file and the config again and hand the config to the daemon; a bad
    one is refused in one line and the running one stays."""
    try:
        config, level = _read_config(args, env)
    except (ConfigError, LogLevelError, EnvFileError) as e:
        log.error("SIGHUP: not reloaded, the running config stays: %s", e)
        return
    logging.getLogger().setLevel(level)
    reloads.send_nowait(config)


def cmd_serve(args: argparse.Namespace) -> int:
    env_path = env_file_path(args.env_file)
    env = EnvFile(env_path) if env_path is not None else None
    try:
        config, level = _read_config(args, env)
    except (ConfigError, LogLevelError, EnvFileError) as e:
        print(f"byok: {e}", file=sys.stderr)
        return EXIT_CONFIG
    tune_allocator()
    configure_logging(level)

    async def main() -> None:
        reloads, reloaded = trio.open_memory_channel[Config](math.inf)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async with trio.open_nursery() as nursery:
                started = await nursery.start(_daemon_task, config, reloaded, nursery.cancel_scope)
                stop: Callable[[], None] | None = started[1]
                # Everything loaded so far (modules, thousands of generated protobuf classes,
                # prompts, the server) lives as long as the process: keep the cyclic GC from
                # scanning it again in every full collection (a 57 ms pause mid-turn, measured).
                gc.collect()
                gc.freeze()
                # A full collection scans every tracked object (21-52 ms with a few histories
                # loaded): the daemon runs them between runs instead (run/upkeep.py).
                gc.set_threshold(*FULL_COLLECTIONS_OFF)
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        if stop is not None:
                            _reload(args, env, reloads)
                        continue
                    if stop is None:
                        log.info("second signal: cancelling now")
                        nursery.cancel_scope.cancel()
                        break
                    log.info("received %s: graceful shutdown", signal.Signals(signum).name)
                    stop()
                    stop = None

    from byok.daemon import ConfigStartupError, StartupError

    try:
        trio.run(main)
    except KeyboardInterrupt:
        return 0
    except BaseExceptionGroup as group:  # the nurseries wrap what the daemon raised
        startup = sole(group, StartupError)
        if startup is None:
            raise
        print(f"byok: {startup}", file=sys.stderr)
        return EXIT_CONFIG if isinstance(startup, ConfigStartupError) else EXIT_STARTUP
    return 0


async def _daemon_task(
    config: Config,
    reloads: trio.MemoryReceiveChannel[Config],
    done: trio.CancelScope,
    task_status: trio.TaskStatus[tuple[str, Callable[[], None]]] = trio.TASK_STATUS_IGNORED,
) -> None:
    from byok.daemon import run_daemon

    await run_daemon(config, reloads=reloads, task_status=task_status)
    done.cancel()  # the daemon has shut down: stop waiting for signals
