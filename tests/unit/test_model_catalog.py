"""The pure model-list merge: byok's models placed first/last, same-name entries replaced."""

from __future__ import annotations

import json

import attrs
import pytest

from byok.config import ModelConfig
from byok.cursor import model_catalog as mc
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver

A = ModelConfig(id="byok-a", provider="p", upstream_model="gpt-x", context_tokens=128000, display_name="A")
B = ModelConfig(
    id="byok-b", provider="p", upstream_model="o-think", context_tokens=3_000_000_000, thinking=True
)
# A byok model that shadows an official one of the same name.
SHADOW = ModelConfig(id="gpt-5", provider="p", upstream_model="gpt-5", context_tokens=400000)

Entry = aiserver.AvailableModelsResponseAvailableModel


def upstream_available() -> aiserver.AvailableModelsResponse:
    return aiserver.AvailableModelsResponse(
        models=[
            Entry(name="claude-4-sonnet", default_on=True, supports_agent=True, context_token_limit=200000),
            Entry(name="gpt-5", default_on=True, supports_thinking=True, client_display_name="GPT-5"),
        ],
        model_names=["claude-4-sonnet", "gpt-5"],
        composer_model_config=aiserver.AvailableModelsResponseFeatureModelConfig(
            default_model="claude-4-sonnet"
        ),
        use_model_parameters=True,
    )


def test_available_model_fields() -> None:
    a = mc.available_model(A)
    assert a.name == "byok-a" and a.server_model_name == "byok-a"
    assert a.client_display_name == "A" and a.inputbox_short_model_name == "A"
    assert a.context_token_limit == 128000
    assert a.supports_thinking is False and a.supports_agent is True and a.default_on is True
    assert a.supports_cmd_k is False and a.supports_max_mode is False
    assert a.tooltip_data is not None and "gpt-x" in (a.tooltip_data.markdown_content or "")
    b = mc.available_model(B)
    assert b.client_display_name == "byok-b"  # no display_name: the id
    assert b.supports_thinking is True
    assert b.context_token_limit == 2**31 - 1  # int32 on the wire
    # Cursor is told whether the model takes images (its vision setting).
    assert a.supports_images is True
    assert mc.available_model(attrs.evolve(A, vision=False)).supports_images is False


def test_model_details_fields() -> None:
    a, b = mc.model_details(A), mc.model_details(B)
    assert (a.model_id, a.display_model_id, a.display_name, a.display_name_short) == ("byok-a",) * 2 + (
        "A",
    ) * 2
    assert a.thinking_details is None
    assert b.thinking_details is not None


@pytest.mark.parametrize("placement", ["first", "last"])
def test_merge_available_models(placement: str) -> None:
    up = upstream_available()
    merged = mc.merge_available_models(up, [A, B], placement)  # type: ignore[arg-type]
    names = [m.name for m in merged.models]
    if placement == "first":
        assert names == ["byok-a", "byok-b", "claude-4-sonnet", "gpt-5"]
        assert merged.model_names == names
    else:
        assert names == ["claude-4-sonnet", "gpt-5", "byok-a", "byok-b"]
        assert merged.model_names == names
    # Everything else of upstream's answer is kept; the input is not modified.
    assert merged.composer_model_config == up.composer_model_config
    assert merged.use_model_parameters is True
    assert [m.name for m in up.models] == ["claude-4-sonnet", "gpt-5"]
    # Round trip on the wire.
    again = aiserver.AvailableModelsResponse.parse(bytes(merged))
    assert [m.name for m in again.models] == names


def test_byok_model_replaces_same_name() -> None:
    merged = mc.merge_available_models(upstream_available(), [SHADOW], "last")
    assert [m.name for m in merged.models] == ["claude-4-sonnet", "gpt-5"]
    assert merged.models[1].tooltip_data is not None  # byok's entry, not upstream's
    assert merged.models[1].client_display_name == "gpt-5"
    assert merged.model_names == ["claude-4-sonnet", "gpt-5"]


def test_model_names_left_alone_when_upstream_omits_them() -> None:
    up = upstream_available()
    up.model_names = []
    merged = mc.merge_available_models(up, [A], "first")
    assert merged.model_names == []
    empty = mc.merge_available_models(aiserver.AvailableModelsResponse(), [A], "first")
    assert empty.model_names == ["byok-a"]


