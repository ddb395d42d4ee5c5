"""Control API routes for providers (with discovery and the test call), models and aliases.
Entries from the config file are listed read-only; writes go through run/console_state.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from byok.config import ConfigError, ModelConfig, ProviderConfig
from byok.console.catalog import provider_config
from byok.console.entries import AliasEntry, ModelEntry, ProviderEntry
from byok.http import console_http as ch
from byok.http.console_routes import ApiRequest, path_id, route
from byok.run.provider_probe import ProbeError, discover, test_call

if TYPE_CHECKING:
    from byok.http.console_api import ControlApi


# --- providers ------------------------------------------------------------------------------


def _file_provider_json(p: ProviderConfig, source: str) -> dict[str, Any]:
    try:
        value = p.api_key()
    except ConfigError:  # api_key_env unset where the daemon runs: key_env says which
        value = None
    key = "…" + value[-4:] if value else None
    return {
        "id": p.id,
        "kind": p.kind,
        "base_url": p.base_url,
        "enabled": True,
        "key": key,
        "key_env": p.api_key_env,
        "header_names": [n for n, _ in p.headers],
        "source": "config",
        "read_only": True,
        "config_file": source,
    }


def _provider_json(api: ControlApi, e: ProviderEntry) -> dict[str, Any]:
    return {
        "id": e.id,
        "kind": e.kind,
        "base_url": e.base_url,
        "enabled": e.enabled,
        "key": None if e.key_last4 is None else "…" + e.key_last4,
        "header_names": list(e.header_names),
        "source": "console",
        "read_only": False,
        "shadowed": api.state.catalog.shadowed("provider", e.id),
        "key_unreadable": e.id in api.state.unreadable,
    }


def _provider_for_calls(api: ControlApi, pid: str) -> ProviderConfig:
    """A provider as a call would use it (a disabled console one too: testing it is the point)."""
    file = api.state.catalog.file.provider(pid)
    if file is not None:
        return file
    found = api.state.provider_entry(pid)
    if found is None:
        raise ch.ApiError(404, "id", f"no provider {pid!r}")
    return provider_config(*found)


@route("GET", "/providers")
async def list_providers(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    file = api.state.catalog.file
    out = [_file_provider_json(p, file.source) for p in file.providers]
    out += [_provider_json(api, e) for e, _ in api.state.catalog.console.providers]
    return 200, {"providers": out}


@route("POST", "/providers")
async def create_provider(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    return 201, _provider_json(api, await api.state.put_provider(req.body))


@route("GET", "/providers/{id}")
async def get_provider(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    pid = path_id(req)
    file = api.state.catalog.file
    if file.provider(pid) is not None:
        return 200, _file_provider_json(file.provider(pid), file.source)  # type: ignore[arg-type]
    found = api.state.provider_entry(pid)
    if found is None:
        raise ch.ApiError(404, "id", f"no provider {pid!r}")
    return 200, _provider_json(api, found[0])


@route("PATCH", "/providers/{id}")
async def update_provider(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    return 200, _provider_json(api, await api.state.put_provider(req.body, path_id(req)))


@route("DELETE", "/providers/{id}")
async def delete_provider(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    await api.state.delete_provider(path_id(req))
    return 200, {"deleted": req.params["id"]}


@route("POST", "/providers/{id}/discover")
async def discover_models(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    provider = _provider_for_calls(api, path_id(req))
    try:
        models = await discover(api.http, provider)
    except ProbeError as e:
        raise ch.ApiError(502, "", f"provider {provider.id!r}: {e}") from None
    except ConfigError as e:  # an unset api_key_env
        raise ch.ApiError(409, "", str(e)) from None
    return 200, {"provider": provider.id, "models": models}


@route("POST", "/providers/{id}/test")
async def test_provider(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    provider = _provider_for_calls(api, path_id(req))
    body = req.body if req.body is not None else {}
    if not isinstance(body, dict):
        raise ch.ApiError(400, "body", "the request body must be a JSON object")
    unknown = set(body) - {"model"}
    if unknown:
        raise ch.ApiError(400, sorted(unknown)[0], "unknown field (allowed: model)")
    model = body.get("model")
    if model is None:
        model = next((m.upstream_model for m in api.state.catalog.models if m.provider == provider.id), None)
    if not isinstance(model, str) or not model.strip():
        raise ch.ApiError(400, "model", "name the upstream model to call (this provider serves none yet)")
    return 200, await test_call(api.http, provider, model)


# --- models and aliases ---------------------------------------------------------------------


def _model_json(api: ControlApi, m: ModelConfig | ModelEntry, source: str) -> dict[str, Any]:
    out = {
        "id": m.id,
        "provider": m.provider,
        "upstream_model": m.upstream_model,
        "context_tokens": m.context_tokens,
        "display_name": m.display_name,
        "max_output_tokens": m.max_output_tokens,
        "thinking": m.thinking,
        "enabled": m.enabled,
        "extra_body": dict(m.extra_body),
        "source": source,
        "read_only": source == "config",
    }
    if isinstance(m, ModelEntry):
        served = api.state.catalog.model(m.id)
        out.update(
            effort=m.effort,
            vision=m.vision,
            position=m.position,
            shadowed=api.state.catalog.shadowed("model", m.id),
            served=served is not None and served.provider == m.provider and not out.get("shadowed"),
        )
    else:
        out.update(effort=None, vision=m.vision, position=None, shadowed=False, served=True)
    return out


def _alias_json(api: ControlApi, a: AliasEntry) -> dict[str, Any]:
    return {
        **attrs.asdict(a),
        "targets": list(a.targets),
        "served": api.state.catalog.alias(a.id) is not None,
    }


@route("GET", "/models")
async def list_models(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    file = api.state.catalog.file
    out = [_model_json(api, m, "config") for m in file.models]
    out += [_model_json(api, m, "console") for m in api.state.catalog.console.models]
    picker = [m.id for m in api.state.catalog.enabled_models()]
    return 200, {"models": out, "picker": picker}


@route("POST", "/models")
async def create_model(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    return 201, _model_json(api, await api.state.put_model(req.body), "console")


@route("GET", "/models/{id}")
async def get_model(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    mid = path_id(req)
    file_model = api.state.catalog.file.model(mid)
    if file_model is not None:
        return 200, _model_json(api, file_model, "config")
    entry = api.state.model_entry(mid)
    if entry is None:
        raise ch.ApiError(404, "id", f"no model {mid!r}")
    return 200, _model_json(api, entry, "console")


@route("PATCH", "/models/{id}")
async def update_model(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    return 200, _model_json(api, await api.state.put_model(req.body, path_id(req)), "console")


@route("DELETE", "/models/{id}")
async def delete_model(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    await api.state.delete_model(path_id(req))
    return 200, {"deleted": req.params["id"]}


@route("GET", "/aliases")
async def list_aliases(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    return 200, {"aliases": [_alias_json(api, a) for a in api.state.catalog.console.aliases]}


@route("POST", "/aliases")
async def create_alias(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    return 201, _alias_json(api, await api.state.put_alias(req.body))


@route("GET", "/aliases/{id}")
async def get_alias(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    entry = api.state.alias_entry(path_id(req))
    if entry is None:
        raise ch.ApiError(404, "id", f"no alias {req.params['id']!r}")
    return 200, _alias_json(api, entry)


@route("PATCH", "/aliases/{id}")
async def update_alias(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    return 200, _alias_json(api, await api.state.put_alias(req.body, path_id(req)))


@route("DELETE", "/aliases/{id}")
async def delete_alias(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    await api.state.delete_alias(path_id(req))
    return 200, {"deleted": req.params["id"]}
