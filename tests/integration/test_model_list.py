"""ModelListRoutes against a loopback fake upstream served by hypercorn."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import httpx
import trio

from byok.config import Config, ModelConfig, ModelsListConfig, ProviderConfig, ServerConfig
from byok.http.connect_envelope import FLAG_END_STREAM, FrameDecoder, encode_frame
from byok.http.model_list import (
    AVAILABLE_MODELS,
    CPP_MODELS,
    DEFAULT_FOR_CLI_AGENT,
    DEFAULT_FOR_CLI_AI,
    DEFAULT_MODEL,
    USABLE_MODELS_AGENT,
    USABLE_MODELS_AI,
    ModelListRoutes,
)
from byok.http.proxy import UPSTREAM_EXTENSION
from byok.http.serve import Receive, Scope, Send, serve_app
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver

Entry = aiserver.AvailableModelsResponseAvailableModel
Tooltip = aiserver.AvailableModelsResponseTooltipData

# Field 45 (varint), newer than the reference schema, as upstream may send it.
FUTURE_FIELD = bytes([0xE8, 0x02, 0x01])


def recorded_available_models() -> bytes:
    """An AvailableModelsResponse shaped like Cursor's: several entries, picker config, flags."""
    resp = aiserver.AvailableModelsResponse(
        models=[
            Entry(
                name="default",
                default_on=True,
                supports_agent=True,
                client_display_name="Auto",
                server_model_name="default",
                tooltip_data=Tooltip(primary_text="Auto", markdown_content="Picks a model for you"),
                supports_non_max_mode=True,
                supports_plan_mode=True,
                named_model_section_index=0,
            ),
            Entry(
                name="claude-4.5-sonnet",
                default_on=True,
                supports_agent=True,
                supports_thinking=True,
                supports_images=True,
                supports_max_mode=True,
                supports_non_max_mode=True,
                context_token_limit=200000,
                context_token_limit_for_max_mode=1000000,
                client_display_name="Sonnet 4.5",
                server_model_name="claude-4.5-sonnet",
                vendor_name="anthropic",
                vendor=aiserver.AvailableModelsResponseModelVendor(
                    id=aiserver.AvailableModelsResponseModelVendorId.ANTHROPIC, display_name="Anthropic"
                ),
                legacy_slugs=["claude-4.5-sonnet-thinking"],
            ),
            Entry(name="gpt-5", default_on=False, supports_agent=True, client_display_name="GPT-5"),
        ],
        model_names=["default", "claude-4.5-sonnet", "gpt-5"],
        composer_model_config=aiserver.AvailableModelsResponseFeatureModelConfig(
            default_model="default", fallback_models=["claude-4.5-sonnet"]
        ),
        use_model_parameters=True,
        display_configuration=aiserver.AvailableModelsResponseModelPickerDisplayConfiguration(),
    )
    return bytes(resp) + FUTURE_FIELD


USABLE = agent.GetUsableModelsResponse(
    models=[agent.ModelDetails(model_id="default", display_name="Auto"), agent.ModelDetails(model_id="gpt-5")]
)
DEFAULT_FOR_CLI = agent.GetDefaultModelForCliResponse(model=agent.ModelDetails(model_id="default"))
CPP = aiserver.AvailableCppModelsResponse(
    models=["default", "gpt-5", "cursor-small"], default_model="default"
)


