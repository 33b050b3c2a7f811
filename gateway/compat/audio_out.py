"""Audio in the formats the vendor protocols ask for: a stream's ``AudioEncoder`` resamples
the engine's 24 kHz PCM with soxr (``gateway.resample``) and encodes it with PyAV, chunk by
chunk (docs/compat.md, "Formats").
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.resample import Resampler, pcm_bytes, to_s16

__all__ = ["ENCODINGS", "OutputFormat", "AudioEncoder", "FormatError", "engine_sample_bytes"]

# encoding -> (PyAV codec, container format or None for raw packets)
_CODECS: dict[str, tuple[str, str | None]] = {
    "mulaw": ("pcm_mulaw", None),
    "alaw": ("pcm_alaw", None),
    "mp3": ("libmp3lame", "mp3"),
    "opus": ("libopus", "ogg"),
    "aac": ("aac", "adts"),
    "flac": ("flac", "flac"),
    "wav": ("pcm_s16le", "wav"),
    "wav_mulaw": ("pcm_mulaw", "wav"),
    "wav_alaw": ("pcm_alaw", "wav"),
}
ENCODINGS = ("pcm_s16le", "pcm_f32le", *_CODECS)
_OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
_MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)


class FormatError(ValueError):
    """A format the encoders cannot make; the message names what is accepted."""


@dataclass(frozen=True)
class OutputFormat:
    encoding: str  # one of ENCODINGS
    sample_rate: int
    bitrate: int = 0  # bits per second for mp3/opus/aac; 0: the codec's default

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise FormatError(f"encoding must be one of {list(ENCODINGS)}, got {self.encoding!r}")
        if not 8000 <= self.sample_rate <= 48000:
            raise FormatError(f"sample rate must be in [8000, 48000], got {self.sample_rate}")
        if self.encoding == "opus" and self.sample_rate not in _OPUS_RATES:
            raise FormatError(f"opus takes sample rates {list(_OPUS_RATES)}, got {self.sample_rate}")
        if self.encoding == "mp3" and self.sample_rate not in _MP3_RATES:
            raise FormatError(f"mp3 takes sample rates {list(_MP3_RATES)}, got {self.sample_rate}")

    @property
    def bytes_per_sample(self) -> int:
        """For raw formats: the bytes of one sample (0 for compressed ones)."""
        return {"pcm_s16le": 2, "pcm_f32le": 4, "mulaw": 1, "alaw": 1}.get(self.encoding, 0)


class _Sink(io.RawIOBase):
    """A write-only, non-seekable file for PyAV's muxer: what it writes is taken by ``take``."""

    def __init__(self) -> None:
        super().__init__()
        self._parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


def _is_passthrough(fmt: OutputFormat, input_rate: int) -> bool:
    return fmt.encoding == "pcm_s16le" and fmt.sample_rate == input_rate


def engine_sample_bytes(fmt: OutputFormat, input_rate: int) -> int:
    """Bytes a sample of the engine's PCM takes in a stream encoded to ``fmt`` (2: s16 passed
    through; 4: f32 for the encoder), to count a native audio message's samples."""
    return 2 if _is_passthrough(fmt, input_rate) else 4


class AudioEncoder:
    """One stream's conversion from the engine's PCM to ``fmt``. Not thread-safe."""

    def __init__(self, fmt: OutputFormat, *, input_rate: int) -> None:
        self.fmt = fmt
        self.input_rate = input_rate
        # 24 kHz s16 out of a 24 kHz engine: bytes pass through untouched
        self.is_passthrough = _is_passthrough(fmt, input_rate)
        self._resampler = (Resampler(input_rate, fmt.sample_rate)
                           if fmt.sample_rate != input_rate else None)
        self._codec: Any = None
        self._container: Any = None
        self._stream: Any = None
        self._sink: _Sink | None = None
        self._pts = 0
        self._is_finished = False
        if fmt.encoding in _CODECS:
            self._open_codec()

    @property
    def engine_format(self) -> str:
        """The PCM format to ask the engine for."""
        return "pcm_s16le" if self.is_passthrough else "pcm_f32le"

    def _open_codec(self) -> None:
        import av  # PyAV when a stream first needs an encoder (not for PCM: see _out)

        codec, container = _CODECS[self.fmt.encoding]
        rate = self.fmt.sample_rate
        if container is None:
            ctx = av.CodecContext.create(codec, "w")
            ctx.sample_rate = rate
            ctx.format = "s16"
            ctx.layout = "mono"
            ctx.open()
            self._codec = ctx
            return
        self._sink = _Sink()
        # flush_packets: each muxed packet is written out at once, not held in a 32 KiB buffer
        self._container = av.open(self._sink, mode="w", format=container,
                                  options={"flush_packets": "1"})
        stream = self._container.add_stream(codec, rate=rate, layout="mono")
        if self.fmt.bitrate and self.fmt.encoding in ("mp3", "opus", "aac"):
            stream.bit_rate = self.fmt.bitrate
        self._stream = stream

    def encode(self, pcm: bytes) -> bytes:
        """One chunk of engine PCM (``engine_format``) in, the bytes ready so far out."""
        if self.is_passthrough:
            return pcm
        x = np.frombuffer(pcm, dtype="<f4")
        if self._resampler is not None:
            x = self._resampler.push(x)
        return self._out(x)

    def finish(self) -> bytes:
        """The stream's last bytes: the resampler's and encoder's tails, the container's end.
        Idempotent (later calls return ``b""``)."""
        if self._is_finished or self.is_passthrough:
            self._is_finished = True
            return b""
        self._is_finished = True
        tail = b""
        if self._resampler is not None:
            tail = self._out(self._resampler.drain())
        return tail + self._flush_codec()

    def drain(self) -> bytes:
        """For raw formats (PCM, G.711): the samples the resampler still holds, out now (a
        flush's audio is then all sent); the resampler starts afresh. Containers: ``b""``."""
        if self._resampler is None or self._is_finished or self._container is not None:
            return b""
        return self._out(self._resampler.drain())

    def close(self) -> None:
        """Free the codec without finishing (a cancelled stream)."""
        self._is_finished = True
        if self._container is not None:
            try:
                self._container.close()
            except Exception:  # nothing was muxed: closing an unstarted container may complain
                pass
            self._container = None

    def _out(self, x: np.ndarray) -> bytes:
        enc = self.fmt.encoding
        if enc in ("pcm_f32le", "pcm_s16le"):
            return pcm_bytes(x, enc)
        samples = to_s16(x)
        if samples.size == 0:
            return b""
        import av

        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.fmt.sample_rate
        frame.pts = self._pts
        self._pts += samples.size
        if self._codec is not None:
            return b"".join(bytes(pkt) for pkt in self._codec.encode(frame))
        for pkt in self._stream.encode(frame):
            self._container.mux(pkt)
        return self._sink.take() if self._sink is not None else b""

    def _flush_codec(self) -> bytes:
        if self._codec is not None:
            return b"".join(bytes(pkt) for pkt in self._codec.encode(None))
        if self._container is None:
            return b""
        for pkt in self._stream.encode(None):
            self._container.mux(pkt)
        self._container.close()
        self._container = None
        return self._sink.take() if self._sink is not None else b""
