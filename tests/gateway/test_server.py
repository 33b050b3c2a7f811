"""The real ``voxgate serve`` (synthetic engine) on port 0: HTTP routes, streams, limits, failures."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import msgpack
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gateway.client import VoxgateClient
from tests.conftest import VoxgateServer

pytestmark = pytest.mark.slow

TEXT = "Hello there, this is a test of the gateway. It speaks word by word, as text arrives."


def _get(server: VoxgateServer, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(server.base_url.rstrip("/") + path, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(scope="module")
def synth(request: pytest.FixtureRequest) -> Any:
    from tests.conftest import start_server

    server = start_server("--model", "synthetic", "--max-streams-per-connection", "4",
                          "--max-text-chars-per-stream", "2000")
    yield server
    server.stop()


async def _speak(client: VoxgateClient, text: str, **kw: Any) -> Any:
    stream = await client.start(**kw)
    for word in text.split(" "):
        await stream.send_text(word + " ")
    await stream.end()
    return stream


def test_http_routes(synth: VoxgateServer) -> None:
    """/health, /v1/voices, /metrics and / answer as documented; unknown paths 404."""
    status, body = _get(synth, "/health")
    health = json.loads(body)
    assert status == 200 and health["status"] == "ok" and health["model_loaded"] is True
    status, body = _get(synth, "/v1/voices")
    voices = json.loads(body)
    assert status == 200 and voices["model"] == "synthetic" and voices["sample_rate"] == 24000
    status, body = _get(synth, "/metrics")
    assert status == 200
    for name in (b"voxgate_connections", b"voxgate_active_streams",
                 b"voxgate_time_to_first_audio_seconds", b"voxgate_chunk_gap_seconds",
                 b"voxgate_engine_queued_jobs"):
        assert name in body
    # the engine's model and device, from its handshake (the synthetic engine runs on the CPU)
    assert b'voxgate_engine_info{device="cpu: ' in body and b'model="synthetic"' in body
    # and the start-up lines say it too, before the URL
    assert any(line.startswith("voxgate: model synthetic on cpu: ") for line in synth.output)
    status, body = _get(synth, "/")
    assert status == 200 and b"<html" in body.lower()
    assert _get(synth, "/nope/../../etc/passwd")[0] == 404


def test_the_apis_unknown_paths_and_methods_answer_in_json(synth: VoxgateServer) -> None:
    """Under /v1/ (and /health, /metrics) an unknown path is 404 ``not_found`` and a wrong method
    405 ``method_not_allowed`` with ``Allow``, in the JSON endpoints' error form; the demo
    page's unknown files stay plain 404s."""
    status, body = _get(synth, "/v1/nope")
    error = json.loads(body)["error"]
    assert status == 404 and error["code"] == "not_found" and error["retryable"] is False
    assert "/v1/nope" in error["message"]
    request = urllib.request.Request(synth.base_url + "v1/voices", method="PUT", data=b"")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 405 and "POST" in info.value.headers["Allow"]
    assert json.loads(info.value.read())["error"]["code"] == "method_not_allowed"
    status, body = _get(synth, "/nope.html")
    assert status == 404 and not body.startswith(b"{")


