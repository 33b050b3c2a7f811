"""StreamingSnac (stateful, each frame decoded once) against whole-sequence SNAC decoding."""

from __future__ import annotations

import math
import random

import pytest
import torch

from models.orpheus.codec import SnacDecoder
from models.orpheus.loader import SNAC_24KHZ_CONFIG
from models.orpheus.measure_streaming import receptive_field
from models.orpheus.snac_stream import OPEN_END_FRAMES, StreamCursor, StreamingSnac
from models.orpheus.tokens import codes_to_frames
from tests.models.orpheus.test_orpheus_codec import SMALL, STREAM_ATOL, _codes, _snac

F = 2048


@pytest.fixture(scope="module")
def small_dec():
    return SnacDecoder(_snac(SMALL))


def _frames(codes):
    return codes_to_frames(*codes)[0]  # [n, 7]


def _run(ss, streams, *, seed=0):
    """Drive several streams through ``ss``; streams: (slot, first call, frames [n, 7]).

    Each call steps every live stream once (a real frame, or a flush step after its last
    frame), rows in a shuffled order. Returns each stream's emitted audio.
    """
    rng = random.Random(seed)
    cursors: dict[int, StreamCursor] = {}
    out: list[list[torch.Tensor]] = [[] for _ in streams]
    call = 0
    while True:
        rows = []
        for i, (slot, first, frames) in enumerate(streams):
            if call < first or (i in cursors and cursors[i].is_done):
                continue
            if i not in cursors:
                cursors[i] = StreamCursor(ss.delay_samples)
                ss.reset(torch.tensor([slot]))
            cur = cursors[i]
            if cur.num_frames < len(frames):
                frame = frames[cur.num_frames]
                lo, hi = cur.push()
                if cur.num_frames == len(frames):
                    cur.finish()
            else:
                frame, (lo, hi) = torch.zeros(7, dtype=torch.long), cur.flush()
            rows.append((i, slot, frame, cur.end_frames, lo, hi))
        if not rows and all(first < call for _, first, _ in streams):
            return [torch.cat(o) for o in out]
        rng.shuffle(rows)
        if rows:
            audio = ss.step(torch.tensor([r[1] for r in rows]), torch.stack([r[2] for r in rows]),
                            torch.tensor([r[3] for r in rows]))  # [B, 2048]
            assert audio.shape == (len(rows), F) and audio.dtype == torch.float32
            for j, (i, *_, lo, hi) in enumerate(rows):
                out[i].append(audio[j, lo:hi])
        call += 1


@pytest.mark.parametrize("n", [1, 2, 3, 7, 20])
def test_streamed_equals_whole_decode(small_dec, n):
    """Every sample comes out once, tail included, equal to SnacDecoder.decode (fixed noise)."""
    codes = _codes(n, seed=30 + n)
    full = small_dec.decode(codes)[0]
    (out,) = _run(StreamingSnac(small_dec, max_streams=2), [(1, 0, _frames(codes))])
    assert out.shape == full.shape == (n * F,)
    torch.testing.assert_close(out, full, atol=STREAM_ATOL, rtol=0)


def test_streamed_equals_whole_decode_full_width():
    """Full-width SNAC 24 kHz (random weights): streaming equals the whole decode."""
    dec = SnacDecoder(_snac(SNAC_24KHZ_CONFIG))
    codes = _codes(3, seed=5)
    (out,) = _run(StreamingSnac(dec, max_streams=1), [(0, 0, _frames(codes))])
    torch.testing.assert_close(out, dec.decode(codes)[0], atol=STREAM_ATOL, rtol=0)


def test_streamed_equals_snac_package_with_noise_silenced():
    """With the noise blocks at zero gain, streaming equals the snac package's SNAC.decode."""
    silent = _snac(SMALL)
    with torch.no_grad():
        for m in silent.decoder.modules():
            if type(m).__name__ == "NoiseBlock":
                m.linear.parametrizations.weight.original0.zero_()
    codes = _codes(6, seed=8)
    with torch.no_grad():
        ref = silent.decode(codes)[0, 0]
    for noise in ("none", "fixed"):
        (out,) = _run(StreamingSnac(SnacDecoder(silent, noise=noise), max_streams=1), [(0, 0, _frames(codes))])
        torch.testing.assert_close(out, ref, atol=STREAM_ATOL, rtol=0)


def test_batched_streams_are_independent(small_dec):
    """Streams in one batch (shuffled rows, staggered starts and ends) each equal their own decode."""
    lengths, starts, slots = (1, 5, 3, 8, 2), (0, 0, 2, 1, 6), (4, 0, 2, 5, 1)
    codes = [_codes(n, seed=40 + i) for i, n in enumerate(lengths)]
    streams = [(s, t, _frames(c)) for s, t, c in zip(slots, starts, codes)]
    outs = _run(StreamingSnac(small_dec, max_streams=6), streams, seed=3)
    for out, c in zip(outs, codes):
        torch.testing.assert_close(out, small_dec.decode(c)[0], atol=STREAM_ATOL, rtol=0)


