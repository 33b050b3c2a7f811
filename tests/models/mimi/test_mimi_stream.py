"""Streaming Mimi parity with moshi 0.2.13's ``mimi.streaming()``; slots, padding rows, resets."""

from __future__ import annotations

import torch
from tests.models.mimi.mimi_fixtures import jobs

from models.mimi.config import TINY
from models.mimi.loader import load_mimi
from models.mimi.stream import MimiDecodeStream

REL = 1e-5


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _stream(mimi, codes: torch.Tensor, slots: list[int], max_slots: int = 4) -> torch.Tensor:
    """codes [B, K, T] through one MimiDecodeStream, frame by frame -> [B, T * 1920]."""
    stream = MimiDecodeStream(mimi, max_slots, num_codebooks=codes.shape[1])
    s = torch.tensor(slots)
    stream.reset(s)
    return torch.cat([stream.step(s, codes[:, :, t]) for t in range(codes.shape[2])], dim=-1)


def test_streaming_equals_reference_streaming(mimi_ckpt, mimi_reference):
    """Frame-by-frame decode equals moshi's mimi.streaming() decode within 1e-5 relative, across
    the transformer window (11 frames, window 3), two rows in two slots."""
    mimi = load_mimi(mimi_ckpt, config=TINY)
    codes = torch.tensor(jobs()["decode32"]["codes"])
    ref = mimi_reference["decode32"]["stream"][:, 0]
    assert _rel(_stream(mimi, codes, [2, 0]), ref) < REL


def test_streaming_with_fewer_codebooks_equals_reference(mimi_ckpt, mimi_reference):
    """num_codebooks=8 (the first 8 of 32) streams like moshi with 8 codebooks."""
    mimi = load_mimi(mimi_ckpt, config=TINY)
    codes = torch.tensor(jobs()["decode8"]["codes"])
    assert _rel(_stream(mimi, codes, [1]), mimi_reference["decode8"]["stream"][:, 0]) < REL


def test_streaming_equals_whole_decode_inside_the_window(mimi_ckpt, mimi_reference):
    """Within the transformer's window the stream equals the reference's whole decode (1e-5)."""
    mimi = load_mimi(mimi_ckpt, config=TINY)
    codes = torch.tensor(jobs()["decode32"]["codes"])
    frames = TINY.transformer.context // TINY.resample_stride  # 3 frames
    n = frames * 1920
    assert _rel(_stream(mimi, codes, [0, 1])[:, :n], mimi_reference["decode32"]["whole"][:, 0, :n]) < REL


def test_reference_streaming_and_whole_decode_differ_past_the_window(mimi_reference):
    """A reference fact the stream follows: past its window moshi's streaming decode is not its
    whole decode (its ring drops the oldest key of each 2-step frame)."""
    ref = mimi_reference["decode32"]
    n = 3 * 1920
    assert _rel(ref["stream"][..., :n], ref["whole"][..., :n]) < 1e-6
    assert _rel(ref["stream"][..., n:], ref["whole"][..., n:]) > 1e-6


def test_slots_at_different_positions_equal_each_alone(mimi_ckpt):
    """Three streams joining at different frames, batched with a padding row on the scratch slot,
    each equal their own solo stream; a reset slot starts afresh."""
    mimi = load_mimi(mimi_ckpt, config=TINY)
    g = torch.Generator().manual_seed(9)
    seqs = [torch.randint(0, 2048, (32, n), generator=g) for n in (9, 7, 5)]
    starts, slot_of = [0, 2, 5], {0: 3, 1: 0, 2: 2}
    solo = [_stream(mimi, s[None], [1])[0] for s in seqs]
    stream = MimiDecodeStream(mimi, 4)
    out: dict[int, list] = {i: [] for i in range(3)}
    stream.step(torch.tensor([3]), seqs[1][:, 0][None])  # slot 3 used before: reset must clear it
    for t in range(10):
        rows = [i for i in range(3) if starts[i] <= t < starts[i] + seqs[i].shape[1]]
        fresh = [slot_of[i] for i in rows if t == starts[i]]
        if fresh:
            stream.reset(torch.tensor(fresh))
        slots = torch.tensor([slot_of[i] for i in rows] + [stream.scratch_slot])
        codes = torch.stack([seqs[i][:, t - starts[i]] for i in rows] + [torch.zeros(32, dtype=torch.int64)])
        pcm = stream.step(slots, codes)
        for j, i in enumerate(rows):
            out[i].append(pcm[j])
    for i in range(3):
        assert _rel(torch.cat(out[i]), solo[i]) < REL, i


def test_step_shapes_and_delay():
    """One frame in, 1,920 samples out per row; no delay to flush."""
    mimi = load_mimi(config=TINY, load_format="dummy")
    stream = MimiDecodeStream(mimi, 2, num_codebooks=16)
    slots = torch.tensor([0, 1, stream.scratch_slot])
    stream.reset(slots[:2])
    pcm = stream.step(slots, torch.randint(0, 2048, (3, 16)))
    assert pcm.shape == (3, 1920) and stream.delay_samples == 0
    assert float(pcm[:2].abs().max()) > 0


def test_the_projected_codebooks_decode_as_the_split_rvq():
    """The stream's one-lookup quantizer decode (``projected_codebooks``) equals
    ``SplitRVQ.decode`` for 1, 5 and all 32 codebooks within 1e-6 relative (float32), on random
    tables and projections (zero tables would make both silent)."""
    from models.mimi.codec import Mimi
    from models.mimi.stream import projected_codebooks

    torch.manual_seed(0)
    mimi = Mimi(TINY).eval()
    with torch.no_grad():
        for name, b in mimi.quantizer.named_buffers():
            b.copy_(torch.rand(b.shape) + 0.5 if "usage" in name else torch.randn(b.shape))
    bins = TINY.quantizer.bins
    for k in (1, 5, 32):
        codes = torch.randint(0, bins, (6, k))
        with torch.no_grad():
            want = mimi.quantizer.decode(codes[:, :, None])[:, :, 0]  # [N, C]
        table = projected_codebooks(mimi, k)
        assert table.shape == (k * bins, TINY.quantizer.output_dimension)
        got = table[codes + torch.arange(k) * bins].sum(1)
        assert want.abs().max() > 1e-3
        assert _rel(got, want) < 1e-6
