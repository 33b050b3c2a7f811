"""A small async Python client for the voxgate protocol (used by tests, the benchmark, agents); one
connection carries several streams, each read on its own. docs/protocol.md has an example.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from gateway import protocol as p

__all__ = ["VoxgateClient", "ClientStream", "StreamFailed"]


class StreamFailed(Exception):
    """The server ended a stream with an ``error``."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.error = error
        self.code = error.get("code")
        self.retryable = bool(error.get("retryable"))
        # a `capacity` refusal's hint: wait this long before starting the stream again (None: none)
        retry = error.get("retry_after_s")
        self.retry_after_s = None if retry is None else float(retry)


class ClientStream:
    """One stream of a connection. Its messages go to its own unbounded queue, fed by the
    connection's one reader task, so a stream whose audio is not consumed never stops another
    stream's messages (memory grows instead: read every stream you start)."""

    def __init__(self, client: VoxgateClient, stream_id: str, fmt: str,
                 sample_rate: int | None = None) -> None:
        self.client = client
        self.id = stream_id
        self.format = fmt
        # Hz: what ``start`` asked for (None: the model's), then what ``ready`` says
        self.sample_rate = sample_rate
        self.ready: dict[str, Any] | None = None
        self.done: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self._queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.t_first_text: float | None = None
        self.t_end_sent: float | None = None

    async def send_text(self, text: str) -> None:
        if self.t_first_text is None and text.strip():
            self.t_first_text = time.monotonic()
        await self.client.send({"type": "text", "stream": self.id, "text": text})

    async def flush(self) -> None:
        await self.client.send({"type": "flush", "stream": self.id})

    async def end(self) -> None:
        self.t_end_sent = time.monotonic()
        await self.client.send({"type": "end", "stream": self.id})

    async def cancel(self) -> None:
        await self.client.send({"type": "cancel", "stream": self.id})

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        """Server maps for this stream (audio, done, error), each with ``t_recv`` added.

        Ends after ``done`` or ``error``, or when the connection closes.
        """
        while True:
            msg = await self._queue.get()
            if msg is None:
                return
            yield msg
            if msg.get("type") == "done" or _is_terminal_error(msg):
                return

    async def audio(self) -> AsyncIterator[np.ndarray]:
        """Float32 PCM chunks until ``done``. Raises ``StreamFailed`` on an ``error``."""
        async for msg in self.messages():
            if msg["type"] == "audio":
                yield self.decode_pcm(msg["pcm"])
            elif _is_terminal_error(msg):
                raise StreamFailed(msg)

    async def collect(self) -> np.ndarray:
        chunks = [chunk async for chunk in self.audio()]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)

    def decode_pcm(self, pcm: bytes) -> np.ndarray:
        if self.format == "pcm_f32le":
            return np.frombuffer(pcm, dtype="<f4").astype(np.float32)
        return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32767.0

    def _deliver(self, msg: dict[str, Any] | None) -> None:
        if msg is not None:
            kind = msg.get("type")
            if kind == "ready":
                self.ready = msg
                self.sample_rate = msg.get("sample_rate", self.sample_rate)
                return
            if kind == "done":
                self.done = msg
            elif kind == "error" and msg.get("code") not in _NON_TERMINAL:
                self.error = msg
        self._queue.put_nowait(msg)


# Errors that reject one message but leave the stream running.
_NON_TERMINAL = {"bad_message", "unknown_type", "stream_ended"}


def _is_terminal_error(msg: dict[str, Any]) -> bool:
    return msg.get("type") == "error" and msg.get("code") not in _NON_TERMINAL


class VoxgateClient:
    def __init__(self, ws: ClientConnection, encoding: p.Encoding) -> None:
        self.ws = ws
        self.encoding = encoding
        self.hello: dict[str, Any] = {}
        self.errors: list[dict[str, Any]] = []  # connection-level errors (stream: null)
        self._streams: dict[str, ClientStream] = {}
        self._ids = itertools.count(1)
        self._reader: asyncio.Task[None] | None = None
        self._hello = asyncio.get_running_loop().create_future()

    @classmethod
    @asynccontextmanager
    async def connect(cls, url: str, *, encoding: p.Encoding = p.Encoding.MSGPACK,
                      open_timeout_s: float = 30.0,
                      max_size: int | None = 16 * 1024 * 1024,
                      api_key: str | None = None) -> AsyncIterator[VoxgateClient]:
        """Connect and wait for ``hello``; ``api_key`` for a server started with one."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        async with connect(url, open_timeout=open_timeout_s, max_size=max_size,
                           additional_headers=headers) as ws:
            client = cls(ws, encoding)
            client._reader = asyncio.create_task(client._read())
            try:
                client.hello = await asyncio.wait_for(asyncio.shield(client._hello),
                                                      open_timeout_s)
                yield client
            finally:
                client._reader.cancel()

    async def start(self, *, voice: str | None = None, format: str = "pcm_s16le",
                    options: dict[str, Any] | None = None, sample_rate: int | None = None,
                    stream_id: str | None = None) -> ClientStream:
        """Send ``start``; returns at once (``ready`` or an error arrives on the stream).
        ``sample_rate`` (Hz, one of ``hello["output_sample_rates"]``): the gateway resamples
        the stream's audio to it; ``None``: the model's rate."""
        sid = stream_id or f"s{next(self._ids)}"
        stream = ClientStream(self, sid, format, sample_rate)
        self._streams[sid] = stream
        msg: dict[str, Any] = {"type": "start", "stream": sid, "format": format}
        if sample_rate is not None:
            msg["sample_rate"] = sample_rate
        if voice is not None:
            msg["voice"] = voice
        if options:
            msg["options"] = options
        await self.send(msg)
        return stream

    async def send(self, msg: dict[str, Any]) -> None:
        await self.ws.send(p.encode_client_message(msg, self.encoding))

    async def send_raw(self, frame: bytes | str) -> None:
        """Send a frame as is (for tests of malformed input)."""
        await self.ws.send(frame)

    async def _read(self) -> None:
        try:
            async for frame in self.ws:
                msg = p.decode_server_frame(frame)
                msg["t_recv"] = time.monotonic()
                kind = msg.get("type")
                if kind == "hello":
                    if not self._hello.done():
                        self._hello.set_result(msg)
                    continue
                stream = self._streams.get(msg.get("stream")) if msg.get("stream") else None
                if stream is None:
                    self.errors.append(msg)
                    continue
                stream._deliver(msg)
        except ConnectionClosed:
            pass
        finally:
            if not self._hello.done():
                self._hello.set_exception(ConnectionError("closed before hello"))
            for stream in self._streams.values():
                stream._deliver(None)
