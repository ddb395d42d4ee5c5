"""request_guard.refusal: what a browser page could send is refused, what Cursor sends is not."""

from __future__ import annotations

from typing import Any

import pytest

from byok.http import app, request_guard
from byok.http.request_guard import AGENT_ROUTES, refusal, without_cors

RUN_SSE = "/agent.v1.AgentService/RunSSE"
BIDI_APPEND = "/aiserver.v1.BidiService/BidiAppend"
OTHER = "/aiserver.v1.AiService/GetServerConfig"


def scope(
    path: str = OTHER, method: str = "POST", *headers: tuple[str, str], http_version: str = "1.1"
) -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "http_version": http_version,
        "headers": [(k.encode(), v.encode()) for k, v in headers],
    }


def status(s: dict[str, Any]) -> int | None:
    refused = refusal(s)
    return None if refused is None else refused.status


def test_the_agent_routes_are_the_apps() -> None:
    assert {app.RUN_SSE, app.RUN_POLL, app.RUN_BIDI, app.BIDI_APPEND} == AGENT_ROUTES


@pytest.mark.parametrize(
    "s",
    [
        # Cursor's agent RPCs.
        scope(RUN_SSE, "POST", ("content-type", "application/connect+proto"), ("content-length", "12")),
        scope(BIDI_APPEND, "POST", ("content-type", "application/proto"), ("content-length", "3")),
        scope(BIDI_APPEND, "POST", ("Content-Type", "Application/Proto; charset=x")),
        scope(app.RUN_BIDI, "POST", ("content-type", "application/connect+proto"), http_version="2"),
        # Its other calls, proto or JSON, unary or streamed, and GETs with no body.
        scope(OTHER, "POST", ("content-type", "application/json"), ("content-length", "2")),
        scope(OTHER, "POST", ("content-type", "application/connect+json"), ("transfer-encoding", "chunked")),
        scope(OTHER, "POST", ("content-type", "application/proto"), http_version="2"),
        scope("/auth/full_stripe_profile", "GET"),
        scope("/auth/full_stripe_profile", "GET", http_version="2"),
        scope(OTHER, "HEAD"),
        scope(OTHER, "POST", ("content-length", "0")),
        scope(OTHER, "POST"),  # HTTP/1.1 with neither length nor transfer-encoding: no body
        scope("/byok/healthz", "GET"),
        # Cursor's own windows are not web pages.
        scope(OTHER, "POST", ("origin", "vscode-file://vscode-app"), ("content-type", "application/proto")),
    ],
)
def test_what_cursor_sends_is_served(s: dict[str, Any]) -> None:
    assert refusal(s) is None


@pytest.mark.parametrize(
    ("s", "expected"),
    [
        # Browser "simple requests": no preflight, so the content type is the guard.
        (scope(RUN_SSE, "POST", ("content-type", "text/plain;charset=UTF-8")), 415),
        (scope(BIDI_APPEND, "POST", ("content-type", "application/x-www-form-urlencoded")), 415),
        (scope(BIDI_APPEND, "POST", ("content-type", "multipart/form-data; boundary=x")), 415),
        (scope(OTHER, "POST", ("content-type", "text/plain"), ("content-length", "4")), 415),
        # A Blob or ArrayBuffer body goes without a content type.
        (scope(BIDI_APPEND, "POST", ("content-length", "4")), 415),
        (scope(RUN_SSE, "POST"), 415),
        (scope(OTHER, "POST", ("content-length", "4")), 415),
        (scope(OTHER, "PUT", ("transfer-encoding", "chunked")), 415),
        (scope(OTHER, "POST", http_version="2"), 415),  # over HTTP/2 a body needs no length
        # Connect's JSON forms are not what the agent routes take.
        (scope(BIDI_APPEND, "POST", ("content-type", "application/json")), 415),
        # Two content types: each must pass.
        (scope(OTHER, "POST", ("content-type", "application/proto"), ("content-type", "text/plain")), 415),
        # A web origin, whatever the request: a page's fetch, a sandboxed frame or file: page ("null").
        (
            scope(
                RUN_SSE,
                "POST",
                ("origin", "https://evil.example"),
                ("content-type", "application/connect+proto"),
            ),
            403,
        ),
        (scope(OTHER, "GET", ("Origin", "http://127.0.0.1:8790")), 403),
        (scope(OTHER, "POST", ("origin", "null"), ("content-type", "application/proto")), 403),
        (scope(OTHER, "POST", ("origin", " HTTPS://EVIL.EXAMPLE ")), 403),
        # A CORS preflight.
        (scope(OTHER, "OPTIONS", ("origin", "https://evil.example")), 403),
        (scope(OTHER, "OPTIONS"), 405),
    ],
)
def test_what_a_web_page_could_send_is_refused(s: dict[str, Any], expected: int) -> None:
    refused = refusal(s)
    assert refused is not None and refused.status == expected
    assert "\n" not in refused.reason


async def test_no_access_control_header_leaves() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    wrapped = without_cors(send)
    start = {
        "type": "http.response.start",
        "status": 200,
        "headers": [
            (b"Access-Control-Allow-Origin", b"*"),
            (b"content-type", b"application/proto"),
            (b"access-control-allow-credentials", b"true"),
        ],
    }
    await wrapped(start)
    await wrapped({"type": "http.response.body", "body": b"x"})
    assert sent[0]["headers"] == [(b"content-type", b"application/proto")]
    assert sent[1] == {"type": "http.response.body", "body": b"x"}
    plain = {"type": "http.response.start", "status": 200, "headers": [(b"x", b"y")]}
    await wrapped(plain)
    assert sent[2] is plain  # nothing to drop: passed as it is


def test_refusals_are_connect_errors() -> None:
    refused = refusal(scope(RUN_SSE, "POST", ("content-type", "text/plain")))
    assert refused == request_guard.Refusal(415, "invalid_argument", "content type 'text/plain' is refused")
