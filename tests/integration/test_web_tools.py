"""WebFetch, WebSearch and GenerateImage end to end: the user approves (or not) through the
simulator, Cursor fetches the page (a loopback server), byok searches and draws with loopback
backends named in the config; without a backend the tool is not offered, and a call for it
anyway is a tool error. Every run is replayed byte for byte at teardown (conftest)."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import attrs
import pytest
import trio

from byok.devtools.cursor_sim import CursorSim, Transcript, user_turn
from byok.devtools.sim_user import SimUser
from byok.devtools.workspace_exec import WorkspaceExecutor
from byok.pb.agent import v1 as agent
from tests.integration.conftest import Daemon, start_daemon
from tests.support.fake_provider import FakeProvider, Script, chat_text_script, chat_tool_script

MODEL = "byok-demo"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(64))


@attrs.define
class Web:
    daemon: Daemon
    site: FakeProvider  # the pages Cursor fetches
    site_url: str
    backend: FakeProvider  # the search API and the images endpoint
    root: Path


def page(body: bytes, status: int = 200, kind: str = "text/html; charset=utf-8") -> Script:
    return Script(status=status, headers=[("content-type", kind)], chunks=[body])


def json_answer(obj: object, status: int = 200) -> Script:
    return Script(
        status=status, headers=[("content-type", "application/json")], chunks=[json.dumps(obj).encode()]
    )


@pytest.fixture
async def web(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[Web]:
    site, backend = FakeProvider(), FakeProvider()
    site_url = await site.start(nursery)
    backend_url = await backend.start(nursery)
    extra = f"""
[search]
kind = "searxng"
url = "{backend_url}/search"
max_results = 2