def _raw_http(server: VoxgateServer, data: bytes) -> list[int]:
    """Send raw bytes, read until the server closes; the status codes of its responses."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return [int(code) for code in re.findall(rb"HTTP/1\.[01] (\d{3}) ", out)]


def test_malformed_http_gets_a_4xx_and_no_traceback(synth: VoxgateServer) -> None:
    """Unknown paths, wrong methods, garbage, huge or contradictory headers and a plain GET on
    the WebSocket path each get a 4xx; a GET with a body and pipelined requests are answered;
    nothing is logged as an error."""
    close = b"Connection: close\r\n"
    assert _raw_http(synth, b"POST /nope/x HTTP/1.1\r\nHost: 127.0.0.1\r\n" + close
                     + b"Content-Length: 3\r\n\r\nabc") == [404]
    assert _raw_http(synth, b"POST /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + close
                     + b"Content-Length: 0\r\n\r\n") == [405]
    assert _raw_http(synth, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + close
                     + b"Content-Length: 5\r\n\r\nhello") == [200]
    assert _raw_http(synth, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                     b"GET /v1/voices HTTP/1.1\r\nHost: 127.0.0.1\r\n" + close + b"\r\n") == [200, 200]
    assert _raw_http(synth, b"\x00\x01\x02garbage\r\n\r\n") == [400]
    assert _raw_http(synth, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"a" * 20000
                     + b"\r\n\r\n") == [400]
    assert _raw_http(synth, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 3\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n") == [400]
    assert _raw_http(synth, b"GET /v1/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n" + close + b"\r\n") == [426]
    assert _get(synth, "/health")[0] == 200  # still serving
    assert not [line for line in synth.output if "Traceback" in line or " ERROR " in line]


def test_two_streams_word_by_word_and_cancel(synth: VoxgateServer) -> None:
    """Two concurrent streams finish; a third cancelled mid-way gets at most one chunk after cancel."""

    async def main() -> None:
        async with VoxgateClient.connect(synth.ws_url) as client:
            a = await _speak(client, TEXT)
            b = await _speak(client, TEXT, format="pcm_f32le")
            c = await _speak(client, TEXT)
            after_cancel = 0
            t_cancel: float | None = None
            async for msg in c.messages():
                if msg["type"] == "audio":
                    if t_cancel is not None:
                        after_cancel += msg["t_recv"] > t_cancel
                    elif msg["seq"] == 1:
                        t_cancel = time.monotonic()
                        await c.cancel()
            audio_a, audio_b = await a.collect(), await b.collect()
            assert c.done is not None and c.done["reason"] == "cancelled"
            assert after_cancel <= 1
            assert a.done["reason"] == "end" and b.done["reason"] == "end"
            assert len(audio_a) == a.done["samples"] == len(audio_b) > 24000
            assert a.done["ttfa_ms"] > 0

    asyncio.run(main())


def test_json_encoding_connection(synth: VoxgateServer) -> None:
    """With ?encoding=json the server answers JSON text frames with base64 audio."""

    async def main() -> None:
        async with connect(synth.ws_url + "?encoding=json") as ws:
            hello = json.loads(await ws.recv())
            assert hello["type"] == "hello"
            # the synthetic engine uses no GPU: it names the CPU it runs on
            assert hello["device"].startswith("cpu: ") and hello["device"].endswith(" cores")
            await ws.send(json.dumps({"type": "start", "stream": "j"}))
            await ws.send(json.dumps({"type": "text", "stream": "j", "text": "Hi there."}))
            await ws.send(json.dumps({"type": "end", "stream": "j"}))
            kinds = []
            while not kinds or kinds[-1] != "done":
                frame = await ws.recv()
                assert isinstance(frame, str)
                kinds.append(json.loads(frame)["type"])
            assert kinds[0] == "ready" and "audio" in kinds

    asyncio.run(main())


def test_bad_input_is_answered_and_the_connection_keeps_serving(synth: VoxgateServer) -> None:
    """Malformed frames, unknown types, text before start, bad voice/option get errors; then a stream works."""

    async def main() -> None:
        async with VoxgateClient.connect(synth.ws_url) as client:
            await client.send_raw(b"\xc1\xc1\xc1")
            await client.send_raw("{oops")
            await client.send({"type": "sing", "stream": "x"})
            await client.send({"type": "text", "stream": "never", "text": "hi"})
            bad_voice = await client.start(voice="nobody")
            bad_opt = await client.start(options={"speed": 9.0})
            good = await _speak(client, "Still here.")
            audio = await good.collect()
            assert len(audio) > 0
            async for _ in bad_opt.messages():
                pass
            codes = [e["code"] for e in client.errors]
            assert codes[:4] == ["bad_message", "bad_message", "unknown_type", "unknown_stream"]
            assert bad_voice.error["code"] == "unknown_voice"
            assert bad_opt.error["code"] == "invalid_option" and "speed" in bad_opt.error["message"]

    asyncio.run(main())


def test_too_many_streams_and_too_much_text(synth: VoxgateServer) -> None:
    """The fifth stream on a connection and text past the limit are refused; others go on."""

    async def main() -> None:
        async with VoxgateClient.connect(synth.ws_url) as client:
            streams = [await client.start() for _ in range(4)]
            extra = await client.start()
            async for _ in extra.messages():
                pass
            assert extra.error["code"] == "too_many_streams" and extra.error["retryable"]
            await streams[0].send_text("x" * 2001)
            async for _ in streams[0].messages():
                pass
            assert streams[0].error["code"] == "text_too_long"
            await streams[1].send_text("Fine. ")
            await streams[1].end()
            assert len(await streams[1].collect()) > 0

    asyncio.run(main())


def test_server_wide_stream_limit_refuses_with_a_retryable_capacity_error(server_factory: Any) -> None:
    """--max-streams 2: a third stream, on another connection, gets `capacity` (retryable) with
    the limit in its message; once a stream is done, a new one is served."""
    server = server_factory("--model", "synthetic", "--max-streams", "2")

    async def main() -> None:
        async with VoxgateClient.connect(server.ws_url) as a, VoxgateClient.connect(server.ws_url) as b:
            first, second = await a.start(), await a.start()
            await first.send_text("Still speaking here. ")
            await second.send_text("And here too. ")
            third = await b.start()
            async for _ in third.messages():
                pass
            assert third.error["code"] == "capacity" and third.error["retryable"]
            assert "max_streams=2" in third.error["message"]
            await first.end()
            assert len(await first.collect()) > 0
            again = await _speak(b, "Now there is room.")
            assert len(await again.collect()) > 0
            await second.cancel()

    asyncio.run(main())


def test_oversized_frame_closes_with_1009(synth: VoxgateServer) -> None:
    """A frame over max_frame_bytes closes that connection with 1009; others are unaffected."""

    async def main() -> None:
        async with VoxgateClient.connect(synth.ws_url) as other:
            async with connect(synth.ws_url, max_size=None) as ws:
                await ws.recv()
                # (the server may close while the frame is still being written: then the send
                # itself raises, having received the 1009)
                with pytest.raises(ConnectionClosed) as info:
                    await ws.send(msgpack.packb({"type": "text", "stream": "x",
                                                 "text": "a" * (2 << 20)}))
                    while True:
                        await ws.recv()
                assert info.value.rcvd is not None and info.value.rcvd.code == 1009
            stream = await _speak(other, "Still fine.")
            assert len(await stream.collect()) > 0

    asyncio.run(main())


def test_idle_connection_is_closed(server_factory: Any) -> None:
    """A connection with no frames and no streams is closed with 1001 after idle_timeout_s."""
    server = server_factory("--model", "synthetic", "--idle-timeout-s", "0.5")

    async def main() -> None:
        async with connect(server.ws_url) as ws:
            frames = []
            with pytest.raises(ConnectionClosed) as info:
                while True:
                    frames.append(await asyncio.wait_for(ws.recv(), 10))
            assert info.value.rcvd is not None and info.value.rcvd.code == 1001
            assert msgpack.unpackb(frames[-1])["code"] == "idle_timeout"

    asyncio.run(main())


async def _until_no_active_streams(server: VoxgateServer) -> None:
    """Return once the server's ``voxgate_active_streams`` gauge reads 0 (polled every 50 ms)."""
    while True:
        _, body = await asyncio.to_thread(_get, server, "/metrics")
        if any(float(line.split()[-1]) == 0 for line in body.decode().splitlines()
               if line.startswith("voxgate_active_streams ")):
            return
        await asyncio.sleep(0.05)


