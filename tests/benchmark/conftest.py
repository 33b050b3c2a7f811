"""Fixtures for the benchmark's tests: in-process fake servers (native WebSocket, chunked HTTP)
that answer at once, served through the ``fakes`` fixture."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace

import pytest

from gateway.protocol import Encoding, decode_server_frame, encode_server_message


SAMPLE_RATE = 24000
CHUNK_SAMPLES = 2400  # 100 ms


def _chunks_for(text: str) -> int:
    return max(1, len(text.split()))  # one 100 ms chunk per word


@asynccontextmanager
async def native_server(*, fail_words: str = "[[fail]]", close_words: str = "[[close]]",
                        refuse_words: str = "[[refuse]]", wait_words: str = "[[wait]]",
                        ) -> AsyncIterator[str]:
    """Speaks the native protocol. A stream whose text contains ``fail_words`` gets an
    ``error`` after its first chunk; one containing ``close_words`` closes the connection; one
    containing ``refuse_words`` is refused (``capacity``, retry_after_s 0.01); one containing
    ``wait_words`` says in its ``done`` that it waited 250 ms for admission."""
    from websockets.asyncio.server import serve

    async def handler(ws: object) -> None:
        send = ws.send  # type: ignore[attr-defined]
        await send(encode_server_message({"type": "hello", "protocol": 1, "model": "fake",
                                          "voices": ["x"], "sample_rate": SAMPLE_RATE},
                                         Encoding.MSGPACK))
        texts: dict[str, str] = {}
        async for frame in ws:  # type: ignore[attr-defined]
            msg = decode_server_frame(frame)  # client maps decode the same way
            sid = msg["stream"]
            if msg["type"] == "start":
                texts[sid] = ""
                await send(encode_server_message({"type": "ready", "stream": sid,
                                                  "sample_rate": SAMPLE_RATE,
                                                  "format": msg.get("format")}, Encoding.MSGPACK))
            elif msg["type"] == "text":
                texts[sid] += msg["text"]
            elif msg["type"] == "end":
                text = texts.pop(sid)
                if close_words in text:
                    await ws.close(1011, "internal error")  # type: ignore[attr-defined]
                    return
                if refuse_words in text:
                    await send(encode_server_message(
                        {"type": "error", "stream": sid, "code": "capacity", "retryable": True,
                         "message": "server at capacity", "retry_after_s": 0.01}, Encoding.MSGPACK))
                    continue
                for k in range(_chunks_for(text)):
                    pcm = b"\x00\x01" * CHUNK_SAMPLES
                    await send(encode_server_message(
                        {"type": "audio", "stream": sid, "seq": k, "offset": k * CHUNK_SAMPLES,
                         "pcm": pcm}, Encoding.MSGPACK))
                    if fail_words in text:
                        await send(encode_server_message(
                            {"type": "error", "stream": sid, "code": "model_error",
                             "message": "injected", "retryable": False}, Encoding.MSGPACK))
                        break
                else:
                    done = {"type": "done", "stream": sid, "reason": "end",
                            "samples": _chunks_for(text) * CHUNK_SAMPLES}
                    if wait_words in text:
                        done["queue_wait_ms"] = 250.0
                    await send(encode_server_message(done, Encoding.MSGPACK))

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        yield f"ws://127.0.0.1:{port}/v1/stream"


def _wav_header(sample_rate: int) -> bytes:
    fmt = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * 2, 2, 16)
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE" + b"fmt " + struct.pack("<I", 16)
            + fmt + b"data" + struct.pack("<I", 0xFFFFFFFF))


@asynccontextmanager
async def http_server(*, status: int = 200
                      ) -> AsyncIterator[tuple[str, list[dict[str, object]]]]:
    """Answers POST /v1/audio/speech (JSON; PCM or WAV) and POST /generate (multipart; WAV)
    with a chunked body: one 100 ms chunk per word. Yields (base URL, requests received)."""
    requests: list[dict[str, object]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.lower(): v.strip() for k, v in
                           (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if path == "/v1/audio/speech":
                    req = json.loads(body)
                    text, wav = req["input"], req.get("response_format") == "wav"
                else:
                    # Multipart: the 'text' part's value (good enough for these tests).
                    part = body.split(b'name="text"\r\n\r\n', 1)[1]
                    text, wav = part.split(b"\r\n--", 1)[0].decode(), True
                    req = {"text": text, "streaming": b'name="streaming"\r\n\r\ntrue' in body}
                requests.append({"path": path, **req})
                if status != 200:
                    msg = b"overloaded"
                    writer.write(f"HTTP/1.1 {status} Err\r\ncontent-length: {len(msg)}\r\n\r\n"
                                 .encode() + msg)
                    await writer.drain()
                    continue
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n"
                             b"content-type: audio/wav\r\n\r\n")
                parts = [_wav_header(SAMPLE_RATE)] if wav else []
                parts += [b"\x00\x01" * CHUNK_SAMPLES for _ in range(_chunks_for(text))]
                for part in parts:
                    writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", requests
    finally:
        server.close()


# Served through a fixture rather than imported as a module, so that the tests work under any
# pytest import mode and never clash with helper modules of other test directories.
@pytest.fixture
def fakes() -> SimpleNamespace:
    """The fake servers (async context managers) and the audio they send."""
    return SimpleNamespace(native_server=native_server, http_server=http_server,
                           CHUNK_SAMPLES=CHUNK_SAMPLES, SAMPLE_RATE=SAMPLE_RATE)
