"""gateway.compat.audio_out: every encoding and rate the vendor protocols list, checked by decoding with FFmpeg."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.compat.audio_out import AudioEncoder, FormatError, OutputFormat
from tests.gateway.compat.conftest import alaw, decode, mulaw

RATE = 24000


def _tone(seconds: float = 1.0, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def _encode(fmt: OutputFormat, x: np.ndarray, *, chunk: int = 2400) -> bytes:
    enc = AudioEncoder(fmt, input_rate=RATE)
    if enc.engine_format == "pcm_s16le":
        pcm = [np.clip(x[i:i + chunk] * 32767, -32767, 32767).astype("<i2").tobytes()
               for i in range(0, x.size, chunk)]
    else:
        pcm = [x[i:i + chunk].astype("<f4").tobytes() for i in range(0, x.size, chunk)]
    return b"".join(enc.encode(part) for part in pcm) + enc.finish()


def _peak_hz(y: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(y * np.hanning(y.size)))
    return float(np.argmax(spectrum) * rate / y.size)


@pytest.mark.parametrize("rate", [8000, 16000, 22050, 24000, 44100, 48000])
def test_raw_pcm_at_every_rate_keeps_length_and_pitch(rate: int) -> None:
    """s16le and f32le at each rate: the length scales with the rate (soxr) and a 440 Hz tone stays 440 Hz."""
    x = _tone()
    for encoding, dtype, scale in (("pcm_s16le", "<i2", 32767.0), ("pcm_f32le", "<f4", 1.0)):
        y = np.frombuffer(_encode(OutputFormat(encoding, rate), x), dtype) / scale
        assert abs(y.size - rate) <= 2
        assert abs(_peak_hz(y, rate) - 440) < 3


@pytest.mark.parametrize("encoding,decoder", [("mulaw", mulaw), ("alaw", alaw)])
def test_g711_decodes_to_the_signal(encoding: str, decoder: object) -> None:
    """μ-law and A-law at 8 kHz: one byte a sample, FFmpeg decodes them back close to the tone."""
    x = _tone()
    data = _encode(OutputFormat(encoding, 8000), x)
    assert abs(len(data) - 8000) <= 2
    y = decoder(data)  # type: ignore[operator]
    assert abs(_peak_hz(y, 8000) - 440) < 3
    assert np.max(np.abs(y)) == pytest.approx(0.5, abs=0.05)


@pytest.mark.parametrize("fmt,decoded_rate", [
    (OutputFormat("mp3", 44100, 128000), 44100), (OutputFormat("mp3", 22050, 32000), 22050),
    (OutputFormat("opus", 24000, 64000), 48000), (OutputFormat("aac", 24000), 24000),
    (OutputFormat("flac", 16000), 16000), (OutputFormat("wav", 16000), 16000),
    (OutputFormat("wav_mulaw", 8000), 8000), (OutputFormat("wav_alaw", 8000), 8000)])
def test_containers_decode_at_their_rate(fmt: OutputFormat, decoded_rate: int) -> None:
    """MP3, Ogg Opus, ADTS AAC, FLAC and WAV (PCM and G.711), encoded chunk by chunk, decode to about a second of the tone."""
    audio, rate = decode(_encode(fmt, _tone()))
    assert rate == decoded_rate
    assert abs(audio.size / rate - 1.0) < 0.1
    assert abs(_peak_hz(audio, rate) - 440) < 5


def test_drain_sends_what_the_resampler_holds() -> None:
    """drain (a flush) returns the resampler's tail for raw formats; the samples then add up to the input's length."""
    enc = AudioEncoder(OutputFormat("mulaw", 8000), input_rate=RATE)
    x = _tone(0.5).tobytes()
    first = enc.encode(x) + enc.drain()
    assert abs(len(first) - 4000) <= 2
    second = enc.encode(x) + enc.finish()
    assert abs(len(second) - 4000) <= 2


def test_unknown_formats_name_what_is_accepted() -> None:
    """An unknown encoding or a rate a codec cannot take is a FormatError listing the choices."""
    with pytest.raises(FormatError, match="pcm_s16le"):
        OutputFormat("pcm_s24le", 24000)
    with pytest.raises(FormatError, match="48000"):
        OutputFormat("opus", 44100)
    with pytest.raises(FormatError, match="8000"):
        OutputFormat("pcm_s16le", 96000)
