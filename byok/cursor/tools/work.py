"""Server work: what a tool asks byok itself to do with I/O (``StartWork``), and what comes back.

The values are plain and JSON-encodable: the run performs the work (run/tool_work.py), records
the result in its input log and hands it to the tool; a replay feeds the recorded result to the
same tool, so it reproduces the run without the network.
"""

from __future__ import annotations

from typing import Any

import attrs

from byok.cursor.tools.await_shell import TerminalWait, TerminalWaited

# Backend name -> what it does, as the user reads it.
BACKENDS = {"search": "web search", "images": "image generation"}


def backend_missing(tool: str, backend: str) -> str:
    """The result of a call to a tool whose backend byok does not have (never a made-up result)."""
    return (
        f"Error: {tool} is not available: byok has no {BACKENDS.get(backend, backend)} backend configured"
        f" ([{backend}] in byok's config file); it was not run."
    )


@attrs.frozen
class SearchWork:
    query: str


@attrs.frozen
class ImageWork:
    prompt: str


Work = SearchWork | ImageWork | TerminalWait  # AwaitShell's: cursor/tools/await_shell.py


@attrs.frozen
class SearchHit:
    title: str
    url: str
    snippet: str


@attrs.frozen
class SearchResults:
    hits: tuple[SearchHit, ...]


@attrs.frozen
class ImageMade:
    image_b64: str  # the image file's bytes, base64 (Cursor's GenerateImageSuccess.image_data)
    mime: str = "image/png"
    revised_prompt: str = ""  # the prompt the endpoint says it used, when it rewrote ours


@attrs.frozen
class WorkFailed:
    message: str  # for the model: what failed, in one line


WorkResult = SearchResults | ImageMade | WorkFailed | TerminalWaited


def encode_result(result: WorkResult) -> dict[str, Any]:
    match result:
        case SearchResults(hits=hits):
            return {"search": [[h.title, h.url, h.snippet] for h in hits]}
        case ImageMade():
            return {"image": result.image_b64, "mime": result.mime, "revised": result.revised_prompt}
        case WorkFailed(message=message):
            return {"failed": message}
        case TerminalWaited():
            return {"terminal": attrs.asdict(result)}
    raise TypeError(f"not a work result: {result!r}")


def decode_result(obj: dict[str, Any]) -> WorkResult:
    if "search" in obj:
        return SearchResults(tuple(SearchHit(str(t), str(u), str(s)) for t, u, s in obj["search"]))
    if "image" in obj:
        return ImageMade(str(obj["image"]), str(obj.get("mime", "image/png")), str(obj.get("revised", "")))
    if "failed" in obj:
        return WorkFailed(str(obj["failed"]))
    if "terminal" in obj:
        return TerminalWaited(**obj["terminal"])
    raise ValueError(f"not a work result: {obj!r}")
