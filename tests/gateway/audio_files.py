"""Audio files made in memory for the voice-store tests (PyAV's encoders), in every accepted format."""

from __future__ import annotations

import io

import av
import numpy as np

__all__ = ["CODECS", "make_audio", "tone"]

# container -> (codec, sample format it takes)
CODECS = {"wav": ("pcm_s16le", "s16"), "flac": ("flac", "s16"), "mp3": ("libmp3lame", "fltp"),
          "ogg": ("libopus", "flt")}


def tone(seconds: float, rate: int, *, channels: int = 1, amplitude: float = 0.3,
         hz: float = 220.0) -> np.ndarray:
    """A sine, float32 [channels, n]."""
    t = np.arange(round(seconds * rate)) / rate
    wave = (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.float32)
    return np.tile(wave, (channels, 1))


def make_audio(fmt: str, samples: np.ndarray, rate: int) -> bytes:
    """Encode float32 [channels, n] as a file of container ``fmt`` (a key of CODECS)."""
    codec, sample_fmt = CODECS[fmt]
    channels = samples.shape[0]
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.layout = "mono" if channels == 1 else "stereo"
        frame_size = 960 if fmt == "ogg" else 1152
        for start in range(0, samples.shape[1], frame_size):
            block = samples[:, start:start + frame_size]
            if sample_fmt == "s16":
                data = (np.clip(block, -1, 1) * 32767).astype(np.int16)
                data = data.T.reshape(1, -1)  # packed: [1, n * channels]
            elif sample_fmt == "flt":
                data = np.ascontiguousarray(block.T.reshape(1, -1))
            else:  # planar float
                data = np.ascontiguousarray(block)
            frame = av.AudioFrame.from_ndarray(data, format=sample_fmt, layout=stream.layout.name)
            frame.sample_rate = rate
            frame.pts = start
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()
