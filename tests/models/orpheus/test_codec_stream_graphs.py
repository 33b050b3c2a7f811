"""StreamingCodecGraphs: eager on the CPU, CUDA-graph replays equal to the whole-sequence decode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.orpheus.codec_stream_graphs import StreamingCodecGraphs
from models.orpheus.snac_stream import OPEN_END_FRAMES, StreamCursor, StreamingSnac
from models.orpheus.tokens import codes_to_frames

F = 2048


def _codes(n, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 4096, (1, n * k), generator=g).to(device) for k in (1, 2, 4)]


def _stream_all(codec: StreamingCodecGraphs, streams):
    """Run streams (slot, first call, frames [n, 7] host ints) through ``codec.decode``."""
    cursors: dict[int, StreamCursor] = {}
    out: dict[int, list[np.ndarray]] = {i: [] for i in range(len(streams))}
    call = 0
    while call <= max(f for _, f, _ in streams) or not all(c.is_done for c in cursors.values()):
        rows, plan = [], []
        for i, (slot, first, frames) in enumerate(streams):
            if call < first or (i in cursors and cursors[i].is_done):
                continue
            if i not in cursors:
                cursors[i] = StreamCursor(codec.snac.delay_samples)
                codec.reset([slot])
            cur = cursors[i]
            if cur.num_frames < len(frames):
                codes = frames[cur.num_frames]
                rng = cur.push()
                if cur.num_frames == len(frames):
                    cur.finish()
            else:
                codes, rng = [0] * 7, cur.flush()
            rows.append((slot, codes, cur.end_frames))
            plan.append((i, rng))
        audio = codec.decode(rows[::-1])[::-1]  # reversed row order on the device
        assert audio.shape == (len(rows), F) and audio.dtype == np.float32
        for (i, (lo, hi)), a in zip(plan, audio):
            out[i].append(a[lo:hi])
        call += 1
    return [np.concatenate(out[i]) for i in range(len(streams))]


def test_cpu_decode_rows_equal_whole_decode(small_codec):
    """On the CPU (eager), decode(rows) streams several staggered streams exactly."""
    codec = StreamingCodecGraphs(StreamingSnac(small_codec, max_streams=4))
    assert not codec.is_graphed
    codes = [_codes(n, seed=n) for n in (2, 4, 1)]
    streams = [(s, t, codes_to_frames(*c)[0].tolist()) for s, t, c in zip((3, 0, 1), (0, 1, 3), codes)]
    for out, c in zip(_stream_all(codec, streams), codes):
        np.testing.assert_allclose(out, small_codec.decode(c)[0].numpy(), atol=1e-4, rtol=0)


def test_flush_emits_the_tail_in_one_call(small_codec):
    """flush(rows) runs the flush steps back to back; with the cursor's ranges the stream is exact."""
    codec = StreamingCodecGraphs(StreamingSnac(small_codec, max_streams=3))
    codes = [_codes(n, seed=20 + n) for n in (2, 3)]
    frames = [codes_to_frames(*c)[0].tolist() for c in codes]
    cursors = [StreamCursor(codec.snac.delay_samples) for _ in codes]
    out: list[list[np.ndarray]] = [[], []]
    for k in range(3):
        live = [i for i in (0, 1) if k < len(frames[i])]
        ranges = [cursors[i].push() for i in live]
        audio = codec.decode([(2 * i, frames[i][k], cursors[i].end_frames) for i in live])
        for i, (lo, hi), a in zip(live, ranges, audio):
            out[i].append(a[lo:hi])
        if k == 1:  # stream 0 ends after 2 frames, stream 1 after 3
            cursors[0].finish()
            tail = codec.flush([(0, cursors[0].end_frames)])
            assert tail.shape == (1, codec.snac.num_flush_steps * F)
            for j in range(codec.snac.num_flush_steps):
                lo, hi = cursors[0].flush()
                out[0].append(tail[0, j * F + lo:j * F + hi])
            assert cursors[0].is_done
    cursors[1].finish()
    tail = codec.flush([(2, cursors[1].end_frames)])
    for j in range(cursors[1].num_flush_steps_left):
        lo, hi = cursors[1].flush()
        out[1].append(tail[0, j * F + lo:j * F + hi])
    for o, c in zip(out, codes):
        np.testing.assert_allclose(np.concatenate(o), small_codec.decode(c)[0].numpy(), atol=1e-4, rtol=0)


def test_captured_function_pads_onto_the_scratch_slot(small_codec):
    """The function a graph captures, fed zero padding rows as BatchGraphs does, equals the
    unpadded step for the real rows (CPU emulation of a replay)."""
    padded = StreamingCodecGraphs(StreamingSnac(small_codec, max_streams=3))
    plain = StreamingSnac(small_codec, max_streams=3)
    g = torch.Generator().manual_seed(1)
    slots = torch.tensor([2, 0])
    ends = torch.tensor([OPEN_END_FRAMES, 5])
    for _ in range(3):
        frames = torch.randint(0, 4096, (2, 7), generator=g)
        zeros = torch.zeros(2, dtype=torch.int64)
        pad_frames = torch.cat([frames, torch.zeros(2, 7, dtype=torch.int64)])
        out = padded._graph_step(torch.cat([slots + 1, zeros]), pad_frames, torch.cat([ends, zeros]))  # [4, 2048]
        torch.testing.assert_close(out[:2], plain.step(slots, frames, ends), atol=1e-6, rtol=0)
    torch.testing.assert_close(padded.snac.state[:3], plain.state[:3], atol=1e-6, rtol=0)
    assert int(padded.snac.frame_index[1]) == 0  # slot 1 untouched


