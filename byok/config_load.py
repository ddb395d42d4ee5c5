"""Reading byok's TOML configuration into the values in ``config.py``: every section checked
strictly (unknown keys are errors at every level), because a typo such as ``upstream_modle``
would otherwise silently fall back to a default and surface much later as a confusing provider
error. Every failure is one ``ConfigError`` line naming the file, the key path
(``models[1].provider``, indexes 0-based) and the problem.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from byok.config import (
    DEFAULT_DATA_DIR,
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_PROXY_INTERCEPT,
    DEFAULT_PROXY_PORT,
    DEFAULT_UPSTREAM,
    DEFAULTS_SOURCE,
    MIN_CACHE_BYTES,
    OVERRIDES_SOURCE,
    PLACEMENTS,
    PROVIDER_KINDS,
    Config,
    ConfigError,
    LoggingConfig,
    ModelConfig,
    ModelsListConfig,
    ProviderConfig,
    ProxyConfig,
    ServerConfig,
)
from byok.config_reader import Table, check_port, check_url, pick
from byok.config_requests import default_prompt_cache_key, extra_body_problem, provider_headers
from byok.config_tools import load_images, load_search

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
    "cache_bytes",
    "tls_cert",
    "tls_key",
    "tls_names",
    "auth_token_env",
    "auth_token",
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
    "vision",
    "extra_body",
)
_MODELS_LIST_KEYS = ("placement", "default")
_PROXY_KEYS = ("enabled", "host", "port", "intercept")
_LOGGING_KEYS = ("detailed", "record_runs")
_OVERRIDE_KEYS = ("host", "port", "data_dir")


def _server(t: Table, overrides: Mapping[str, object]) -> ServerConfig:
    if "idle_release_s" in t.data:
        raise t.error(
            "idle_release_s",
            "no longer read: the caches are bounded by cache_bytes, one byte budget shared by "
            "all conversations (remove idle_release_s; see docs/config.md)",
        )
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
    tls_cert, tls_key, tls_names = t.string("tls_cert"), t.string("tls_key"), t.strings("tls_names")
    if (tls_cert is None) != (tls_key is None):
        raise t.error("tls_key" if tls_key is None else "tls_cert", "set both tls_cert and tls_key")
    if tls_cert is not None and tls_names:
        raise t.error(
            "tls_names",
            "set tls_cert and tls_key (your certificate) or tls_names (byok issues one), not both",
        )
    token_env, token = t.string("auth_token_env"), t.string("auth_token")
    if token_env is not None and token is not None:
        raise t.error("auth_token", "set at most one of auth_token and auth_token_env")
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
            cache_bytes=t.integer("cache_bytes", minimum=MIN_CACHE_BYTES),
        ),
        tls_cert=None if tls_cert is None else Path(tls_cert).expanduser(),
        tls_key=None if tls_key is None else Path(tls_key).expanduser(),
        tls_names=tuple(n.strip() for n in tls_names or ()),
        auth_token_env=token_env,
        auth_token=token,
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
        vision=pick(t.boolean("vision"), True),
        extra_body=tuple(t.json_table("extra_body").items()),
    )


def _models_list(t: Table) -> ModelsListConfig:
    t.check_keys(_MODELS_LIST_KEYS)
    placement = pick(t.string("placement"), "first")
    if placement not in PLACEMENTS:
        raise t.error("placement", f"expected one of: {', '.join(PLACEMENTS)}, got {placement!r}")
    return ModelsListConfig(placement=placement, default=t.string("default"))  # type: ignore[arg-type]


def _check_default(source: str, models_list: ModelsListConfig, models: list[ModelConfig]) -> None:
    """The configured default must be a model Cursor is shown."""
    default = models_list.default
    if default is None:
        return
    model = next((m for m in models if m.id == default), None)
    if model is None:
        listing = ", ".join(m.id for m in models if m.enabled) or "none configured"
        raise ConfigError(source, "models_list.default", f"unknown model {default!r} (enabled: {listing})")
    if not model.enabled:
        raise ConfigError(source, "models_list.default", f"model {default!r} has enabled = false")


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
    return LoggingConfig(
        detailed=pick(t.boolean("detailed"), False), record_runs=pick(t.boolean("record_runs"), False)
    )


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
    root.check_keys(("server", "providers", "models", "models_list", "proxy", "logging", "search", "images"))
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
    models_list = _models_list(root.table("models_list"))
    _check_default(source, models_list, models)
    return Config(
        server=server,
        providers=tuple(providers),
        models=tuple(models),
        source=source,
        models_list=models_list,
        proxy=_proxy(root.table("proxy")),
        logging=_logging(root.table("logging")),
        search=load_search(root.table("search")),
        images=load_images(root.table("images")),
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
