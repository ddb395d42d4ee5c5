"""WebSearch and GenerateImage: the user approves, then byok does the work with the backend the
config names (``[search]``, ``[images]``) and the result comes back to the call.

Cursor's client only approves these (seeds 000 §26.13, §33.4): the search or the image comes from
a server. byok offers them to the model only when the backend is configured (clarification 14);
a call for one anyway, or one whose backend is gone, is a tool error saying so, never a made-up
result.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from typing import Any

from byok.cursor.tools.base import (
    Action,
    Invocation,
    StartWork,
    ToolDef,
    ToolOutcome,
    optional_text,
    require_str,
)
from byok.cursor.tools.exec_results import no_variant, variant
from byok.cursor.tools.interaction import Interaction, declined
from byok.cursor.tools.work import (
    ImageMade,
    ImageWork,
    SearchResults,
    SearchWork,
    WorkFailed,
    WorkResult,
    backend_missing,
)
from byok.pb.agent import v1 as agent


class _Served(Interaction):
    """Approval, then server work. Subclasses say what the work is and what its result means."""

    backend = ""
    tool = ""

    def __init__(self, inv: Invocation, query: agent.InteractionQuery, expected: str) -> None:
        self._env_backends = getattr(inv.env, "backends", frozenset())
        super().__init__(query, expected, self._approval, self._error)
        self._working = False

    def start(self) -> list[Action]:
        if self.backend not in self._env_backends:
            return self.fail(backend_missing(self.tool, self.backend))
        return super().start()

    def _approval(self, response: Any) -> list[Action]:
        name, value = variant(response)
        if name == "approved":
            self._working = True
            return [StartWork(self.work(value))]
        if name == "rejected":
            return self.finish(self.rejected(value.reason))
        return self.fail(no_variant(self._expected))

    def on_work(self, result: Any) -> list[Action]:
        if self.done or not self._working:
            return self._unexpected("work result")
        if isinstance(result, WorkFailed):
            return self.fail(result.message)
        outcome = self.worked(result)
        if outcome is None:
            return self.fail(f"protocol error: unexpected work result {type(result).__name__}")
        return self.finish(outcome)

    # --- what the subclass says ---------------------------------------------------------------
    def _error(self, message: str) -> ToolOutcome:
        raise NotImplementedError

    def work(self, approved: Any) -> Any:
        raise NotImplementedError

    def rejected(self, reason: str) -> ToolOutcome:
        raise NotImplementedError

    def worked(self, result: WorkResult) -> ToolOutcome | None:
        raise NotImplementedError


# --- WebSearch -----------------------------------------------------------------------------------


def _parse_search(args: Mapping[str, Any]) -> Mapping[str, Any]:
    return {
        "search_term": require_str(args, "search_term").strip(),
        "explanation": optional_text(args, "explanation"),
    }


def _search_args(args: Mapping[str, Any], call_id: str = "") -> agent.WebSearchArgs:
    return agent.WebSearchArgs(search_term=args["search_term"], tool_call_id=call_id)


def search_text(term: str, results: SearchResults) -> str:
    if not results.hits:
        return f'No web results for "{term}".'
    lines = [f'Web results for "{term}":']
    for i, hit in enumerate(results.hits, 1):
        lines += ["", f"{i}. {hit.title or hit.url}", f"   {hit.url}"]
        if hit.snippet:
            lines.append(f"   {' '.join(hit.snippet.split())}")
    return "\n".join(lines)


class _Search(_Served):
    backend, tool = "search", "WebSearch"

    def __init__(self, inv: Invocation) -> None:
        self._term: str = inv.args["search_term"]
        self._args = _search_args(inv.args, inv.call_id)
        query = agent.InteractionQuery(web_search_request_query=agent.WebSearchRequestQuery(self._args))
        super().__init__(inv, query, "web_search_request_response")

    def _card(self, result: agent.WebSearchResult) -> agent.ToolCall:
        return agent.ToolCall(web_search_tool_call=agent.WebSearchToolCall(self._args, result))

    def _error(self, message: str) -> ToolOutcome:
        result = agent.WebSearchResult(error=agent.WebSearchError(message))
        text = message if message.startswith("Error:") else f"Web search failed: {message}"
        return ToolOutcome(text, True, self._card(result))

    def work(self, approved: Any) -> SearchWork:
        return SearchWork(self._term)

    def rejected(self, reason: str) -> ToolOutcome:
        result = agent.WebSearchResult(rejected=agent.WebSearchRejected(reason))
        return ToolOutcome(declined(f'the web search for "{self._term}"', reason), True, self._card(result))

    def worked(self, result: WorkResult) -> ToolOutcome | None:
        if not isinstance(result, SearchResults):
            return None
        refs = [agent.WebSearchReference(title=h.title, url=h.url, chunk=h.snippet) for h in result.hits]
        card = self._card(agent.WebSearchResult(success=agent.WebSearchSuccess(references=refs)))
        return ToolOutcome(search_text(self._term, result), False, card)


# --- GenerateImage ---------------------------------------------------------------------------------


def _parse_image(args: Mapping[str, Any]) -> Mapping[str, Any]:
    return {
        "description": require_str(args, "description").strip(),
        "file_path": optional_text(args, "file_path"),
    }


def _image_args(args: Mapping[str, Any], prompt: str | None = None) -> agent.GenerateImageArgs:
    return agent.GenerateImageArgs(description=prompt or args["description"], file_path=args["file_path"])


class _Image(_Served):
    backend, tool = "images", "GenerateImage"

    def __init__(self, inv: Invocation) -> None:
        self._inv = inv
        self._prompt: str = inv.args["description"]
        query = agent.InteractionQuery(
            generate_image_request_query=agent.GenerateImageRequestQuery(_image_args(inv.args), inv.call_id)
        )
        super().__init__(inv, query, "generate_image_request_response")

    def _card(self, result: agent.GenerateImageResult) -> agent.ToolCall:
        record = agent.GenerateImageToolCall(_image_args(self._inv.args, self._prompt), result)
        return agent.ToolCall(generate_image_tool_call=record)

    def _error(self, message: str) -> ToolOutcome:
        result = agent.GenerateImageResult(error=agent.GenerateImageError(message))
        text = message if message.startswith("Error:") else f"Image generation failed: {message}"
        return ToolOutcome(text, True, self._card(result))

    def work(self, approved: Any) -> ImageWork:
        # The user may have edited the description in the approval.
        self._prompt = (getattr(approved, "description", "") or "").strip() or self._prompt
        return ImageWork(self._prompt)

    def rejected(self, reason: str) -> ToolOutcome:
        result = agent.GenerateImageResult(error=agent.GenerateImageError(declined("the image", reason)))
        return ToolOutcome(declined("generating the image", reason), True, self._card(result))

    def worked(self, result: WorkResult) -> ToolOutcome | None:
        if not isinstance(result, ImageMade):
            return None
        size = len(base64.b64decode(result.image_b64, validate=False))
        path = self._inv.args["file_path"] or ""
        success = agent.GenerateImageSuccess(file_path=path, image_data=result.image_b64)
        text = f"Generated the image ({size // 1024} KiB, {result.mime}) and showed it to the user."
        if path:
            text += f" Cursor was asked to save it as {path}."
        if result.revised_prompt and result.revised_prompt != self._prompt:
            text += f"\nThe image service rewrote the prompt as: {result.revised_prompt}"
        return ToolOutcome(text, False, self._card(agent.GenerateImageResult(success=success)))


def _served(
    name: str, field: str, placeholder: Callable[[], Any], parse: Any, ui: Any, execute: Any, backend: str
) -> ToolDef:
    return ToolDef(
        name=name,
        ui_field=field,
        placeholder=placeholder,
        parse=parse,
        ui=ui,
        execute=execute,
        transport="interaction",
        backend=backend,
    )


WEB_SEARCH = _served(
    "WebSearch",
    "web_search_tool_call",
    agent.WebSearchToolCall,
    _parse_search,
    lambda args: agent.WebSearchToolCall(args=_search_args(args)),
    _Search,
    "search",
)
GENERATE_IMAGE = _served(
    "GenerateImage",
    "generate_image_tool_call",
    agent.GenerateImageToolCall,
    _parse_image,
    lambda args: agent.GenerateImageToolCall(args=_image_args(args)),
    _Image,
    "images",
)

TOOLS: tuple[ToolDef, ...] = (WEB_SEARCH, GENERATE_IMAGE)
