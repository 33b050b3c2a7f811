"""gateway.security on the real server: Host, Origin and API-key checks at the handshake and on
HTTP, --metrics-public, TLS, per-IP limits."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from aiohttp.test_utils import make_mocked_request
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gateway.client import VoxgateClient
from gateway.security import SecurityPolicy, api_key_of, is_loopback
from tests.conftest import ROOT, VoxgateServer

pytestmark = pytest.mark.slow

KEY = "s3cret-key"


def test_api_key_is_taken_from_every_convention() -> None:
    """Bearer and Token authorization, xi-api-key, X-API-Key and ?api_key= all give the key."""
    for headers, path in (({"Authorization": f"Bearer {KEY}"}, "/"),
                          ({"Authorization": f"Token {KEY}"}, "/"), ({"xi-api-key": KEY}, "/"),
                          ({"X-API-Key": KEY, "Cartesia-Version": "2025-04-16"}, "/"),
                          ({}, f"/v1/stream?api_key={KEY}")):
        assert api_key_of(make_mocked_request("GET", path, headers=headers)) == KEY
    assert api_key_of(make_mocked_request("GET", "/", headers={"Authorization": "Basic x"})) is None


def test_the_servers_own_page_is_an_allowed_origin_through_a_tls_proxy() -> None:
    """An Origin whose host and port are the request's Host passes, whatever its scheme or a
    default port; another host, port or a look-alike does not."""
    from gateway.security import _origin_allowed

    policy = SecurityPolicy()
    for origin, host, allowed in (("http://127.0.0.1:8000", "127.0.0.1:8000", True),
                                  ("https://tts.example.com", "tts.example.com", True),
                                  ("https://tts.example.com", "tts.example.com:443", True),
                                  ("http://127.0.0.1:8001", "127.0.0.1:8000", False),
                                  ("https://tts.example.com.evil.io", "tts.example.com", False),
                                  ("null", "127.0.0.1:8000", False)):
        request = make_mocked_request("GET", "/v1/stream", headers={"Origin": origin, "Host": host})
        assert _origin_allowed(policy, request) is allowed, (origin, host)


def test_host_check_follows_the_bind_address() -> None:
    """Bound to loopback, loopback names and --allowed-hosts are checked; bound to every
    interface nothing is, unless --allowed-hosts is given (then with the bind address)."""
    loop = SecurityPolicy.for_bind("127.0.0.1", api_key="", allowed_origins=(),
                                   allowed_hosts=("My.Box",), metrics_public=False)
    assert loop.checks_host and loop.allow_loopback_hosts and loop.allowed_hosts == ("my.box", "127.0.0.1")
    assert not SecurityPolicy.for_bind("0.0.0.0", api_key="", allowed_origins=(), allowed_hosts=(),
                                       metrics_public=False).checks_host
    named = SecurityPolicy.for_bind("10.1.2.3", api_key="", allowed_origins=(),
                                    allowed_hosts=("tts.lan",), metrics_public=False)
    assert named.allowed_hosts == ("tts.lan", "10.1.2.3") and not named.allow_loopback_hosts
    assert is_loopback("::1") and is_loopback("app.localhost") and not is_loopback("0.0.0.0")


def _start(*args: str, env: dict[str, str] | None = None, scheme: str = "http") -> VoxgateServer:
    """``voxgate serve --port 0 ARGS`` (http or https) once it prints its URL."""
    import re

    pattern = re.compile(rf"serving on ({scheme}://[\d.]+:(\d+)/)")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--model", "synthetic", "--host",
         "127.0.0.1", "--port", "0", "--log-level", "WARNING", *args], cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    found = threading.Event()
    url: list[tuple[str, int]] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            if (m := pattern.search(line)) and not url:
                url.append((m.group(1), int(m.group(2))))
                found.set()
        found.set()

    threading.Thread(target=pump, daemon=True).start()
    if not found.wait(120) or not url:
        proc.kill()
        raise RuntimeError("voxgate serve did not start:\n" + "".join(output))
    return VoxgateServer(proc, url[0][0], url[0][1], output)


@pytest.fixture
def start() -> Any:
    started: list[VoxgateServer] = []

    def factory(*args: str, **kw: Any) -> VoxgateServer:
        started.append(_start(*args, **kw))
        return started[-1]

    yield factory
    for server in started:
        server.stop()


async def _handshake(url: str, **headers: str) -> int:
    """101 if the WebSocket opened (and said hello), else the HTTP status it was refused with."""
    try:
        async with connect(url, additional_headers=headers or None) as ws:
            await ws.recv()  # hello
            return 101
    except InvalidStatus as exc:
        return exc.response.status_code


def test_api_key_origin_and_host_at_the_handshake_and_on_http(start: Any) -> None:
    """With --api-key (here from VOXGATE_API_KEY) the WebSocket and /v1/... need the key (401
    without, 403 wrong) in any convention; /health and the page do not; a foreign Origin is
    403 even with the key, the server's own and --allowed-origins pass; a foreign Host is 403."""
    server = start("--allowed-origins", "https://app.example", "--allowed-hosts", "tts.box",
                   env={"VOXGATE_API_KEY": KEY})
    url, own = server.ws_url, f"http://127.0.0.1:{server.port}"

    async def main() -> None:
        assert await _handshake(url) == 401
        assert await _handshake(url, Authorization="Bearer wrong") == 403
        assert await _handshake(url, Authorization=f"Bearer {KEY}") == 101
        assert await _handshake(url, **{"X-API-Key": KEY}) == 101
        assert await _handshake(url, **{"xi-api-key": KEY}) == 101
        assert await _handshake(url + f"?api_key={KEY}") == 101
        assert await _handshake(url, Authorization=f"Bearer {KEY}", Origin="https://evil.example") == 403
        assert await _handshake(url, Authorization=f"Bearer {KEY}", Origin=own) == 101
        assert await _handshake(url, Authorization=f"Bearer {KEY}", Origin="https://app.example") == 101
        async with VoxgateClient.connect(url, api_key=KEY) as client:
            stream = await client.start()
            await stream.send_text("Fine. ")
            await stream.end()
            assert len(await stream.collect()) > 0

    asyncio.run(main())
    with httpx.Client(base_url=server.base_url) as http:
        assert http.get("/health").status_code == 200
        assert http.get("/").status_code == 200
        unauthorized = http.get("/v1/voices")
        assert unauthorized.status_code == 401 and unauthorized.headers["WWW-Authenticate"] == "Bearer"
        assert unauthorized.json()["error"]["code"] == "unauthorized"
        assert http.get("/metrics").status_code == 401
        assert http.get("/metrics", headers={"X-API-Key": KEY}).status_code == 200
        assert http.get("/v1/voices", headers={"X-API-Key": "nope"}).status_code == 403
        for host, status in (("evil.example", 403), (f"evil.example:{server.port}", 403),
                             ("tts.box", 200), (f"localhost:{server.port}", 200)):
            response = http.get("/health", headers={"Host": host})
            assert response.status_code == status, host
        refused = http.delete("/v1/voices/v-1", headers={"X-API-Key": KEY, "Origin": "https://evil.example"})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "origin_not_allowed"


