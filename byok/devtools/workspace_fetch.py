"""``fetch_args`` as Cursor's client answers it: GET the URL and hand back the page as text.

The tests point it at a loopback server. A page that cannot be fetched is a typed ``error``;
one that answers with an error status is a ``success`` carrying that status (byok decides).
"""

from __future__ import annotations

import httpx

from byok.pb.agent import v1 as agent

FETCH_TIMEOUT_S = 10.0


async def fetch(args: agent.FetchArgs) -> agent.FetchResult:
    try:
        async with httpx.AsyncClient(timeout=FETCH_TIMEOUT_S, follow_redirects=True) as client:
            resp = await client.get(args.url)
    except httpx.HTTPError as e:
        return agent.FetchResult(error=agent.FetchError(url=args.url, error=f"{type(e).__name__}: {e}"))
    success = agent.FetchSuccess(
        url=str(resp.url),
        content=resp.text,
        status_code=resp.status_code,
        content_type=resp.headers.get("content-type", ""),
    )
    return agent.FetchResult(success=success)