def test_slow_reader_is_closed_and_others_keep_streaming(server_factory: Any) -> None:
    """A client that stops reading has its stream stopped and is closed with 1008 once its
    outbox passes the limit; the last frame it gets is a slow_consumer error."""
    server = server_factory("--model", "synthetic", "--synthetic-fast",
                            "--max-outbox-bytes", "200000")

    async def main() -> None:
        async with connect(server.ws_url, max_queue=1) as slow:
            await slow.recv()
            await slow.send(msgpack.packb({"type": "start", "stream": "s"}))
            await slow.send(msgpack.packb({"type": "text", "stream": "s", "text": "word " * 8000}))
            await slow.send(msgpack.packb({"type": "end", "stream": "s"}))
            async with VoxgateClient.connect(server.ws_url) as other:
                stream = await _speak(other, TEXT)
                audio = await asyncio.wait_for(stream.collect(), 30)
                assert stream.done["reason"] == "end" and len(audio) > 0
            # still not reading: the server stops the slow stream once its outbox passes the
            # limit (after the socket buffers fill, however long the engine takes for that)
            await asyncio.wait_for(_until_no_active_streams(server), 60)
            frames = []
            with pytest.raises(ConnectionClosed) as info:
                while True:
                    frames.append(msgpack.unpackb(await asyncio.wait_for(slow.recv(), 60)))
            assert info.value.rcvd is not None and info.value.rcvd.code == 1008
            assert frames[-1]["type"] == "error" and frames[-1]["code"] == "slow_consumer"
            assert frames[-1]["retryable"] is True

    asyncio.run(main())


