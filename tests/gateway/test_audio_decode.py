"""gateway.audio_decode: uploads in every accepted format become mono float32 at their rate; bad ones are refused by name."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from gateway.audio_decode import AudioRejected, check_audio, decode_audio
from tests.gateway.audio_files import CODECS, make_audio, tone


@pytest.mark.parametrize("fmt", sorted(CODECS))
@pytest.mark.parametrize("channels", [1, 2])
def test_every_accepted_format_decodes_to_mono_at_its_rate(fmt: str, channels: int) -> None:
    """WAV, FLAC, MP3 and OGG (Opus), mono or stereo, decode to mono float32 at the file's rate
    with the duration and level of the tone written (channels are averaged, not summed)."""
    rate = 48000 if fmt == "ogg" else 22050
    audio = decode_audio(make_audio(fmt, tone(2.0, rate, channels=channels), rate),
                         max_duration_s=30)
    assert audio.samples.dtype == np.float32 and audio.samples.ndim == 1
    assert audio.sample_rate == rate
    assert abs(audio.duration_s - 2.0) < 0.1  # codecs add priming and padding
    assert abs(audio.rms_dbfs - 20 * np.log10(0.3 / np.sqrt(2))) < 1.0


def test_a_rate_above_48k_is_resampled_to_48k() -> None:
    """A 96 kHz file comes out at 48 kHz with its duration kept; 44.1 kHz stays 44.1 kHz."""
    audio = decode_audio(make_audio("wav", tone(1.5, 96000), 96000), max_duration_s=30)
    assert audio.sample_rate == 48000 and audio.samples.size == 72000
    assert decode_audio(make_audio("wav", tone(1.5, 44100), 44100), max_duration_s=30).sample_rate == 44100


@pytest.mark.parametrize("data", [b"", b"hello, I am not audio", b"\x00" * 5000,
                                  b"RIFF\x10\x00\x00\x00WAVEfmt "])
def test_what_is_not_audio_is_refused_as_not_audio(data: bytes) -> None:
    """Empty, text, zeros and a truncated WAV header raise not_audio."""
    with pytest.raises(AudioRejected) as info:
        decode_audio(data, max_duration_s=30)
    assert info.value.code == "not_audio"


def test_other_containers_are_refused_by_name() -> None:
    """An AIFF file (audio, but not an accepted container) is refused, naming what is accepted."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="aiff") as out:
        stream = out.add_stream("pcm_s16be", rate=16000)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 16000), np.int16), format="s16", layout="mono")
        frame.sample_rate = 16000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    with pytest.raises(AudioRejected) as info:
        decode_audio(buf.getvalue(), max_duration_s=30)
    assert info.value.code == "unsupported_audio_format" and "WAV, FLAC, MP3, OGG" in info.value.message


def test_decoding_stops_at_the_duration_limit() -> None:
    """A clip past max_duration_s raises audio_too_long naming the limit and its flag."""
    with pytest.raises(AudioRejected) as info:
        decode_audio(make_audio("flac", tone(12.0, 8000), 8000), max_duration_s=10)
    assert info.value.code == "audio_too_long" and "10 s" in info.value.message
    assert "--max-voice-duration-s" in info.value.message


def test_check_refuses_short_and_silent_clips() -> None:
    """Below the minimum duration: audio_too_short; below the level: audio_silent; else nothing."""
    short = decode_audio(make_audio("wav", tone(0.5, 16000), 16000), max_duration_s=30)
    quiet = decode_audio(make_audio("wav", tone(2.0, 16000, amplitude=0.001), 16000), max_duration_s=30)
    fine = decode_audio(make_audio("wav", tone(2.0, 16000), 16000), max_duration_s=30)
    for audio, code in ((short, "audio_too_short"), (quiet, "audio_silent")):
        with pytest.raises(AudioRejected) as info:
            check_audio(audio, min_duration_s=1.0, min_rms_dbfs=-50.0)
        assert info.value.code == code
    check_audio(fine, min_duration_s=1.0, min_rms_dbfs=-50.0)


def test_float_wav_with_out_of_range_values_is_clipped() -> None:
    """A float WAV holding NaN and values past full scale decodes into [-1, 1]."""
    buf = io.BytesIO()
    samples = np.full((1, 16000), 3.0, np.float32)
    samples[0, :10] = np.nan
    with av.open(buf, mode="w", format="wav") as out:
        stream = out.add_stream("pcm_f32le", rate=16000)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(samples, format="flt", layout="mono")
        frame.sample_rate = 16000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    audio = decode_audio(buf.getvalue(), max_duration_s=30)
    assert np.all(np.isfinite(audio.samples)) and audio.samples.max() <= 1.0


def test_the_gateway_starts_without_pyav_loaded() -> None:
    """PyAV (FFmpeg) loads on the first upload or encoded stream, not when the server imports:
    a fresh process that cannot import ``av`` still imports the whole gateway."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['av'] = None\n"
            "import gateway.cli, gateway.server, gateway.compat, gateway.voice_routes\n"
            "import gateway.audio_decode, gateway.compat.audio_out\n"
            "assert sys.modules['av'] is None")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
