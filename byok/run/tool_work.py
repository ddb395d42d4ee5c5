"""Server work for tools (``StartWork``): a web search or an image, done with the backend the
config names (config_tools.py), or AwaitShell's wait on a terminal file (run/terminal_wait.py);
always ending in a result value, never an exception: a backend that fails is a ``WorkFailed``
the model reads, and the run goes on.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import re
from typing import Any

import httpx

from byok.config import Config, ConfigError
from byok.config_tools import ImagesConfig, SearchConfig
from byok.cursor.tools.await_shell import TerminalWait
from byok.cursor.tools.work import (
    ImageMade,
    ImageWork,
    SearchHit,
    SearchResults,
    SearchWork,
    Work,
    WorkFailed,
    WorkResult,
)
from byok.run.terminal_wait import wait_for_terminal

log = logging.getLogger("byok.tools")

_TAG = re.compile(r"<[^>]+>")
_ERROR_EXCERPT = 300  # characters of a backend's error body shown to the model


async def perform(work: Work, config: Config, http: httpx.AsyncClient) -> WorkResult:
    if isinstance(work, TerminalWait):  # AwaitShell: a local file, waited on (run/terminal_wait.py)
        return await wait_for_terminal(work)
    try:
        if isinstance(work, SearchWork):
            if config.search is None:
                return WorkFailed("no search backend is configured ([search] in byok's config)")
            return await _search(work, config.search, http)
        if isinstance(work, ImageWork):
            if config.images is None:
                return WorkFailed("no image backend is configured ([images] in byok's config)")
            return await _image(work, config.images, http)
    except ConfigError as e:  # a key's environment variable is not set where the daemon runs
        return WorkFailed(str(e))
    except httpx.TimeoutException:
        return WorkFailed("the backend did not answer in time")
    except httpx.HTTPError as e:
        return WorkFailed(f"the backend could not be reached: {type(e).__name__}: {e}")
    raise TypeError(f"no server work {work!r}")


def _failed_status(what: str, resp: httpx.Response) -> WorkFailed:
    detail = " ".join(resp.text.split())[:_ERROR_EXCERPT]
    return WorkFailed(f"the {what} answered HTTP {resp.status_code}" + (f": {detail}" if detail else ""))


def _json(resp: httpx.Response) -> Any:
    try:
        return json.loads(resp.content)
    except ValueError:
        return None


# --- search ----------------------------------------------------------------------------------------


def _clean(text: object) -> str:
    """A snippet as plain text: search APIs mark matches with HTML (<strong>) and escape entities."""
    return html.unescape(_TAG.sub("", text)) if isinstance(text, str) else ""


async def _search(work: SearchWork, c: SearchConfig, http: httpx.AsyncClient) -> WorkResult:
    key = c.key.value()
    headers = {"accept": "application/json"}
    if c.kind == "brave":
        params: dict[str, str | int] = {"q": work.query, "count": c.max_results}
        if key:
            headers["x-subscription-token"] = key
    else:
        params = {"q": work.query, "format": "json"}
        if key:
            headers["authorization"] = f"Bearer {key}"
    resp = await http.get(c.url, params=params, headers=headers, timeout=c.timeout_s)
    if resp.status_code != 200:
        return _failed_status("search service", resp)
    data = _json(resp)
    if not isinstance(data, dict):
        return WorkFailed("the search service's answer is not a JSON object")
    if c.kind == "brave":
        web = data.get("web")
        items, snippet = (web.get("results") if isinstance(web, dict) else None), "description"
    else:
        items, snippet = data.get("results"), "content"
    if items is None:
        items = []
    if not isinstance(items, list):
        return WorkFailed("the search service's results are not a list")
    hits = [
        SearchHit(_clean(i.get("title")), i["url"], _clean(i.get(snippet)))
        for i in items
        if isinstance(i, dict) and isinstance(i.get("url"), str)
    ]
    return SearchResults(tuple(hits[: c.max_results]))


# --- images ----------------------------------------------------------------------------------------


def _mime(data: bytes) -> str:
    if data.startswith(b"\x89PNG"):
        return "image/png"
    if data.startswith(b"\xff\xd8"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return "application/octet-stream"


async def _image(work: ImageWork, c: ImagesConfig, http: httpx.AsyncClient) -> WorkResult:
    key = c.key.value()
    headers = {"authorization": f"Bearer {key}"} if key else {}
    body = {"model": c.model, "prompt": work.prompt, "n": 1, "size": c.size}
    resp = await http.post(
        f"{c.base_url}/images/generations", json=body, headers=headers, timeout=c.timeout_s
    )
    data = _json(resp)
    if resp.status_code != 200:
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return WorkFailed(f"the image service answered HTTP {resp.status_code}: {error['message']}")
        return _failed_status("image service", resp)
    items = data.get("data") if isinstance(data, dict) else None
    first = items[0] if isinstance(items, list) and items and isinstance(items[0], dict) else None
    if first is None:
        return WorkFailed("the image service's answer holds no image")
    revised = first.get("revised_prompt") if isinstance(first.get("revised_prompt"), str) else ""
    if isinstance(first.get("b64_json"), str):
        try:
            raw = base64.b64decode(first["b64_json"], validate=True)
        except ValueError:
            return WorkFailed("the image service's b64_json is not base64")
    elif isinstance(first.get("url"), str):
        got = await http.get(first["url"], timeout=c.timeout_s)
        if got.status_code != 200:
            return _failed_status("image download", got)
        raw = got.content
    else:
        return WorkFailed("the image service's answer holds neither b64_json nor url")
    return ImageMade(base64.b64encode(raw).decode("ascii"), _mime(raw), revised)
