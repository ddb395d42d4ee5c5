"""The control API against the real daemon: who may call it, what it refuses (each bad input a
4xx naming the field), and providers, models and aliases made through it, which the next run
uses without a restart."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio

from byok.console.token import new_token
from byok.devtools.cursor_sim import user_turn
from byok.http.console_routes import ROUTES
from tests.integration.conftest import Daemon, start_daemon
from tests.support.console_client import console_client, wait_calls
from tests.support.fake_provider import (
    FakeProvider,
    anthropic_text_script,
    chat_text_script,
    error_script,
    responses_text_script,
)

KEY = "sk-console-secret-0123456789abcd"


@pytest.fixture
async def api(daemon: Daemon) -> AsyncIterator[httpx.AsyncClient]:
    async with console_client(daemon.base_url, daemon.data_dir) as client:
        yield client


def _concrete(pattern: str) -> str:
    return pattern.replace("{id}", "1" if pattern.startswith("/calls") else "x1")


ALL_ROUTES = sorted({(r.method, _concrete(r.pattern)) for r in ROUTES} | {("GET", "/calls/live")})


@pytest.mark.parametrize(("method", "path"), ALL_ROUTES)
async def test_every_route_wants_the_token(daemon: Daemon, method: str, path: str) -> None:
    url = daemon.base_url + "/byok/api" + path
    body = {} if method in ("POST", "PATCH") else None
    missing = await daemon.client.request(method, url, json=body)
    assert missing.status_code == 401
    assert missing.json()["error"]["field"] == "authorization"
    assert "missing" in missing.json()["error"]["message"]
    wrong = await daemon.client.request(method, url, json=body, headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert "wrong" in wrong.json()["error"]["message"]
    assert not any(k.lower().startswith("access-control-") for k in wrong.headers)


@pytest.mark.parametrize(("method", "path"), [r for r in ALL_ROUTES if r[1] != "/calls/live"])
async def test_every_route_answers_the_right_token_in_json(
    api: httpx.AsyncClient, method: str, path: str
) -> None:
    body = {} if method in ("POST", "PATCH") else None
    r = await api.request(method, path, json=body)
    assert r.status_code != 401, r.text
    answer = r.json() if r.headers["content-type"] == "application/json" else None
    assert answer is not None or r.status_code == 200
    if r.status_code >= 400:  # made-up ids and empty bodies: refused, naming what is wrong
        assert set(answer["error"]) == {"field", "message"} and answer["error"]["message"]


async def test_routes_answer_with_the_token(daemon: Daemon, api: httpx.AsyncClient) -> None:
    for path in ("/providers", "/models", "/aliases", "/calls", "/conversations", "/usage", "/setup"):
        r = await api.get(path)
        assert r.status_code == 200, (path, r.text)
    doc = (await api.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    assert {"/byok/api/providers", "/byok/api/calls/live", "/byok/api/usage"} <= set(doc["paths"])
    # The config file's entries are there, read-only, the key shown by its last four only.
    providers = (await api.get("/providers")).json()["providers"]
    assert providers == [
        {
            "id": "fake",
            "kind": "openai_chat",
            "base_url": providers[0]["base_url"],
            "enabled": True,
            "key": "…test",
            "key_env": None,
            "header_names": [],
            "source": "config",
            "read_only": True,
            "config_file": str(daemon.config_path),
        }
    ]
    assert (await api.patch("/providers/fake", json={"enabled": False})).status_code == 409
    assert (await api.delete("/models/byok-demo")).json()["error"]["field"] == "id"


async def test_web_pages_of_other_origins_are_refused(daemon: Daemon, api: httpx.AsyncClient) -> None:
    evil = await api.get("/providers", headers={"origin": "http://evil.example"})
    assert evil.status_code == 403 and evil.json()["error"]["field"] == "origin"
    rebinding = await api.get("/providers", headers={"host": "evil.example:8790"})
    assert rebinding.status_code == 403 and rebinding.json()["error"]["field"] == "host"
    cross = await api.get("/providers", headers={"sec-fetch-site": "cross-site"})
    assert cross.status_code == 403
    preflight = await api.options("/providers", headers={"access-control-request-method": "POST"})
    assert preflight.status_code == 405
    assert not any(k.lower().startswith("access-control-") for k in preflight.headers)
    same = await api.get("/providers", headers={"origin": daemon.base_url, "sec-fetch-site": "same-origin"})
    assert same.status_code == 200
    bare = await daemon.client.get(daemon.base_url + "/byok")
    assert bare.status_code == 308 and bare.headers["location"] == "byok/"  # kept relative
    page = await daemon.client.get(daemon.base_url + "/byok/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    for escape in ("/byok/ui/%2E%2E/secret_box.py", "/byok/ui/%2e%2e/%2e%2e/config.py", "/byok/ui/app.py"):
        assert (await daemon.client.get(daemon.base_url + escape)).status_code == 404, escape


_P = {"id": "p1", "kind": "openai_chat", "base_url": "http://x"}


def _with(**fields: object) -> str:
    return json.dumps({**_P, **fields})


BAD_BODIES = [
    ("not json", "body", 400, {"content-type": "application/json"}),
    (json.dumps({"id": "p1"}), "content-type", 415, {"content-type": "text/plain"}),
    (json.dumps([1]), "", 400, None),
    (_with(colour=1), "colour", 400, None),
    (_with(id="p 1"), "id", 400, None),
    (_with(kind="gpt"), "kind", 400, None),
    (_with(base_url="ftp://x"), "base_url", 400, None),
    (_with(enabled="yes"), "enabled", 400, None),
    (_with(api_key="a b"), "api_key", 400, None),
    (_with(headers={"bad name": "v"}), "headers.bad name", 400, None),
    (_with(id="fake"), "id", 409, None),
    ("x" * ((1 << 20) + 1), "body", 413, None),
]


@pytest.mark.parametrize(("body", "field", "status", "headers"), BAD_BODIES)
async def test_bad_provider_bodies_name_the_field(
    api: httpx.AsyncClient, body: str, field: str, status: int, headers: dict[str, str] | None
) -> None:
    r = await api.post("/providers", content=body, headers=headers or {"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert r.json()["error"]["field"] == field
    assert (await api.get("/providers")).json()["providers"][1:] == []  # nothing was made


async def test_bad_model_alias_and_query_inputs(api: httpx.AsyncClient) -> None:
    model = {"id": "m1", "provider": "fake", "upstream_model": "gpt", "context_tokens": 1000}
    cases = [
        ("/models", {**model, "provider": "nope"}, "provider", 400),
        ("/models", {**model, "context_tokens": 0}, "context_tokens", 400),
        ("/models", {**model, "effort": "max"}, "effort", 400),
        ("/models", {**model, "extra_body": {"model": "x"}}, "extra_body.model", 400),
        ("/models", {**model, "id": "byok-demo"}, "id", 409),
        ("/aliases", {"id": "a1", "targets": []}, "targets", 400),
        ("/aliases", {"id": "a1", "targets": ["byok-demo", "nope"]}, "targets[1]", 400),
        ("/aliases", {"id": "a1", "targets": ["byok-demo"], "cooldown_s": -1}, "cooldown_s", 400),
        ("/aliases", {"id": "byok-demo", "targets": ["byok-demo"]}, "id", 409),
    ]
    for path, body, field, status in cases:
        r = await api.post(path, json=body)
        assert (r.status_code, r.json()["error"]["field"]) == (status, field), (body, r.text)
    for path, field in (
        ("/calls?limit=x", "limit"),
        ("/calls?status=great", "status"),
        ("/calls?since_ms=-5", "since_ms"),
        ("/calls/abc", "id"),
        ("/usage?tz_offset_min=9999", "tz_offset_min"),
        ("/models/a%20b", "id"),
    ):
        r = await api.get(path)
        assert r.status_code == 400 and r.json()["error"]["field"] == field, (path, r.text)
    assert (await api.get("/calls/999")).status_code == 404
    assert (await api.get("/providers/none")).status_code == 404
    assert (await api.put("/providers")).status_code == 405
    assert (await api.get("/nothing-here")).status_code == 404


async def test_provider_crud_keeps_the_key_write_only(api: httpx.AsyncClient) -> None:
    made = await api.post(
        "/providers",
        json={"id": "p1", "kind": "anthropic", "base_url": "http://127.0.0.1:9/", "api_key": KEY},
    )
    assert made.status_code == 201, made.text
    assert made.json()["key"] == "…abcd" and KEY not in made.text
    assert made.json()["base_url"] == "http://127.0.0.1:9"
    changed = await api.patch("/providers/p1", json={"enabled": False, "headers": {"x-team": "a"}})
    assert changed.json()["enabled"] is False and changed.json()["key"] == "…abcd"
    assert changed.json()["header_names"] == ["x-team"]
    listed = await api.get("/providers")
    assert KEY not in listed.text and [p["id"] for p in listed.json()["providers"]] == ["fake", "p1"]
    cleared = await api.patch("/providers/p1", json={"api_key": None})
    assert cleared.json()["key"] is None
    model = {"id": "m1", "provider": "p1", "upstream_model": "claude", "context_tokens": 1000}
    assert (await api.post("/models", json=model)).status_code == 201
    refused = await api.delete("/providers/p1")
    assert refused.status_code == 409 and "m1" in refused.json()["error"]["message"]
    assert (await api.delete("/models/m1")).status_code == 200
    assert (await api.delete("/providers/p1")).status_code == 200
    assert (await api.get("/providers/p1")).status_code == 404


async def _second_provider(nursery: trio.Nursery) -> tuple[FakeProvider, str]:
    provider = FakeProvider()
    return provider, await provider.start(nursery)


async def test_a_provider_added_in_the_api_serves_the_next_turn(
    daemon: Daemon, api: httpx.AsyncClient, nursery: trio.Nursery
) -> None:
    other, url = await _second_provider(nursery)
    other.models = [{"id": "other-large", "context_window": 64000}, {"id": "other-small"}]
    made = await api.post(
        "/providers", json={"id": "other", "kind": "openai_chat", "base_url": url, "api_key": KEY}
    )
    assert made.status_code == 201
    found = await api.post("/providers/other/discover")
    assert found.json()["models"] == [{"id": "other-large", "context_window": 64000}, {"id": "other-small"}]
    assert other.requests[-1].headers["authorization"] == f"Bearer {KEY}"  # decrypted to be sent
    other.enqueue(chat_text_script(["OK"], usage=(12, 1)))
    tested = (await api.post("/providers/other/test", json={"model": "other-large"})).json()
    assert tested["ok"] is True and tested["text"] == "OK" and tested["ttft_ms"] is not None
    assert other.requests[-1].json["max_tokens"] == 1
    other.enqueue(error_script(401, f"Incorrect API key provided: {KEY}"))
    failed = (await api.post("/providers/other/test", json={"model": "other-large"})).json()
    assert failed["ok"] is False and "Incorrect API key" in failed["error"] and KEY not in failed["error"]
    model = {
        "id": "console-large",
        "provider": "other",
        "upstream_model": "other-large",
        "context_tokens": 64000,
    }
    assert (await api.post("/models", json=model)).status_code == 201
    assert "console-large" in (await api.get("/models")).json()["picker"]

    other.enqueue(chat_text_script(["from the console"], usage=(40, 3)))
    tr = await daemon.sim.run(
        "req-console-1", user_turn("hi", conversation_id="c1", model_id="console-large", message_id="m1")
    )
    assert tr.end_stream == {} and tr.text() == "from the console"
    assert other.requests[-1].json["model"] == "other-large"
    (call,) = await wait_calls(api, 1, model="console-large")
    assert (call["provider_id"], call["model_id"], call["alias_id"]) == ("other", "console-large", None)
    assert call["usage"]["input"] == 40 and call["usage"]["output"] == 3
    detail = (await api.get(f"/calls/{call['id']}")).json()
    assert detail["status"] == "ok" and detail["retries"] == 0 and detail["has_request_body"]
    assert (await api.get(f"/calls/{call['id']}/request")).status_code == 409  # detailed logging is off

    # Disabled: the next run refuses the model, relays nothing, and the picker drops it.
    await api.patch("/providers/other", json={"enabled": False})
    assert "console-large" not in (await api.get("/models")).json()["picker"]


async def test_calls_conversations_and_usage(daemon: Daemon, api: httpx.AsyncClient) -> None:
    daemon.provider.enqueue(
        chat_text_script(["one"], usage=(100, 5)), chat_text_script(["two"], usage=(150, 6))
    )
    for i in (1, 2):
        tr = await daemon.sim.run(
            f"req-u{i}", user_turn(f"t{i}", conversation_id="cu", model_id="byok-demo", message_id=f"m{i}")
        )
        assert tr.end_stream == {}
    calls = await wait_calls(api, 2)
    assert [c["request_id"] for c in calls] == ["req-u2", "req-u1"]  # newest first
    assert calls[0]["prefix_extends"] is True
    older = (await api.get("/calls", params={"before_id": calls[0]["id"]})).json()["calls"]
    assert [c["request_id"] for c in older] == ["req-u1"]
    assert (await api.get("/calls", params={"status": "error"})).json()["calls"] == []
    assert (await api.get("/calls", params={"provider": "nope"})).json()["calls"] == []
    conv = (await api.get("/conversations/cu")).json()
    assert [t["request_id"] for t in conv["turns"]] == ["req-u1", "req-u2"]
    assert conv["calls"] == 2 and conv["usage"]["input"] == 250 and len(conv["revisions"]) >= 2
    listed = (await api.get("/conversations")).json()["conversations"]
    assert listed[0]["conversation_id"] == "cu" and listed[0]["turns"] == 2
    (row,) = (await api.get("/usage")).json()["usage"]
    assert (row["model"], row["provider"], row["calls"], row["errors"]) == ("byok-demo", "fake", 2, 0)
    assert row["usage"]["output"] == 11


async def test_live_stream_shows_each_call(daemon: Daemon, api: httpx.AsyncClient) -> None:
    daemon.provider.enqueue(chat_text_script(["live"], usage=(30, 2)))
    seen: list[dict] = []
    async with trio.open_nursery() as nursery:

        async def listen(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            async with api.stream("GET", "/calls/live") as resp:
                assert resp.headers["content-type"] == "text/event-stream"
                task_status.started()
                event = ""
                async for line in resp.aiter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: ") and event == "call":
                        seen.append(json.loads(line[6:]))
                        nursery.cancel_scope.cancel()

        await nursery.start(listen)
        tr = await daemon.sim.run(
            "req-live", user_turn("x", conversation_id="cl", model_id="byok-demo", message_id="m1")
        )
        assert tr.end_stream == {}
    (call,) = seen
    assert call["request_id"] == "req-live" and call["usage"]["output"] == 2 and call["id"] > 0


async def test_a_console_key_is_nowhere_in_clear(
    daemon: Daemon, api: httpx.AsyncClient, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    other, url = await _second_provider(nursery)
    made = await api.post(
        "/providers", json={"id": "k", "kind": "openai_chat", "base_url": url, "api_key": KEY}
    )
    assert made.status_code == 201
    model = {"id": "keyed", "provider": "k", "upstream_model": "m", "context_tokens": 1000}
    assert (await api.post("/models", json=model)).status_code == 201
    # The provider echoes the key back in an error; then answers a turn.
    other.enqueue(error_script(401, f"Incorrect API key provided: {KEY}"))
    failed = await daemon.sim.run(
        "req-k1", user_turn("a", conversation_id="ck", model_id="keyed", message_id="m1")
    )
    assert failed.error is not None and KEY not in json.dumps(failed.end_stream)
    other.enqueue(chat_text_script(["fine"]))
    ok = await daemon.sim.run(
        "req-k2", user_turn("b", conversation_id="ck", model_id="keyed", message_id="m2")
    )
    assert ok.end_stream == {}
    assert other.requests[-1].headers["authorization"] == f"Bearer {KEY}"
    calls = await wait_calls(api, 2, model="keyed")
    for call in calls:
        assert KEY not in (await api.get(f"/calls/{call['id']}")).text
    for path in ("/providers", "/providers/k", "/models", "/calls"):
        assert KEY not in (await api.get(path)).text
    stored = b"".join(p.read_bytes() for p in daemon.data_dir.glob("byok.sqlite3*"))
    assert KEY.encode() not in stored and KEY[:12].encode() not in stored
    for run_log in (daemon.data_dir / "runs").glob("*.jsonl"):
        assert KEY not in run_log.read_text()
    assert KEY not in caplog.text and KEY[:12] not in caplog.text
    assert made.json()["key"] == "…abcd"  # the console shows the last four, and only those


async def test_bodies_with_detailed_logging_are_redacted(tmp_path: Path, nursery: trio.Nursery) -> None:
    async with (
        start_daemon(tmp_path, nursery, extra="[logging]\ndetailed = true") as daemon,
        console_client(daemon.base_url, daemon.data_dir) as api,
    ):
        other, url = await _second_provider(nursery)
        body = {"id": "k", "kind": "openai_chat", "base_url": url, "api_key": KEY}
        assert (await api.post("/providers", json=body)).status_code == 201
        model = {"id": "keyed", "provider": "k", "upstream_model": "m", "context_tokens": 1000}
        assert (await api.post("/models", json=model)).status_code == 201
        other.enqueue(error_script(401, f"Incorrect API key provided: {KEY}"))  # echoed back
        refused = user_turn("show", conversation_id="cd", model_id="keyed", message_id="m1")
        assert (await daemon.sim.run("req-d1", refused)).error is not None
        other.enqueue(chat_text_script(["shown"]))
        turn = user_turn("show", conversation_id="cd", model_id="keyed", message_id="m1")
        assert (await daemon.sim.run("req-d2", turn)).end_stream == {}
        ok, failed = await wait_calls(api, 2)
        detail = (await api.get(f"/calls/{ok['id']}")).json()
        assert detail["bodies_logged"] and detail["has_request_body"] and detail["has_response_body"]
        request = await api.get(f"/calls/{ok['id']}/request")
        assert request.status_code == 200 and json.loads(request.text)["model"] == "m"
        assert "shown" in (await api.get(f"/calls/{ok['id']}/response")).text
        response = await api.get(f"/calls/{failed['id']}/response")
        assert "Incorrect API key provided: [REDACTED]" in response.text and KEY not in response.text
        stored = b"".join(p.read_bytes() for p in daemon.data_dir.glob("byok.sqlite3*"))
        assert KEY.encode() not in stored and KEY[:12].encode() not in stored


async def test_the_console_in_lan_mode(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind LAN mode's credential (a path prefix, over TLS): the page's links are relative so
    they keep the prefix; the console still wants its own token; the TLS name is a host it
    answers to."""
    from tests.integration.test_lan import TOKEN, lan_daemon

    async with lan_daemon(tmp_path, nursery, monkeypatch) as lan:
        token = new_token(tmp_path / "data")
        base = f"{lan.base_url}/{TOKEN}/byok"
        async with httpx.AsyncClient(verify=lan.trust, timeout=30) as client:
            page = await client.get(base + "/")
            assert page.status_code == 200 and 'src="ui/app.js"' in page.text
            assert (await client.get(base + "/ui/app.js")).status_code == 200
            assert (await client.get(base + "/api/providers")).status_code == 401
            auth = {"authorization": f"Bearer {token}"}
            mine = await client.get(base + "/api/providers", headers={**auth, "origin": lan.base_url})
            assert mine.status_code == 200 and mine.json()["providers"][0]["id"] == "fake"
            named = await client.get(
                base + "/api/setup",
                headers={**auth, "host": lan.base_url.split("//")[1].replace("127.0.0.2", "byok.lan")},
            )
            assert named.status_code == 200 and named.json()["backend_url"].startswith("https://byok.lan:")
            other = await client.get(
                base + "/api/providers", headers={**auth, "origin": "https://evil.example"}
            )
            assert other.status_code == 403
            assert (await client.get(lan.base_url + "/byok/")).status_code != 200  # no LAN credential


