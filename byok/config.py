"""byok's configuration as values: ``[server]``, ``[[providers]]``, ``[[models]]``, and the
optional ``[models_list]`` (where byok's models go in Cursor's picker), ``[proxy]`` and
``[logging]`` tables, and the tool backends ``[search]`` and ``[images]`` (config_tools.py).
``config_load.load_config`` reads and checks a TOML file into them.

API keys are never resolved at load time: ``ProviderConfig.api_key()`` reads the environment
when a request needs it, so the daemon starts without secrets and picks up rotated keys.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, get_args

import attrs

if TYPE_CHECKING:  # config_tools builds on this module's ConfigError
    from byok.config_tools import ImagesConfig, SearchConfig

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


# The cache budget. A 5,000-message conversation (a long day's agent work, ~6 MB of history)
# is charged ~20 MiB for its caches: 256 MiB keeps a dozen of those hot, or hundreds of ordinary ones,
# more than one user switches between; beside an IDE's own gigabytes it is small. Below 1 MiB
# not even a short conversation stays (and `cache_bytes = 256` was surely meant as MiB).
DEFAULT_CACHE_BYTES = 256 * 2**20
MIN_CACHE_BYTES = 2**20


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
    # What all conversations' caches (decoded histories, request fragments, meter hashes, client
    # memory) may hold together; past it the least recently used idle ones go
    # (run/conversation_caches.py).
    cache_bytes: int = DEFAULT_CACHE_BYTES
    # LAN mode (docs/lan.md). TLS on every listener: a certificate of the user's (tls_cert and
    # tls_key, PEM) or one byok's local CA issues for tls_names. A credential every request must
    # carry: auth_token_env names the variable holding it (auth_token: the token itself).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_names: tuple[str, ...] = ()
    auth_token_env: str | None = None
    _auth_token: str | None = attrs.field(default=None, repr=False, alias="auth_token")

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None or bool(self.tls_names)

    @property
    def has_auth_token(self) -> bool:
        return self.auth_token_env is not None or self._auth_token is not None

    @property
    def auth_token_in_file(self) -> bool:
        return self._auth_token is not None

    def auth_token(self) -> str | None:
        """The credential requests must carry, or None when none is configured. Reads the
        environment now."""
        if self.auth_token_env is None:
            return self._auth_token
        value = os.environ.get(self.auth_token_env)
        if not value:
            state = "is empty" if value == "" else "is not set"
            raise ConfigError(
                "<environment>",
                "server.auth_token_env",
                f"environment variable {self.auth_token_env} {state}",
            )
        return value


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
    # The model reads images: pasted ones and Read of an image file go to it. False: Cursor is
    # told the model takes no images, and a message with images is refused with a clear error.
    vision: bool = True
    # Top-level request fields added to every call of this model, in the file's order
    # (``[models.extra_body]``): reasoning effort, a thinking budget, sampling settings.
    # Its values are JSON (dicts, lists): compared, not hashed, so the config stays hashable.
    extra_body: tuple[tuple[str, Any], ...] = attrs.field(default=(), hash=False)


@attrs.frozen
class ModelsListConfig:
    """``[models_list]``: how byok's models are merged into Cursor's model list."""

    placement: Placement = "first"
    # The model Cursor's default-model calls answer with (an enabled model's id); None leaves
    # upstream's default in place.
    default: str | None = None


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
    # Keep each run's input log ({data_dir}/runs/{request_id}.jsonl) for `byok replay`.
    record_runs: bool = False


@attrs.frozen
class Config:
    server: ServerConfig
    providers: tuple[ProviderConfig, ...]
    models: tuple[ModelConfig, ...]
    source: str
    models_list: ModelsListConfig = attrs.field(factory=ModelsListConfig)
    proxy: ProxyConfig = attrs.field(factory=ProxyConfig)
    logging: LoggingConfig = attrs.field(factory=LoggingConfig)
    # Backends of server-side tools (config_tools.py): None leaves the tool unoffered.
    search: SearchConfig | None = None
    images: ImagesConfig | None = None

    def enabled_models(self) -> tuple[ModelConfig, ...]:
        """The models Cursor is shown, in config order."""
        return tuple(m for m in self.models if m.enabled)

    def model(self, model_id: str) -> ModelConfig | None:
        return next((m for m in self.models if m.id == model_id), None)

    def serves(self, model_id: str) -> bool:
        """Whether byok runs this model itself: a configured, enabled one. A run for any other
        model is relayed to upstream."""
        model = self.model(model_id) if model_id else None
        return model is not None and model.enabled

    def provider(self, provider_id: str) -> ProviderConfig | None:
        return next((p for p in self.providers if p.id == provider_id), None)
