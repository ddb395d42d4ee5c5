"""``[search]`` and ``[images]``: the backends of WebSearch and GenerateImage, and which tools a
mode offers when they are missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from byok.config import ConfigError
from byok.config_load import load_config
from byok.config_reload import reload_plan
from byok.config_tools import BRAVE_URL, tool_backends
from byok.cursor.tools.registry import build_registry
from byok.model.request import ToolSpec
from byok.run.deps import tool_setup
from byok.startup_summary import summary


def load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "byok.toml"
    path.write_text(text)
    return load_config(path)


def error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    return str(info.value)


def test_no_tables_no_backends(tmp_path: Path) -> None:
    config = load(tmp_path, "")
    assert config.search is None and config.images is None  # type: ignore[attr-defined]
    assert tool_backends(None, None) == frozenset()


def test_brave_defaults_to_its_api_and_needs_a_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = load(tmp_path, '[search]\nkind = "brave"\napi_key_env = "BRAVE_KEY"\n')
    search = config.search  # type: ignore[attr-defined]
    assert (search.kind, search.url, search.max_results, search.timeout_s) == ("brave", BRAVE_URL, 5, 20.0)
    monkeypatch.delenv("BRAVE_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"search\.api_key_env: environment variable BRAVE_KEY is not set"):
        search.key.value()
    monkeypatch.setenv("BRAVE_KEY", "k")
    assert search.key.value() == "k"
    assert "needs a key" in error(tmp_path, '[search]\nkind = "brave"\n')


def test_searxng_needs_its_url(tmp_path: Path) -> None:
    config = load(
        tmp_path, '[search]\nkind = "searxng"\nurl = "http://127.0.0.1:8888/search/"\nmax_results = 3\n'
    )
    search = config.search  # type: ignore[attr-defined]
    assert (search.url, search.max_results, search.key.value()) == ("http://127.0.0.1:8888/search", 3, None)
    assert "search.url: missing required key" in error(tmp_path, '[search]\nkind = "searxng"\n')


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('[search]\nkind = "google"\n', "search.kind: unknown kind 'google'"),
        ('[search]\nkind = "searxng"\nurl = "x"\n', "search.url: expected an http(s) URL"),
        ('[search]\nkind = "brave"\napi_key = "k"\nmax_results = 50\n', "search.max_results: must be <= 20"),
        (
            '[search]\nkind = "brave"\napi_key = "k"\napi_key_env = "K"\n',
            "set at most one of api_key and api_key_env",
        ),
        ('[search]\nkind = "brave"\napi_key = "k"\ncount = 3\n', "search.count: unknown key"),
        ('[images]\nmodel = "m"\n', "images.base_url: missing required key"),
        ('[images]\nbase_url = "https://x/v1"\n', "images.model: missing required key"),
        (
            '[images]\nbase_url = "https://x/v1"\nmodel = "m"\nsize = "big"\n',
            "images.size: expected WIDTHxHEIGHT",
        ),
    ],
)
def test_bad_tables_name_the_key(tmp_path: Path, text: str, fragment: str) -> None:
    assert fragment in error(tmp_path, text)


def test_images(tmp_path: Path) -> None:
    config = load(tmp_path, '[images]\nbase_url = "https://api.example/v1/"\nmodel = "img"\napi_key = "sk"\n')
    images = config.images  # type: ignore[attr-defined]
    assert (images.base_url, images.model, images.size, images.key.value()) == (
        "https://api.example/v1",
        "img",
        "1024x1024",
        "sk",
    )
    assert "sk" not in repr(images)
    assert tool_backends(None, images) == frozenset({"images"})


def test_tools_without_their_backend_are_not_offered() -> None:
    registry = build_registry()
    specs = tuple(ToolSpec(n, "d", "{}") for n in ("Read", "WebSearch", "WebFetch", "GenerateImage"))
    names = lambda setup: [s.name for s in setup.specs_by_mode["agent"]]  # noqa: E731
    assert names(tool_setup(registry, {"agent": specs}, frozenset())) == ["Read", "WebFetch"]
    assert names(tool_setup(registry, {"agent": specs}, frozenset({"search"}))) == [
        "Read",
        "WebSearch",
        "WebFetch",
    ]


def test_a_reload_keeps_the_backends_until_a_restart(tmp_path: Path) -> None:
    old = load(tmp_path, "")
    new = load(tmp_path, '[search]\nkind = "searxng"\nurl = "http://127.0.0.1:1/s"\n')
    effective, lines = reload_plan(old, new)  # type: ignore[arg-type]
    assert effective.search is None
    assert lines == ["kept until a restart: [search] changed"]


def test_the_start_up_summary_names_the_backends(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        '[search]\nkind = "searxng"\nurl = "http://127.0.0.1:8888/search"\n'
        '[images]\nbase_url = "https://api.example/v1"\nmodel = "img"\n',
    )
    text = summary(config, "http://127.0.0.1:8790", pid=1, version="0")  # type: ignore[arg-type]
    assert (
        "tool backends: web search (searxng, http://127.0.0.1:8888/search), images (img at https://api.example/v1)"
        in text
    )
    assert "tool backends" not in summary(load(tmp_path, ""), "u", pid=1, version="0")  # type: ignore[arg-type]
