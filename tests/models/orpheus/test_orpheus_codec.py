"""SnacDecoder against the snac package, and streaming against whole-sequence decoding."""

from __future__ import annotations

import numpy as np
import pytest
import snac
import torch

from models.orpheus.codec import SnacDecoder, StreamingDecoder, decode_requests
from models.orpheus.loader import SNAC_24KHZ_CONFIG
from models.orpheus.tokens import codes_to_frames

# The real 24 kHz layout (rates, strides, kernel sizes: the receptive field) at narrow widths,
# so CPU tests stay fast. One test below runs the full-width model.
SMALL = {**SNAC_24KHZ_CONFIG, "encoder_dim": 4, "decoder_dim": 64}
# Streaming and whole-sequence decoding differ only by float rounding (measured ~1e-6).
STREAM_ATOL = 1e-4


def _snac(config, seed=0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = snac.SNAC(**config).eval()
        with torch.no_grad():  # weight-norm gains and snake alphas away from their init values
            for name, p in model.named_parameters():
                if name.endswith("alpha") or "original0" in name:
                    p.mul_(1 + 0.3 * torch.rand_like(p))
    return model


def _codes(n, seed=0, batch=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 4096, (batch, n * k), generator=g) for k in (1, 2, 4)]


@pytest.fixture(scope="module")
def small():
    return _snac(SMALL)


def test_decode_equals_snac_package_full_width():
    """With the package's random noise and the same seed, decode equals SNAC.decode (24 kHz)."""
    model = _snac(SNAC_24KHZ_CONFIG)
    dec = SnacDecoder(model, noise="random")
    codes = _codes(2)
    torch.manual_seed(7)
    with torch.no_grad():
        ref = model.decode(codes)[:, 0]  # [1, 4096]
    torch.manual_seed(7)
    ours = dec.decode(codes)
    assert ours.shape == (1, 2 * 2048) and ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fold", [False, True])
def test_decode_batch_equals_snac_package(small, fold):
    """A batch of 3 sequences decodes like the package (noise drawn identically), folded or not."""
    dec = SnacDecoder(small, noise="random", fold_weight_norm=fold)
    codes = _codes(5, seed=1, batch=3)
    torch.manual_seed(3)
    with torch.no_grad():
        ref = small.decode(codes)[:, 0]
    torch.manual_seed(3)
    torch.testing.assert_close(dec.decode(codes), ref, atol=1e-5, rtol=0)


def test_noise_free_decode_equals_package_with_noise_disabled(small):
    """noise='none' equals the package when its noise blocks are silenced (zero gain)."""
    silent = _snac(SMALL)
    with torch.no_grad():
        for m in silent.decoder.modules():
            if type(m).__name__ == "NoiseBlock":
                m.linear.parametrizations.weight.original0.zero_()
    codes = _codes(4, seed=2)
    with torch.no_grad():
        ref = silent.decode(codes)[:, 0]
    torch.testing.assert_close(SnacDecoder(silent, noise="none").decode(codes), ref, atol=1e-5, rtol=0)


def test_fixed_noise_is_keyed_by_absolute_position(small):
    """A window starting at frame s decodes like the same frames inside a whole sequence."""
    dec = SnacDecoder(small)
    codes = _codes(10, seed=3)
    full = dec.decode(codes)[0]
    s, w = 3, 7  # frames [3, 10): right edge is the true end, left edge masked off
    win = dec.decode_windows(*[c[:, s * k:(s + w) * k] for c, k in zip(codes, (1, 2, 4))],
                             torch.tensor([s]))[0]
    # Interior samples (more than one receptive field from the window's left edge) agree.
    torch.testing.assert_close(win[5120:], full[s * 2048 + 5120:], atol=STREAM_ATOL, rtol=0)


def test_valid_range_mask_equals_decoding_only_those_frames(small):
    """Masking frames outside [a, b) gives the audio of decoding frames a..b-1 alone."""
    dec = SnacDecoder(small)
    codes = _codes(8, seed=4)
    a, b = 2, 6
    alone = dec.decode_windows(*[c[:, a * k:b * k] for c, k in zip(codes, (1, 2, 4))], torch.tensor([a]))
    masked = dec.decode_windows(*codes, torch.tensor([0]), torch.tensor([a]), torch.tensor([b]))
    torch.testing.assert_close(masked[:, a * 2048:b * 2048], alone, atol=STREAM_ATOL, rtol=0)


def _stream(dec, codes, **kw):
    frames = codes_to_frames(*codes)[0]  # [n, 7]
    sd = StreamingDecoder(dec, **kw)
    chunks = [sd.push(f) for f in frames]
    chunks.append(sd.flush())
    return chunks


