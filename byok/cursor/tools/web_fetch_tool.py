"""WebFetch: the user approves (``web_fetch_request_query``), then Cursor fetches the page
(``fetch_args`` with the url and the call's id) and its ``fetch_result`` becomes the call's
WebFetchResult and the model's text (seeds 000 §26.13). The call stays one tool call across both
phases; a rejection is its typed terminal result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from byok.cursor.tools.base import (
    Action,
    Invocation,
    SendExec,
    ToolArgError,
    ToolDef,
    ToolOutcome,
    require_str,
)
from byok.cursor.tools.exec_results import no_variant, variant, with_detail
from byok.cursor.tools.interaction import Interaction, declined
from byok.pb.agent import v1 as agent

# The page as the model reads it: beyond this it gets the head and a note of what was left out.
MODEL_TEXT_LIMIT = 100_000


def _parse(args: Mapping[str, Any]) -> Mapping[str, Any]:
    url = require_str(args, "url").strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ToolArgError(f"argument 'url' must be a full http(s) URL, got {url!r}")
    return {"url": url}


def _ui(args: Mapping[str, Any]) -> agent.WebFetchToolCall:
    return agent.WebFetchToolCall(args=agent.WebFetchArgs(url=args["url"]))


def page_text(url: str, success: agent.FetchSuccess) -> str:
    content = success.content
    cut = len(content) - MODEL_TEXT_LIMIT
    if cut > 0:
        content = f"{content[:MODEL_TEXT_LIMIT]}\n... (page truncated: {cut} more characters)"
    kind = f", {success.content_type}" if success.content_type else ""
    status = f"HTTP {success.status_code}" if success.status_code else "fetched"
    return f"Fetched {success.url or url} ({status}{kind}):\n\n{content}"


class _Fetch(Interaction):
    def __init__(self, inv: Invocation) -> None:
        self._url: str = inv.args["url"]
        self._call_id = inv.call_id
        query = agent.InteractionQuery(
            web_fetch_request_query=agent.WebFetchRequestQuery(
                args=agent.WebFetchArgs(url=self._url, tool_call_id=inv.call_id)
            )
        )
        super().__init__(query, "web_fetch_request_response", self._approval, self._error)
        self._fetching = False

    def _card(self, result: agent.WebFetchResult) -> agent.ToolCall:
        args = agent.WebFetchArgs(url=self._url, tool_call_id=self._call_id)
        return agent.ToolCall(web_fetch_tool_call=agent.WebFetchToolCall(args, result))

    def _error(self, message: str) -> ToolOutcome:
        result = agent.WebFetchResult(error=agent.WebFetchError(url=self._url, error=message))
        return ToolOutcome(f"Cannot fetch {self._url}: {message}", True, self._card(result))

    def _approval(self, response: agent.WebFetchRequestResponse) -> list[Action]:
        name, value = variant(response)
        if name == "approved":
            self._fetching = True
            fetch = agent.FetchArgs(url=self._url, tool_call_id=self._call_id)
            return [SendExec(agent.ExecServerMessage(fetch_args=fetch))]
        if name == "rejected":
            result = agent.WebFetchResult(rejected=agent.WebFetchRejected(reason=value.reason))
            return self.finish(
                ToolOutcome(declined(f"fetching {self._url}", value.reason), True, self._card(result))
            )
        return self.fail(no_variant("web_fetch_request_response"))

    def on_result(self, msg: agent.ExecClientMessage) -> list[Action]:
        if self.done or not self._fetching:
            return self._unexpected("exec result")
        field, fetched = variant(msg, "message")
        if field != "fetch_result":
            return self.fail(f"protocol error: expected fetch_result, got {field or 'an empty message'}")
        name, value = variant(fetched)
        if name == "success":
            if value.status_code >= 400:
                return self.fail(f"the server answered HTTP {value.status_code}")
            result = agent.WebFetchResult(
                success=agent.WebFetchSuccess(url=value.url or self._url, markdown=value.content)
            )
            return self.finish(ToolOutcome(page_text(self._url, value), False, self._card(result)))
        if name == "error":
            return self.fail(with_detail("the fetch failed", value.error).removesuffix("."))
        return self.fail(no_variant("fetch_result"))


WEB_FETCH = ToolDef(
    name="WebFetch",
    ui_field="web_fetch_tool_call",
    placeholder=agent.WebFetchToolCall,
    parse=_parse,
    ui=_ui,
    execute=_Fetch,
    transport="interaction",
)

TOOLS: tuple[ToolDef, ...] = (WEB_FETCH,)
