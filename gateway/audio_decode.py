"""Decode an uploaded voice sample (WAV, FLAC, MP3, OGG) into mono float32, and check it.
Decoding stops once the audio passes the duration limit; it blocks, so run it off the event
loop (docs/architecture.md, "Gateway").
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import soxr

if TYPE_CHECKING:
    import av

__all__ = ["ACCEPTED_FORMATS", "MAX_SAMPLE_RATE_HZ", "AudioRejected", "DecodedAudio",
           "decode_audio", "check_audio"]

# FFmpeg's demuxer names for the containers accepted (others are refused before decoding).
ACCEPTED_FORMATS = {"wav": "WAV", "flac": "FLAC", "mp3": "MP3", "ogg": "OGG"}
MAX_SAMPLE_RATE_HZ = 48_000


class AudioRejected(ValueError):
    """The upload is not usable; ``code`` names the limit (an HTTP error code in the API)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class DecodedAudio:
    samples: np.ndarray  # float32 [n], mono, in [-1, 1]
    sample_rate: int

    @property
    def duration_s(self) -> float:
        return self.samples.size / self.sample_rate

    @property
    def rms_dbfs(self) -> float:
        """Level of the whole clip relative to full scale (-inf for digital silence)."""
        if not self.samples.size:
            return -math.inf
        rms = float(np.sqrt(np.mean(np.square(self.samples, dtype=np.float64))))
        return 20.0 * math.log10(rms) if rms > 0 else -math.inf


def decode_audio(data: bytes, *, max_duration_s: float) -> DecodedAudio:
    """Decode ``data`` into mono float32 at its own rate (at most ``MAX_SAMPLE_RATE_HZ``).

    Raises ``AudioRejected``: ``not_audio`` (not a readable audio file, or no audio stream),
    ``unsupported_audio_format`` (a container other than ``ACCEPTED_FORMATS``),
    ``audio_too_long`` (more than ``max_duration_s``).
    """
    import av  # PyAV on the first upload: a server that takes none never loads FFmpeg

    try:
        container = av.open(io.BytesIO(data), mode="r")
    except (av.FFmpegError, ValueError, OSError) as exc:
        raise AudioRejected("not_audio", "the file is not audio that can be decoded "
                            f"({_reason(exc)})") from None
    with container:
        names = set(container.format.name.split(","))
        if not names & ACCEPTED_FORMATS.keys():
            raise AudioRejected("unsupported_audio_format",
                                f"the file is {container.format.long_name or container.format.name}; "
                                f"accepted: {', '.join(ACCEPTED_FORMATS.values())}")
        if not container.streams.audio:
            raise AudioRejected("not_audio", "the file has no audio stream")
        samples, rate = _decode_mono(container, container.streams.audio[0], max_duration_s)
    if rate > MAX_SAMPLE_RATE_HZ:
        samples = soxr.resample(samples, rate, MAX_SAMPLE_RATE_HZ).astype(np.float32, copy=False)
        rate = MAX_SAMPLE_RATE_HZ
    np.nan_to_num(samples, copy=False, nan=0.0, posinf=1.0, neginf=-1.0)
    np.clip(samples, -1.0, 1.0, out=samples)
    return DecodedAudio(samples, rate)


def _decode_mono(container: av.container.InputContainer, stream: av.AudioStream,
                 max_duration_s: float) -> tuple[np.ndarray, int]:
    import av

    resampler: av.AudioResampler | None = None
    rate = 0
    limit = 0
    parts: list[np.ndarray] = []
    num_samples = 0
    try:
        for frame in container.decode(stream):
            if resampler is None:  # the first frame's rate is the clip's
                rate = frame.sample_rate
                limit = math.floor(max_duration_s * rate)
                # planar float in the clip's layout and rate: only the sample format changes
                resampler = av.AudioResampler(format="fltp", layout=frame.layout.name, rate=rate)
            for out in resampler.resample(frame):
                part = out.to_ndarray().mean(axis=0, dtype=np.float32)  # [channels, n] -> [n]
                parts.append(part)
                num_samples += part.size
            if num_samples > limit:
                raise AudioRejected("audio_too_long",
                                    f"the audio is longer than the limit of {max_duration_s:g} s "
                                    "(--max-voice-duration-s)")
        if resampler is not None:
            for out in resampler.resample(None):
                parts.append(out.to_ndarray().mean(axis=0, dtype=np.float32))
    except av.FFmpegError as exc:
        raise AudioRejected("not_audio", f"the audio could not be decoded ({_reason(exc)})") from None
    if not parts:
        raise AudioRejected("not_audio", "the file holds no audio samples")
    samples = np.concatenate(parts).astype(np.float32, copy=False)
    if samples.size > limit:
        raise AudioRejected("audio_too_long", f"the audio is longer than the limit of "
                            f"{max_duration_s:g} s (--max-voice-duration-s)")
    return samples, rate


def _reason(exc: Exception) -> str:
    """FFmpeg's own words for an error, without its error number and file name."""
    return getattr(exc, "strerror", None) or str(exc)


def check_audio(audio: DecodedAudio, *, min_duration_s: float, min_rms_dbfs: float) -> None:
    """Refuse a clip too short to clone from, or silent. Raises ``AudioRejected``."""
    if audio.duration_s < min_duration_s:
        raise AudioRejected("audio_too_short",
                            f"the audio lasts {audio.duration_s:.2f} s; at least {min_duration_s:g} s "
                            "is needed (--min-voice-duration-s)")
    level = audio.rms_dbfs
    if level < min_rms_dbfs:
        shown = "digital silence" if math.isinf(level) else f"{level:.1f} dBFS"
        raise AudioRejected("audio_silent",
                            f"the audio is silent: its level is {shown}, below the "
                            f"{min_rms_dbfs:g} dBFS limit (--min-voice-rms-dbfs)")
