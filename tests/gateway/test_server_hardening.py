"""The real ``voxgate serve`` (synthetic engine) against hostile frames, slow readers, a hung
engine and an engine that keeps dying."""

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

_LONG_TEXT = "A sentence that takes a good while to speak at real time, and then some more. " * 20


def _get(server: VoxgateServer, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(server.base_url.rstrip("/") + path, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _metric(server: VoxgateServer, name: str) -> float | None:
    for line in _get(server, "/metrics")[1].decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    return None


async def _poll(predicate: Any, timeout_s: float = 60.0) -> None:
    """Poll a status endpoint every 50 ms until ``predicate()`` (not a synchronising sleep)."""
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(predicate):
        assert time.monotonic() < deadline, "the condition was not reached in time"
        await asyncio.sleep(0.05)


async def _start_speaking(ws: Any, stream: str = "s") -> None:
    """Start a stream with long text and return once its first audio arrives."""
    await ws.send(msgpack.packb({"type": "start", "stream": stream}))
    await ws.send(msgpack.packb({"type": "text", "stream": stream, "text": _LONG_TEXT}))
    await ws.send(msgpack.packb({"type": "flush", "stream": stream}))
    while msgpack.unpackb(await asyncio.wait_for(ws.recv(), 60))["type"] != "audio":
        pass


async def _until_error(ws: Any) -> dict[str, Any]:
    while True:
        msg = msgpack.unpackb(await asyncio.wait_for(ws.recv(), 120))
        if msg["type"] == "error":
            return msg


def _engine_pid(server: VoxgateServer) -> int:
    return json.loads(_get(server, "/health")[1])["engine"]["pid"]


def _is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_hostile_frames_queued_before_others_are_answered_and_the_rest_served(server_factory: Any) -> None:
    """Deep nesting, lone surrogates and a 70-bit option, sent ahead of 40 more frames, each get
    an error; the frames behind them are answered at once and the connection stays open (these
    used to kill the connection handler, and the close then took 10 s)."""
    server = server_factory("--model", "synthetic", "--max-streams-per-connection", "64")

    async def main() -> None:
        async with connect(server.ws_url) as ws:
            await ws.recv()
            hostile = ["[" * 1000 + "]" * 1000, '{"type": "start", "stream": "\\ud800"}',
                       '{"type": "start", "stream": "q", "options": {"seed": %d}}' % 2**70,
                       b"\x82\xa4type\xa5start\xa6stream\xa3\xed\xa0\x80"]
            for frame in hostile:
                await ws.send(frame)
            for i in range(40):
                await ws.send(msgpack.packb({"type": "start", "stream": f"s{i}"}))
            answers = [msgpack.unpackb(await asyncio.wait_for(ws.recv(), 30))
                       for _ in range(len(hostile) + 40)]
            codes = [a.get("code") for a in answers if a["type"] == "error"]
            assert sorted(codes) == ["bad_message", "bad_message", "bad_message", "invalid_option"]
            assert sum(a["type"] == "ready" for a in answers) == 40

    asyncio.run(main())


def test_slow_reader_has_its_endless_streams_cancelled_and_is_closed_1008(server_factory: Any) -> None:
    """A client that stops reading, with streams that never end: once its outbox passes the
    limit the engine stops them (they used to generate until they ended), it gets a
    slow_consumer error and a 1008 close."""
    server = server_factory("--model", "synthetic", "--synthetic-fast", "--max-outbox-bytes", "200000")

    async def main() -> None:
        async with connect(server.ws_url, max_queue=1) as slow:
            await slow.recv()
            for name in ("a", "b"):
                await slow.send(msgpack.packb({"type": "start", "stream": name}))
                await slow.send(msgpack.packb({"type": "text", "stream": name, "text": "word " * 9000}))
                await slow.send(msgpack.packb({"type": "flush", "stream": name}))
            # not reading: both streams end as slow consumers once the outbox overflows (the
            # gateway reads all six frames before any audio comes back, so both were started;
            # waiting to see the engine hold 2 first would race the overflow, which can come
            # before the engine's once-a-second stats), and the engine's streams go
            await _poll(lambda: _metric(server, 'voxgate_streams_total{outcome="slow_consumer"}') == 2)
            await _poll(lambda: _metric(server, "voxgate_engine_streams") == 0)
            frames = []
            with pytest.raises(ConnectionClosed) as info:
                while True:
                    frames.append(msgpack.unpackb(await asyncio.wait_for(slow.recv(), 60)))
            assert info.value.rcvd is not None and info.value.rcvd.code == 1008
            errors = [f for f in frames if f["type"] == "error"]
            assert [(e["code"], e["stream"], e["retryable"]) for e in errors] == [
                ("slow_consumer", None, True)]

    asyncio.run(main())


def test_stopped_engine_is_killed_by_the_watchdog_and_restarted(server_factory: Any) -> None:
    """SIGSTOP the engine mid-stream: with --engine-watchdog-s 3 the stream gets
    engine_restarted (retryable), the stopped process is killed, and service comes back."""
    server = server_factory("--model", "synthetic", "--engine-watchdog-s", "3")
    pid = _engine_pid(server)

    async def main() -> None:
        async with connect(server.ws_url) as ws:
            await ws.recv()
            await _start_speaking(ws)
            os.kill(pid, signal.SIGSTOP)
            err = await _until_error(ws)
            assert (err["stream"], err["code"], err["retryable"]) == ("s", "engine_restarted", True)
            assert _metric(server, "voxgate_engine_hangs_total") == 1
            await _poll(lambda: _is_gone(pid))
            await _poll(lambda: _get(server, "/health")[0] == 200)
            health = json.loads(_get(server, "/health")[1])
            assert health["engine"]["restarts"] == 1 and health["engine"]["pid"] != pid
            await _start_speaking(ws, "again")

    try:
        asyncio.run(main())
    finally:
        if not _is_gone(pid):
            os.kill(pid, signal.SIGKILL)  # never leave a stopped process behind


def test_idle_stopped_engine_is_left_alone(server_factory: Any) -> None:
    """With no stream open the watchdog does not act on a silent engine (nothing waits on it)."""
    server = server_factory("--model", "synthetic", "--engine-watchdog-s", "3")
    pid = _engine_pid(server)
    os.kill(pid, signal.SIGSTOP)
    try:
        async def main() -> None:
            # /health answers from the gateway; wait until the engine has been silent past the limit
            await _poll(lambda: json.loads(_get(server, "/health")[1])["engine"]["last_heard_s"] > 4.0)
            assert _metric(server, "voxgate_engine_hangs_total") == 0 and not _is_gone(pid)

        asyncio.run(main())
    finally:
        os.kill(pid, signal.SIGCONT)


def test_an_engine_dying_past_the_restart_limit_ends_the_server(server_factory: Any) -> None:
    """--max-engine-restarts 0: the engine's first death gives its stream and its connection a
    non-retryable engine_failed, closes 1011, and the server exits with status 1."""
    server = server_factory("--model", "synthetic", "--max-engine-restarts", "0")

    async def main() -> None:
        async with connect(server.ws_url) as ws:
            await ws.recv()
            await _start_speaking(ws)
            os.kill(_engine_pid(server), signal.SIGKILL)
            stream_err = await _until_error(ws)
            conn_err = await _until_error(ws)
            assert (stream_err["stream"], stream_err["code"], stream_err["retryable"]) == (
                "s", "engine_failed", False)
            assert (conn_err["stream"], conn_err["code"], conn_err["retryable"]) == (
                None, "engine_failed", False)
            with pytest.raises(ConnectionClosed) as info:
                await asyncio.wait_for(ws.recv(), 60)
            assert info.value.rcvd is not None and info.value.rcvd.code == 1011

    asyncio.run(main())
    assert server.process.wait(timeout=60) == 1
    assert any("giving up" in line for line in server.output)
