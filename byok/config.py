"""byok's TOML configuration: ``[server]``, ``[[providers]]``, ``[[models]]``, and the optional
``[models_list]`` (where byok's models go in Cursor's picker), ``[proxy]`` and ``[logging]`` tables.

Validation is strict (unknown keys are errors at every level) because a typo such as
``upstream_modle`` would otherwise silently fall back to a default and surface much later
as a confusing provider error. Every failure is one ``ConfigError`` line naming the file, the
key path (``models[1].provider``, indexes 0-based) and the problem.

API keys are never resolved at load time: ``ProviderConfig.api_key()`` reads the environment
when a request needs it, so the daemon starts without secrets and picks up rotated keys.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal, get_args

import attrs

from byok.config_reader import Table, check_port, check_url, pick
from byok.config_requests import default_prompt_cache_key, extra_body_problem, provider_headers

ProviderKind = Literal["openai_chat", "openai_responses", "anthropic"]
PROVIDER_KINDS: Final[tuple[str, ...]] = get_args(ProviderKind)

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8790
DEFAULT_DATA_DIR: Final = "~/.local/share/byok"
DEFAULT_UPSTREAM: Final = "https://api2.cursor.sh"
DEFAULT_HEARTBEAT_S: Final = 5.0
DEFAULT_KV_ACK_TIMEOUT_S: Final = 30.0
DEFAULT_MAX_BODY_BYTES: Final = 32 * 1024 * 1024
DEFAULT_PROXY_PORT: Final = 8791
DEFAULT_PROXY_INTERCEPT: Final = ("*.cursor.sh",)
Placement = Literal["first", "last"]
PLACEMENTS: Final[tuple[str, ...]] = get_args(Placement)

DEFAULTS_SOURCE: Final = "<defaults>"
OVERRIDES_SOURCE: Final = "<command line>"


class ConfigError(Exception):
    """One-line, user-facing: ``<file>: <key path>: <problem>``."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        self.source = source
        self.key = key
        # Keep it on one line whatever the underlying message (tomllib, OSError) contains.
        self.problem = " ".join(problem.split())
        super().__init__(f"{source}: {key}: {self.problem}" if key else f"{source}: {self.problem}")


@attrs.frozen
class ServerConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    data_dir: Path = attrs.field(factory=lambda: Path(DEFAULT_DATA_DIR).expanduser())
    upstream: str = DEFAULT_UPSTREAM
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    kv_ack_timeout_s: float = DEFAULT_KV_ACK_TIMEOUT_S
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # Provider retries (408/425/429/5xx, connection errors, before any output reached Cursor).
    provider_max_tries: int = 4
    provider_retry_base_s: float = 0.5
    # A dropped RunSSE keeps its run alive this long for a reconnect (Bidi may still deliver results).
    reconnect_grace_s: float = 30.0
    # On SIGTERM, active runs get this long to finish before they are cancelled.
    shutdown_grace_s: float = 10.0
    # After this long with no run, the decoded histories and request fragments held for fast next
    # turns are dropped and the memory handed back (run/upkeep.py).
    idle_release_s: float = 600.0


# A header whose name holds one of these carries a credential.
_CREDENTIAL_MARKERS = ("key", "auth", "token", "secret")