def test_reused_slot_after_reset_equals_fresh_pool(small_dec):
    """A slot reused by a new stream (after reset) gives the audio of a fresh pool."""
    first, second = _codes(4, seed=50), _codes(3, seed=51)
    ss = StreamingSnac(small_dec, max_streams=2)
    _run(ss, [(1, 0, _frames(first))])
    (reused,) = _run(ss, [(1, 0, _frames(second))])
    (fresh,) = _run(StreamingSnac(small_dec, max_streams=2), [(1, 0, _frames(second))])
    torch.testing.assert_close(reused, fresh, atol=0, rtol=0)


def test_scratch_rows_do_not_disturb_real_rows(small_dec):
    """Padding rows (scratch slot, end_frames 0, repeated) leave the real rows' audio unchanged."""
    codes = _codes(3, seed=60)
    frames = _frames(codes)
    ss = StreamingSnac(small_dec, max_streams=2)
    pad = ss.scratch_slot
    out = []
    for k in range(6):
        f = frames[k] if k < 3 else torch.zeros(7, dtype=torch.long)
        audio = ss.step(torch.tensor([pad, 0, pad]), torch.stack([frames[0], f, frames[1]]),
                        torch.tensor([0, 3, 0]))
        out.append(audio[1])
    d = ss.delay_samples
    torch.testing.assert_close(torch.cat(out)[d:d + 3 * F], small_dec.decode(codes)[0], atol=STREAM_ATOL, rtol=0)


def test_delay_is_the_sum_of_layer_delays(small_dec):
    """D = stem pad, then per block D*s + ceil(s/2) + (3 + 9 + 27), then the head's 3: 4757."""
    d = 3
    for s in SNAC_24KHZ_CONFIG["decoder_rates"]:
        d = d * s + math.ceil(s / 2) + 3 + 9 + 27
    d += 3
    assert StreamingSnac(small_dec, max_streams=1).delay_samples == d == 4757


def test_delay_bounds_the_measured_receptive_field():
    """A frame's perturbation reaches back at most D samples (float64), and nearly D."""
    model = _snac(SMALL).double()
    dec = SnacDecoder(model).double()
    left, _ = receptive_field(dec, _codes(6, seed=1), 3)
    delay = StreamingSnac(dec, max_streams=1, dtype=torch.float64).delay_samples
    assert delay - 64 < left <= delay


def test_streaming_is_causal(small_dec):
    """Changing frame k changes no step before step k, and changes step k's output."""
    codes = _codes(6, seed=70)
    frames = _frames(codes)
    other = frames.clone()
    other[3] = (other[3] + 1234) % 4096

    def steps(fr):
        ss = StreamingSnac(small_dec, max_streams=1)
        end = torch.tensor([OPEN_END_FRAMES])
        return [ss.step(torch.tensor([0]), fr[k:k + 1], end)[0] for k in range(len(fr))]

    a, b = steps(frames), steps(other)
    for k in range(3):
        torch.testing.assert_close(a[k], b[k], atol=0, rtol=0)
    assert (a[3] - b[3]).abs().max() > 1e-6


def test_bf16_state_stays_close(small_dec):
    """dtype=bfloat16 runs end to end and stays near the fp32 audio (loose bound)."""
    codes = _codes(4, seed=80)
    (out,) = _run(StreamingSnac(small_dec, max_streams=1, dtype=torch.bfloat16), [(0, 0, _frames(codes))])
    assert out.dtype == torch.float32
    assert (out - small_dec.decode(codes)[0]).abs().max() < 0.1


def test_rejects_random_noise_and_empty_pool(small_dec):
    """Per-call random noise cannot be streamed; a pool needs at least one slot."""
    with pytest.raises(ValueError, match="noise"):
        StreamingSnac(SnacDecoder(_snac(SMALL), noise="random"), max_streams=1)
    with pytest.raises(ValueError, match="max_streams"):
        StreamingSnac(small_dec, max_streams=0)


def test_cursor_ranges_and_flush_count():
    """The cursor emits [D, ...) from step 3 on, cuts at the true end, and counts flush steps."""
    cur = StreamCursor(4757)
    assert cur.end_frames == OPEN_END_FRAMES and cur.num_flush_steps_left == 0
    assert [cur.push() for _ in range(4)] == [(0, 0), (0, 0), (661, 2048), (0, 2048)]
    cur.finish()
    assert cur.end_frames == 4 and cur.num_flush_steps_left == 3
    ranges = [cur.flush() for _ in range(3)]
    assert ranges == [(0, 2048), (0, 2048), (0, 4 * F - (6 * F - 4757))]
    assert cur.is_done
    assert sum(hi - lo for lo, hi in [(661, 2048), (0, 2048)] + ranges) == 4 * F
    with pytest.raises(ValueError):
        cur.flush()
    with pytest.raises(ValueError):
        cur.push()


