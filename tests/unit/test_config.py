from __future__ import annotations

import re
from pathlib import Path

import pytest

from byok.config import (
    Config,
    ConfigError,
    ModelConfig,
    ModelsListConfig,
    ProviderConfig,
    ProxyConfig,
    ServerConfig,
)
from byok.config_load import load_config

FULL = """
[server]
host = "0.0.0.0"
port = 9000
data_dir = "~/byok-data"
upstream = "https://api2.cursor.sh/"
heartbeat_s = 2
kv_ack_timeout_s = 12.5
max_body_bytes = 1048576
cache_bytes = 67108864

[[providers]]
id = "local"
kind = "openai_chat"
base_url = "http://127.0.0.1:9999/v1"

[[providers]]
id = "oa"
kind = "openai_responses"
base_url = "https://api.openai.com/v1"
api_key_env = "BYOK_TEST_OA_KEY"

[[providers]]
id = "ant"
kind = "anthropic"
base_url = "https://api.anthropic.com"
api_key = "sk-literal"

[[models]]
id = "byok-demo"
provider = "local"
upstream_model = "gpt-4.1"
context_tokens = 128000
display_name = "Demo"
max_output_tokens = 8192
replay_reasoning = false

[[models]]
id = "claude"
provider = "ant"
upstream_model = "claude-sonnet-4"
context_tokens = 200000
"""

