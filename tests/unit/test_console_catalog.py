"""Console entries from request bodies, and their merge with the config file's."""

from __future__ import annotations

from pathlib import Path

import pytest

from byok.config import Config
from byok.config_load import load_config
from byok.console.catalog import ANTHROPIC_BUDGETS, Catalog, ConsoleEntries, model_config
from byok.console.entries import (
    FieldError,
    ModelEntry,
    ProviderSecrets,
    entry_data,
    entry_from_data,
    parse_alias,
    parse_model,
    parse_provider,
)

CONFIG = """
[[providers]]
id = "file-p"
kind = "openai_chat"
base_url = "http://127.0.0.1:1/v1"

[[models]]
id = "file-m"
provider = "file-p"
upstream_model = "u"
context_tokens = 1000
"""


@pytest.fixture
def file_config(tmp_path: Path) -> Config:
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    return load_config(path)


def test_provider_body_update_keeps_what_it_leaves_out() -> None:
    body = {"id": "p", "kind": "anthropic", "base_url": "https://api.example/", "api_key": "sk-abcdefgh1234"}
    entry, secrets = parse_provider(body)
    assert (entry.base_url, entry.key_last4, secrets.api_key) == (
        "https://api.example",
        "1234",
        "sk-abcdefgh1234",
    )
    assert "sk-" not in repr(secrets)
    updated, kept = parse_provider({"enabled": False}, entry, secrets, path_id="p")
    assert updated.enabled is False and kept.api_key == secrets.api_key and updated.kind == "anthropic"
    with pytest.raises(FieldError) as e:
        parse_provider({"id": "q"}, entry, secrets, path_id="p")
    assert e.value.field == "id"
    assert ProviderSecrets.from_json(secrets.to_json()) == secrets


def test_entries_round_trip_their_storage_form() -> None:
    model = parse_model(
        {
            "id": "m",
            "provider": "p",
            "upstream_model": "u",
            "context_tokens": 10,
            "extra_body": {"top_p": 0.5},
        }
    )
    assert entry_from_data("model", "m", entry_data(model)) == model
    alias = parse_alias({"id": "a", "targets": ["m", "n"], "cooldown_s": 5})
    assert entry_from_data("alias", "a", entry_data(alias)) == alias
    with pytest.raises(FieldError, match="listed twice"):
        parse_alias({"id": "a", "targets": ["m", "m"]})


def test_effort_becomes_each_kinds_field() -> None:
    entry = ModelEntry(id="m", provider="p", upstream_model="u", context_tokens=10, effort="high")
    assert model_config(entry, "openai_chat").extra_body == (("reasoning_effort", "high"),)
    assert model_config(entry, "openai_responses").extra_body == (
        ("reasoning", {"effort": "high", "summary": "auto"}),
    )
    anthropic = model_config(entry, "anthropic")
    budget = ANTHROPIC_BUDGETS["high"]
    assert anthropic.extra_body == (("thinking", {"type": "enabled", "budget_tokens": budget}),)
    assert anthropic.max_output_tokens is not None and anthropic.max_output_tokens > budget
    assert anthropic.thinking
    with pytest.raises(FieldError) as e:
        model_config(ModelEntry("m", "p", "u", 10, max_output_tokens=100, effort="low"), "anthropic")
    assert e.value.field == "effort"


def test_merge_file_first_console_by_position_aliases_and_shadowing(file_config: Config) -> None:
    p, s = parse_provider({"id": "cp", "kind": "openai_chat", "base_url": "http://127.0.0.1:2"})
    shadow, _ = parse_provider({"id": "file-p", "kind": "anthropic", "base_url": "http://127.0.0.1:3"})
    models = (
        ModelEntry("late", "cp", "u1", 5000, position=5),
        ModelEntry("early", "cp", "u2", 8000, position=1),
        ModelEntry("hidden", "cp", "u3", 9000, enabled=False),
        ModelEntry("file-m", "cp", "u4", 100),  # the file's id wins
        ModelEntry("orphan", "nope", "u5", 100),
    )
    alias = parse_alias({"id": "both", "targets": ["late", "hidden", "gone"], "position": 3})
    catalog = Catalog(file_config, ConsoleEntries(((p, s), (shadow, s)), models, (alias,)))
    assert [m.id for m in catalog.enabled_models()] == ["file-m", "early", "both", "late"]
    assert catalog.provider("file-p").kind == "openai_chat" and catalog.shadowed("provider", "file-p")
    assert catalog.model("file-m").upstream_model == "u" and catalog.model("orphan") is None
    assert [t.model.id for t in catalog.targets("both")] == ["late", "hidden"]  # disabled still serves
    assert catalog.model("both").context_tokens == 5000  # what every target takes
    assert [t.model.id for t in catalog.targets("early")] == ["early"] and catalog.targets("nope") == ()
    catalog.use_console(ConsoleEntries())  # deleted: gone for the next run
    assert [m.id for m in catalog.enabled_models()] == ["file-m"] and catalog.targets("both") == ()
