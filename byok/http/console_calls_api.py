"""Control API routes for what happened: provider calls (list, filter, one, its bodies with
detailed logging), conversations, usage per day x model x provider. The live stream of calls is
ControlApi's own (it streams)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from byok.http import console_http as ch
from byok.http.console_routes import ApiRequest, int_param, route
from byok.store import SQLiteStore
from byok.store import console_queries as q

if TYPE_CHECKING:
    from byok.http.console_api import ControlApi

MAX_BODY_SHOWN: Final = 8 * 2**20
CALL_STATUSES: Final = ("ok", "error", "canceled")


# --- calls, conversations, usage --------------------------------------------------------------


@route("GET", "/calls")
async def list_calls(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    status = req.query.get("status") or None
    if status is not None and status not in CALL_STATUSES:
        raise ch.ApiError(400, "status", f"expected one of: {', '.join(CALL_STATUSES)}")
    f = q.CallFilter(
        since_ms=int_param(req, "since_ms"),
        until_ms=int_param(req, "until_ms"),
        model=req.query.get("model") or None,
        provider=req.query.get("provider") or None,
        status=status,
        conversation=req.query.get("conversation") or None,
        before_id=int_param(req, "before_id", minimum=1),
        limit=int_param(req, "limit", 100, minimum=1) or 100,
    )
    calls = await api.store.call(SQLiteStore.transact, q.list_calls, f)
    return 200, {"calls": calls}


def _call_id(req: ApiRequest) -> int:
    raw = req.params["id"]
    if not raw.isdigit() or len(raw) > 18:
        raise ch.ApiError(400, "id", f"a call id is a positive integer, got {raw[:50]!r}")
    return int(raw)


@route("GET", "/calls/{id}")
async def get_call(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    found = await api.store.call(SQLiteStore.transact, q.call_detail, _call_id(req))
    if found is None:
        raise ch.ApiError(404, "id", f"no call {req.params['id']}")
    found["bodies_logged"] = api.config.logging.detailed
    return 200, found


async def _body(api: ControlApi, req: ApiRequest, part: str) -> tuple[int, Any]:
    call_id = _call_id(req)
    if not api.config.logging.detailed:
        raise ch.ApiError(409, "", "bodies are shown with detailed logging on ([logging] detailed = true)")
    body = await api.store.call(SQLiteStore.transact, q.call_body, call_id, part)
    if body is None:
        raise ch.ApiError(404, "id", f"call {call_id} has no stored {part} body")
    # Request bodies are stored redacted (run/redaction.py), captures cleaned of the provider's
    # secrets (providers/secrets.py).
    return 200, bytes(body[:MAX_BODY_SHOWN])


@route("GET", "/calls/{id}/request")
async def call_request(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    return await _body(api, req, "request")


@route("GET", "/calls/{id}/response")
async def call_response(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    return await _body(api, req, "response")


@route("GET", "/conversations")
async def list_conversations(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    limit = int_param(req, "limit", 50, minimum=1) or 50
    found = await api.store.call(SQLiteStore.transact, q.conversations, limit, int_param(req, "before_ms"))
    return 200, {"conversations": found}


@route("GET", "/conversations/{id}")
async def get_conversation(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    cid = req.params["id"]
    if len(cid) > 200:
        raise ch.ApiError(400, "id", "a conversation id is at most 200 characters")
    found = await api.store.call(SQLiteStore.transact, q.conversation, cid)
    if found is None:
        raise ch.ApiError(404, "id", f"no conversation {cid[:100]!r}")
    return 200, found


@route("GET", "/usage")
async def get_usage(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    raw = req.query.get("tz_offset_min", "0")
    try:
        offset = int(raw)
    except ValueError:
        raise ch.ApiError(400, "tz_offset_min", f"expected an integer, got {raw[:50]!r}") from None
    if not -14 * 60 <= offset <= 14 * 60:
        raise ch.ApiError(400, "tz_offset_min", "must be between -840 and 840")
    rows = await api.store.call(
        SQLiteStore.transact, q.usage, int_param(req, "since_ms"), int_param(req, "until_ms"), offset
    )
    return 200, {"usage": rows, "tz_offset_min": offset}
