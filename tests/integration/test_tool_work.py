"""Server work against loopback backends (run/tool_work.py): the request each search API and the
images endpoint gets, what byok reads from the answer, and every failure as a result value."""

from __future__ import annotations

import base64
import json
from urllib.parse import parse_qs, urlsplit

import attrs
import httpx
import trio

from byok.config import Config, ServerConfig
from byok.config_tools import ImagesConfig, SearchConfig, Secret
from byok.cursor.tools.work import ImageMade, ImageWork, SearchHit, SearchResults, SearchWork, WorkFailed
from byok.run.tool_work import perform
from tests.support.fake_provider import FakeProvider, Script

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


def config(**backends: object) -> Config:
    return Config(server=ServerConfig(), providers=(), models=(), source="<test>", **backends)  # type: ignore[arg-type]


def answer(obj: object, status: int = 200) -> Script:
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return Script(status=status, headers=[("content-type", "application/json")], chunks=[body])


async def test_brave_search(nursery: trio.Nursery) -> None:
    backend = FakeProvider()
    url = await backend.start(nursery)
    backend.enqueue(
        answer(
            {
                "web": {
                    "results": [
                        {"title": "A &amp; B", "url": "https://a", "description": "<strong>x</strong> y"},
                        {"title": "no url"},
                        {"title": "C", "url": "https://c"},
                    ]
                }
            }
        )
    )
    search = SearchConfig("brave", f"{url}/web", Secret(literal="bk"), max_results=4)
    async with httpx.AsyncClient() as http:
        result = await perform(SearchWork("trio 2026"), config(search=search), http)
    assert result == SearchResults((SearchHit("A & B", "https://a", "x y"), SearchHit("C", "https://c", "")))
    (request,) = backend.requests
    assert request.headers["x-subscription-token"] == "bk"
    assert parse_qs(urlsplit(request.path).query) == {"q": ["trio 2026"], "count": ["4"]}


async def test_search_failures_are_results(nursery: trio.Nursery) -> None:
    backend = FakeProvider()
    url = await backend.start(nursery)
    search = SearchConfig("searxng", f"{url}/search", Secret(literal="tok"))
    backend.enqueue(answer(b"<html>not json</html>"), answer(["a list"]), answer({"results": "x"}))
    async with httpx.AsyncClient() as http:
        results = [await perform(SearchWork("q"), config(search=search), http) for _ in range(3)]
        # Nothing listens on port 9 of loopback.
        gone = attrs.evolve(search, url="http://127.0.0.1:9/search")
        unreachable = await perform(SearchWork("q"), config(search=gone), http)
        missing = await perform(SearchWork("q"), config(), http)
    assert results == [
        WorkFailed("the search service's answer is not a JSON object"),
        WorkFailed("the search service's answer is not a JSON object"),
        WorkFailed("the search service's results are not a list"),
    ]
    assert backend.requests[0].headers["authorization"] == "Bearer tok"
    assert isinstance(unreachable, WorkFailed) and unreachable.message.startswith(
        "the backend could not be reached"
    )
    assert missing == WorkFailed("no search backend is configured ([search] in byok's config)")


async def test_a_key_missing_from_the_environment_is_a_result() -> None:
    search = SearchConfig("brave", "https://unused.invalid", Secret(env="BYOK_TEST_NO_SUCH_KEY"))
    async with httpx.AsyncClient() as http:
        result = await perform(SearchWork("q"), config(search=search), http)
    assert isinstance(result, WorkFailed) and "BYOK_TEST_NO_SUCH_KEY is not set" in result.message


async def test_an_image_by_url_and_the_endpoints_errors(nursery: trio.Nursery) -> None:
    backend = FakeProvider()
    url = await backend.start(nursery)
    images = ImagesConfig(url, "img-1", Secret(literal="sk"), size="512x512")
    backend.enqueue(
        answer({"data": [{"url": f"{url}/files/1.png", "revised_prompt": "a fox, detailed"}]}),
        Script(headers=[("content-type", "image/png")], chunks=[PNG]),
        answer({"error": {"message": "content policy"}}, status=400),
        answer({"data": []}),
    )
    async with httpx.AsyncClient() as http:
        made = await perform(ImageWork("a fox"), config(images=images), http)
        refused = await perform(ImageWork("a fox"), config(images=images), http)
        empty = await perform(ImageWork("a fox"), config(images=images), http)
    assert made == ImageMade(base64.b64encode(PNG).decode(), "image/png", "a fox, detailed")
    first = backend.requests[0]
    assert first.path == "/v1/images/generations" and first.headers["authorization"] == "Bearer sk"
    assert first.json == {"model": "img-1", "prompt": "a fox", "n": 1, "size": "512x512"}
    assert backend.requests[1].path == "/v1/files/1.png"
    assert refused == WorkFailed("the image service answered HTTP 400: content policy")
    assert empty == WorkFailed("the image service's answer holds no image")