@attrs.frozen
class ProviderConfig:
    id: str
    kind: ProviderKind
    base_url: str
    api_key_env: str | None = None
    # A literal key from the file; private so callers go through api_key(), kept out of repr.
    _api_key: str | None = attrs.field(default=None, repr=False, alias="api_key")
    # Anthropic: ask for automatic prompt caching (a top-level cache_control). Without it the
    # Messages API caches nothing, and every turn pays for (and waits on) the whole history.
    prompt_cache: bool = True
    # Anthropic: stream each tool's input as it is generated (eager_input_streaming on every
    # tool). Without it the API buffers a parameter until it validates, so a Write's live
    # content reaches Cursor only when the whole file is written.
    eager_input_streaming: bool = True
    # OpenAI kinds: send a prompt_cache_key per conversation. OpenAI routes a request by a hash
    # of its first tokens (the system prompt, the same in every conversation) and the key; one
    # key for all conversations lets a busy prefix spill to machines without its cache.
    prompt_cache_key: bool = False
    # HTTP headers sent with every request to this provider (``[providers.headers]``): a
    # gateway's own, a beta feature; one named like an auth header byok sends replaces it.
    headers: tuple[tuple[str, str], ...] = ()
    # Where this entry came from, so a missing env var can be reported like a file error.
    source: str = attrs.field(default=DEFAULTS_SOURCE, eq=False, repr=False)
    key_path: str = attrs.field(default="providers", eq=False, repr=False)

    @property
    def secrets_in_file(self) -> bool:
        """Whether the config file itself holds a credential of this provider: a literal key, or
        a header named like one (Azure's ``api-key``, a gateway's token)."""
        return self._api_key is not None or any(
            marker in name.lower() for name, _ in self.headers for marker in _CREDENTIAL_MARKERS
        )

    def api_key(self) -> str | None:
        """The key to send, or None for keyless (local) servers. Reads the environment now."""
        if self.api_key_env is None:
            return self._api_key
        value = os.environ.get(self.api_key_env)
        if not value:
            state = "is empty" if value == "" else "is not set"
            raise ConfigError(
                self.source,
                f"{self.key_path}.api_key_env",
                f"environment variable {self.api_key_env} {state}",
            )
        return value


@attrs.frozen
class ModelConfig:
    id: str
    provider: str
    upstream_model: str
    context_tokens: int
    display_name: str | None = None
    max_output_tokens: int | None = None
    replay_reasoning: bool = True
    # Listed in Cursor's model picker (and the CLI's model list) when true.
    enabled: bool = True
    # Shown to Cursor as a thinking (reasoning) model.
    thinking: bool = False
    # Top-level request fields added to every call of this model, in the file's order
    # (``[models.extra_body]``): reasoning effort, a thinking budget, sampling settings.
    # Its values are JSON (dicts, lists): compared, not hashed, so the config stays hashable.
    extra_body: tuple[tuple[str, Any], ...] = attrs.field(default=(), hash=False)


@attrs.frozen
class ModelsListConfig:
    """``[models_list]``: how byok's models are merged into Cursor's model list."""

    placement: Placement = "first"


@attrs.frozen
class ProxyConfig:
    """``[proxy]``: the optional HTTPS (CONNECT) proxy listener with byok's local CA."""

    enabled: bool = False
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PROXY_PORT
    # Host patterns (fnmatch, case-insensitive) whose TLS byok terminates; others are tunnelled.
    intercept: tuple[str, ...] = DEFAULT_PROXY_INTERCEPT


@attrs.frozen
class LoggingConfig:
    """``[logging]``: what provider-call records keep beyond the request (always stored)."""

    # Also store each call's raw response stream (capped at 8 MiB) in llm_calls.response_capture.
    detailed: bool = False


@attrs.frozen
class Config:
    server: ServerConfig
    providers: tuple[ProviderConfig, ...]
    models: tuple[ModelConfig, ...]
    source: str
    models_list: ModelsListConfig = attrs.field(factory=ModelsListConfig)
    proxy: ProxyConfig = attrs.field(factory=ProxyConfig)
    logging: LoggingConfig = attrs.field(factory=LoggingConfig)

    def enabled_models(self) -> tuple[ModelConfig, ...]:
        """The models Cursor is shown, in config order."""
        return tuple(m for m in self.models if m.enabled)

    def model(self, model_id: str) -> ModelConfig | None:
        return next((m for m in self.models if m.id == model_id), None)

    def provider(self, provider_id: str) -> ProviderConfig | None:
        return next((p for p in self.providers if p.id == provider_id), None)


# --- sections -------------------------------------------------------------------------

_SERVER_KEYS = (
    "host",
    "port",
    "data_dir",
    "upstream",
    "heartbeat_s",
    "kv_ack_timeout_s",
    "max_body_bytes",
    "provider_max_tries",
    "provider_retry_base_s",
    "reconnect_grace_s",
    "shutdown_grace_s",
    "idle_release_s",
)
_PROVIDER_KEYS = (
    "id",
    "kind",
    "base_url",
    "api_key_env",
    "api_key",
    "prompt_cache",
    "eager_input_streaming",
    "prompt_cache_key",
    "headers",
)
_MODEL_KEYS = (
    "id",
    "provider",
    "upstream_model",
    "context_tokens",
    "display_name",
    "max_output_tokens",
    "replay_reasoning",
    "enabled",
    "thinking",
    "extra_body",
)
_MODELS_LIST_KEYS = ("placement",)
_PROXY_KEYS = ("enabled", "host", "port", "intercept")
_LOGGING_KEYS = ("detailed",)
_OVERRIDE_KEYS = ("host", "port", "data_dir")