MINIMAL_PROVIDER = """
[[providers]]
id = "local"
kind = "openai_chat"
base_url = "http://127.0.0.1:9999/v1"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "byok.toml"
    path.write_text(text)
    return path


def error_for(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides={})
    message = str(info.value)
    assert "\n" not in message
    return message.removeprefix(f"{path}: ")


def test_full_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    path = write(tmp_path, FULL)
    cfg = load_config(path, overrides={})
    assert cfg.source == str(path)
    assert cfg.server == ServerConfig(
        host="0.0.0.0",
        port=9000,
        data_dir=tmp_path / "byok-data",
        upstream="https://api2.cursor.sh",
        heartbeat_s=2.0,
        kv_ack_timeout_s=12.5,
        max_body_bytes=1048576,
        cache_bytes=64 * 2**20,
    )
    assert isinstance(cfg.server.heartbeat_s, float)
    assert [p.id for p in cfg.providers] == ["local", "oa", "ant"]
    assert [p.kind for p in cfg.providers] == ["openai_chat", "openai_responses", "anthropic"]
    assert cfg.models[0] == ModelConfig(
        id="byok-demo",
        provider="local",
        upstream_model="gpt-4.1",
        context_tokens=128000,
        display_name="Demo",
        max_output_tokens=8192,
        replay_reasoning=False,
    )
    claude = cfg.model("claude")
    assert claude is not None
    assert (claude.display_name, claude.max_output_tokens, claude.replay_reasoning) == (None, None, True)
    assert cfg.model("nope") is None
    assert cfg.provider("oa") is not None
    assert cfg.provider("nope") is None


def test_api_key_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, FULL)
    cfg = load_config(path, overrides={})
    local, oa, ant = cfg.providers
    assert local.api_key() is None
    assert ant.api_key() == "sk-literal"
    assert "sk-literal" not in repr(ant)

    monkeypatch.delenv("BYOK_TEST_OA_KEY", raising=False)
    with pytest.raises(ConfigError) as info:
        oa.api_key()
    assert str(info.value) == (
        f"{path}: providers[1].api_key_env: environment variable BYOK_TEST_OA_KEY is not set"
    )
    monkeypatch.setenv("BYOK_TEST_OA_KEY", "")
    with pytest.raises(ConfigError, match="BYOK_TEST_OA_KEY is empty"):
        oa.api_key()
    # Read at call time: a key set after loading is picked up.
    monkeypatch.setenv("BYOK_TEST_OA_KEY", "sk-env")
    assert oa.api_key() == "sk-env"


def test_defaults_without_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = load_config(None, overrides={})
    assert cfg == Config(server=ServerConfig(), providers=(), models=(), source="<defaults>")
    assert cfg.server.host == "127.0.0.1"
    assert cfg.server.port == 8790
    assert cfg.server.data_dir == tmp_path / ".local/share/byok"
    assert cfg.server.upstream == "https://api2.cursor.sh"
    assert (cfg.server.heartbeat_s, cfg.server.kv_ack_timeout_s) == (5.0, 30.0)
    assert cfg.server.max_body_bytes == 33554432


def test_empty_file_is_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, ""), overrides={})
    assert cfg.server == ServerConfig()
    assert cfg.providers == () and cfg.models == ()


def test_overrides_win(tmp_path: Path) -> None:
    path = write(tmp_path, FULL)
    cfg = load_config(path, overrides={"host": "::1", "port": 0, "data_dir": tmp_path / "d"})
    assert (cfg.server.host, cfg.server.port, cfg.server.data_dir) == ("::1", 0, tmp_path / "d")
    # None means "flag not given".
    cfg = load_config(path, overrides={"host": None, "port": None, "data_dir": None})
    assert (cfg.server.host, cfg.server.port) == ("0.0.0.0", 9000)
    assert load_config(None, overrides={"port": 1234}).server.port == 1234


def test_bad_overrides() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides={"port": 70000})
    assert str(info.value) == "<command line>: port: port must be between 0 and 65535, got 70000"
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides={"upstream": "x"})
    assert str(info.value).startswith("<command line>: upstream: unknown key")


def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.toml"
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides={})
    assert str(info.value) == f"{path}: cannot read file: No such file or directory"


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "byok.toml"
    path.write_bytes(b'[server]\nhost = "\xff"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides={})
    assert str(info.value) == f"{path}: not valid UTF-8 at byte 17"


def test_invalid_toml_has_line_and_column(tmp_path: Path) -> None:
    msg = error_for(tmp_path, "[server]\nport = 80\nhost = \n")
    assert msg.startswith("invalid TOML: ")
    assert "line 3, column 8" in msg


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "frobnicate = 1",
            "frobnicate: unknown key"
            " (allowed: server, providers, models, models_list, proxy, logging, search, images)",
        ),
        (
            "[server]\nprot = 1",
            "server.prot: unknown key (allowed: host, port, data_dir, upstream, "
            "heartbeat_s, kv_ack_timeout_s, max_body_bytes, provider_max_tries, provider_retry_base_s, "
            "reconnect_grace_s, shutdown_grace_s, cache_bytes, tls_cert, tls_key, tls_names, "
            "auth_token_env, auth_token)",
        ),
        (
            MINIMAL_PROVIDER + 'apikey = "x"',
            "providers[0].apikey: unknown key "
            "(allowed: id, kind, base_url, api_key_env, api_key, prompt_cache, eager_input_streaming, "
            "prompt_cache_key, headers)",
        ),
        (
            MINIMAL_PROVIDER + '[[models]]\nid = "m"\nprovider = "local"\nupstream_model = "x"\n'
            "context_tokens = 1\nupstream_modle = 2",
            "models[0].upstream_modle: unknown key (allowed: id, "
            "provider, upstream_model, context_tokens, display_name, max_output_tokens, replay_reasoning, "
            "enabled, thinking, vision, extra_body)",
        ),
    ],
)
def test_unknown_keys(tmp_path: Path, text: str, expected: str) -> None:
    assert error_for(tmp_path, text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("server = 1", "server: expected table, got integer"),
        ('[server]\nport = "80"', "server.port: expected integer, got string"),
        ("[server]\nport = true", "server.port: expected integer, got boolean"),
        ("[server]\nport = 80.0", "server.port: expected integer, got float"),
        ("[server]\nhost = 1", "server.host: expected string, got integer"),
        ("[server]\nheartbeat_s = false", "server.heartbeat_s: expected number, got boolean"),
        ('[server]\nkv_ack_timeout_s = "1"', "server.kv_ack_timeout_s: expected number, got string"),
        ("[server]\ncache_bytes = 256", "server.cache_bytes: must be >= 1048576, got 256"),
        ("[server]\ncache_bytes = 2.5e8", "server.cache_bytes: expected integer, got float"),
        (
            "[server]\nidle_release_s = 600",
            "server.idle_release_s: no longer read: the caches are bounded by cache_bytes, one byte "
            "budget shared by all conversations (remove idle_release_s; see docs/config.md)",
        ),
        ("[server]\nmax_body_bytes = 1.5", "server.max_body_bytes: expected integer, got float"),
        ("[server]\nupstream = 1979-05-27", "server.upstream: expected string, got date/time"),
        ("providers = 3", "providers: expected array of tables, got integer"),
        ("[providers]\nid = 'x'", "providers: expected array of tables, got table"),
        ("providers = [1]", "providers[0]: expected table, got integer"),
        ("models = [[]]", "models[0]: expected table, got array"),
        (
            MINIMAL_PROVIDER + '[[models]]\nid = "m"\nprovider = "local"\nupstream_model = "x"\n'
            'context_tokens = "big"',
            "models[0].context_tokens: expected integer, got string",
        ),
        (
            MINIMAL_PROVIDER + '[[models]]\nid = "m"\nprovider = "local"\nupstream_model = "x"\n'
            'context_tokens = 5\nreplay_reasoning = "yes"',
            "models[0].replay_reasoning: expected boolean, got string",
        ),
    ],
)
def test_wrong_types(tmp_path: Path, text: str, expected: str) -> None:
    assert error_for(tmp_path, text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[server]\nport = 65536", "server.port: port must be between 0 and 65535, got 65536"),
        ("[server]\nport = -1", "server.port: port must be between 0 and 65535, got -1"),
        ('[server]\nhost = ""', "server.host: must not be empty"),
        (
            '[server]\nupstream = "api2.cursor.sh"',
            "server.upstream: expected an http(s) URL, got 'api2.cursor.sh'",
        ),
        ("[server]\nheartbeat_s = 0", "server.heartbeat_s: must be > 0, got 0"),
        ("[server]\nmax_body_bytes = 0", "server.max_body_bytes: must be >= 1, got 0"),
    ],
)
def test_bad_server_values(tmp_path: Path, text: str, expected: str) -> None:
    assert error_for(tmp_path, text) == expected


def test_prompt_cache_and_eager_input_streaming_are_anthropic_provider_settings(tmp_path: Path) -> None:
    anthropic = '[[providers]]\nid = "a"\nkind = "anthropic"\nbase_url = "https://api.anthropic.com"\n'
    (on,) = load_config(write(tmp_path, anthropic), overrides={}).providers
    off_text = anthropic + "prompt_cache = false\neager_input_streaming = false"
    (off,) = load_config(write(tmp_path, off_text), overrides={}).providers
    assert (on.prompt_cache, on.eager_input_streaming) == (True, True)
    assert (off.prompt_cache, off.eager_input_streaming) == (False, False)
    assert error_for(tmp_path, MINIMAL_PROVIDER + "prompt_cache = true") == (
        "providers[0].prompt_cache: applies to anthropic providers (OpenAI caches prefixes on its own)"
    )
    assert error_for(tmp_path, MINIMAL_PROVIDER + "eager_input_streaming = true") == (
        "providers[0].eager_input_streaming: applies to anthropic providers"
    )
    assert error_for(tmp_path, anthropic + 'prompt_cache = "yes"') == (
        "providers[0].prompt_cache: expected boolean, got string"
    )


def test_provider_errors(tmp_path: Path) -> None:
    assert error_for(tmp_path, '[[providers]]\nkind = "anthropic"\nbase_url = "http://x"') == (
        "providers[0].id: missing required key"
    )
    assert error_for(tmp_path, '[[providers]]\nid = "p"\nkind = "gemini"\nbase_url = "http://x"') == (
        "providers[0].kind: unknown kind 'gemini' (expected one of: openai_chat, openai_responses, anthropic)"
    )
    assert error_for(tmp_path, '[[providers]]\nid = "p"\nkind = "anthropic"\nbase_url = "ftp://x"') == (
        "providers[0].base_url: expected an http(s) URL, got 'ftp://x'"
    )
    both = (
        '[[providers]]\nid = "p"\nkind = "anthropic"\nbase_url = "http://x"\napi_key = "a"\napi_key_env = "B"'
    )
    assert error_for(tmp_path, both) == "providers[0]: set at most one of api_key and api_key_env"
    assert (
        error_for(tmp_path, MINIMAL_PROVIDER + 'api_key_env = ""')
        == "providers[0].api_key_env: must not be empty"
    )


def test_duplicate_ids(tmp_path: Path) -> None:
    assert error_for(tmp_path, MINIMAL_PROVIDER + MINIMAL_PROVIDER) == (
        "providers[1].id: duplicate id 'local' (first at providers[0])"
    )
    model = '[[models]]\nid = "m"\nprovider = "local"\nupstream_model = "x"\ncontext_tokens = 1\n'
    assert error_for(tmp_path, MINIMAL_PROVIDER + model + model + model) == (
        "models[1].id: duplicate id 'm' (first at models[0])"
    )


def test_model_errors(tmp_path: Path) -> None:
    def model(**fields: object) -> str:
        base: dict[str, object] = {"id": "m", "provider": "local", "upstream_model": "x", "context_tokens": 1}
        base.update(fields)
        body = "\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in base.items() if v is not None)
        return MINIMAL_PROVIDER + "[[models]]\n" + body + "\n"

    ok = '[[models]]\nid = "ok"\nprovider = "local"\nupstream_model = "x"\ncontext_tokens = 1\n'
    missing = model(provider="nowhere").removeprefix(MINIMAL_PROVIDER)
    assert error_for(tmp_path, MINIMAL_PROVIDER + ok + missing) == (
        "models[1].provider: unknown provider 'nowhere' (known: local)"
    )
    assert (
        error_for(tmp_path, missing)
        == "models[0].provider: unknown provider 'nowhere' (known: none configured)"
    )
    assert error_for(tmp_path, model(upstream_model="")) == "models[0].upstream_model: must not be empty"
    assert error_for(tmp_path, model(upstream_model=None)) == "models[0].upstream_model: missing required key"
    assert error_for(tmp_path, model(context_tokens=0)) == "models[0].context_tokens: must be >= 1, got 0"
    assert (
        error_for(tmp_path, model(max_output_tokens=-5))
        == "models[0].max_output_tokens: must be >= 1, got -5"
    )
    assert error_for(tmp_path, model(display_name=" ")) == "models[0].display_name: must not be empty"


def test_provider_config_direct_construction() -> None:
    # Other modules and tests build these by hand: the defaults must make that easy.
    p = ProviderConfig(id="x", kind="openai_chat", base_url="http://h", api_key="k")
    assert p.api_key() == "k"
    assert ProviderConfig(id="x", kind="openai_chat", base_url="http://h").api_key() is None


MODEL = '[[models]]\nid = "{id}"\nprovider = "local"\nupstream_model = "x"\ncontext_tokens = 1\n'


def test_model_list_flags_and_placement(tmp_path: Path) -> None:
    text = (
        MINIMAL_PROVIDER
        + MODEL.format(id="a")
        + "enabled = false\nthinking = true\n"
        + MODEL.format(id="b")
        + '[models_list]\nplacement = "last"\n'
    )
    cfg = load_config(write(tmp_path, text), overrides={})
    a, b = cfg.models
    assert (a.enabled, a.thinking) == (False, True)
    assert (b.enabled, b.thinking) == (True, False)
    assert cfg.enabled_models() == (b,)
    assert cfg.models_list == ModelsListConfig(placement="last")


def test_models_list_default(tmp_path: Path) -> None:
    text = MINIMAL_PROVIDER + MODEL.format(id="a") + MODEL.format(id="b") + '[models_list]\ndefault = "b"\n'
    cfg = load_config(write(tmp_path, text), overrides={})
    assert cfg.models_list == ModelsListConfig(placement="first", default="b")


def test_models_list_and_proxy_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, ""), overrides={})
    assert cfg.models_list.placement == "first"
    assert cfg.proxy == ProxyConfig()
    assert (cfg.proxy.enabled, cfg.proxy.host, cfg.proxy.port) == (False, "127.0.0.1", 8791)
    assert cfg.proxy.intercept == ("*.cursor.sh",)


def test_proxy_section(tmp_path: Path) -> None:
    text = '[proxy]\nenabled = true\nhost = "::1"\nport = 0\nintercept = ["*.cursor.sh", "cursor.com"]\n'
    cfg = load_config(write(tmp_path, text), overrides={})
    assert cfg.proxy == ProxyConfig(enabled=True, host="::1", port=0, intercept=("*.cursor.sh", "cursor.com"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[models_list]\nplacement = "middle"',
            "models_list.placement: expected one of: first, last, got 'middle'",
        ),
        ("[models_list]\norder = 1", "models_list.order: unknown key (allowed: placement, default)"),
        (
            MINIMAL_PROVIDER + MODEL.format(id="m") + '[models_list]\ndefault = "gpt-5"',
            "models_list.default: unknown model 'gpt-5' (enabled: m)",
        ),
        (
            MINIMAL_PROVIDER + MODEL.format(id="m") + 'enabled = false\n[models_list]\ndefault = "m"',
            "models_list.default: model 'm' has enabled = false",
        ),
        ("[models_list]\ndefault = 1", "models_list.default: expected string, got integer"),
        ("[proxy]\nenabled = 1", "proxy.enabled: expected boolean, got integer"),
        ("[proxy]\nport = 70000", "proxy.port: port must be between 0 and 65535, got 70000"),
        ('[proxy]\nintercept = "*.cursor.sh"', "proxy.intercept: expected array of strings, got string"),
        ("[proxy]\nintercept = [1]", "proxy.intercept[0]: expected string, got integer"),
        ('[proxy]\nintercept = [" "]', "proxy.intercept[0]: must not be empty"),
        ("[proxy]\nlisten = 1", "proxy.listen: unknown key (allowed: enabled, host, port, intercept)"),
        (
            MINIMAL_PROVIDER + MODEL.format(id="m") + 'thinking = "yes"',
            "models[0].thinking: expected boolean, got string",
        ),
    ],
)
def test_models_list_and_proxy_errors(tmp_path: Path, text: str, expected: str) -> None:
    assert error_for(tmp_path, text) == expected


def _with_kind(kind: str) -> str:
    return MINIMAL_PROVIDER.replace('"openai_chat"', f'"{kind}"') + MODEL.format(id="m")


def test_extra_body_is_kept_in_file_order_with_its_nested_values(tmp_path: Path) -> None:
    text = (
        _with_kind("openai_responses")
        + '[models.extra_body]\nreasoning = { effort = "high", summary = "auto" }\n'
        + "top_p = 0.5\nmetadata = { tags = [1, 2.5, true] }\n"
    )
    (m,) = load_config(write(tmp_path, text), overrides={}).models
    assert m.extra_body == (
        ("reasoning", {"effort": "high", "summary": "auto"}),
        ("top_p", 0.5),
        ("metadata", {"tags": [1, 2.5, True]}),
    )
    (plain,) = load_config(write(tmp_path, _with_kind("openai_chat")), overrides={}).models
    assert plain.extra_body == ()


@pytest.mark.parametrize(
    ("kind", "extra", "expected"),
    [
        (
            "openai_chat",
            'model = "x"',
            "extra_body.model: byok sets 'model' itself; set upstream_model instead",
        ),
        ("openai_chat", "stream = false", "extra_body.stream: byok sets 'stream' itself"),
        ("openai_chat", "messages = []", "extra_body.messages: byok sets 'messages' itself"),
        (
            "openai_chat",
            "max_tokens = 5",
            "extra_body.max_tokens: byok sets 'max_tokens' itself; set max_output_tokens instead",
        ),
        ("openai_responses", 'include = ["x"]', "extra_body.include: byok sets 'include' itself"),
        ("openai_responses", "store = true", "extra_body.store: byok sets 'store' itself"),
        ("anthropic", 'system = "x"', "extra_body.system: byok sets 'system' itself"),
        (
            "anthropic",
            'cache_control = { type = "ephemeral" }',
            "extra_body.cache_control: byok sets 'cache_control' itself; "
            "set prompt_cache (on the provider) instead",
        ),
        (
            "anthropic",
            'thinking = { type = "enabled", budget_tokens = 10000 }',
            "extra_body.thinking.budget_tokens: 10000 must be below the default max_output_tokens (8192), "
            "which includes the thinking; raise max_output_tokens",
        ),
        ("openai_chat", "when = 1979-05-27", "extra_body.when: a date/time cannot be sent as JSON"),
        ("openai_chat", "a = { b = [1, nan] }", "extra_body.a.b[1]: the float nan cannot be sent as JSON"),
        ("openai_chat", "", "extra_body: expected table, got integer"),
    ],
)
def test_extra_body_refuses_what_byok_sets_and_what_json_cannot_hold(
    tmp_path: Path, kind: str, extra: str, expected: str
) -> None:
    body = "extra_body = 3\n" if not extra else f"[models.extra_body]\n{extra}\n"
    assert error_for(tmp_path, _with_kind(kind) + body) == f"models[0].{expected}"


def test_thinking_budget_below_a_configured_limit_and_other_thinking_shapes_pass(tmp_path: Path) -> None:
    budget = (
        _with_kind("anthropic") + "max_output_tokens = {limit}\n[models.extra_body]\nthinking = {thinking}\n"
    )
    ok = budget.format(limit=20000, thinking='{ type = "enabled", budget_tokens = 16000 }')
    assert load_config(write(tmp_path, ok), overrides={}).models[0].max_output_tokens == 20000
    adaptive = budget.format(limit=20000, thinking='{ type = "adaptive" }')
    assert load_config(write(tmp_path, adaptive), overrides={}).models[0].extra_body
    over = budget.format(limit=16000, thinking='{ type = "enabled", budget_tokens = 16000 }')
    assert error_for(tmp_path, over) == (
        "models[0].extra_body.thinking.budget_tokens: 16000 must be below max_output_tokens (16000), "
        "which includes the thinking; raise max_output_tokens"
    )
    # Thinking is Anthropic's field: other kinds send it as given.
    chat = (
        _with_kind("openai_chat")
        + '[models.extra_body]\nthinking = { type = "enabled", budget_tokens = 99999 }\n'
    )
    assert load_config(write(tmp_path, chat), overrides={}).models[0].extra_body


def test_output_limit_hint_names_the_setting_to_raise() -> None:
    from byok.run.provider_call import output_limit_hint

    model = ModelConfig(id="m", provider="p", upstream_model="u", context_tokens=1)
    assert output_limit_hint(model, "anthropic") == (
        " (model 'm' has the default max_output_tokens = 8192; set a higher one in the config)"
    )
    assert output_limit_hint(model, "openai_chat") == ""  # no limit sent: the provider's own
    limited = ModelConfig(id="m", provider="p", upstream_model="u", context_tokens=1, max_output_tokens=900)
    assert output_limit_hint(limited, "openai_responses") == (
        " (model 'm' has max_output_tokens = 900; raise it in the config)"
    )


def test_prompt_cache_key_defaults_by_kind_and_host(tmp_path: Path) -> None:
    def provider(kind: str, base_url: str, extra: str = "") -> ProviderConfig:
        text = f'[[providers]]\nid = "p"\nkind = "{kind}"\nbase_url = "{base_url}"\n{extra}'
        return load_config(write(tmp_path, text), overrides={}).providers[0]

    assert provider("openai_responses", "http://127.0.0.1:1/v1").prompt_cache_key is True
    assert provider("openai_chat", "https://api.openai.com/v1").prompt_cache_key is True
    assert provider("openai_chat", "https://api.deepseek.com/v1").prompt_cache_key is False
    assert provider(
        "openai_chat", "https://api.deepseek.com/v1", "prompt_cache_key = true\n"
    ).prompt_cache_key
    assert not provider(
        "openai_responses", "https://api.openai.com/v1", "prompt_cache_key = false\n"
    ).prompt_cache_key
    anthropic = '[[providers]]\nid = "p"\nkind = "anthropic"\nbase_url = "https://api.anthropic.com"\n'
    assert error_for(tmp_path, anthropic + "prompt_cache_key = true\n") == (
        "providers[0].prompt_cache_key: applies to OpenAI providers (Anthropic has prompt_cache)"
    )
    assert error_for(
        tmp_path, _with_kind("openai_responses") + '[models.extra_body]\nprompt_cache_key = "k"\n'
    ) == (
        "models[0].extra_body.prompt_cache_key: byok sets 'prompt_cache_key' itself; "
        "set prompt_cache_key (on the provider) instead"
    )


def test_provider_headers(tmp_path: Path) -> None:
    base = '[[providers]]\nid = "p"\nkind = "{kind}"\nbase_url = "https://h/v1"\n{key}[providers.headers]\n{headers}\n'

    def headers(headers: str, kind: str = "openai_chat", key: str = "") -> tuple[tuple[str, str], ...]:
        text = base.format(kind=kind, key=key, headers=headers)
        return load_config(write(tmp_path, text), overrides={}).providers[0].headers

    assert headers('"HTTP-Referer" = "https://example.dev"\nX-Title = "byok"') == (
        ("http-referer", "https://example.dev"),
        ("x-title", "byok"),
    )
    # Azure-style: no api_key, the key in a header of the provider's own.
    assert headers('api-key = "secret"') == (("api-key", "secret"),)
    assert headers(
        'anthropic-beta = "interleaved-thinking-2025-05-14"', kind="anthropic", key='api_key = "k"\n'
    )

    def error(headers: str, key: str = "") -> str:
        return error_for(tmp_path, base.format(kind="openai_chat", key=key, headers=headers))

    assert error('"bad name" = "x"') == "providers[0].headers.bad name: not a valid HTTP header name"
    assert error("x-n = 1") == "providers[0].headers.x-n: expected string, got integer"
    assert (
        error('x-n = "a\\nb"') == "providers[0].headers.x-n: a header value cannot hold a line break or NUL"
    )
    assert (
        error('Content-Type = "text/plain"')
        == "providers[0].headers.Content-Type: byok sets this header itself"
    )
    assert error('Authorization = "Bearer x"', key='api_key = "k"\n') == (
        "providers[0].headers.Authorization: "
        "api_key/api_key_env already sends the key in this header; set one of them"
    )
    assert headers('Authorization = "Bearer from-a-header"') == (("authorization", "Bearer from-a-header"),)


def test_which_providers_keep_a_credential_in_the_file(tmp_path: Path) -> None:
    base = '[[providers]]\nid = "p"\nkind = "openai_chat"\nbase_url = "https://h/v1"\n{key}[providers.headers]\n{headers}\n'

    def secrets(key: str, headers: str) -> bool:
        text = base.format(key=key, headers=headers)
        return load_config(write(tmp_path, text), overrides={}).providers[0].secrets_in_file

    assert secrets('api_key = "k"\n', "")
    assert secrets("", 'api-key = "azure"')  # Azure's key header
    assert secrets("", 'X-Gateway-Token = "t"')
    assert not secrets('api_key_env = "K"\n', 'anthropic-beta = "b"\nX-Title = "byok"')


def test_a_model_with_an_extra_body_stays_hashable(tmp_path: Path) -> None:
    text = _with_kind("anthropic") + '[models.extra_body]\nthinking = { type = "adaptive" }\nstop = ["x"]\n'
    cfg = load_config(write(tmp_path, text), overrides={})
    (m,) = cfg.models
    assert {m, cfg} and m == load_config(write(tmp_path, text), overrides={}).models[0]


def _toml_blocks(doc: str) -> list[str]:
    text = (Path(__file__).parents[2] / doc).read_text()
    return re.findall(r"```toml\n(.*?)```", text, re.S)


def test_the_documented_config_examples_load(tmp_path: Path) -> None:
    """README's and docs/config.md's TOML examples are real configs (models given the providers
    their example names, when the block holds none)."""
    providers = (
        '[[providers]]\nid = "anthropic"\nkind = "anthropic"\nbase_url = "https://api.anthropic.com"\n'
        '[[providers]]\nid = "openai"\nkind = "openai_responses"\nbase_url = "https://api.openai.com/v1"\n'
    )
    blocks = _toml_blocks("README.md") + _toml_blocks("docs/config.md")
    assert len(blocks) >= 3
    for block in blocks:
        text = block if "[[providers]]" in block or "[[models]]" not in block else providers + block
        load_config(write(tmp_path, text), overrides={})


def test_lan_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = '[server]\nhost = "0.0.0.0"\ntls_cert = "~/c.pem"\ntls_key = "/k.pem"\nauth_token_env = "T"\n'
    server = load_config(write(tmp_path, text), overrides={}).server
    assert (server.tls_cert, server.tls_key) == (Path("~/c.pem").expanduser(), Path("/k.pem"))
    assert server.tls and server.has_auth_token and not server.auth_token_in_file
    monkeypatch.setenv("T", "secret")
    assert server.auth_token() == "secret"
    monkeypatch.delenv("T")
    with pytest.raises(ConfigError, match="environment variable T is not set"):
        server.auth_token()
    named = load_config(
        write(tmp_path, '[server]\ntls_names = ["byok.lan", " 10.0.0.2 "]\nauth_token = "x"\n')
    )
    assert named.server.tls_names == ("byok.lan", "10.0.0.2") and named.server.auth_token() == "x"
    assert named.server.auth_token_in_file and "auth_token" not in repr(named.server).replace(
        "auth_token_env", ""
    )
    plain = load_config(write(tmp_path, ""), overrides={}).server
    assert not plain.tls and not plain.has_auth_token and plain.auth_token() is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[server]\ntls_cert = "/c.pem"', "server.tls_key: set both tls_cert and tls_key"),
        ('[server]\ntls_key = "/k.pem"', "server.tls_cert: set both tls_cert and tls_key"),
        (
            '[server]\ntls_cert = "/c"\ntls_key = "/k"\ntls_names = ["h"]',
            "server.tls_names: set tls_cert and tls_key (your certificate) or tls_names (byok issues one), "
            "not both",
        ),
        (
            '[server]\nauth_token = "a"\nauth_token_env = "B"',
            "server.auth_token: set at most one of auth_token and auth_token_env",
        ),
        ("[server]\ntls_names = [1]", "server.tls_names[0]: expected string, got integer"),
    ],
)
def test_lan_key_errors(tmp_path: Path, text: str, expected: str) -> None:
    assert error_for(tmp_path, text) == expected
