"""What `byok serve` says once it listens: the config it runs on, what it serves, where."""

from __future__ import annotations

from byok.config import DEFAULTS_SOURCE, Config

# Where a user without a config is told to write one (the CLI's default path).
DEFAULT_CONFIG_PATH = "~/.config/byok/config.toml"


def config_source(config: Config) -> str:
    return "no config: built-in defaults" if config.source == DEFAULTS_SOURCE else config.source


def model_lines(config: Config) -> list[str]:
    """The providers and models a config loads, by id; disabled models are relayed upstream."""
    providers = ", ".join(f"{p.id} ({p.kind}, {p.base_url})" for p in config.providers) or "none"
    served = ", ".join(f"{m.id} ({m.provider}/{m.upstream_model})" for m in config.enabled_models())
    lines = [f"providers: {providers}", f"models: {served or 'none'}"]
    hidden = [m.id for m in config.models if not m.enabled]
    if hidden:
        lines.append(f"disabled (relayed to Cursor's backend): {', '.join(hidden)}")
    return lines


def next_step(config: Config) -> str | None:
    """The one line a daemon with no model to serve needs."""
    if config.enabled_models():
        return None
    where = DEFAULT_CONFIG_PATH if config.source == DEFAULTS_SOURCE else config.source
    return (
        f"no model to serve: add a [[providers]] and a [[models]] entry to {where} "
        "(docs/config.md), then `byok doctor` to check it and SIGHUP (or a restart) to load it"
    )


def summary(config: Config, url: str, *, pid: int, version: str, proxy: str | None = None) -> str:
    lines = [
        f"byok listening on {url} (version {version}, pid {pid})",
        f"config: {config_source(config)}",
        *model_lines(config),
        f"data dir: {config.server.data_dir}",
    ]
    if proxy is not None:
        lines.append(f"HTTPS proxy: {proxy}")
    backends = [
        *([f"web search ({config.search.kind}, {config.search.url})"] if config.search else []),
        *([f"images ({config.images.model} at {config.images.base_url})"] if config.images else []),
    ]
    if backends:
        lines.append(f"tool backends: {', '.join(backends)}")
    step = next_step(config)
    if step is not None:
        lines.append(step)
    return "\n  ".join(lines)
