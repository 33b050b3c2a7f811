"""Incremental decoders for HTTP audio bodies, raw PCM or a streamed WAV, that count whole sample
frames as network reads arrive."""

from __future__ import annotations

import struct

import numpy as np

__all__ = ["PcmDecoder", "WavStreamDecoder", "pcm_to_float"]

_FORMATS = {("pcm", 2): "pcm_s16le", ("float", 4): "pcm_f32le"}


def pcm_to_float(pcm: bytes, fmt: str) -> np.ndarray:
    """PCM bytes -> float32 [n] in [-1, 1]."""
    if fmt == "pcm_s16le":
        return np.frombuffer(pcm[: len(pcm) // 2 * 2], dtype="<i2").astype(np.float32) / 32768.0
    if fmt == "pcm_f32le":
        return np.frombuffer(pcm[: len(pcm) // 4 * 4], dtype="<f4").astype(np.float32)
    raise ValueError(f"unknown PCM format {fmt!r}")


class PcmDecoder:
    """Raw little-endian PCM of a known format, rate and channel count."""

    def __init__(self, *, sample_rate: int, fmt: str = "pcm_s16le", channels: int = 1) -> None:
        if fmt not in ("pcm_s16le", "pcm_f32le"):
            raise ValueError(f"unknown PCM format {fmt!r}")
        self.sample_rate = sample_rate
        self.format = fmt
        self.channels = channels
        self.frame_bytes = (2 if fmt == "pcm_s16le" else 4) * channels
        self._pending = 0  # bytes of a partial frame

    @property
    def is_ready(self) -> bool:
        return True

    def feed(self, data: bytes) -> tuple[int, bytes]:
        """Bytes in; (whole frames completed, the PCM bytes among ``data``) out."""
        total = self._pending + len(data)
        frames, self._pending = divmod(total, self.frame_bytes)
        return frames, data


class WavStreamDecoder:
    """A WAV body read as it arrives: parses RIFF chunks up to ``data``, then counts frames."""

    def __init__(self) -> None:
        self._header = bytearray()
        self._pcm: PcmDecoder | None = None
        self.sample_rate: int | None = None
        self.format: str | None = None

    @property
    def is_ready(self) -> bool:
        return self._pcm is not None

    def feed(self, data: bytes) -> tuple[int, bytes]:
        if self._pcm is not None:
            return self._pcm.feed(data)
        self._header += data
        rest = self._parse_header()
        if rest is None:
            return 0, b""
        return self._pcm.feed(rest)  # type: ignore[union-attr]

    def _parse_header(self) -> bytes | None:
        """When the header is complete: set up the PCM decoder, return the bytes after it."""
        h = self._header
        if len(h) < 12:
            return None
        if h[:4] != b"RIFF" or h[8:12] != b"WAVE":
            raise ValueError("response is not a WAV (RIFF/WAVE) stream")
        pos = 12
        fmt: tuple[int, int, int, int] | None = None
        while len(h) >= pos + 8:
            cid = bytes(h[pos:pos + 4])
            (size,) = struct.unpack_from("<I", h, pos + 4)
            body = pos + 8
            if cid == b"data":  # its size is not read: streamed WAVs often say 0 or 0xFFFFFFFF
                if fmt is None:
                    raise ValueError("WAV stream: data chunk before fmt chunk")
                tag, channels, rate, bits = fmt
                kind = "float" if tag == 3 else "pcm" if tag == 1 else None
                name = _FORMATS.get((kind, bits // 8)) if kind else None
                if name is None:
                    raise ValueError(f"WAV stream: unsupported format tag {tag}, {bits} bits")
                self.sample_rate, self.format = rate, name
                self._pcm = PcmDecoder(sample_rate=rate, fmt=name, channels=channels)
                return bytes(h[body:])
            if len(h) < body + size:
                return None
            if cid == b"fmt ":
                tag, channels, rate = struct.unpack_from("<HHI", h, body)
                (bits,) = struct.unpack_from("<H", h, body + 14)
                if tag == 0xFFFE and size >= 26:  # WAVE_FORMAT_EXTENSIBLE: the subformat's tag
                    (tag,) = struct.unpack_from("<H", h, body + 24)
                fmt = (tag, channels, rate, bits)
            pos = body + size + (size & 1)  # chunks are padded to even sizes
        return None