def test_engine_death_fails_streams_and_restarts(server_factory: Any) -> None:
    """Killing the engine fails the live stream (retryable), /health says so, then it serves again."""
    server = server_factory("--model", "synthetic")

    async def main() -> None:
        async with VoxgateClient.connect(server.ws_url) as client:
            stream = await client.start()
            await stream.send_text("A sentence that takes a while to speak at real time. ")
            async for msg in stream.messages():
                if msg["type"] == "audio":
                    break
            pid = json.loads(_get(server, "/health")[1])["engine"]["pid"]
            os.kill(pid, signal.SIGKILL)
            async for _ in stream.messages():
                pass
            assert stream.error["code"] == "engine_restarted" and stream.error["retryable"]
            for _ in range(200):
                status, body = _get(server, "/health")
                if status == 200:
                    break
                assert json.loads(body)["status"] in ("restarting", "starting")
                await asyncio.sleep(0.1)  # polling a status endpoint, not synchronising
            health = json.loads(_get(server, "/health")[1])
            assert health["status"] == "ok" and health["engine"]["restarts"] == 1
            again = await _speak(client, "Back again.")
            assert len(await again.collect()) > 0

    asyncio.run(main())


def test_past_max_connections_the_handshake_gets_503_with_retry_after(server_factory: Any) -> None:
    """With --max-connections 2 a third WebSocket is refused with HTTP 503 and Retry-After
    (no upgrade); /health still answers, and once one closes a new connection is served."""
    from websockets.exceptions import InvalidStatus

    server = server_factory("--model", "synthetic", "--max-connections", "2")

    async def main() -> None:
        async with connect(server.ws_url) as a, connect(server.ws_url):
            await a.recv()
            with pytest.raises(InvalidStatus) as info:
                async with connect(server.ws_url):
                    pass
            response = info.value.response
            assert response.status_code == 503 and response.headers["Retry-After"] == "1"
            assert json.loads(response.body)["error"]["code"] == "too_many_connections"
            assert _get(server, "/health")[0] == 200
        async with VoxgateClient.connect(server.ws_url) as client:
            stream = await _speak(client, "Room again.")
            assert len(await stream.collect()) > 0

    asyncio.run(main())


def test_a_low_open_file_limit_lowers_max_connections_with_a_warning() -> None:
    """Started with a hard open-file limit of 100, the server warns and lowers
    --max-connections to 100 - 64 reserved; the next connection gets 503, /health answers."""
    import resource
    import subprocess
    import sys

    from websockets.exceptions import InvalidStatus

    from tests.conftest import ROOT, _URL

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))

    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--model", "synthetic", "--port", "0",
         "--log-level", "WARNING"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, preexec_fn=low_limit)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if match := _URL.search(line):
                break
        else:
            raise AssertionError("".join(lines))
        server = VoxgateServer(proc, match.group(1), int(match.group(2)), lines)
        assert any("lowering --max-connections from 2048 to 36" in line for line in lines), lines

        async def main() -> None:
            conns = [await connect(server.ws_url).__aenter__() for _ in range(36)]
            with pytest.raises(InvalidStatus) as info:
                async with connect(server.ws_url):
                    pass
            assert info.value.response.status_code == 503
            assert (await asyncio.to_thread(_get, server, "/health"))[0] == 200
            for ws in conns:
                await ws.close()

        asyncio.run(main())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