def test_decode_validates_rows(small_codec):
    """Duplicate or out-of-range slots and short frames are refused; no rows -> empty audio."""
    codec = StreamingCodecGraphs(StreamingSnac(small_codec, max_streams=2))
    assert codec.decode([]).shape == (0, F)
    with pytest.raises(ValueError, match="twice"):
        codec.decode([(0, [0] * 7, 1), (0, [0] * 7, 1)])
    with pytest.raises(ValueError, match="slots"):
        codec.decode([(2, [0] * 7, 1)])
    with pytest.raises(ValueError):
        codec.decode([(0, [0] * 6, 1)])


def test_buckets_cover_max_streams(small_codec):
    """Buckets above max_streams are dropped and max_streams closes the list."""
    codec = StreamingCodecGraphs(StreamingSnac(small_codec, max_streams=6), buckets=(1, 4, 8, 16))
    assert codec.buckets == (1, 4, 6)



def test_compile_switch_on_the_snac(small_codec):
    """compile=True is refused for the original layout; compile=False turns a compiled snac eager."""
    with pytest.raises(ValueError, match="channels"):
        StreamingCodecGraphs(StreamingSnac(small_codec, max_streams=2), compile=True)
    snac = StreamingSnac(small_codec, max_streams=2, compile=True)
    codec = StreamingCodecGraphs(snac, compile=False)
    assert codec.snac.channels_last and not codec.snac.is_compiled


@pytest.fixture
def no_tf32():
    """cuDNN convolutions (and optionally cuBLAS) use TF32 by default on CUDA: ~6e-4 off in fp32."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("path,dtype", [("ncw", torch.float32), ("ncw", torch.bfloat16), ("nwc", torch.float32),
                                        ("compiled", torch.float32), ("compiled", torch.bfloat16)])
def test_graphs_equal_whole_decode_full_width(path, dtype, no_tf32):
    """Full-width SNAC on CUDA, each step path: graph replays (padded buckets, split batches)
    match the whole decode (TF32 off, so fp32 is fp32)."""
    from models.orpheus.codec import SnacDecoder
    from models.orpheus.loader import load_snac

    dec = SnacDecoder(load_snac(load_format="dummy", device="cuda"))
    snac = StreamingSnac(dec, max_streams=5, dtype=dtype, channels_last=path != "ncw")
    codec = StreamingCodecGraphs(snac, buckets=(1, 2, 4), progress=False, compile=path == "compiled")
    assert codec.is_graphed and codec.buckets == (1, 2, 4, 5)
    codes = [_codes(n, seed=10 + n, device="cuda") for n in (3, 6, 1, 4, 2)]
    streams = [(s, t, codes_to_frames(*c)[0].tolist()) for s, t, c in zip((4, 0, 2, 1, 3), (0, 0, 1, 2, 2), codes)]
    atol = 1e-4 if dtype == torch.float32 else 0.05  # bf16: ~1e-2 max on CPU, full width
    for out, c in zip(_stream_all(codec, streams), codes):
        ref = dec.decode(c)[0].cpu().numpy()
        assert np.abs(out - ref).max() < atol


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_graph_replay_equals_original_eager_step(no_tf32):
    """The compiled channels-last step replayed from graphs (buckets 1, 2, 4) gives the original
    eager step's audio, row for row."""
    from models.orpheus.codec import SnacDecoder
    from models.orpheus.loader import load_snac

    dec = SnacDecoder(load_snac(load_format="dummy", device="cuda"))
    eager = StreamingSnac(dec, max_streams=4)
    graphed = StreamingCodecGraphs(StreamingSnac(dec, max_streams=4, compile=True), buckets=(1, 2, 4),
                                   progress=False)
    g = torch.Generator().manual_seed(0)
    for slots in ([2, 0, 1], [3], [1, 3], [0, 1, 2, 3]):
        slots_t = torch.tensor(slots, device="cuda")
        ends = torch.full((len(slots),), OPEN_END_FRAMES, device="cuda")
        frames = torch.randint(0, 4096, (len(slots), 7), generator=g).cuda()
        torch.testing.assert_close(graphed.step(slots_t, frames, ends), eager.step(slots_t, frames, ends),
                                   atol=1e-4, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graph_replay_equals_eager_step(no_tf32):
    """A replay with padding rows gives the eager step's audio and state, bit for bit close."""
    from models.orpheus.codec import SnacDecoder
    from models.orpheus.loader import load_snac

    dec = SnacDecoder(load_snac(load_format="dummy", device="cuda"))
    eager = StreamingSnac(dec, max_streams=4)
    graphed = StreamingCodecGraphs(StreamingSnac(dec, max_streams=4), buckets=(4,), progress=False)
    g = torch.Generator().manual_seed(0)
    slots = torch.tensor([2, 0, 1], device="cuda")
    ends = torch.full((3,), OPEN_END_FRAMES, device="cuda")
    for _ in range(4):
        frames = torch.randint(0, 4096, (3, 7), generator=g).cuda()
        a = eager.step(slots, frames, ends)
        b = graphed.step(slots, frames, ends)
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
    torch.testing.assert_close(graphed.snac.state[:4], eager.state[:4], atol=1e-5, rtol=0)