def test_metrics_public_and_no_key_by_default(start: Any) -> None:
    """--metrics-public opens /metrics while /v1/voices still needs the key; without a key
    configured nothing needs one, but a foreign Origin is still refused at the handshake."""
    public = start("--api-key", KEY, "--metrics-public")
    with httpx.Client(base_url=public.base_url) as http:
        assert http.get("/metrics").status_code == 200
        assert http.get("/v1/voices").status_code == 401
    plain = start()
    with httpx.Client(base_url=plain.base_url) as http:
        assert http.get("/metrics").status_code == 200 and http.get("/v1/voices").status_code == 200

    async def main() -> None:
        assert await _handshake(plain.ws_url) == 101
        assert await _handshake(plain.ws_url, Origin="https://evil.example") == 403

    asyncio.run(main())


def test_tls_serves_https_and_wss(start: Any, tmp_path: Path) -> None:
    """With --ssl-certfile/--ssl-keyfile (a certificate made here) the server speaks https and
    wss to a client that trusts it, and prints those URLs."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    for pem in cert.cert_chain_pems[1:]:
        pem.write_to_path(str(cert_path), append=True)
    cert.private_key_pem.write_to_path(str(key_path))
    server = start("--ssl-certfile", str(cert_path), "--ssl-keyfile", str(key_path), scheme="https")
    assert any(f"wss://127.0.0.1:{server.port}/v1/stream" in line for line in server.output)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    with httpx.Client(verify=client_ctx) as http:
        assert http.get(f"https://127.0.0.1:{server.port}/health").status_code == 200

    async def main() -> None:
        async with connect(f"wss://127.0.0.1:{server.port}/v1/stream", ssl=client_ctx) as ws:
            await ws.recv()  # hello

    asyncio.run(main())


def test_per_ip_connection_and_stream_limits(start: Any) -> None:
    """--max-connections-per-ip 2: a third connection from the address gets 429; with
    --max-streams-per-ip 2, a third active stream over its two connections gets a retryable
    too_many_streams, and once one ends a new one starts."""
    server = start("--max-connections-per-ip", "2", "--max-streams-per-ip", "2")

    async def main() -> None:
        async with VoxgateClient.connect(server.ws_url) as a, VoxgateClient.connect(server.ws_url) as b:
            assert await _handshake(server.ws_url) == 429
            first, second = await a.start(), await b.start()
            await first.send_text("Still speaking here. ")
            await second.send_text("And here. ")
            third = await b.start()
            async for _ in third.messages():
                pass
            assert third.error["code"] == "too_many_streams" and third.error["retryable"]
            assert "--max-streams-per-ip" in third.error["message"]
            await first.end()
            await first.collect()
            again = await a.start()
            await again.send_text("Room now. ")
            await again.end()
            assert len(await again.collect()) > 0
            await second.cancel()

    asyncio.run(main())
