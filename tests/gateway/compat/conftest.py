"""The real ``voxgate serve`` (hibari voice, an API key) shared by the vendor-protocol tests,
and helpers to decode and score what the vendors' clients receive."""

from __future__ import annotations

import asyncio
import io
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import av
import numpy as np
import pytest
import soxr
import trustme

from benchmark.asr import transcribe, word_error_rate
from tests.conftest import VoxgateServer, start_server

API_KEY = "compat-test-key"


@pytest.fixture(scope="session")
def compat_server() -> Iterator[VoxgateServer]:
    """``voxgate serve`` with the embedded voice and ``--api-key``, for every protocol's tests."""
    server = start_server("--api-key", API_KEY)
    yield server
    server.stop()


def decode(data: bytes) -> tuple[np.ndarray, int]:
    """A compressed or containered file (MP3, Ogg Opus, ADTS AAC, FLAC, WAV) as float32 mono
    and its sample rate, decoded by FFmpeg."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        rate = stream.codec_context.sample_rate
        parts = [frame.to_ndarray().astype(np.float32).reshape(-1)
                 if frame.format.name == "flt" else
                 _to_float(frame) for frame in container.decode(stream)]
    return np.concatenate(parts), rate


def _to_float(frame: av.AudioFrame) -> np.ndarray:
    x = frame.to_ndarray()
    if x.ndim == 2:
        x = x[0]
    if np.issubdtype(x.dtype, np.integer):
        return x.astype(np.float32) / float(np.iinfo(x.dtype).max)
    return x.astype(np.float32)


def s16(data: bytes) -> np.ndarray:
    """Raw little-endian 16-bit PCM as float32."""
    return np.frombuffer(data, "<i2").astype(np.float32) / 32767.0


def mulaw(data: bytes) -> np.ndarray:
    """G.711 μ-law as float32 (decoded by FFmpeg)."""
    return _g711(data, "pcm_mulaw")


def alaw(data: bytes) -> np.ndarray:
    """G.711 A-law as float32 (decoded by FFmpeg)."""
    return _g711(data, "pcm_alaw")


def _g711(data: bytes, codec: str) -> np.ndarray:
    ctx = av.CodecContext.create(codec, "r")
    ctx.sample_rate = 8000
    ctx.layout = "mono"
    packet = av.Packet(data)
    return np.concatenate([_to_float(f) for f in ctx.decode(packet)] + [np.zeros(0, np.float32)])


def assert_intelligible(audio: np.ndarray, rate: int, text: str, *, max_wer: float = 0.25) -> None:
    """The audio says ``text`` (pocketsphinx word error rate at most ``max_wer``)."""
    assert audio.size > rate // 2, f"only {audio.size} samples"
    # to 16 kHz with soxr first: the scorer's own NumPy resampler is slow for 44.1 and 22.05 kHz
    speech = soxr.resample(audio.astype(np.float32), rate, 16000) if rate != 16000 else audio
    heard = transcribe(speech.astype(np.float32), 16000)
    wer = word_error_rate(text, heard)
    assert wer <= max_wer, f"WER {wer:.2f}: heard {heard!r} for {text!r}"


@dataclass
class TlsTerminator:
    """A local TLS terminator (a self-signed certificate made here) in front of a plain server,
    for clients that insist on https/wss; ``ca_file`` is the PEM a client trusts."""

    port: int
    ca_file: str


@pytest.fixture(scope="session")
def tls_terminator(compat_server: VoxgateServer, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[TlsTerminator]:
    """TLS on 127.0.0.1 (port 0) forwarding each connection to ``compat_server``."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    folder = tmp_path_factory.mktemp("tls")
    ca_file = str(folder / "ca.pem")
    ca.cert_pem.write_to_path(ca_file)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    loop = asyncio.new_event_loop()
    ready: list[asyncio.AbstractServer] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", compat_server.port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def main() -> None:
        ready.append(await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx))

    loop.run_until_complete(main())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield TlsTerminator(ready[0].sockets[0].getsockname()[1], ca_file)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