def test_unknown_fields_survive_merge() -> None:
    # A field newer than the reference schema (number 45, varint 1) in an upstream entry.
    raw = bytes(aiserver.AvailableModelsResponse(models=[Entry(name="new-model")]))
    entry = bytes(Entry(name="new-model")) + bytes([0xE8, 0x02, 0x01])
    raw = bytes([0x12, len(entry)]) + entry
    merged = mc.merge_available_models(aiserver.AvailableModelsResponse.parse(raw), [A], "first")
    assert bytes(merged).endswith(entry)


def test_merge_usable_models() -> None:
    up = agent.GetUsableModelsResponse(
        models=[
            agent.ModelDetails(model_id="gpt-5", display_name="GPT-5"),
            agent.ModelDetails(model_id="auto"),
        ]
    )
    merged = mc.merge_usable_models(up, [A, SHADOW], "first")
    assert [m.model_id for m in merged.models] == ["byok-a", "gpt-5", "auto"]
    assert merged.models[1].display_name == "gpt-5"
    last = mc.merge_usable_models(up, [B], "last")
    assert [m.model_id for m in last.models] == ["gpt-5", "auto", "byok-b"]
    assert last.models[2].thinking_details is not None


def test_local_answers() -> None:
    avail = mc.local_available_models([A, B])
    assert [m.name for m in avail.models] == ["byok-a", "byok-b"]
    assert avail.model_names == ["byok-a", "byok-b"]
    assert avail.composer_model_config is not None
    assert avail.composer_model_config.default_model == "byok-a"
    assert [m.model_id for m in mc.local_usable_models([A, B]).models] == ["byok-a", "byok-b"]
    cli = mc.local_default_model_for_cli([A, B])
    assert cli.model is not None and cli.model.model_id == "byok-a"
    assert mc.local_default_model_for_cli([]).model is None
    default = mc.local_default_model([A, B])
    assert (default.model, default.thinking_model) == ("byok-a", "byok-b")
    assert bytes(mc.local_default_model([])) == b""
    assert bytes(mc.local_available_models([])) == b""


def test_merge_json_keeps_unknown_keys_and_spelling() -> None:
    up = {
        "models": [{"name": "gpt-5", "futureFlag": True}, {"name": "claude-4-sonnet"}],
        "modelNames": ["gpt-5", "claude-4-sonnet"],
        "somethingNew": {"x": 1},
    }
    merged = mc.merge_available_models_json(up, [A, SHADOW], "last")
    assert [m["name"] for m in merged["models"]] == ["claude-4-sonnet", "byok-a", "gpt-5"]
    assert merged["models"][1]["clientDisplayName"] == "A"
    assert merged["models"][1]["contextTokenLimit"] == 128000
    assert merged["modelNames"] == ["claude-4-sonnet", "byok-a", "gpt-5"]
    assert merged["somethingNew"] == {"x": 1}
    assert up["models"][0] == {"name": "gpt-5", "futureFlag": True}  # input untouched
    # Decodes as the real message type (ignoring upstream's unknown key).
    msg = aiserver.AvailableModelsResponse.from_dict(
        json.loads(json.dumps(merged)), ignore_unknown_fields=True
    )
    assert [m.name for m in msg.models] == ["claude-4-sonnet", "byok-a", "gpt-5"]

    snake = mc.merge_available_models_json({"model_names": ["x"], "models": [{"name": "x"}]}, [A], "first")
    assert snake["model_names"] == ["byok-a", "x"] and "modelNames" not in snake


def test_merge_usable_json() -> None:
    up = {"models": [{"modelId": "gpt-5"}, {"model_id": "auto"}]}
    merged = mc.merge_usable_models_json(up, [SHADOW, B], "first")
    assert [m.get("modelId", m.get("model_id")) for m in merged["models"]] == ["gpt-5", "byok-b", "auto"]
    assert merged["models"][1]["thinkingDetails"] == {}
    assert mc.merge_usable_models_json({}, [A], "last") == {"models": [mc.model_details(A).to_dict()]}
