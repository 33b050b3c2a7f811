"""Output sample rates other than the model's: one stream's streaming resampler (soxr) and the
PCM conversions around it. The native protocol's ``start.sample_rate`` (``gateway.session``)
and the compatibility adapters' encoders (``gateway.compat.audio_out``) both use it.

soxr's streaming resampler holds back its filter's delay (at HQ, 24 kHz in: about 26 ms of
audio at 48 kHz out, 33 ms at 16 kHz, 64 ms at 8 kHz) until more audio comes or ``drain``
pushes it out; its output equals soxr's one-shot resampling of the same audio. A chunk costs
tens of microseconds (docs/protocol.md, "Sample rates").
"""

from __future__ import annotations

import numpy as np
import soxr

__all__ = ["QUALITY", "ENGINE_FORMAT", "to_s16", "pcm_bytes", "Resampler", "PcmResampler"]

QUALITY = "HQ"  # soxr's recipe: linear phase, a steep filter
ENGINE_FORMAT = "pcm_f32le"  # what a resampled stream asks the engine for: no rounding twice


def to_s16(x: np.ndarray) -> np.ndarray:
    """float32 [-1, 1] -> int16, the engine's own conversion (engine.core): scale, clip, truncate."""
    return np.clip(x * np.float32(32767.0), -32767.0, 32767.0).astype("<i2")


def pcm_bytes(x: np.ndarray, fmt: str) -> bytes:
    """float32 samples as ``pcm_f32le`` or ``pcm_s16le`` bytes."""
    if fmt == "pcm_f32le":
        return np.ascontiguousarray(x, dtype="<f4").tobytes()
    if fmt == "pcm_s16le":
        return to_s16(x).tobytes()
    raise ValueError(f"fmt must be pcm_f32le or pcm_s16le, got {fmt!r}")


class Resampler:
    """One stream's streaming resampler, float32 mono in and out. Not thread-safe."""

    def __init__(self, input_rate: int, output_rate: int) -> None:
        if input_rate <= 0 or output_rate <= 0:
            raise ValueError(f"rates must be positive, got {input_rate} -> {output_rate}")
        self.input_rate = input_rate
        self.output_rate = output_rate
        self._stream = soxr.ResampleStream(input_rate, output_rate, 1, dtype="float32",
                                           quality=QUALITY)

    def push(self, x: np.ndarray) -> np.ndarray:
        """One chunk in; the samples ready so far out (fewer than the ratio says, or none, while
        the filter fills)."""
        return self._stream.resample_chunk(x, last=False)

    def drain(self) -> np.ndarray:
        """What it still holds, out now (a segment's end: no audio is left behind); then it
        starts afresh, as for a new signal."""
        tail = self._stream.resample_chunk(np.zeros(0, np.float32), last=True)
        self._stream.clear()
        return tail


class PcmResampler:
    """The native protocol's resampling of one stream: engine PCM (``ENGINE_FORMAT``) at the
    model's rate in, ``fmt`` bytes at ``output_rate`` out. Not thread-safe."""

    def __init__(self, *, input_rate: int, output_rate: int, fmt: str) -> None:
        pcm_bytes(np.zeros(0, np.float32), fmt)  # checks fmt
        self.fmt = fmt
        self._resampler = Resampler(input_rate, output_rate)

    def resample(self, pcm: bytes) -> bytes:
        """One engine chunk in, the bytes ready so far out (maybe none)."""
        return pcm_bytes(self._resampler.push(np.frombuffer(pcm, dtype="<f4")), self.fmt)

    def drain(self) -> bytes:
        """The held tail's bytes (for a flush or the stream's end); it then starts afresh."""
        return pcm_bytes(self._resampler.drain(), self.fmt)
