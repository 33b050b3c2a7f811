"""The real ``voxgate serve --engines N`` (synthetic CPU engines) behind one gateway: streams
spread over the engines, one engine killed with SIGKILL fails only its streams and comes back,
/health and /metrics per engine, and the server's rule when engines fail for good."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.error
import urllib.request
from typing import Any

import msgpack
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.conftest import VoxgateServer

pytestmark = pytest.mark.slow


def _get(server: VoxgateServer, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(server.base_url.rstrip("/") + path, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _health(server: VoxgateServer) -> dict[str, Any]:
    return json.loads(_get(server, "/health")[1])


def _samples(server: VoxgateServer, name: str) -> dict[str, float]:
    """Every sample of a metric family, keyed by its label text ("" for none)."""
    out: dict[str, float] = {}
    for line in _get(server, "/metrics")[1].decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            labels = line[len(name):].rsplit(" ", 1)[0].strip()
            out[labels] = float(line.rsplit(" ", 1)[1])
    return out


async def _poll(predicate: Any, timeout_s: float = 90.0) -> None:
    """Poll a status endpoint every 50 ms until ``predicate()`` (not a synchronising sleep)."""
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(predicate):
        assert time.monotonic() < deadline, "the condition was not reached in time"
        await asyncio.sleep(0.05)


class Streams:
    """Streams on one connection: their frames by stream id, read by one task."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.frames: dict[str, list[dict[str, Any]]] = {}
        self.audio_seen: dict[str, asyncio.Event] = {}
        self.ended: dict[str, asyncio.Event] = {}
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for data in self.ws:
                msg = msgpack.unpackb(data)
                stream = msg.get("stream")
                if stream is None:
                    continue
                self.frames.setdefault(stream, []).append(msg)
                if msg["type"] == "audio":
                    self.audio_seen[stream].set()
                elif msg["type"] in ("done", "error"):
                    self.ended[stream].set()
        except ConnectionClosed:
            pass

    async def start(self, stream: str) -> None:
        """Start a stream with a sentence and no end: it stays open once it has spoken."""
        self.audio_seen[stream], self.ended[stream] = asyncio.Event(), asyncio.Event()
        await self.ws.send(msgpack.packb({"type": "start", "stream": stream}))
        await self.ws.send(msgpack.packb({"type": "text", "stream": stream,
                                          "text": "A first sentence, spoken at once. "}))
        await self.ws.send(msgpack.packb({"type": "flush", "stream": stream}))
        await asyncio.wait_for(self.audio_seen[stream].wait(), 60)

    async def finish(self, stream: str) -> dict[str, Any]:
        await self.ws.send(msgpack.packb({"type": "text", "stream": stream, "text": "And the end."}))
        await self.ws.send(msgpack.packb({"type": "end", "stream": stream}))
        await asyncio.wait_for(self.ended[stream].wait(), 60)
        return self.frames[stream][-1]

    def errors(self) -> dict[str, dict[str, Any]]:
        return {s: f[-1] for s, f in self.frames.items() if f and f[-1]["type"] == "error"}


def _open_streams(server: VoxgateServer) -> list[int]:
    return [e["open_streams"] for e in _health(server)["engines"]]


def test_streams_spread_an_engine_killed_fails_only_its_own_and_comes_back(server_factory: Any) -> None:
    """Three CPU engines: six streams land two on each; SIGKILL one engine: its two streams get
    engine_restarted (retryable), the other four nothing and finish normally; it restarts alone
    (the others keep their processes), new streams go to it, the one with room, and /health
    and /metrics say all this per engine."""
    server = server_factory("--model", "synthetic", "--engines", "3")
    health = _health(server)
    assert health["status"] == "ok" and health["engine"]["engines"] == 3
    pids = [e["pid"] for e in health["engines"]]
    for index, pid in enumerate(pids):  # each engine process is told its place
        with open(f"/proc/{pid}/environ", "rb") as f:
            assert f"VOXGATE_ENGINE_INDEX={index}".encode() in f.read().split(b"\0")

    async def main() -> None:
        async with connect(server.ws_url) as ws:
            await ws.recv()  # hello
            s = Streams(ws)
            for i in range(6):
                await s.start(f"s{i}")
            assert _open_streams(server) == [2, 2, 2]
            placed = _samples(server, "voxgate_pool_engine_placed_streams_total")
            assert placed == {f'{{engine="{i}"}}': 2.0 for i in range(3)}

            os.kill(pids[1], signal.SIGKILL)
            await _poll(lambda: len(s.errors()) == 2)
            errors = s.errors()
            assert {(e["code"], e["retryable"]) for e in errors.values()} == {("engine_restarted", True)}
            await _poll(lambda: _health(server)["engines"][1]["status"] == "ready")
            health = _health(server)
            assert [e["restarts"] for e in health["engines"]] == [0, 1, 0]
            assert [e["pid"] for e in health["engines"]][::2] == pids[::2] and health["engines"][1]["pid"] != pids[1]
            assert health["status"] == "ok"

            await s.start("n0")  # engine 1 has room, the others hold two each
            await s.start("n1")
            assert _open_streams(server) == [2, 2, 2]
            survivors = [f"s{i}" for i in range(6) if f"s{i}" not in errors] + ["n0", "n1"]
            for stream in survivors:
                done = await s.finish(stream)
                assert done["type"] == "done" and done["reason"] == "end", done
                audio = [f for f in s.frames[stream] if f["type"] == "audio"]
                assert [f["seq"] for f in audio] == list(range(len(audio)))  # nothing lost between
            assert len(s.errors()) == 2

        restarts = _samples(server, "voxgate_pool_engine_restarts_total")
        assert restarts == {'{engine="1"}': 1.0} and _samples(server, "voxgate_engine_restarts_total") == {"": 1.0}
        assert _samples(server, "voxgate_engine_up") == {"": 3.0}
        assert _samples(server, "voxgate_pool_engines")['{status="ready"}'] == 3.0

    asyncio.run(main())


def test_an_engine_given_up_leaves_the_others_serving_and_the_last_ends_the_server(server_factory: Any) -> None:
    """--max-engine-restarts 0 with two engines: the first engine killed is given up (its stream
    gets engine_restarted, /health says degraded with 200) and the server serves on the other;
    killing that one too ends every connection with engine_failed (1011), and the server exits 1."""
    server = server_factory("--model", "synthetic", "--engines", "2", "--max-engine-restarts", "0")
    pids = [e["pid"] for e in _health(server)["engines"]]

    async def main() -> None:
        async with connect(server.ws_url) as ws:
            await ws.recv()
            s = Streams(ws)
            await s.start("a")
            await s.start("b")
            os.kill(pids[0], signal.SIGKILL)
            await _poll(lambda: len(s.errors()) == 1)
            assert next(iter(s.errors().values()))["code"] == "engine_restarted"
            await _poll(lambda: _health(server)["engines"][0]["status"] == "failed")
            status, body = _get(server, "/health")
            assert status == 200 and json.loads(body)["status"] == "degraded"
            await s.start("c")  # placed on the engine that serves
            assert _open_streams(server) == [0, 2]
            os.kill(pids[1], signal.SIGKILL)
            await asyncio.wait_for(s.reader, 60)
            assert ws.close_code == 1011
            codes = {f[-1]["code"] for f in s.frames.values()}
            assert codes == {"engine_restarted", "engine_failed"}

    asyncio.run(main())
    assert server.process.wait(timeout=60) == 1