def _server(t: Table, overrides: Mapping[str, object]) -> ServerConfig:
    t.check_keys(_SERVER_KEYS)
    # Overrides come from CLI flags; they are validated with the same rules, reported
    # against the command line rather than the file.
    given = {k: str(v) if isinstance(v, Path) else v for k, v in overrides.items() if v is not None}
    o = Table(OVERRIDES_SOURCE, "", given, ConfigError)
    o.check_keys(_OVERRIDE_KEYS)

    host = pick(o.string("host"), pick(t.string("host"), DEFAULT_HOST))
    port = pick(
        check_port(o, "port", o.integer("port", minimum=None)),
        pick(check_port(t, "port", t.integer("port", minimum=None)), DEFAULT_PORT),
    )
    data_dir = pick(o.string("data_dir"), pick(t.string("data_dir"), DEFAULT_DATA_DIR))
    upstream = t.string("upstream")
    return ServerConfig(
        host=host,
        port=port,
        data_dir=Path(data_dir).expanduser(),
        upstream=DEFAULT_UPSTREAM if upstream is None else check_url(t, "upstream", upstream),
        **_given(  # what the file leaves out keeps ServerConfig's default
            heartbeat_s=t.number("heartbeat_s"),
            kv_ack_timeout_s=t.number("kv_ack_timeout_s"),
            max_body_bytes=t.integer("max_body_bytes"),
            provider_max_tries=t.integer("provider_max_tries"),
            provider_retry_base_s=t.number("provider_retry_base_s"),
            reconnect_grace_s=t.number("reconnect_grace_s"),
            shutdown_grace_s=t.number("shutdown_grace_s"),
            idle_release_s=t.number("idle_release_s"),
        ),
    )


def _given(**values: object) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _provider(t: Table) -> ProviderConfig:
    t.check_keys(_PROVIDER_KEYS)
    pid = t.string("id", required=True)
    kind = t.string("kind", required=True)
    if kind not in PROVIDER_KINDS:
        raise t.error("kind", f"unknown kind {kind!r} (expected one of: {', '.join(PROVIDER_KINDS)})")
    base_url = check_url(t, "base_url", t.string("base_url", required=True) or "")
    api_key_env = t.string("api_key_env")
    api_key = t.string("api_key")
    if api_key_env is not None and api_key is not None:
        raise ConfigError(t.source, t.path, "set at most one of api_key and api_key_env")
    prompt_cache = t.boolean("prompt_cache")
    if prompt_cache is not None and kind != "anthropic":
        raise t.error("prompt_cache", "applies to anthropic providers (OpenAI caches prefixes on its own)")
    eager = t.boolean("eager_input_streaming")
    if eager is not None and kind != "anthropic":
        raise t.error("eager_input_streaming", "applies to anthropic providers")
    cache_key = t.boolean("prompt_cache_key")
    if cache_key is not None and kind == "anthropic":
        raise t.error("prompt_cache_key", "applies to OpenAI providers (Anthropic has prompt_cache)")
    assert pid is not None
    return ProviderConfig(
        id=pid,
        kind=kind,  # type: ignore[arg-type]  # narrowed by the membership test above
        base_url=base_url,
        api_key_env=api_key_env,
        api_key=api_key,
        prompt_cache=pick(prompt_cache, True),
        eager_input_streaming=pick(eager, True),
        prompt_cache_key=pick(cache_key, default_prompt_cache_key(kind, base_url)),
        headers=provider_headers(t, api_key_env is not None or api_key is not None),
        source=t.source,
        key_path=t.path,
    )


