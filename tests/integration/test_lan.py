"""LAN mode: a listener others can reach needs TLS and a credential on every request, or byok
refuses to start in one line. Served on 127.0.0.2 (a loopback address other than 127.0.0.1: the
TLS and credential apply to every listener once configured) with real TLS clients."""

from __future__ import annotations

import base64
import datetime as dt
import json
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import attrs
import httpx
import pytest
import trio
from cryptography import x509

from byok.config_load import load_config
from byok.daemon import StartupError, run_daemon
from byok.devtools.cursor_sim import CursorSim, user_turn
from byok.http.ca import LEAF_RENEW, LocalCA
from byok.http.connect_envelope import FrameDecoder, encode_frame
from byok.http.h2_call import H2Error, h2_call
from byok.http.lan import Credential
from byok.pb.agent import v1 as agent
from tests.integration.conftest import assert_runs_replay, write_config
from tests.integration.test_cli import byok
from tests.support.fake_provider import FakeProvider, chat_text_script

TOKEN = "t0k3n-" + "a1b2c3d4" * 5  # 46 characters
ENV = "BYOK_TEST_LAN_TOKEN"
HOST = "127.0.0.2"


def lan_config(tmp_path: Path, *, host: str = HOST, server: str = "", proxy: str = "", url: str = "") -> Path:
    cfg = tmp_path / "byok.toml"
    write_config(
        cfg, provider_url=url or "http://127.0.0.1:9/v1", data_dir=tmp_path / "data", server_extra=server
    )
    cfg.write_text(cfg.read_text().replace('host = "127.0.0.1"', f'host = "{host}"', 1) + proxy)
    return cfg


TLS = f'tls_names = ["{HOST}", "byok.lan"]'
AUTH = f'auth_token_env = "{ENV}"'


@pytest.mark.parametrize(
    ("server", "proxy", "says"),
    [
        ("", "", ["needs TLS ([server] tls_cert and tls_key, or tls_names) and a credential"]),
        (TLS, "", ["needs a credential ([server] auth_token_env)"]),
        (AUTH, "", ["needs TLS ("]),
        ("", '\n[proxy]\nenabled = true\nhost = "::"\nport = 0\n', ["'::' (proxy)", "and a credential"]),
    ],
)
async def test_a_reachable_address_without_tls_or_credential_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: str, proxy: str, says: list[str]
) -> None:
    monkeypatch.setenv(ENV, TOKEN)
    host = "0.0.0.0" if not proxy else "127.0.0.1"
    cfg = lan_config(tmp_path, host=host, server=server, proxy=proxy)
    with pytest.raises(StartupError) as e:
        await run_daemon(load_config(cfg, overrides={}))
    message = str(e.value)
    assert message.startswith("refusing to listen on ") and "\n" not in message
    for part in says:
        assert part in message
    assert not (tmp_path / "data").exists()  # refused before anything was made


@pytest.mark.parametrize(
    ("token", "says"),
    [
        (None, f"environment variable {ENV} is not set"),
        ("short", f"the credential in {ENV} is 5 characters; use 32 or more"),
        ("a" * 40 + "/x", "may hold only letters, digits and . _ ~ -"),
    ],
)
async def test_a_bad_credential_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token: str | None, says: str
) -> None:
    if token is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, token)
    cfg = lan_config(tmp_path, host="0.0.0.0", server=f"{TLS}\n{AUTH}")
    with pytest.raises(StartupError, match=says.replace(".", r"\.")):
        await run_daemon(load_config(cfg, overrides={}))
    assert not (tmp_path / "data").exists()


def test_serve_says_what_lan_mode_lacks_in_one_line(tmp_path: Path) -> None:
    cfg = lan_config(tmp_path, host="127.0.0.1", server=TLS)
    result = byok("serve", "--config", str(cfg), "--host", "0.0.0.0", "--port", "0")
    assert result.returncode == 2, result.stderr  # a config error: the systemd unit does not restart it
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("byok: refusing to listen on '0.0.0.0': ") and "a credential" in last
    assert "Traceback" not in result.stderr


# --- serving ---------------------------------------------------------------------------------


