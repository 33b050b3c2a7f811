"""deploy/haproxy/haproxy.cfg run by a real HAProxy on loopback in front of two real voxgate
instances (synthetic engine): least-connections balancing of WebSockets and HTTP, a killed or
draining instance's new streams go to the other while the streams in flight on the survivor
are untouched, and a reload lets streams in flight finish."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from websockets.asyncio.client import connect

from tests.conftest import VoxgateServer, start_server
from tests.deploy.haproxy import Haproxy, haproxy_binary, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    haproxy_binary() is None,
    reason="haproxy is not installed (apt-get install -y haproxy; .ci/run installs it)")]

# The two instances tell themselves apart in their hello: a limit each announces.
_MARK = {"a": "5", "b": "6"}


def _instance(name: str, *args: str) -> VoxgateServer:
    return start_server("--model", "synthetic", "--max-streams-per-connection", _MARK[name], *args)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Callable[..., tuple[dict[str, VoxgateServer], Haproxy]]]:
    """Start instances a and b (extra flags per instance), and HAProxy in front of them once
    its health checks have both in the pool; everything is stopped after the test."""
    started: list[Any] = []

    def make(**flags: tuple[str, ...]) -> tuple[dict[str, VoxgateServer], Haproxy]:
        servers = {name: _instance(name, *flags.get(name, ())) for name in ("a", "b")}
        started.extend(servers.values())
        lb = Haproxy.start(tmp_path, {name: s.port for name, s in servers.items()})
        started.append(lb)
        wait_until(lambda: lb.server_states() == {"a": "UP", "b": "UP"})
        return servers, lb

    yield make
    for item in reversed(started):
        item.stop()


class Conn:
    """A WebSocket through the balancer: which instance it reached, and its frames."""

    def __init__(self, ws: Any, instance: str) -> None:
        self.ws, self.instance = ws, instance
        self.frames: list[dict[str, Any]] = []

    @classmethod
    async def open(cls, url: str) -> Conn:
        ws = await connect(url)
        hello = msgpack.unpackb(await ws.recv())
        mark = str(hello["limits"]["max_streams_per_connection"])
        return cls(ws, next(name for name, m in _MARK.items() if m == mark))

    async def _next(self) -> dict[str, Any]:
        msg = msgpack.unpackb(await asyncio.wait_for(self.ws.recv(), 60))
        self.frames.append(msg)
        return msg

    async def speak(self, stream: str) -> None:
        """Start a stream and return at its first audio; it stays open (no end yet)."""
        await self.ws.send(msgpack.packb({"type": "start", "stream": stream}))
        await self.ws.send(msgpack.packb({"type": "text", "stream": stream,
                                          "text": "A first sentence, spoken at once. "}))
        await self.ws.send(msgpack.packb({"type": "flush", "stream": stream}))
        while (await self._next())["type"] != "audio":
            pass

    async def finish(self, stream: str) -> dict[str, Any]:
        """More text, the end, and every frame up to the stream's done or error."""
        await self.ws.send(msgpack.packb({"type": "text", "stream": stream, "text": "And the end."}))
        await self.ws.send(msgpack.packb({"type": "end", "stream": stream}))
        while (msg := await self._next())["type"] not in ("done", "error"):
            pass
        return msg

    def assert_untouched(self, stream: str, last: dict[str, Any]) -> None:
        """The stream ended normally with every chunk in order: nothing failed or went missing."""
        assert last["type"] == "done" and last["reason"] == "end", last
        assert not [f for f in self.frames if f["type"] == "error"]
        audio = [f for f in self.frames if f["type"] == "audio" and f["stream"] == stream]
        assert [f["seq"] for f in audio] == list(range(len(audio))) and len(audio) > 1


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _connections(server: VoxgateServer) -> float:
    for line in _get(server.base_url + "metrics")[1].decode().splitlines():
        if line.startswith("voxgate_connections "):
            return float(line.split()[1])
    raise AssertionError("no voxgate_connections")


def test_websockets_and_http_are_balanced_by_least_connections(cluster: Any) -> None:
    """Four WebSockets held open land two on each instance (and each serves its streams);
    /health and /metrics answer through the balancer."""
    servers, lb = cluster()

    async def main() -> None:
        conns = [await Conn.open(lb.ws_url) for _ in range(4)]
        assert Counter(c.instance for c in conns) == {"a": 2, "b": 2}
        assert _connections(servers["a"]) == 2 and _connections(servers["b"]) == 2
        for i, conn in enumerate(conns):
            await conn.speak(f"s{i}")
        for i, conn in enumerate(conns):
            conn.assert_untouched(f"s{i}", await conn.finish(f"s{i}"))
            await conn.ws.close()

    asyncio.run(main())
    status, body = _get(lb.base_url + "/health")
    assert status == 200 and json.loads(body)["status"] == "ok"
    status, body = _get(lb.base_url + "/metrics")
    assert status == 200 and b"voxgate_connections" in body


