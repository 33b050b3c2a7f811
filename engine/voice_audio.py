"""Reading a registered voice's audio for a model: the voice store's WAV checked against its
record, as float32 mono at the rate the model's encoder wants (resampled with soxr)."""

from __future__ import annotations

import hashlib
import wave
from typing import Any

import numpy as np

from engine.backend import OptionError

__all__ = ["read_voice"]


def read_voice(voice_ref: Any, sample_rate: int) -> np.ndarray:
    """float32 mono samples of ``voice_ref`` (an ``engine.messages.VoiceRef``) at ``sample_rate``.

    Raises ``OptionError("voice_unavailable", ...)`` (the file is gone, unreadable, or not the
    one the store recorded: its sha256 or rate differ)."""
    name = voice_ref.voice_id
    try:
        with open(voice_ref.path, "rb") as f:
            data = f.read()
        with wave.open(voice_ref.path, "rb") as w:
            rate, width, channels, n = w.getframerate(), w.getsampwidth(), w.getnchannels(), w.getnframes()
            frames = w.readframes(n)
    except (OSError, wave.Error, EOFError) as exc:
        raise OptionError("voice_unavailable", f"voice {name!r} cannot be read: {exc}") from None
    if hashlib.sha256(data).hexdigest() != voice_ref.sha256 or rate != voice_ref.sample_rate:
        raise OptionError("voice_unavailable", f"voice {name!r}: its file does not match the store's record")
    if width != 2:
        raise OptionError("voice_unavailable", f"voice {name!r}: expected 16-bit PCM, got {8 * width}-bit")
    pcm = np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0
    if channels > 1:
        pcm = pcm.reshape(-1, channels).mean(axis=1)
    if rate != sample_rate:
        import soxr

        pcm = soxr.resample(pcm, rate, sample_rate).astype(np.float32, copy=False)
    return pcm