@attrs.define
class Lan:
    base_url: str  # https://127.0.0.2:port, without the token
    provider: FakeProvider
    trust: ssl.SSLContext  # trusts byok's CA
    proxy_port: int


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def lan_daemon(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Lan]:
    monkeypatch.setenv(ENV, TOKEN)
    provider = FakeProvider()
    url = await provider.start(nursery)
    proxy_port = _free_port(HOST)
    proxy = f'\n[proxy]\nenabled = true\nhost = "{HOST}"\nport = {proxy_port}\n'
    cfg = lan_config(tmp_path, server=f"{TLS}\n{AUTH}", proxy=proxy, url=url)
    config = load_config(cfg, overrides={})
    config = attrs.evolve(config, logging=attrs.evolve(config.logging, record_runs=True))
    base_url, stop = await nursery.start(run_daemon, config)
    trust = ssl.create_default_context(cafile=str(tmp_path / "data" / "ca" / "byok-ca.pem"))
    yield Lan(base_url, provider, trust, proxy_port)
    stop()
    assert_runs_replay(tmp_path / "data")


async def test_a_turn_over_tls_with_the_credential(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with lan_daemon(tmp_path, nursery, monkeypatch) as lan:
        assert lan.base_url.startswith(f"https://{HOST}:")
        lan.provider.enqueue(chat_text_script(["over ", "the LAN"]))
        async with httpx.AsyncClient(verify=lan.trust, timeout=30) as client:
            # Backend-URL mode: the token is the first path segment of every call.
            sim = CursorSim(f"{lan.base_url}/{TOKEN}", client)
            tr = await sim.run(
                "req-lan", user_turn("hi", conversation_id="c-lan", model_id="byok-demo", message_id="m1")
            )
            health = await client.get(f"{lan.base_url}/{TOKEN}/byok/healthz")
            refused = [
                await client.get(f"{lan.base_url}/byok/healthz"),
                await client.get(f"{lan.base_url}/{TOKEN[:-1]}/byok/healthz"),
                await client.get(f"{lan.base_url}/{TOKEN}x/byok/healthz"),
                await client.post(f"{lan.base_url}/aiserver.v1.AiService/Anything", content=b""),
            ]
        async with httpx.AsyncClient(timeout=10) as plain:
            with pytest.raises(httpx.HTTPError):  # TLS only: plain HTTP gets no answer
                await plain.get(f"http://{HOST}:{lan.base_url.rsplit(':', 1)[1]}/{TOKEN}/byok/healthz")
    assert tr.end_stream == {} and tr.text() == "over the LAN"
    assert health.status_code == 200 and health.json()["models"] == ["byok-demo"]
    for resp in refused:
        assert resp.status_code == 401
        assert resp.json()["code"] == "unauthenticated"
    assert TOKEN not in json.dumps([r.json() for r in refused])


async def test_http2_over_tls_with_the_credential(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with lan_daemon(tmp_path, nursery, monkeypatch) as lan:
        lan.provider.enqueue(chat_text_script(["h2 ", "over TLS"]))
        run = user_turn("hi", conversation_id="c-lan-h2", model_id="byok-demo", message_id="m1")
        headers = [(b"content-type", b"application/connect+proto"), (b"x-request-id", b"req-lan-h2")]
        url = httpx.URL(f"{lan.base_url}/{TOKEN}/agent.v1.AgentService/Run")
        texts: list[str] = []
        end = None
        async with httpx.AsyncClient(verify=lan.trust, timeout=30) as client:
            acker = CursorSim(f"{lan.base_url}/{TOKEN}", client)
            seq = 1
            with trio.fail_after(20):
                async with h2_call(url, headers, ssl_context=lan.trust) as call:
                    await call.send(encode_frame(bytes(agent.AgentClientMessage(run_request=run))))
                    assert (await call.response())[0] == 200
                    decoder = FrameDecoder()
                    async for chunk in call.body():
                        for frame in decoder.feed(chunk):
                            if frame.end_stream:
                                end = json.loads(frame.payload)
                                continue
                            msg = agent.AgentServerMessage.parse(frame.payload)
                            if (
                                msg.interaction_update is not None
                                and msg.interaction_update.text_delta is not None
                            ):
                                texts.append(msg.interaction_update.text_delta.text)
                            for reply in acker.auto_reply(msg, set()):
                                assert (await acker.append("req-lan-h2", seq, reply)).status_code == 200
                                seq += 1
        with pytest.raises(H2Error, match="TLS handshake"):  # a client that does not trust byok's CA
            async with h2_call(url, headers, ssl_context=ssl.create_default_context()):
                pass
    assert (end, "".join(texts)) == ({}, "h2 over TLS")


async def test_a_turn_through_the_https_proxy_with_credentials(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with lan_daemon(tmp_path, nursery, monkeypatch) as lan:
        lan.provider.enqueue(chat_text_script(["through ", "the proxy"]))
        proxy = f"https://byok:{TOKEN}@{HOST}:{lan.proxy_port}"
        async with httpx.AsyncClient(
            proxy=httpx.Proxy(proxy, ssl_context=lan.trust), verify=lan.trust, timeout=30
        ) as client:
            # Proxy mode: Cursor's own backend URL; the tunnel's CONNECT carried the credential.
            sim = CursorSim("https://api2.cursor.sh", client)
            tr = await sim.run(
                "req-lan-proxy",
                user_turn("hi", conversation_id="c-lan-p", model_id="byok-demo", message_id="m1"),
            )
        for bad in (
            f"https://byok:{TOKEN[:-1]}x@{HOST}:{lan.proxy_port}",
            f"https://{HOST}:{lan.proxy_port}",
        ):
            async with httpx.AsyncClient(
                proxy=httpx.Proxy(bad, ssl_context=lan.trust), verify=lan.trust
            ) as c:
                with pytest.raises(httpx.ProxyError, match="407"):
                    await c.get("https://api2.cursor.sh/byok/healthz")
        async with httpx.AsyncClient(
            proxy=f"http://byok:{TOKEN}@{HOST}:{lan.proxy_port}", verify=lan.trust
        ) as c:
            with pytest.raises(httpx.HTTPError):  # the proxy speaks TLS only
                await c.get("https://api2.cursor.sh/byok/healthz")
    assert tr.end_stream == {} and tr.text() == "through the proxy"


def test_credential_forms() -> None:
    c = Credential(TOKEN)
    scope = {
        "type": "http",
        "path": f"/{TOKEN}/agent.v1.AgentService/RunSSE",
        "raw_path": f"/{TOKEN}/a%2Fb".encode(),
    }
    inner = c.strip_path(scope)
    assert inner is not None and (inner["path"], inner["raw_path"]) == (
        "/agent.v1.AgentService/RunSSE",
        b"/a%2Fb",
    )
    bare = c.strip_path({"path": f"/{TOKEN}", "raw_path": f"/{TOKEN}".encode()})
    assert bare is not None and (bare["path"], bare["raw_path"]) == ("/", b"/")
    for path in ("/", "/x", f"/{TOKEN}x/y", f"//{TOKEN}/y", f"/x/{TOKEN}/y", TOKEN):
        assert c.strip_path({"path": path, "raw_path": path.encode()}) is None, path
    basic = b"Basic " + base64.b64encode(f"anyone:{TOKEN}".encode())
    assert c.proxy_ok(basic) and c.proxy_ok(f"Bearer {TOKEN}".encode())
    for bad in (
        None,
        b"",
        b"Basic !!",
        b"Basic " + base64.b64encode(TOKEN.encode()),
        f"Bearer {TOKEN}x".encode(),
    ):
        assert not c.proxy_ok(bad), bad


def _handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, name: str | None) -> bytes:
    """One TLS handshake in memory; the certificate the server presented (DER)."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=name)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for side in (client, server):
            with suppress(ssl.SSLWantReadError):
                side.do_handshake()
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    cert = client.getpeercert(binary_form=True)
    assert cert is not None
    return cert


@pytest.mark.parametrize("name", ["byok.lan", "127.0.0.2"])  # an IP literal sends no SNI
def test_the_listener_certificate_renews_in_place(tmp_path: Path, name: str) -> None:
    ca = LocalCA.load_or_create(tmp_path)
    ctx = ca.listener_context(("byok.lan", "127.0.0.2"))
    trust = ssl.create_default_context(cadata=ca.cert_pem.decode())
    first = _handshake(ctx, trust, name)
    cert = x509.load_der_x509_certificate(first)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(v) for v in sans.get_values_for_type(x509.DNSName)] == ["byok.lan"]
    assert [str(v) for v in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.2"]
    assert _handshake(ctx, trust, name) == first  # the same leaf while it has long to run
    # The listener keeps ``ctx``; once its leaf is about to expire, each handshake gets a new one.
    (leaf,) = ca._leaves.values()
    leaf.not_after = dt.datetime.now(dt.UTC) + LEAF_RENEW / 2
    renewed = x509.load_der_x509_certificate(_handshake(ctx, trust, name))
    assert renewed.serial_number != cert.serial_number
    assert renewed.not_valid_after_utc > cert.not_valid_after_utc - dt.timedelta(minutes=1)