[images]
base_url = "{backend_url}"
model = "image-test"
api_key = "sk-images"
"""
    root = tmp_path / "ws"
    root.mkdir()
    async with start_daemon(tmp_path, nursery, extra=extra) as d:
        yield Web(d, site, site_url, backend, root)


def turn(text: str, conv: str) -> agent.AgentRunRequest:
    return user_turn(text, conversation_id=conv, model_id=MODEL, message_id=f"m-{conv}")


def offered(d: Daemon, request: int = 0) -> set[str]:
    return {t["function"]["name"] for t in d.provider.requests[request].json["tools"]}


def result_of(d: Daemon, request: int = 1) -> dict:
    [result] = [m for m in d.provider.requests[request].json["messages"] if m["role"] == "tool"]
    return result


def completed(tr: Transcript) -> agent.ToolCall:
    [card] = [
        f.message.interaction_update.tool_call_completed.tool_call
        for f in tr.frames
        if f.kind == "interaction_update.tool_call_completed"
    ]
    return card


async def call_tool(w: Web, user: SimUser, conv: str, name: str, args: dict) -> Transcript:
    w.daemon.provider.enqueue(
        chat_tool_script([(f"call-{conv}", name, json.dumps(args))]), chat_text_script(["ok"])
    )
    executor = WorkspaceExecutor(w.root)
    sim = CursorSim(w.daemon.base_url, w.daemon.client, executor=executor, on_query=user)
    try:
        tr = await sim.run(f"req-{conv}", turn(f"use {name}", conv))
    finally:
        await executor.aclose()
    assert tr.end_stream == {}, tr.end_stream
    return tr


# --- WebFetch ------------------------------------------------------------------------------------


async def test_web_fetch_approved_fetches_through_cursor(web: Web) -> None:
    web.site.enqueue(page(b"<h1>Release notes</h1><p>v2 is out</p>"))
    url = f"{web.site_url}/notes"
    user = SimUser()
    tr = await call_tool(web, user, "conv-fetch", "WebFetch", {"url": url})
    [query] = user.seen
    assert query.web_fetch_request_query.args.url == url
    assert query.web_fetch_request_query.args.tool_call_id == "call-conv-fetch"
    # Approved: the fetch goes to the client as fetch_args for the same call, after the approval.
    [fetch] = [f.message.exec_server_message for f in tr.frames if f.kind == "exec_server_message.fetch_args"]
    assert (fetch.fetch_args.url, fetch.fetch_args.tool_call_id, fetch.exec_id) == (
        url,
        "call-conv-fetch",
        "call-conv-fetch",
    )
    kinds = tr.kinds()
    assert kinds.index("interaction_query.web_fetch_request_query") < kinds.index(
        "exec_server_message.fetch_args"
    )
    assert [r.path for r in web.site.requests] == ["/v1/notes"]
    content = result_of(web.daemon)["content"]
    assert content.startswith(f"Fetched {url} (HTTP 200, text/html; charset=utf-8):")
    assert "<h1>Release notes</h1><p>v2 is out</p>" in content
    success = completed(tr).web_fetch_tool_call.result.success
    assert success.url == url and "v2 is out" in success.markdown


async def test_web_fetch_of_a_missing_page_is_an_error(web: Web) -> None:
    web.site.enqueue(page(b"nope", status=404, kind="text/plain"))
    tr = await call_tool(web, SimUser(), "conv-fetch-404", "WebFetch", {"url": f"{web.site_url}/gone"})
    result = result_of(web.daemon)
    assert result["content"].endswith("the server answered HTTP 404")
    assert completed(tr).web_fetch_tool_call.result.error is not None


async def test_web_fetch_rejected_fetches_nothing(web: Web) -> None:
    url = f"{web.site_url}/private"
    user = SimUser(decisions={"web_fetch_request_query": "reject"}, reason="private site")
    tr = await call_tool(web, user, "conv-fetch-no", "WebFetch", {"url": url})
    assert not [k for k in tr.kinds() if k.startswith("exec_server_message")]
    assert not web.site.requests
    assert result_of(web.daemon)["content"] == f"The user declined fetching {url} (private site)."
    assert completed(tr).web_fetch_tool_call.result.rejected.reason == "private site"


# --- WebSearch -------------------------------------------------------------------------------------


SEARX = {
    "results": [
        {
            "title": "Trio docs",
            "url": "https://trio.readthedocs.io",
            "content": "Structured <b>concurrency</b>",
        },
        {"title": "Trio on PyPI", "url": "https://pypi.org/project/trio/", "content": "Release 0.27"},
        {"title": "third", "url": "https://example.com/3", "content": "cut by max_results"},
    ]
}


async def test_web_search_with_a_backend(web: Web) -> None:
    web.backend.enqueue(json_answer(SEARX))
    user = SimUser()
    tr = await call_tool(web, user, "conv-search", "WebSearch", {"search_term": "trio nursery 2026"})
    assert {"WebSearch", "GenerateImage"} <= offered(web.daemon)
    [query] = user.seen
    assert query.web_search_request_query.args.search_term == "trio nursery 2026"
    [request] = web.backend.requests
    target = urlsplit(request.path)
    assert target.path == "/v1/search"
    assert parse_qs(target.query) == {"q": ["trio nursery 2026"], "format": ["json"]}
    content = result_of(web.daemon)["content"]
    assert content.splitlines()[:4] == [
        'Web results for "trio nursery 2026":',
        "",
        "1. Trio docs",
        "   https://trio.readthedocs.io",
    ]
    assert "Structured concurrency" in content and "third" not in content
    refs = completed(tr).web_search_tool_call.result.success.references
    assert [r.url for r in refs] == ["https://trio.readthedocs.io", "https://pypi.org/project/trio/"]


async def test_web_search_backend_failure_is_a_tool_error(web: Web) -> None:
    web.backend.enqueue(json_answer({"error": "rate limited"}, status=429))
    tr = await call_tool(web, SimUser(), "conv-search-429", "WebSearch", {"search_term": "x"})
    content = result_of(web.daemon)["content"]
    assert content.startswith("Web search failed: the search service answered HTTP 429")
    assert completed(tr).web_search_tool_call.result.error is not None
    # The run went on to its next call: a backend failing is the model's to read, not the run's.
    assert len(web.daemon.provider.requests) == 2


async def test_web_search_rejected_searches_nothing(web: Web) -> None:
    user = SimUser(decisions={"web_search_request_query": "reject"})
    await call_tool(web, user, "conv-search-no", "WebSearch", {"search_term": "x"})
    assert not web.backend.requests
    assert result_of(web.daemon)["content"] == 'The user declined the web search for "x".'


async def test_without_a_search_backend_web_search_is_not_offered_and_a_call_is_an_error(
    daemon: Daemon, tmp_path: Path
) -> None:
    user = SimUser()
    w = Web(daemon, FakeProvider(), "", FakeProvider(), tmp_path)
    tr = await call_tool(w, user, "conv-no-backend", "WebSearch", {"search_term": "x"})
    assert "WebSearch" not in offered(daemon) and "GenerateImage" not in offered(daemon)
    assert "WebFetch" in offered(daemon)
    assert not user.seen  # no approval asked for a search byok cannot do
    result = result_of(daemon)
    assert result["content"] == (
        "Error: WebSearch is not available: byok has no web search backend configured"
        " ([search] in byok's config file); it was not run."
    )
    assert not [k for k in tr.kinds() if k.startswith("interaction_query")]


# --- GenerateImage ---------------------------------------------------------------------------------


async def test_generate_image_with_a_backend(web: Web) -> None:
    web.backend.enqueue(json_answer({"data": [{"b64_json": base64.b64encode(PNG).decode()}]}))
    user = SimUser()
    tr = await call_tool(web, user, "conv-image", "GenerateImage", {"description": "a red fox"})
    [request] = web.backend.requests
    assert request.method == "POST" and request.path == "/v1/images/generations"
    assert request.headers["authorization"] == "Bearer sk-images"
    assert request.json == {"model": "image-test", "prompt": "a red fox", "n": 1, "size": "1024x1024"}
    content = result_of(web.daemon)["content"]
    assert content == "Generated the image (0 KiB, image/png) and showed it to the user."
    assert base64.b64encode(PNG).decode() not in json.dumps(web.daemon.provider.requests[1].json)
    success = completed(tr).generate_image_tool_call.result.success
    assert base64.b64decode(success.image_data) == PNG
