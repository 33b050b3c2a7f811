"""voxgate serve as an operator runs it: a port in use, SIGTERM draining, Ctrl-C; no tracebacks."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gateway.client import VoxgateClient
from tests.conftest import ROOT, VoxgateServer

pytestmark = pytest.mark.slow


def _health(server: VoxgateServer) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(server.base_url + "health", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_port_in_use_is_one_line_and_exit_1_before_the_engine_starts() -> None:
    """With the port taken, serve prints one error line naming the address and exits 1, without
    a traceback and without starting the engine."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "serve", "--model", "synthetic", "--port",
             str(port)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    assert f"voxgate: error: cannot listen on 127.0.0.1:{port}: Address already in use" in out
    assert "Traceback" not in out and "starting the engine" not in out


async def _stream_until_first_audio(client: VoxgateClient, text: str) -> tuple[Any, int]:
    """A stream speaking ``text`` (flushed, not ended) and the samples of its first chunk."""
    stream = await client.start()
    await stream.send_text(text)
    await stream.flush()  # speak it now; the stream stays open until the test ends it
    async for msg in stream.messages():
        if msg["type"] == "audio":
            return stream, len(msg["pcm"]) // 2
    raise AssertionError(f"no audio: {stream.error}")


def test_sigterm_drains_streams_in_flight_and_refuses_new_ones(server_factory: Any) -> None:
    """After SIGTERM /health says draining (503), a new connection gets HTTP 503 with
    Retry-After, a new stream on an open connection gets server_shutdown, and the stream in
    flight goes on (its end is sent after these checks) and finishes with all its audio; then
    the server exits 0 with no traceback."""
    server = server_factory("--model", "synthetic", "--drain-timeout-s", "60")

    async def main() -> None:
        async with VoxgateClient.connect(server.ws_url) as client:
            stream, received = await _stream_until_first_audio(client, "A sentence of two seconds.")
            server.process.send_signal(signal.SIGTERM)
            while _health(server)[1]["status"] != "draining":
                await asyncio.sleep(0.05)  # polling a status endpoint
            assert _health(server)[0] == 503
            with pytest.raises(InvalidStatus) as info:
                async with connect(server.ws_url):
                    pass
            assert info.value.response.status_code == 503 and "Retry-After" in info.value.response.headers
            late = await client.start()
            async for _ in late.messages():
                pass
            assert late.error["code"] == "server_shutdown" and late.error["retryable"]
            await stream.end()
            async for msg in stream.messages():
                received += len(msg["pcm"]) // 2 if msg["type"] == "audio" else 0
            assert stream.done is not None and stream.done["reason"] == "end"
            assert received == stream.done["samples"] > 24000

    asyncio.run(main())
    assert server.process.wait(timeout=30) == 0
    assert not [line for line in server.output if "Traceback" in line]


@pytest.mark.parametrize("sig,args", [(signal.SIGTERM, ("--drain-timeout-s", "0.3")),
                                      (signal.SIGINT, ())])
def test_streams_left_at_shutdown_get_server_shutdown_and_1001(server_factory: Any, sig: int,
                                                               args: tuple[str, ...]) -> None:
    """Past the drain timeout (SIGTERM) or at once (Ctrl-C), a stream still speaking gets a
    retryable server_shutdown error and its connection closes with 1001; exit 0, no traceback."""
    server = server_factory("--model", "synthetic", *args)

    async def main() -> None:
        async with connect(server.ws_url + "?encoding=json") as ws:
            await ws.recv()
            await ws.send(json.dumps({"type": "start", "stream": "s"}))
            await ws.send(json.dumps({"type": "text", "stream": "s", "text": "word " * 200}))
            while json.loads(await ws.recv())["type"] != "audio":
                pass
            server.process.send_signal(sig)
            frames = []
            with pytest.raises(ConnectionClosed) as info:
                while True:
                    frames.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
            assert info.value.rcvd is not None and info.value.rcvd.code == 1001
            errors = [f for f in frames if f["type"] == "error"]
            assert [(e["code"], e["stream"], e["retryable"]) for e in errors] == [
                ("server_shutdown", "s", True)]

    asyncio.run(main())
    assert server.process.wait(timeout=30) == 0
    assert not [line for line in server.output if "Traceback" in line]
