"""The providers, models and aliases runs may use: the config file's merged with the console's.

The file's entries come first and win: a console entry whose id the file also uses is kept but
shadowed (the API shows it so). Console models go into Cursor's picker after the file's models
(which keep file order), ordered by their ``position``, aliases among them. A console provider
that is disabled serves nothing, nor do its models.

``Catalog`` is the one mutable holder: ``use_console`` (after every console write) and
``use_file`` (a reloaded config) swap in new values, and every run, model list and routing
decision reads the current ones, so a change applies to the next run without a restart. Sans-IO.
"""

from __future__ import annotations

from typing import Any, Final

import attrs

from byok.config import Config, ModelConfig, ProviderConfig
from byok.config_requests import extra_body_problem
from byok.console.entries import AliasEntry, FieldError, ModelEntry, ProviderEntry, ProviderSecrets
from byok.providers.anthropic_request import DEFAULT_MAX_TOKENS
from byok.providers.kinds import ANTHROPIC, OPENAI_CHAT

CONSOLE_SOURCE: Final = "<console>"
# Anthropic has no effort setting: a thinking budget stands for it.
ANTHROPIC_BUDGETS: Final = {"low": 4096, "medium": 12000, "high": 24000}


@attrs.frozen
class ConsoleEntries:
    providers: tuple[tuple[ProviderEntry, ProviderSecrets], ...] = ()
    models: tuple[ModelEntry, ...] = ()
    aliases: tuple[AliasEntry, ...] = ()


@attrs.frozen
class Target:
    """One model an alias (or a plain model id) runs on."""

    model: ModelConfig
    provider: ProviderConfig


@attrs.frozen
class AliasConfig:
    id: str
    targets: tuple[str, ...]
    first_token_timeout_s: float
    cooldown_s: float


def effort_fields(kind: str, effort: str | None) -> tuple[tuple[str, Any], ...]:
    """The request fields a model's effort becomes for a provider of ``kind``."""
    if effort is None:
        return ()
    if kind == OPENAI_CHAT:
        return (("reasoning_effort", effort),)
    if kind == ANTHROPIC:
        return (("thinking", {"type": "enabled", "budget_tokens": ANTHROPIC_BUDGETS[effort]}),)
    return (("reasoning", {"effort": effort, "summary": "auto"}),)


def model_config(entry: ModelEntry, kind: str) -> ModelConfig:
    """A console model as the runs see it; FieldError when its settings cannot be sent."""
    effort = effort_fields(kind, entry.effort)
    clash = {k for k, _ in effort} & {k for k, _ in entry.extra_body}
    if clash:
        raise FieldError("effort", f"extra_body also sets {sorted(clash)[0]!r}: set one of them")
    max_out = entry.max_output_tokens
    if kind == ANTHROPIC and entry.effort is not None and max_out is None:
        max_out = ANTHROPIC_BUDGETS[entry.effort] + DEFAULT_MAX_TOKENS  # room to answer after thinking
    model = ModelConfig(
        id=entry.id,
        provider=entry.provider,
        upstream_model=entry.upstream_model,
        context_tokens=entry.context_tokens,
        display_name=entry.display_name,
        max_output_tokens=max_out,
        enabled=entry.enabled,
        thinking=entry.thinking or entry.effort is not None,
        vision=entry.vision,
        extra_body=(*entry.extra_body, *effort),
    )
    problem = extra_body_problem(kind, model)
    if problem is not None:
        key, text = problem
        from_effort = bool(effort) and key.startswith(".thinking")  # the budget effort chose
        raise FieldError("effort" if from_effort else "extra_body" + key, text)
    return model


def provider_config(entry: ProviderEntry, secrets: ProviderSecrets) -> ProviderConfig:
    return ProviderConfig(
        id=entry.id,
        kind=entry.kind,  # type: ignore[arg-type]  # checked when the entry was made
        base_url=entry.base_url,
        api_key=secrets.api_key,
        headers=secrets.headers,
        prompt_cache_key=entry.kind == "openai_responses",
        source=CONSOLE_SOURCE,
        key_path=f"provider {entry.id!r}",
    )


