"""byok's models as Cursor's model-list RPCs describe them, and the merge into upstream's lists.

Sans-IO: messages (or their proto3-JSON dicts) in, messages out. The HTTP side lives in
``byok.http.model_list``.

Wire shapes (reference schema):

- ``aiserver.v1.AiService/AvailableModels`` answers ``AvailableModelsResponse``: the IDE's picker.
  Each entry is an ``AvailableModel`` keyed by ``name``; ``model_names`` repeats the names.
- ``GetUsableModels`` (on ``agent.v1.AgentService`` and ``aiserver.v1.AiService``) answers
  ``agent.v1.GetUsableModelsResponse``: a list of ``agent.v1.ModelDetails`` keyed by
  ``model_id`` (the cursor-agent CLI's list). The aiserver copy of the message names the same
  client class, so byok reads both with the agent.v1 type.
- ``aiserver.v1.CppService/AvailableModels`` answers ``AvailableCppModelsResponse``: model ids
  and a default; the cursor-agent CLI's model list.
- ``GetDefaultModelForCli`` answers ``agent.v1.GetDefaultModelForCliResponse`` and
  ``AiService/GetDefaultModel`` answers ``aiserver.v1.GetDefaultModelResponse``.

``default`` is ``[models_list] default``: the model byok answers as the default, or None (the
first model when byok answers alone).

A byok model replaces an upstream entry with the same name; byok's models keep config order and
go first or last as configured. Fields byok does not know (newer than the reference schema) are
preserved: betterproto2 keeps unknown proto fields, and the JSON merge only touches the lists.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from byok.config import ModelConfig, Placement
from byok.cursor import proto_decode
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver

T = TypeVar("T")
_INT32_MAX = 2**31 - 1

AvailableModel = aiserver.AvailableModelsResponseAvailableModel


def display_name(model: ModelConfig) -> str:
    return model.display_name or model.id


def available_model(model: ModelConfig) -> AvailableModel:
    """One picker entry. Capabilities byok does not serve are left off: no Cmd-K (that RPC is
    not byok's), no max mode. Images as the model's ``vision`` says."""
    name = display_name(model)
    context = min(model.context_tokens, _INT32_MAX)
    return AvailableModel(
        name=model.id,
        default_on=True,
        supports_agent=True,
        supports_thinking=model.thinking,
        supports_images=model.vision,
        supports_plan_mode=True,
        supports_max_mode=False,
        supports_non_max_mode=True,
        supports_cmd_k=False,
        context_token_limit=context,
        client_display_name=name,
        server_model_name=model.id,
        inputbox_short_model_name=name,
        tooltip_data=aiserver.AvailableModelsResponseTooltipData(
            primary_text=name,
            secondary_text=f"byok: {model.provider} / {model.upstream_model}",
            markdown_content=(
                f"**{name}** runs on your own account via byok "
                f"(`{model.provider}` / `{model.upstream_model}`, {context:,} token context)"
            ),
        ),
    )


def model_details(model: ModelConfig) -> agent.ModelDetails:
    """One ``GetUsableModels`` entry; a thinking model carries ``thinking_details``."""
    name = display_name(model)
    return agent.ModelDetails(
        model_id=model.id,
        display_model_id=model.id,
        display_name=name,
        display_name_short=name,
        thinking_details=agent.ThinkingDetails() if model.thinking else None,
    )


def splice(
    upstream: Sequence[T], ours: Sequence[T], key: Callable[[T], str], placement: Placement
) -> list[T]:
    """``ours`` placed first or last; upstream entries whose key one of ours has are dropped."""
    taken = {key(o) for o in ours}
    kept = [u for u in upstream if key(u) not in taken]
    return [*ours, *kept] if placement == "first" else [*kept, *ours]


def _same(x: str) -> str:
    return x


def _clone(msg: T) -> T:
    # parse(bytes(...)) keeps unknown fields, which dataclasses.replace would drop.
    return proto_decode.parse(type(msg), bytes(msg))


# --- proto ----------------------------------------------------------------------------


def merge_available_models(
    resp: aiserver.AvailableModelsResponse, models: Sequence[ModelConfig], placement: Placement
) -> aiserver.AvailableModelsResponse:
    out = _clone(resp)
    out.models = splice(resp.models, [available_model(m) for m in models], lambda e: e.name, placement)
    if resp.model_names or not resp.models:
        out.model_names = splice(resp.model_names, [m.id for m in models], _same, placement)
    return out


def merge_usable_models(
    resp: agent.GetUsableModelsResponse, models: Sequence[ModelConfig], placement: Placement
) -> agent.GetUsableModelsResponse:
    out = _clone(resp)
    out.models = splice(resp.models, [model_details(m) for m in models], lambda e: e.model_id, placement)
    return out


def merge_cpp_models(
    resp: aiserver.AvailableCppModelsResponse,
    models: Sequence[ModelConfig],
    placement: Placement,
    default: ModelConfig | None = None,
) -> aiserver.AvailableCppModelsResponse:
    out = _clone(resp)
    out.models = splice(resp.models, [m.id for m in models], _same, placement)
    if default is not None:
        out.default_model = default.id
    return out


def local_available_models(models: Sequence[ModelConfig]) -> aiserver.AvailableModelsResponse:
    """The picker when upstream cannot be asked: byok's models alone, the first as default."""
    resp = aiserver.AvailableModelsResponse(
        models=[available_model(m) for m in models], model_names=[m.id for m in models]
    )
    if models:
        resp.composer_model_config = aiserver.AvailableModelsResponseFeatureModelConfig(
            default_model=models[0].id, fallback_models=[m.id for m in models[1:]]
        )
    return resp


def local_usable_models(models: Sequence[ModelConfig]) -> agent.GetUsableModelsResponse:
    return agent.GetUsableModelsResponse(models=[model_details(m) for m in models])


def _default_of(models: Sequence[ModelConfig], default: ModelConfig | None) -> ModelConfig | None:
    return default if default is not None else (models[0] if models else None)


def local_cpp_models(
    models: Sequence[ModelConfig], default: ModelConfig | None = None
) -> aiserver.AvailableCppModelsResponse:
    chosen = _default_of(models, default)
    return aiserver.AvailableCppModelsResponse(
        models=[m.id for m in models], default_model=chosen.id if chosen is not None else None
    )


def local_default_model_for_cli(
    models: Sequence[ModelConfig], default: ModelConfig | None = None
) -> agent.GetDefaultModelForCliResponse:
    chosen = _default_of(models, default)
    return agent.GetDefaultModelForCliResponse(model=model_details(chosen) if chosen is not None else None)


def local_default_model(
    models: Sequence[ModelConfig], default: ModelConfig | None = None
) -> aiserver.GetDefaultModelResponse:
    chosen = _default_of(models, default)
    if chosen is None:
        return aiserver.GetDefaultModelResponse()
    # The default when thinking is on: the default itself if it thinks, else the first that does.
    thinking = chosen if chosen.thinking else next((m for m in models if m.thinking), chosen)
    return aiserver.GetDefaultModelResponse(model=chosen.id, thinking_model=thinking.id)


# --- proto3 JSON (application/json) ---------------------------------------------------


def _key_of(obj: dict[str, Any], camel: str, snake: str) -> str:
    # Proto3 JSON parsers accept both spellings; answer in whichever upstream used.
    return snake if snake in obj and camel not in obj else camel


def _entry_key(*names: str) -> Callable[[Any], str]:
    def key(entry: Any) -> str:
        if isinstance(entry, dict):
            for n in names:
                if isinstance(entry.get(n), str):
                    return str(entry[n])
        return ""

    return key


def merge_available_models_json(
    obj: dict[str, Any], models: Sequence[ModelConfig], placement: Placement
) -> dict[str, Any]:
    out = dict(obj)
    ours = [available_model(m).to_dict() for m in models]
    upstream = obj.get("models") or []
    out["models"] = splice(upstream, ours, _entry_key("name"), placement)
    names = _key_of(obj, "modelNames", "model_names")
    if obj.get(names) or not upstream:
        out[names] = splice(obj.get(names) or [], [m.id for m in models], _same, placement)
    return out


def merge_cpp_models_json(
    obj: dict[str, Any],
    models: Sequence[ModelConfig],
    placement: Placement,
    default: ModelConfig | None = None,
) -> dict[str, Any]:
    out = dict(obj)
    out["models"] = splice(obj.get("models") or [], [m.id for m in models], _same, placement)
    if default is not None:
        out[_key_of(obj, "defaultModel", "default_model")] = default.id
    return out


def merge_usable_models_json(
    obj: dict[str, Any], models: Sequence[ModelConfig], placement: Placement
) -> dict[str, Any]:
    out = dict(obj)
    ours = [model_details(m).to_dict() for m in models]
    out["models"] = splice(obj.get("models") or [], ours, _entry_key("modelId", "model_id"), placement)
    return out
