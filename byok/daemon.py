"""Start the daemon: store, prompt assets, HTTP clients, the ASGI app, hypercorn."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import ssl
import stat
import time
from collections.abc import Callable, Iterator

import attrs
import trio

from byok import fd_limit
from byok.config import Config, ConfigError
from byok.config_reload import reload_plan
from byok.config_tools import tool_backends
from byok.console.secret_box import SecretBox, SecretBoxError
from byok.console.token import TokenCheck, ensure_token
from byok.cursor import proto_decode
from byok.cursor.prompting import PromptAssetError, default_prompt_root, load_prompt_assets
from byok.cursor.tools.catalog import ToolCatalogError, load_tool_catalog, mode_tools
from byok.cursor.tools.registry import build_registry
from byok.daemon_lock import DataDirInUse, DataDirLock
from byok.exception_groups import sole
from byok.http import lan
from byok.http.app import App
from byok.http.ca import LocalCA
from byok.http.clients import provider_client, upstream_client
from byok.http.console_api import ControlApi
from byok.http.forwarder import Forwarder
from byok.http.model_list import ModelListRoutes
from byok.http.offline import OfflineAnswers, UpstreamHealth
from byok.http.proxy import serve_proxy
from byok.http.serve import serve_app
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver
from byok.run.call_feed import CallFeed
from byok.run.call_log import DRAIN_TIMEOUT_S, CallLog
from byok.run.console_state import ConsoleState
from byok.run.conversation_caches import own_cap
from byok.run.deps import RunDeps, tool_setup
from byok.run.upkeep import (
    RunActivity,
    between_runs,
    checkpoint_while_calling,
    tidy,
    until_quiet,
)
from byok.startup_summary import summary
from byok.store import AsyncStore, StoreError
from byok.version import byok_version

log = logging.getLogger("byok")


class StartupError(Exception):
    """The daemon could not start; the message says what to fix (`byok serve` prints it)."""


class ConfigStartupError(StartupError):
    """The config asks for what cannot work: a restart fails the same way until it is fixed
    (`byok serve` exits 2, which the systemd unit does not restart)."""


@contextlib.contextmanager
def _starting(what: str) -> Iterator[None]:
    """The OS's or the store's refusal while starting ``what`` (alone, or all a task group
    raised), as a StartupError."""
    try:
        yield
    except (OSError, StoreError, BaseExceptionGroup) as e:
        refused = sole(e, (OSError, StoreError))
        if refused is None:
            raise
        reason = refused.strerror if isinstance(refused, OSError) and refused.strerror else str(refused)
        raise StartupError(f"cannot {what}: {reason}") from e


def _lan_credential(config: Config) -> lan.Credential | None:
    """Refuse a listen address others can reach without TLS and a credential (LAN mode,
    docs/lan.md), before anything is opened or created; the credential, read and checked."""
    reason = lan.refusal(config)
    if reason is not None:
        raise ConfigStartupError(reason)
    try:
        return lan.credential(config)
    except lan.LanError as e:
        raise ConfigStartupError(str(e)) from None


def _listener_tls(config: Config, *, alpn: tuple[str, ...] = ("h2", "http/1.1")) -> ssl.SSLContext | None:
    try:
        return lan.listener_tls(config, alpn=alpn)
    except lan.LanError as e:
        raise ConfigStartupError(str(e)) from None


def _lock_data_dir(config: Config) -> DataDirLock:
    """The data dir for this daemon alone, or a StartupError naming the daemon that has it."""
    with _starting(f"use data_dir {config.server.data_dir}"):
        try:
            return DataDirLock.acquire(config.server.data_dir, config.source)
        except DataDirInUse as e:
            raise StartupError(str(e)) from None


@contextlib.contextmanager
def _released_on_error(lock: DataDirLock) -> Iterator[None]:
    try:
        yield
    except BaseException:
        lock.release()
        raise


# After the runs end, how long their streams get to write their last frames.
STREAM_DRAIN_S = 5.0
# How long shutdown may spend storing the renders of the histories called since the last release.
RENDERS_SAVE_S = 10.0
# How long a provider-call record may wait for the runs to go quiet before it is written anyway.
CALL_LOG_DEFER_S = 1.0


def _warn_about_keys(config: Config) -> None:
    for provider in config.providers:
        try:
            provider.api_key()
        except ConfigError as e:
            # A service does not see the shell's environment: say so now, not at the first turn.
            log.warning("%s (runs on provider %r fail until it is set)", e, provider.id)
    for tool, backend in (("WebSearch", config.search), ("GenerateImage", config.images)):
        try:
            if backend is not None:
                backend.key.value()
        except ConfigError as e:
            log.warning("%s (%s calls fail until it is set)", e, tool)
    _warn_if_others_read_secrets(config)


async def _apply_reloads(reloads: trio.MemoryReceiveChannel[Config], app: App, config: Config) -> None:
    """Each config sent (the CLI's SIGHUP, read and checked) replaces the running one."""
    async for new in reloads:
        config, changes = reload_plan(config, new)
        app.reconfigure(config)
        log.info("config reloaded from %s: %s", config.source, "; ".join(changes) or "nothing changed")
        _warn_about_keys(config)


def _warn_if_others_read_secrets(config: Config) -> None:
    """A config file that holds keys should be readable by its owner alone."""
    holders = [p.id for p in config.providers if p.secrets_in_file]
    if not holders and not config.server.auth_token_in_file:
        return
    try:
        mode = os.stat(config.source).st_mode
    except OSError:  # built-in defaults, or a file gone since it was read
        return
    if mode & 0o077 and config.server.auth_token_in_file:
        log.warning(
            "%s holds [server] auth_token and other users can read it (mode %s): chmod 600 %s",
            config.source,
            oct(stat.S_IMODE(mode)),
            config.source,
        )
    if not holders:
        return
    if mode & 0o077:
        log.warning(
            "%s holds the keys of provider(s) %s and other users can read it (mode %s): chmod 600 %s",
            config.source,
            ", ".join(map(repr, holders)),
            oct(stat.S_IMODE(mode)),
            config.source,
        )


def _announce_console(base_url: str, new_token: str | None) -> None:
    """The console's address; on the first start, with the token (shown this once: only its
    hash is kept). The token rides in the URL's fragment, which the browser never sends."""
    if new_token is None:
        log.info(
            "console: %s/byok/ (token: the one shown at the first start; `byok console-token`)", base_url
        )
        return
    log.warning(
        "console: %s/byok/#token=%s  (the console token, shown once; `byok console-token` makes a new one)",
        base_url,
        new_token,
    )


async def run_daemon(
    config: Config,
    *,
    reloads: trio.MemoryReceiveChannel[Config] | None = None,
    task_status: trio.TaskStatus[tuple[str, Callable[[], None]]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until ``stop`` (given to ``task_status.started`` with the base URL) is called: then
    stop accepting runs, let active runs finish within shutdown_grace_s, cancel the rest, return.
    Each config received on ``reloads`` replaces the running one (config_reload.py)."""
    credential = _lan_credential(config)
    # Every protobuf class's metadata now (~50-90 ms), not on the first turn's path (47 ms there).
    proto_decode.prime([agent, aiserver])
    fd_limit.raise_fd_limit()  # each connection is a descriptor; macOS starts at 256
    root = default_prompt_root()
    try:
        prompts = load_prompt_assets(root)
        catalog = load_tool_catalog(root)
        tools = tool_setup(
            build_registry(),
            {mode: mode_tools(root, mode, catalog) for mode in prompts},
            tool_backends(config.search, config.images),
        )
    except (PromptAssetError, ToolCatalogError) as e:  # a broken install: no mode falls back
        raise StartupError(f"cannot load the prompt assets: {e}") from e
    _warn_about_keys(config)
    lock = _lock_data_dir(config)
    with _starting(f"use data_dir {config.server.data_dir}"), _released_on_error(lock):
        store = await AsyncStore.open(config.server.data_dir, cache_bytes=own_cap(config.server.cache_bytes))
        # Runs a crash left 'running' can never finish now: record them as interrupted, once.
        interrupted = await store.interrupt_running_runs(int(time.time() * 1000))
    if interrupted:
        log.warning("marked %d run(s) interrupted by the previous shutdown", interrupted)
    try:
        box = SecretBox.load_or_create(config.server.data_dir)
        new_token = ensure_token(config.server.data_dir)
        with _starting("read the console's entries"):
            console = await ConsoleState.open(store, box, config, lambda: int(time.time() * 1000))
    except BaseException as e:
        await store.aclose()
        lock.release()
        if isinstance(e, OSError | SecretBoxError):
            where = config.server.data_dir
            raise StartupError(f"cannot set up the console's key and token in {where}: {e}") from e
        raise
    activity = RunActivity()
    # Call records are finalized once the runs are quiet (or CALL_LOG_DEFER_S at most).
    quiet = functools.partial(until_quiet, activity, CALL_LOG_DEFER_S)
    call_log = CallLog(store, detailed=config.logging.detailed, quiet=quiet)
    feed = CallFeed()
    call_log.on_written = feed.publish  # the console's live call log
    try:
        async with provider_client() as http, upstream_client() as up, trio.open_nursery() as nursery:
            # Call records are written by this task; cancelling the nursery makes it drain its queue.
            await nursery.start(call_log.run)
            deps = RunDeps(
                config=config,
                store=store,
                prompts=prompts,
                tools=tools,
                http=http,
                call_log=call_log,
                activity=activity,
                catalog=console.catalog,
            )
            forwarder = Forwarder(config.server.upstream, up, logging.getLogger("byok.forward"))
            health = UpstreamHealth(config.server.upstream, up)
            app = App(
                config=config,
                deps=deps,
                nursery=nursery,
                forward=forwarder,
                model_list=ModelListRoutes(
                    config, up, config.server.upstream, health=health, catalog=console.catalog
                ),
                offline=OfflineAnswers(config, console.catalog),
                health=health,
                console=ControlApi(
                    config=config,
                    state=console,
                    store=store,
                    tokens=TokenCheck(config.server.data_dir),
                    feed=feed,
                    http=http,
                ),
            )
            # WAL checkpoints and full GC collections between runs, never during one; during
            # runs, WAL checkpoints only while every run waits on its provider.
            await nursery.start(between_runs, app.activity, functools.partial(tidy, store))
            await nursery.start(checkpoint_while_calling, app.activity, store)
            tls = _listener_tls(config)
            served = app if credential is None else lan.guard(app, credential)
            with _starting(f"listen on {config.server.host}:{config.server.port}"):
                base_url, stop_server = await serve_app(
                    served, host=config.server.host, port=config.server.port, nursery=nursery, ssl_context=tls
                )
            stop_proxy: Callable[[], None] | None = None
            proxy_line: str | None = None
            if config.proxy.enabled:
                with _starting(f"load or create the proxy's CA in {config.server.data_dir}"):
                    ca = LocalCA.load_or_create(config.server.data_dir)
                with _starting(f"listen on {config.proxy.host}:{config.proxy.port} (proxy)"):
                    proxy_url, stop_proxy = await serve_proxy(
                        app,
                        host=config.proxy.host,
                        port=config.proxy.port,
                        intercept=config.proxy.intercept,
                        ca=ca,
                        nursery=nursery,
                        # CONNECT is HTTP/1.1: the proxy's own TLS offers nothing else.
                        tls=_listener_tls(config, alpn=("http/1.1",)),
                        credential=credential,
                    )
                proxy_line = f"{proxy_url} (CA {ca.cert_path})"
            lock.announce(base_url)
            # What it serves: the config file's providers and models and the console's.
            serving = attrs.evolve(config, providers=console.catalog.providers, models=console.catalog.models)
            log.info(
                "%s", summary(serving, base_url, pid=os.getpid(), version=byok_version(), proxy=proxy_line)
            )
            if reloads is not None:
                nursery.start_soon(_apply_reloads, reloads, app, config)
            _announce_console(base_url, new_token)
            stop = trio.Event()
            task_status.started((base_url, stop.set))
            await stop.wait()
            log.info("shutting down: waiting up to %gs for active runs", config.server.shutdown_grace_s)
            await app.shutdown(config.server.shutdown_grace_s)
            with trio.move_on_after(RENDERS_SAVE_S):  # the next start's first turns start from them
                await deps.renders.save_all(store)
            app.service.caches.close()
            await app.run_streams.drain_streams(STREAM_DRAIN_S)
            if app.console is not None:  # its live streams never end by themselves
                await app.console.end_live(STREAM_DRAIN_S)
            if stop_proxy is not None:
                stop_proxy()
            stop_server()
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            with trio.move_on_after(DRAIN_TIMEOUT_S):
                await call_log.flush()  # records of runs that ended after the writer stopped
            await store.aclose()
            lock.release()