@pytest.mark.parametrize("n", [1, 3, 8])
def test_streaming_equals_whole_sequence(small, n):
    """Streaming emits every sample exactly once and equals the whole decode, edges included."""
    dec = SnacDecoder(small)
    codes = _codes(n, seed=10 + n)
    chunks = _stream(dec, codes)
    out = np.concatenate(chunks)
    full = dec.decode(codes)[0].numpy()
    assert out.shape == full.shape == (n * 2048,)
    err = float(np.abs(out - full).max())
    assert err < STREAM_ATOL, err


def test_streaming_chunking_and_first_audio_latency(small):
    """Defaults: nothing before frame 3, then 1024 samples, then 2048 per frame; tail at flush."""
    chunks = _stream(SnacDecoder(small), _codes(6, seed=5))
    assert [len(c) for c in chunks] == [0, 0, 1024, 2048, 2048, 2048, 5120]


def test_small_lookahead_is_approximate_but_sample_exact_in_count(small):
    """A 1-frame lookahead emits each sample once; error stays bounded (not exact)."""
    dec = SnacDecoder(small)
    codes = _codes(6, seed=6)
    chunks = _stream(dec, codes, window_frames=4, lookahead_samples=2048)
    assert [len(c) for c in chunks][:2] == [0, 2048]
    out = np.concatenate(chunks)
    assert out.shape == (6 * 2048,)
    assert np.abs(out - dec.decode(codes)[0].numpy()).max() < 1.0


def test_batched_requests_equal_each_stream_alone(small):
    """decode_requests over several streams at different stages equals decoding each alone."""
    dec = SnacDecoder(small)
    streams = [_codes(n, seed=20 + n) for n in (1, 3, 5)]
    alone = [np.concatenate(_stream(dec, c)) for c in streams]
    sds = [StreamingDecoder(dec) for _ in streams]
    frames = [codes_to_frames(*c)[0] for c in streams]
    outs: list[list[np.ndarray]] = [[] for _ in streams]
    for step in range(6):
        reqs, idx = [], []
        for i, (sd, f) in enumerate(zip(sds, frames)):
            if step < len(f):
                r = sd.push_frame(f[step])
            elif not sd.is_finished:
                r = sd.finish()
            else:
                r = None
            if r is not None:
                reqs.append(r)
                idx.append(i)
        for i, pcm in zip(idx, decode_requests(dec, reqs)):
            outs[i].append(pcm)
    for got, want in zip(outs, alone):
        np.testing.assert_allclose(np.concatenate(got), want, atol=STREAM_ATOL, rtol=0)


def test_streaming_rejects_bad_frames_and_settings(small):
    """Out-of-range codes, wrong frame size and impossible window settings raise ValueError."""
    sd = StreamingDecoder(SnacDecoder(small))
    with pytest.raises(ValueError):
        sd.push_frame([0, 1, 2, 3, 4, 5, 4096])
    with pytest.raises(ValueError):
        sd.push_frame([0, 1, 2])
    with pytest.raises(ValueError, match="lookahead_samples"):
        StreamingDecoder(window_frames=2, lookahead_samples=4096)


def test_steeper_ramp_reaches_the_full_lookahead_in_fewer_frames(small):
    """ramp_step_samples=1536: 1024, 512, 512, 1024 samples in frames 1-4, then 2048 per frame;
    every sample once, exact from 3072 on (samples there saw the full lookahead); never behind
    the exact schedule; a step below 1 is refused."""
    dec = SnacDecoder(small)
    codes = _codes(9, seed=12)
    chunks = _stream(dec, codes, first_lookahead_samples=1024, ramp_step_samples=1536)
    assert [len(c) for c in chunks] == [1024, 512, 512, 1024] + [2048] * 5 + [5120]
    out = np.concatenate(chunks)
    full = dec.decode(codes)[0].numpy()
    assert out.shape == full.shape
    assert float(np.abs(out[3072:] - full[3072:]).max()) < STREAM_ATOL
    exact_out = np.cumsum([len(c) for c in _stream(dec, codes)])
    assert (np.cumsum([len(c) for c in chunks]) >= exact_out).all()
    with pytest.raises(ValueError, match="ramp_step_samples"):
        StreamingDecoder(ramp_step_samples=0)


def test_fast_start_ramp_emits_first_samples_after_one_frame(small):
    """Fast start: 1024 samples per frame from frame 1, then exact; every sample once, exact past 4096."""
    dec = SnacDecoder(small)
    codes = _codes(9, seed=11)
    chunks = _stream(dec, codes, first_lookahead_samples=1024)
    assert [len(c) for c in chunks] == [1024] * 5 + [2048] * 4 + [5120]
    out = np.concatenate(chunks)
    full = dec.decode(codes)[0].numpy()
    assert out.shape == full.shape
    assert float(np.abs(out[4096:] - full[4096:]).max()) < STREAM_ATOL
    exact_lens = [len(c) for c in _stream(dec, codes)]
    ramp_out, exact_out = np.cumsum([len(c) for c in chunks]), np.cumsum(exact_lens)
    assert (ramp_out >= exact_out).all()  # never behind the exact schedule