def test_a_killed_instance_sends_new_streams_to_the_other(cluster: Any) -> None:
    """SIGKILL instance a: new connections reach b at once (the refused connection is tried
    again on the other server), the health check takes a out of the pool, and a stream in
    flight on b goes on untouched."""
    servers, lb = cluster()

    async def main() -> None:
        first = [await Conn.open(lb.ws_url) for _ in range(2)]
        on_b = next(c for c in first if c.instance == "b")
        await on_b.speak("live")
        servers["a"].process.send_signal(signal.SIGKILL)
        servers["a"].process.wait(timeout=30)
        soon = [await Conn.open(lb.ws_url) for _ in range(3)]  # whether or not a check saw it go
        assert [c.instance for c in soon] == ["b"] * 3
        await asyncio.to_thread(wait_until, lambda: lb.server_states()["a"].startswith("DOWN"))
        later = [await Conn.open(lb.ws_url) for _ in range(3)]
        assert [c.instance for c in later] == ["b"] * 3
        await later[0].speak("new")
        later[0].assert_untouched("new", await later[0].finish("new"))
        on_b.assert_untouched("live", await on_b.finish("live"))

    asyncio.run(main())


def test_a_draining_instance_leaves_the_pool_and_finishes_its_streams(cluster: Any) -> None:
    """SIGTERM instance a while it has a stream in flight: its /health turns 503, HAProxy takes
    it out of the pool, new connections (even before the check sees it: the 503 is tried
    again on the other) go to b; the streams in flight on both finish, and a exits 0."""
    servers, lb = cluster(a=("--drain-timeout-s", "120"))

    async def main() -> None:
        first = [await Conn.open(lb.ws_url) for _ in range(2)]
        on_a = next(c for c in first if c.instance == "a")
        on_b = next(c for c in first if c.instance == "b")
        await on_a.speak("draining")
        await on_b.speak("live")
        servers["a"].process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(wait_until, lambda: _get(servers["a"].base_url + "health")[0] == 503)
        soon = [await Conn.open(lb.ws_url) for _ in range(3)]
        assert [c.instance for c in soon] == ["b"] * 3
        await asyncio.to_thread(wait_until, lambda: lb.server_states()["a"].startswith("DOWN"))
        later = await Conn.open(lb.ws_url)
        assert later.instance == "b"
        await later.speak("new")
        later.assert_untouched("new", await later.finish("new"))
        on_b.assert_untouched("live", await on_b.finish("live"))
        on_a.assert_untouched("draining", await on_a.finish("draining"))  # drain let it finish

    asyncio.run(main())
    assert servers["a"].process.wait(timeout=60) == 0


def test_a_reload_lets_streams_in_flight_finish(cluster: Any) -> None:
    """SIGUSR2 to HAProxy's master (systemctl reload): a new worker takes new connections,
    the stream in flight on the old one goes on to its end, and the old worker exits once its
    connection closes."""
    _, lb = cluster()

    async def main() -> None:
        conn = await Conn.open(lb.ws_url)
        await conn.speak("live")
        lb.reload()
        await asyncio.to_thread(wait_until, lambda: lb.log().count("Loading success") == 2)
        fresh = await Conn.open(lb.ws_url)
        await fresh.speak("new")
        fresh.assert_untouched("new", await fresh.finish("new"))
        conn.assert_untouched("live", await conn.finish("live"))
        await conn.ws.close()
        await asyncio.to_thread(wait_until, lambda: "Former worker" in lb.log())
        await fresh.ws.close()

    asyncio.run(main())
    assert "exited with code 0" in lb.log()


def test_the_template_is_valid_as_shipped(tmp_path: Path) -> None:
    """`haproxy -c` accepts deploy/haproxy/haproxy.cfg itself (its socket path aside)."""
    import subprocess

    from tests.deploy.haproxy import TEMPLATE

    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(TEMPLATE.read_text().replace("/run/haproxy/admin.sock", str(tmp_path / "s")))
    done = subprocess.run([haproxy_binary() or "haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert os.path.getsize(cfg) > 0