class Catalog:
    def __init__(self, config: Config, console: ConsoleEntries | None = None) -> None:
        self._file = config
        self._console = console or ConsoleEntries()
        self._rebuild()

    @property
    def file(self) -> Config:
        return self._file

    @property
    def console(self) -> ConsoleEntries:
        return self._console

    def use_file(self, config: Config) -> None:
        self._file = config
        self._rebuild()

    def use_console(self, console: ConsoleEntries) -> None:
        self._console = console
        self._rebuild()

    # --- what runs and model lists read ---------------------------------------------------------
    @property
    def models(self) -> tuple[ModelConfig, ...]:
        return tuple(self._models.values())

    @property
    def providers(self) -> tuple[ProviderConfig, ...]:
        return tuple(self._providers.values())

    def model(self, model_id: str) -> ModelConfig | None:
        """A model, or an alias as the picker shows it."""
        return self._models.get(model_id) or self._alias_models.get(model_id)

    def provider(self, provider_id: str) -> ProviderConfig | None:
        return self._providers.get(provider_id)

    def serves(self, model_id: str) -> bool:
        """Whether byok runs this model itself (an enabled model or alias with something to run
        on); a run for any other model is relayed to upstream."""
        model = self.model(model_id) if model_id else None
        return model is not None and model.enabled and bool(self.targets(model_id))

    def alias(self, alias_id: str) -> AliasConfig | None:
        return self._aliases.get(alias_id)

    def enabled_models(self) -> tuple[ModelConfig, ...]:
        """Cursor's picker: the file's models in file order, then the console's by position."""
        return self._picker

    def targets(self, model_id: str) -> tuple[Target, ...]:
        """What a run for ``model_id`` may run on, in order (one target unless it is an alias)."""
        alias = self._aliases.get(model_id)
        ids = alias.targets if alias is not None else (model_id,)
        out = []
        for mid in ids:
            model = self._models.get(mid)
            provider = self._providers.get(model.provider) if model is not None else None
            if model is not None and provider is not None:
                out.append(Target(model, provider))
        return tuple(out)

    def shadowed(self, kind: str, entry_id: str) -> bool:
        """Whether the config file holds the id of this console entry (the file's wins)."""
        if kind == "provider":
            return self._file.provider(entry_id) is not None
        return self._file.model(entry_id) is not None

    # --- merge -----------------------------------------------------------------------------------
    def _rebuild(self) -> None:
        file, console = self._file, self._console
        providers = {p.id: p for p in file.providers}
        for entry, secrets in console.providers:
            if entry.id not in providers and entry.enabled:
                providers[entry.id] = provider_config(entry, secrets)
        models = {m.id: m for m in file.models}
        placed: list[tuple[int, str, ModelConfig]] = []
        for entry in console.models:
            provider = providers.get(entry.provider)
            if entry.id in models or provider is None:
                continue
            try:
                model = model_config(entry, provider.kind)
            except FieldError:
                continue  # made for another provider kind: served once it fits again
            models[entry.id] = model
            if model.enabled:
                placed.append((entry.position, entry.id, model))
        aliases: dict[str, AliasConfig] = {}
        alias_models: dict[str, ModelConfig] = {}
        for alias in console.aliases:
            served = [models[t] for t in alias.targets if t in models]
            if alias.id in models or not served or not alias.enabled:
                continue
            aliases[alias.id] = AliasConfig(
                alias.id, alias.targets, alias.first_token_timeout_s, alias.cooldown_s
            )
            first = served[0]
            shown = ModelConfig(
                id=alias.id,
                provider=first.provider,
                upstream_model=first.upstream_model,
                # What every target can take: the conversation may land on any of them.
                context_tokens=min(m.context_tokens for m in served),
                display_name=alias.display_name,
                thinking=first.thinking,
                vision=all(m.vision for m in served),
            )
            alias_models[alias.id] = shown
            placed.append((alias.position, alias.id, shown))
        placed.sort(key=lambda p: (p[0], p[1]))
        self._providers = providers
        self._models = models
        self._aliases = aliases
        self._alias_models = alias_models
        self._picker = file.enabled_models() + tuple(m for _, _, m in placed)
