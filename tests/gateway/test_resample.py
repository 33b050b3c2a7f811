"""gateway.resample: the streaming resampler against soxr's one-shot resampling."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from gateway.resample import PcmResampler, Resampler, pcm_bytes


def _tone(n: int, rate: int = 24000) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * 220 * np.arange(n) / rate)).astype(np.float32)  # [n]


@pytest.mark.parametrize("rate", [8000, 16000, 22050, 44100, 48000])
def test_chunks_then_drain_equal_one_shot_resampling(rate: int) -> None:
    """Chunks pushed then drained give soxr.resample of the whole signal (HQ), sample for sample."""
    x = _tone(24000)
    r = Resampler(24000, rate)
    y = np.concatenate([r.push(x[i:i + 960]) for i in range(0, x.size, 960)] + [r.drain()])
    ref = soxr.resample(x, 24000, rate, quality="HQ")
    assert y.size == ref.size == 24000 * rate // 24000
    np.testing.assert_allclose(y, ref, atol=1e-6)


def test_drain_starts_afresh() -> None:
    """After a drain the resampler treats the next chunk as a new signal."""
    x = _tone(4800)
    r = Resampler(24000, 16000)
    first = np.concatenate([r.push(x), r.drain()])
    second = np.concatenate([r.push(x), r.drain()])
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(first, soxr.resample(x, 24000, 16000, quality="HQ"), atol=1e-6)


def test_pcm_resampler_speaks_bytes_in_the_stream_format() -> None:
    """Engine f32 bytes in; s16 bytes out, the engine's s16 conversion of the resampled audio."""
    x = _tone(9600)
    r = PcmResampler(input_rate=24000, output_rate=48000, fmt="pcm_s16le")
    out = r.resample(x.tobytes()) + r.drain()
    ref = soxr.resample(x, 24000, 48000, quality="HQ")
    assert out == pcm_bytes(ref, "pcm_s16le")
    with pytest.raises(ValueError):
        PcmResampler(input_rate=24000, output_rate=16000, fmt="mp3")