def test_cursor_short_stream_and_empty_stream():
    """One frame: 2048 samples over 4 steps; no frames: done at once with nothing to flush."""
    cur = StreamCursor(4757)
    got = [cur.push()]
    cur.finish()
    while cur.num_flush_steps_left:
        got.append(cur.flush())
    assert sum(hi - lo for lo, hi in got) == F and len(got) == 4
    empty = StreamCursor(4757)
    empty.finish()
    assert empty.is_done and empty.num_flush_steps_left == 0
    with pytest.raises(ValueError):
        StreamCursor(4757).flush()


def test_cursor_skip_to_hands_over_from_another_decoder():
    """After skip_to(4096), the cursor resumes exactly at sample 4096, each sample once."""
    cur = StreamCursor(4757)
    for _ in range(4):
        cur.push()
    cur.skip_to(4096)
    assert cur.num_emitted == 4096
    assert cur.push() == (4096 - (4 * F - 4757), F)  # step 4 covers [3435, 5483)
    assert cur.num_emitted == 5 * F - 4757


def test_channels_last_streams_equal_whole_decode(small_dec):
    """The channels-last step (GEMMs, shifted depthwise taps): staggered streams equal their decode."""
    lengths, starts, slots = (4, 1, 6), (0, 2, 1), (2, 0, 3)
    codes = [_codes(n, seed=90 + i) for i, n in enumerate(lengths)]
    streams = [(s, t, _frames(c)) for s, t, c in zip(slots, starts, codes)]
    ss = StreamingSnac(small_dec, max_streams=4, channels_last=True)
    assert ss.channels_last and not ss.is_compiled
    for out, c in zip(_run(ss, streams, seed=4), codes):
        torch.testing.assert_close(out, small_dec.decode(c)[0], atol=STREAM_ATOL, rtol=0)


def test_channels_last_full_width_equals_whole_decode():
    """Full-width SNAC 24 kHz on the channels-last path equals the whole decode."""
    dec = SnacDecoder(_snac(SNAC_24KHZ_CONFIG))
    codes = _codes(2, seed=6)
    (out,) = _run(StreamingSnac(dec, max_streams=1, channels_last=True), [(0, 0, _frames(codes))])
    torch.testing.assert_close(out, dec.decode(codes)[0], atol=STREAM_ATOL, rtol=0)


def test_channels_last_step_equals_original_step(small_dec):
    """Row for row (padding rows on the scratch slot, reset slots), both paths give the same audio."""
    ncw = StreamingSnac(small_dec, max_streams=3)
    nwc = StreamingSnac(small_dec, max_streams=3, channels_last=True)
    g = torch.Generator().manual_seed(2)
    slots = torch.tensor([2, 3, 0, 3])  # 3 = the scratch slot, twice
    ends = torch.tensor([OPEN_END_FRAMES, 0, 4, 0])
    for k in range(6):
        if k == 3:
            for ss in (ncw, nwc):
                ss.reset(torch.tensor([2]))
        frames = torch.randint(0, 4096, (4, 7), generator=g)
        a, b = ncw.step(slots, frames, ends), nwc.step(slots, frames, ends)
        torch.testing.assert_close(b[[0, 2]], a[[0, 2]], atol=1e-5, rtol=0)
    assert torch.equal(ncw.frame_index, nwc.frame_index)
    assert nwc.state.shape == ncw.state.shape


def test_compiled_step_one_graph_for_all_batch_sizes(small_dec):
    """torch.compile of the channels-last step (aot_eager: the same trace, no codegen) is exact
    and, once compiled, serves batch sizes 1..4 without recompiling."""
    ref = StreamingSnac(small_dec, max_streams=4)
    ss = StreamingSnac(small_dec, max_streams=4, channels_last=True)
    ss.use_compile(True, backend="aot_eager")
    assert ss.is_compiled
    g = torch.Generator().manual_seed(3)
    sizes = (3, 1, 4, 2, 1)
    for k, n in enumerate(sizes):
        slots = torch.randperm(4, generator=g)[:n]
        frames = torch.randint(0, 4096, (n, 7), generator=g)
        ends = torch.full((n,), OPEN_END_FRAMES)
        with torch._dynamo.config.patch(error_on_recompile=k > 0):
            out = ss.step(slots, frames, ends)
        torch.testing.assert_close(out, ref.step(slots, frames, ends), atol=1e-5, rtol=0)
    assert torch.equal(ss.frame_index, ref.frame_index)


def test_compile_needs_channels_last(small_dec):
    """Compiling the original [B, C, T] step is refused; compile=True implies channels-last."""
    with pytest.raises(ValueError, match="channels"):
        StreamingSnac(small_dec, max_streams=1).use_compile(True)
    assert StreamingSnac(small_dec, max_streams=1, compile=True).channels_last