@attrs.define
class FakeUpstream:
    mode: str = "proto"  # proto | json | gzip | 401 | 500 | hang
    seen: list[tuple[Scope, bytes]] = attrs.field(factory=list)
    release: trio.Event = attrs.field(factory=trio.Event)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        self.seen.append((scope, body))
        path = scope["path"]
        raw = {
            AVAILABLE_MODELS: recorded_available_models(),
            USABLE_MODELS_AI: bytes(USABLE),
            USABLE_MODELS_AGENT: bytes(USABLE),
            DEFAULT_FOR_CLI_AGENT: bytes(DEFAULT_FOR_CLI),
            CPP_MODELS: bytes(CPP),
        }.get(path, b"")
        headers = [(b"content-type", b"application/proto"), (b"x-upstream", b"yes")]
        status = 200
        if self.mode == "hang":
            await self.release.wait()
        if self.mode == "json":
            msg = aiserver.AvailableModelsResponse.parse(recorded_available_models())
            obj = CPP.to_dict() if path == CPP_MODELS else msg.to_dict()
            obj["futureKey"] = [1, 2]
            raw = json.dumps(obj).encode()
            headers = [(b"content-type", b"application/json")]
        elif self.mode == "connect":
            raw = encode_frame(raw) + encode_frame(b"{}", FLAG_END_STREAM)
            headers = [(b"content-type", b"application/connect+proto")]
        elif self.mode == "gzip":
            raw = gzip.compress(raw)
            headers.append((b"content-encoding", b"gzip"))
        elif self.mode == "garbage":
            raw = b"\x12\x10ab"  # a truncated length-delimited field
        elif self.mode == "401":
            status, raw = 401, b'{"code":"unauthenticated","message":"Not logged in"}'
            headers = [(b"content-type", b"application/json")]
        elif self.mode == "500":
            status, raw = 500, b'{"code":"internal"}'
            headers = [(b"content-type", b"application/json")]
        headers.append((b"content-length", str(len(raw)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": raw})


def make_config(tmp_path: Path, placement: str = "first", default: str | None = None) -> Config:
    provider = ProviderConfig(id="p", kind="openai_chat", base_url="http://127.0.0.1:9/v1")
    models = (
        ModelConfig(
            id="byok-a", provider="p", upstream_model="m1", context_tokens=128000, display_name="My A"
        ),
        ModelConfig(id="gpt-5", provider="p", upstream_model="gpt-5", context_tokens=400000, thinking=True),
        ModelConfig(id="byok-off", provider="p", upstream_model="m3", context_tokens=1000, enabled=False),
    )
    return Config(
        server=ServerConfig(data_dir=tmp_path),
        providers=(provider,),
        models=models,
        source="test",
        models_list=ModelsListConfig(placement=placement, default=default),  # type: ignore[arg-type]
    )


@attrs.frozen
class Rig:
    upstream: FakeUpstream
    client: httpx.AsyncClient


async def _closed_port_url() -> str:
    # Not a freed ephemeral port: a connection to one can pick that very port as its own source
    # port and connect to itself (TCP simultaneous open), and then wait for an answer forever
    # (seen once in the suite: a ReadTimeout). Port 9 (discard) is below the ephemeral range.
    return "http://127.0.0.1:9"


@asynccontextmanager
async def rig(
    tmp_path: Path,
    *,
    placement: str = "first",
    upstream_down: bool = False,
    via_extension: bool = False,
    timeout_s: float = 10.0,
    default: str | None = None,
) -> AsyncIterator[Rig]:
    fake = FakeUpstream()
    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(10, read=None)) as up_client,
        trio.open_nursery() as nursery,
    ):
        up_url, stop_up = await serve_app(fake, host="127.0.0.1", port=0, nursery=nursery)
        if upstream_down:
            up_url = await _closed_port_url()
        base = up_url
        if via_extension:  # the configured upstream is dead; the proxy's per-scope origin is not
            base = await _closed_port_url()
        config = make_config(tmp_path, placement, default)
        routes = ModelListRoutes(config, up_client, base, timeout_s=timeout_s)

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "lifespan":
                while (await receive())["type"] != "lifespan.shutdown":
                    await send({"type": "lifespan.startup.complete"})
                await send({"type": "lifespan.shutdown.complete"})
                return
            if via_extension:
                scope = {**scope, "extensions": {UPSTREAM_EXTENSION: up_url}}
            if not await routes.handle(scope, receive, send):
                await send({"type": "http.response.start", "status": 418, "headers": []})
                await send({"type": "http.response.body", "body": b"not mine"})

        url, stop = await serve_app(app, host="127.0.0.1", port=0, nursery=nursery)
        try:
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                with trio.fail_after(20):
                    yield Rig(fake, client)
        finally:
            fake.release.set()
            stop()
            stop_up()


PROTO = {"content-type": "application/proto", "connect-protocol-version": "1"}


async def test_available_models_merged_first(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        req = bytes(aiserver.AvailableModelsRequest(use_model_parameters=True))
        resp = await r.client.post(
            AVAILABLE_MODELS, content=req, headers={**PROTO, "authorization": "Bearer tok"}
        )
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/proto"
    assert resp.headers["x-upstream"] == "yes"
    assert int(resp.headers["content-length"]) == len(resp.content)
    merged = aiserver.AvailableModelsResponse.parse(resp.content)
    # byok's enabled models first in config order; byok's gpt-5 replaces upstream's; byok-off hidden.
    assert [m.name for m in merged.models] == ["byok-a", "gpt-5", "default", "claude-4.5-sonnet"]
    assert merged.model_names == ["byok-a", "gpt-5", "default", "claude-4.5-sonnet"]
    a, g = merged.models[0], merged.models[1]
    assert (a.client_display_name, a.context_token_limit, a.supports_thinking) == ("My A", 128000, False)
    assert (g.client_display_name, g.context_token_limit, g.supports_thinking) == ("gpt-5", 400000, True)
    # Upstream's own entries and settings untouched, unknown field included.
    sonnet = merged.models[3]
    assert sonnet.vendor is not None and sonnet.legacy_slugs == ["claude-4.5-sonnet-thinking"]
    assert merged.composer_model_config is not None
    assert merged.composer_model_config.default_model == "default"
    assert resp.content.endswith(FUTURE_FIELD)
    # The request reached upstream unchanged, with its credentials.
    scope, body = r.upstream.seen[0]
    assert body == req
    assert dict(scope["headers"])[b"authorization"] == b"Bearer tok"


async def test_available_models_placement_last(tmp_path: Path) -> None:
    async with rig(tmp_path, placement="last") as r:
        resp = await r.client.post(AVAILABLE_MODELS, content=b"", headers=PROTO)
    merged = aiserver.AvailableModelsResponse.parse(resp.content)
    assert [m.name for m in merged.models] == ["default", "claude-4.5-sonnet", "byok-a", "gpt-5"]


async def test_json_content_type(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.upstream.mode = "json"
        resp = await r.client.post(AVAILABLE_MODELS, json={}, headers={"connect-protocol-version": "1"})
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/json"
    obj = resp.json()
    assert [m["name"] for m in obj["models"]] == ["byok-a", "gpt-5", "default", "claude-4.5-sonnet"]
    assert obj["futureKey"] == [1, 2]
    assert obj["models"][0]["clientDisplayName"] == "My A"


async def test_connect_enveloped_answer(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.upstream.mode = "connect"
        resp = await r.client.post(AVAILABLE_MODELS, content=b"", headers=PROTO)
    assert resp.headers["content-type"] == "application/connect+proto"
    frames = FrameDecoder().feed(resp.content)
    assert [f.end_stream for f in frames] == [False, True]
    merged = aiserver.AvailableModelsResponse.parse(frames[0].payload)
    assert [m.name for m in merged.models][:2] == ["byok-a", "gpt-5"]
    assert frames[1].payload == b"{}"


async def test_undecodable_answer_passes_through(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.upstream.mode = "garbage"
        resp = await r.client.post(AVAILABLE_MODELS, content=b"", headers=PROTO)
    assert (resp.status_code, resp.content) == (200, b"\x12\x10ab")


async def test_gzip_upstream_answer(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.upstream.mode = "gzip"
        async with r.client.stream(
            "POST", AVAILABLE_MODELS, content=b"", headers={**PROTO, "accept-encoding": "gzip"}
        ) as resp:
            raw = b"".join([c async for c in resp.aiter_raw()])
    assert "content-encoding" not in resp.headers
    assert int(resp.headers["content-length"]) == len(raw)
    merged = aiserver.AvailableModelsResponse.parse(raw)
    assert [m.name for m in merged.models][:2] == ["byok-a", "gpt-5"]
    scope, _ = r.upstream.seen[0]
    assert dict(scope["headers"])[b"accept-encoding"] == b"gzip"


async def test_401_passes_through(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.upstream.mode = "401"
        resp = await r.client.post(AVAILABLE_MODELS, content=b"", headers=PROTO)
    assert resp.status_code == 401
    assert resp.json() == {"code": "unauthenticated", "message": "Not logged in"}


async def test_5xx_answers_locally(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.upstream.mode = "500"
        resp = await r.client.post(AVAILABLE_MODELS, content=b"", headers=PROTO)
    assert resp.status_code == 200
    local = aiserver.AvailableModelsResponse.parse(resp.content)
    assert [m.name for m in local.models] == ["byok-a", "gpt-5"]


async def test_upstream_down_answers_locally(tmp_path: Path) -> None:
    async with rig(tmp_path, upstream_down=True) as r:
        avail = await r.client.post(AVAILABLE_MODELS, content=b"", headers=PROTO)
        usable = await r.client.post(USABLE_MODELS_AGENT, content=b"", headers=PROTO)
        cli = await r.client.post(DEFAULT_FOR_CLI_AGENT, content=b"", headers=PROTO)
        default = await r.client.post(DEFAULT_MODEL, content=b"", headers=PROTO)
        as_json = await r.client.post(USABLE_MODELS_AI, json={})
    assert all(x.status_code == 200 for x in (avail, usable, cli, default, as_json))
    local = aiserver.AvailableModelsResponse.parse(avail.content)
    assert [m.name for m in local.models] == ["byok-a", "gpt-5"]
    assert [m.model_id for m in agent.GetUsableModelsResponse.parse(usable.content).models] == [
        "byok-a",
        "gpt-5",
    ]
    cli_model = agent.GetDefaultModelForCliResponse.parse(cli.content).model
    assert cli_model is not None and cli_model.model_id == "byok-a"
    d = aiserver.GetDefaultModelResponse.parse(default.content)
    assert (d.model, d.thinking_model) == ("byok-a", "gpt-5")
    assert as_json.headers["content-type"] == "application/json"
    assert [m["modelId"] for m in as_json.json()["models"]] == ["byok-a", "gpt-5"]


async def test_upstream_timeout_answers_locally(tmp_path: Path) -> None:
    async with rig(tmp_path, timeout_s=0.3) as r:
        r.upstream.mode = "hang"
        resp = await r.client.post(AVAILABLE_MODELS, content=b"", headers=PROTO)
    assert resp.status_code == 200
    assert [m.name for m in aiserver.AvailableModelsResponse.parse(resp.content).models] == [
        "byok-a",
        "gpt-5",
    ]


async def test_usable_models_both_services(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        for path in (USABLE_MODELS_AGENT, USABLE_MODELS_AI):
            resp = await r.client.post(path, content=b"", headers=PROTO)
            merged = agent.GetUsableModelsResponse.parse(resp.content)
            assert [m.model_id for m in merged.models] == ["byok-a", "gpt-5", "default"]
            assert merged.models[1].thinking_details is not None


async def test_default_model_passes_through_when_upstream_answers(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        resp = await r.client.post(DEFAULT_FOR_CLI_AGENT, content=b"", headers=PROTO)
    assert resp.content == bytes(DEFAULT_FOR_CLI)


async def test_other_routes_are_not_handled(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        assert (await r.client.post("/aiserver.v1.AiService/Other", content=b"")).status_code == 418
        assert (await r.client.get(AVAILABLE_MODELS)).status_code == 418
    assert r.upstream.seen == []


async def test_proxy_origin_extension_wins(tmp_path: Path) -> None:
    async with rig(tmp_path, via_extension=True) as r:
        resp = await r.client.post(AVAILABLE_MODELS, content=b"", headers=PROTO)
    assert resp.headers.get("x-upstream") == "yes"
    assert len(r.upstream.seen) == 1


async def test_cli_model_list_merged(tmp_path: Path) -> None:
    """The cursor-agent CLI's CppService list: byok's enabled ids merged in, upstream's default kept."""
    async with rig(tmp_path) as r:
        resp = await r.client.post(CPP_MODELS, content=b"", headers=PROTO)
    assert resp.status_code == 200
    merged = aiserver.AvailableCppModelsResponse.parse(resp.content)
    assert merged.models == ["byok-a", "gpt-5", "default", "cursor-small"]
    assert merged.default_model == "default"
    assert [scope["path"] for scope, _ in r.upstream.seen] == [CPP_MODELS]


async def test_cli_model_list_json(tmp_path: Path) -> None:
    async with rig(tmp_path, default="gpt-5") as r:
        r.upstream.mode = "json"
        resp = await r.client.post(CPP_MODELS, json={})
    obj = resp.json()
    assert obj["models"] == ["byok-a", "gpt-5", "default", "cursor-small"]
    assert (obj["defaultModel"], obj["futureKey"]) == ("gpt-5", [1, 2])


async def test_cli_model_list_names_the_configured_default(tmp_path: Path) -> None:
    async with rig(tmp_path, default="gpt-5") as r:
        resp = await r.client.post(CPP_MODELS, content=b"", headers=PROTO)
    merged = aiserver.AvailableCppModelsResponse.parse(resp.content)
    assert merged.models == ["byok-a", "gpt-5", "default", "cursor-small"]
    assert merged.default_model == "gpt-5"


async def test_cli_model_list_when_upstream_is_down(tmp_path: Path) -> None:
    async with rig(tmp_path, upstream_down=True) as r:
        resp = await r.client.post(CPP_MODELS, content=b"", headers=PROTO)
    local = aiserver.AvailableCppModelsResponse.parse(resp.content)
    assert (local.models, local.default_model) == (["byok-a", "gpt-5"], "byok-a")


async def test_configured_default_answers_the_default_routes(tmp_path: Path) -> None:
    async with rig(tmp_path, default="gpt-5") as r:
        cli = [
            await r.client.post(p, content=b"", headers=PROTO)
            for p in (DEFAULT_FOR_CLI_AGENT, DEFAULT_FOR_CLI_AI)
        ]
        default = await r.client.post(DEFAULT_MODEL, content=b"", headers=PROTO)
        as_json = await r.client.post(DEFAULT_FOR_CLI_AGENT, json={})
    for resp in cli:
        model = agent.GetDefaultModelForCliResponse.parse(resp.content).model
        assert model is not None and model.model_id == "gpt-5" and model.thinking_details is not None
    d = aiserver.GetDefaultModelResponse.parse(default.content)
    assert (d.model, d.thinking_model) == ("gpt-5", "gpt-5")
    assert as_json.json()["model"]["modelId"] == "gpt-5"
    assert r.upstream.seen == []  # the user's choice: upstream is not asked


async def test_configured_default_that_does_not_think(tmp_path: Path) -> None:
    async with rig(tmp_path, default="byok-a", upstream_down=True) as r:
        default = await r.client.post(DEFAULT_MODEL, content=b"", headers=PROTO)
        usable = await r.client.post(USABLE_MODELS_AGENT, content=b"", headers=PROTO)
    d = aiserver.GetDefaultModelResponse.parse(default.content)
    assert (d.model, d.thinking_model) == ("byok-a", "gpt-5")  # the first byok model that thinks
    # The lists keep config order whatever the default.
    assert [m.model_id for m in agent.GetUsableModelsResponse.parse(usable.content).models] == [
        "byok-a",
        "gpt-5",
    ]
