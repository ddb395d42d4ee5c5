"""The answers Cursor needs when its backend is unreachable, and the probe that decides it.

Cursor's IDE calls a handful of small backend RPCs around every agent turn (PROTOCOL.md §1.1):
connectivity, server config, account and dashboard data, conversation metadata, docs, knowledge
base, commit messages, feature flags. When upstream answers, byok relays them like any other
route. When it does not, those calls would fail and Cursor would treat itself as offline,
aborting the byok run too (``NetworkService/IsConnected`` is probed about 10 s into a slow
request). ``OfflineAnswers`` then serves minimal valid answers: the empty (all-default)
message of each RPC's response type. For types byok's proto subset leaves out
(``GetServerConfigResponse``, ``GetEffectiveUserPluginsResponse``, BootstrapStatsig's) or the
reference schema lacks (AuthService's) that is the empty encoding, valid for any message.
Nothing about the user's account or plan is invented.

``UpstreamHealth`` is the cheap check that picks between the two: a HEAD to upstream with a
short timeout through the same httpx client (so proxies and TLS are as for real traffic), any
HTTP answer meaning reachable, cached for a few seconds.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence

import betterproto2
import httpx
import trio

from byok.config import Config, ModelConfig
from byok.console.catalog import Catalog
from byok.http.asgi import BodyTooLarge, ClientGone, Receive, Scope, Send, header, read_body
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver

log = logging.getLogger("byok.offline")

_Answer = Callable[[Sequence[ModelConfig]], betterproto2.Message | None]


def _empty(msg: type[betterproto2.Message]) -> _Answer:
    return lambda _models: msg()


def _untyped(_models: Sequence[ModelConfig]) -> None:
    return None  # a response type outside byok's subset: its empty encoding


def _nudge(models: Sequence[ModelConfig]) -> betterproto2.Message:
    # No "switch your default model" nudge, and none for byok's models.
    return aiserver.GetDefaultModelNudgeDataResponse(models_with_no_default_switch=[m.id for m in models])


_AI = "/aiserver.v1.AiService/"
_DASH = "/aiserver.v1.DashboardService/"

# POST path -> answer (Connect unary).
UNARY: dict[str, _Answer] = {
    "/aiserver.v1.NetworkService/IsConnected": _empty(aiserver.IsConnectedResponse),
    _AI + "GetServerConfig": _untyped,
    "/aiserver.v1.ServerConfigService/GetServerConfig": _untyped,
    _AI + "GetDefaultModelNudgeData": _nudge,
    "/aiserver.v1.AuthService/GetEmail": _untyped,
    "/aiserver.v1.AuthService/GetUserMeta": _untyped,
    _DASH + "GetMe": _empty(aiserver.GetMeResponse),
    _DASH + "GetTeams": _empty(aiserver.GetTeamsResponse),
    _DASH + "GetUserProfile": _empty(aiserver.GetUserProfileResponse),
    _DASH + "GetCurrentPeriodUsage": _empty(aiserver.GetCurrentPeriodUsageResponse),
    _DASH + "GetUsageLimitStatusAndActiveGrants": _empty(aiserver.GetUsageLimitStatusAndActiveGrantsResponse),
    _DASH + "GetEffectiveUserPlugins": _untyped,
    _DASH + "GetUserPrivacyMode": _empty(aiserver.GetUserPrivacyModeResponse),
    "/agent.v1.AgentService/UpdateConversationMetadata": _empty(agent.UpdateConversationMetadataResponse),
    _AI + "AvailableDocs": _empty(aiserver.AvailableDocsResponse),
    _AI + "KnowledgeBaseAdd": _empty(aiserver.KnowledgeBaseAddResponse),
    _AI + "KnowledgeBaseList": _empty(aiserver.KnowledgeBaseListResponse),
    _AI + "KnowledgeBaseUpdate": _empty(aiserver.KnowledgeBaseUpdateResponse),
    _AI + "KnowledgeBaseRemove": _empty(aiserver.KnowledgeBaseRemoveResponse),
    _AI + "WriteGitCommitMessage": _empty(aiserver.WriteGitCommitMessageResponse),
    "/aiserver.v1.AnalyticsService/BootstrapStatsig": _untyped,
}
# GET path -> JSON body.
GET_JSON: dict[str, dict[str, object]] = {
    "/auth/stripe_profile": {},
    "/auth/full_stripe_profile": {},
}

MAX_REQUEST_BYTES = 4 * 1024 * 1024


class OfflineAnswers:
    """Serves the offline set when the caller says upstream is down; False otherwise."""

    def __init__(self, config: Config, catalog: Catalog | None = None) -> None:
        self._config = config
        self._catalog = catalog or Catalog(config)

    def reconfigure(self, config: Config) -> None:
        self._config = config

    @staticmethod
    def matches(scope: Scope) -> bool:
        if scope.get("type") != "http":
            return False
        method, path = scope.get("method"), scope.get("path")
        return (method == "POST" and path in UNARY) or (method == "GET" and path in GET_JSON)

    async def handle(self, scope: Scope, receive: Receive, send: Send, *, upstream_ok: bool) -> bool:
        if upstream_ok or not self.matches(scope):
            return False
        try:
            await read_body(receive, MAX_REQUEST_BYTES)  # drained, not needed
        except ClientGone:
            return True
        except BodyTooLarge:
            pass  # the answer does not depend on it
        path = scope["path"]
        log.info("upstream unreachable: answering %s %s locally", scope["method"], path)
        if scope["method"] == "GET":
            await _respond(send, json.dumps(GET_JSON[path]).encode(), b"application/json")
            return True
        message = UNARY[path](self._catalog.enabled_models())
        if (header(scope, "content-type") or "").split(";")[0].strip().lower() == "application/json":
            body = json.dumps(message.to_dict() if message is not None else {}).encode()
            await _respond(send, body, b"application/json")
        else:
            await _respond(send, bytes(message) if message is not None else b"", b"application/proto")
        return True


async def _respond(send: Send, body: bytes, content_type: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                (b"connect-protocol-version", b"1"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


class UpstreamHealth:
    """Is upstream reachable? One HEAD per ``ttl_s`` at most, shared by concurrent callers."""

    def __init__(
        self,
        upstream: str,
        client: httpx.AsyncClient,
        *,
        ttl_s: float = 5.0,
        timeout_s: float = 2.0,
    ) -> None:
        self._url = upstream.rstrip("/") + "/"
        self._client = client
        self._ttl_s = ttl_s
        self._timeout_s = timeout_s
        self._lock = trio.Lock()
        self._known: bool | None = None
        self._at = -float("inf")
        self.probes = 0  # for tests and logs

    def note(self, reachable: bool) -> None:
        """Record what real traffic just showed (refreshes the cache without a probe)."""
        self._known, self._at = reachable, trio.current_time()

    async def reachable(self) -> bool:
        async with self._lock:
            if self._known is not None and trio.current_time() - self._at < self._ttl_s:
                return self._known
            ok = await self._probe()
            if ok != self._known:
                log.log(
                    logging.INFO if ok else logging.WARNING,
                    "upstream %s is %s",
                    self._url,
                    "reachable" if ok else "unreachable",
                )
            self.note(ok)
            return ok

    async def _probe(self) -> bool:
        self.probes += 1
        with trio.move_on_after(self._timeout_s + 0.5):
            try:
                response = await self._client.request(
                    "HEAD", self._url, timeout=httpx.Timeout(self._timeout_s)
                )
            except httpx.TransportError:
                return False
            await response.aclose()
            return True  # any HTTP status: something answered
        return False