async def test_console_entries_survive_a_restart_and_need_their_key_file(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    other, url = await _second_provider(nursery)
    async with start_daemon(tmp_path, nursery) as d1, console_client(d1.base_url, d1.data_dir) as api:
        body = {"id": "kept", "kind": "openai_chat", "base_url": url, "api_key": KEY}
        assert (await api.post("/providers", json=body)).status_code == 201
        model = {"id": "kept-m", "provider": "kept", "upstream_model": "up", "context_tokens": 1000}
        assert (await api.post("/models", json=model)).status_code == 201
        assert (await api.post("/aliases", json={"id": "kept-a", "targets": ["kept-m"]})).status_code == 201

    async with start_daemon(tmp_path, nursery) as d2, console_client(d2.base_url, d2.data_dir) as api:
        (provider,) = [p for p in (await api.get("/providers")).json()["providers"] if p["id"] == "kept"]
        assert provider["key"] == "…abcd" and provider["key_unreadable"] is False
        assert {"kept-m", "kept-a"} <= set((await api.get("/models")).json()["picker"])
        other.enqueue(chat_text_script(["after the restart"]))
        turn = user_turn("hi", conversation_id="cr", model_id="kept-a", message_id="m1")
        tr = await d2.sim.run("req-r1", turn)
        assert tr.end_stream == {} and tr.text() == "after the restart"
        assert other.requests[-1].headers["authorization"] == f"Bearer {KEY}"  # decrypted again

    (tmp_path / "data" / "console.key").unlink()  # the database without its key file
    async with start_daemon(tmp_path, nursery) as d3, console_client(d3.base_url, d3.data_dir) as api:
        (provider,) = [p for p in (await api.get("/providers")).json()["providers"] if p["id"] == "kept"]
        assert provider["key_unreadable"] is True and provider["enabled"] is False
        assert "kept-m" not in (await api.get("/models")).json()["picker"]
        fixed = await api.patch("/providers/kept", json={"api_key": KEY, "enabled": True})
        assert fixed.status_code == 200 and fixed.json()["key_unreadable"] is False
        assert "kept-m" in (await api.get("/models")).json()["picker"]


async def test_live_streams_end_when_the_daemon_stops(tmp_path: Path, nursery: trio.Nursery) -> None:
    ended = trio.Event()
    async with httpx.AsyncClient(timeout=30) as client:
        async with start_daemon(tmp_path, nursery) as daemon:
            token = new_token(daemon.data_dir)

            async def listen(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                url = daemon.base_url + "/byok/api/calls/live"
                async with client.stream("GET", url, headers={"authorization": f"Bearer {token}"}) as resp:
                    task_status.started()
                    async for _ in resp.aiter_lines():
                        pass
                ended.set()

            await nursery.start(listen)
        with trio.fail_after(5):  # not held open until the server's own timeout
            await ended.wait()


@pytest.mark.parametrize("kind", ["anthropic", "openai_responses"])
async def test_discovery_and_test_call_per_kind(
    api: httpx.AsyncClient, nursery: trio.Nursery, kind: str
) -> None:
    other, url = await _second_provider(nursery)
    base = url.removesuffix("/v1") if kind == "anthropic" else url  # Anthropic's base has no /v1
    other.models = [{"id": "m-1", "display_name": "Model One", "max_input_tokens": 200000}]
    made = await api.post("/providers", json={"id": "k", "kind": kind, "base_url": base, "api_key": KEY})
    assert made.status_code == 201
    found = (await api.post("/providers/k/discover")).json()["models"]
    assert found == [{"id": "m-1", "context_window": 200000, "display_name": "Model One"}]
    listed = other.requests[-1]
    assert listed.method == "GET" and listed.path.split("?")[0] == "/v1/models"
    auth = listed.headers.get("x-api-key") if kind == "anthropic" else listed.headers.get("authorization")
    assert auth in (KEY, f"Bearer {KEY}")
    script = anthropic_text_script(["OK"]) if kind == "anthropic" else responses_text_script(["OK"])
    other.enqueue(script)
    tested = (await api.post("/providers/k/test", json={"model": "m-1"})).json()
    assert tested["ok"] is True and tested["text"] == "OK" and tested["output_tokens"] == 5
    sent = other.requests[-1].json
    limit = sent["max_tokens"] if kind == "anthropic" else sent["max_output_tokens"]
    assert (sent["model"], limit) == ("m-1", 1 if kind == "anthropic" else 16)