def _model(t: Table) -> ModelConfig:
    t.check_keys(_MODEL_KEYS)
    mid = t.string("id", required=True)
    provider = t.string("provider", required=True)
    upstream_model = t.string("upstream_model", required=True)
    context_tokens = t.integer("context_tokens", required=True)
    assert mid is not None and provider is not None and upstream_model is not None
    assert context_tokens is not None
    return ModelConfig(
        id=mid,
        provider=provider,
        upstream_model=upstream_model,
        context_tokens=context_tokens,
        display_name=t.string("display_name"),
        max_output_tokens=t.integer("max_output_tokens"),
        replay_reasoning=pick(t.boolean("replay_reasoning"), True),
        enabled=pick(t.boolean("enabled"), True),
        thinking=pick(t.boolean("thinking"), False),
        extra_body=tuple(t.json_table("extra_body").items()),
    )


def _models_list(t: Table) -> ModelsListConfig:
    t.check_keys(_MODELS_LIST_KEYS)
    placement = pick(t.string("placement"), "first")
    if placement not in PLACEMENTS:
        raise t.error("placement", f"expected one of: {', '.join(PLACEMENTS)}, got {placement!r}")
    return ModelsListConfig(placement=placement)  # type: ignore[arg-type]  # checked above


def _proxy(t: Table) -> ProxyConfig:
    t.check_keys(_PROXY_KEYS)
    intercept = t.strings("intercept")
    return ProxyConfig(
        enabled=pick(t.boolean("enabled"), False),
        host=pick(t.string("host"), DEFAULT_HOST),
        port=pick(check_port(t, "port", t.integer("port", minimum=None)), DEFAULT_PROXY_PORT),
        intercept=DEFAULT_PROXY_INTERCEPT if intercept is None else tuple(p.strip() for p in intercept),
    )


def _logging(t: Table) -> LoggingConfig:
    t.check_keys(_LOGGING_KEYS)
    return LoggingConfig(detailed=pick(t.boolean("detailed"), False))


def _unique_ids(source: str, section: str, ids: list[str]) -> None:
    seen: dict[str, int] = {}
    for i, item_id in enumerate(ids):
        if item_id in seen:
            raise ConfigError(
                source,
                f"{section}[{i}].id",
                f"duplicate id {item_id!r} (first at {section}[{seen[item_id]}])",
            )
        seen[item_id] = i


def _build(source: str, data: Mapping[str, object], overrides: Mapping[str, object]) -> Config:
    root = Table(source, "", data, ConfigError)
    root.check_keys(("server", "providers", "models", "models_list", "proxy", "logging"))
    server = _server(root.table("server"), overrides)
    providers = [_provider(t) for t in root.tables("providers")]
    _unique_ids(source, "providers", [p.id for p in providers])
    models = [_model(t) for t in root.tables("models")]
    _unique_ids(source, "models", [m.id for m in models])
    known = {p.id: p for p in providers}
    for i, m in enumerate(models):
        if m.provider not in known:
            listing = ", ".join(sorted(known)) or "none configured"
            raise ConfigError(
                source, f"models[{i}].provider", f"unknown provider {m.provider!r} (known: {listing})"
            )
        problem = extra_body_problem(known[m.provider].kind, m)
        if problem is not None:
            key, text = problem
            raise ConfigError(source, f"models[{i}].extra_body{key}", text)
    return Config(
        server=server,
        providers=tuple(providers),
        models=tuple(models),
        source=source,
        models_list=_models_list(root.table("models_list")),
        proxy=_proxy(root.table("proxy")),
        logging=_logging(root.table("logging")),
    )


def load_config(path: Path | None, *, overrides: Mapping[str, object] | None = None) -> Config:
    """Read and validate ``path``; ``None`` gives the defaults (no providers, no models).

    ``overrides`` carries CLI flags (``host``, ``port``, ``data_dir``; ``None`` values are
    ignored) and wins over the file. Locating the file (``BYOK_CONFIG``) is the CLI's job.
    """
    overrides = overrides or {}
    if path is None:
        return _build(DEFAULTS_SOURCE, {}, overrides)
    source = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(source, "", f"cannot read file: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(source, "", f"not valid UTF-8 at byte {exc.start}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, "", f"invalid TOML: {exc}") from None
    return _build(source, data, overrides)
