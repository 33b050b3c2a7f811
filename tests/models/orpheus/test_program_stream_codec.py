"""OrpheusProgram with the stateful streaming codec: same audio as the window decoder path
(fast-start ramp included), interleaved streams, slots reused and released."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.orpheus.codec_stream_graphs import StreamingCodecGraphs
from models.orpheus.program import OrpheusProgram
from models.orpheus import tokens as tok
from models.orpheus.snac_stream import StreamingSnac
from tests.models.orpheus.orpheus_fixtures import build_tokenizer


def _programs(codec, max_streams: int = 3, window_frames: int | None = None, **kw):
    plain = OrpheusProgram(build_tokenizer(), codec, **kw)
    stream = OrpheusProgram(build_tokenizer(), codec, stream_codec=StreamingCodecGraphs(
        StreamingSnac(codec, max_streams=max_streams), capture=False), window_frames=window_frames, **kw)
    return plain, stream


def _tokens(num_frames: int, seed: int) -> list[int]:
    g = np.random.default_rng(seed)
    return [tok.code_to_token(int(g.integers(0, 4096)), k) for k in range(num_frames * 7)]


def _run(program: OrpheusProgram, streams: dict[str, list[int]], starts: dict[str, int]) -> dict[str, np.ndarray]:
    """Feed each stream one token per step from its start step; finish each after its last."""
    states = {name: program.new_state("tara", {}) for name in streams}
    audio: dict[str, list[np.ndarray]] = {name: [] for name in streams}
    step = 0
    live = set(streams)
    while live:
        rows = [n for n in sorted(live) if starts[n] <= step < starts[n] + len(streams[n])]
        outs = program.postprocess([states[n] for n in rows], [streams[n][step - starts[n]] for n in rows])
        for n, pcm in zip(rows, outs):
            if pcm is not None:
                audio[n].append(pcm)
        ended = [n for n in sorted(live) if step == starts[n] + len(streams[n]) - 1]
        for n, pcm in zip(ended, program.finish([states[n] for n in ended])):
            if pcm is not None:
                audio[n].append(pcm)
            live.discard(n)
        step += 1
    return {n: np.concatenate(a) if a else np.zeros(0, np.float32) for n, a in audio.items()}


@pytest.mark.parametrize(("first_lookahead", "ramp_window", "ramp_step"),
                         [(1024, 6, None), (1024, 4, None), (None, 6, None), (1024, 4, 1536), (1024, 4, 2048)])
def test_stateful_codec_gives_the_window_decoders_audio(small_codec, first_lookahead, ramp_window, ramp_step) -> None:
    """Four interleaved streams (1, 3, 6 and 12 frames; more streams than slots over time):
    the stateful path's audio equals the 6-frame window decoder path's (ramp samples the same,
    also from 4-frame ramp windows, the rest exact in both), every sample once, and every
    slot is free at the end."""
    plain, stream = _programs(small_codec, first_lookahead_samples=first_lookahead, window_frames=ramp_window,
                              ramp_step_samples=ramp_step)
    streams = {"a": _tokens(1, 0), "b": _tokens(3, 1), "c": _tokens(6, 2), "d": _tokens(12, 3)}
    starts = {"a": 0, "b": 2, "c": 5, "d": 10}  # a ends before d starts: its slot is reused
    ref = _run(plain, streams, starts)
    got = _run(stream, streams, starts)
    for name in streams:
        assert got[name].shape == ref[name].shape == (len(streams[name]) // 7 * 2048,)
        np.testing.assert_allclose(got[name], ref[name], atol=1e-4, rtol=0)
    assert sorted(stream._free_slots) == [0, 1, 2]


def test_released_slot_is_reset_for_its_next_stream(small_codec) -> None:
    """A stream aborted mid-way (release) leaves no state behind: its slot's next user gets the
    same audio as on a fresh program."""
    _, stream = _programs(small_codec, max_streams=1)
    aborted = stream.new_state("tara", {})
    for t in _tokens(8, 5):
        stream.postprocess([aborted], [t])
    assert aborted.slot == 0 and not stream._free_slots
    stream.release(aborted)
    stream.release(aborted)  # idempotent
    assert stream._free_slots == [0]
    _, fresh = _programs(small_codec, max_streams=1)
    streams = {"x": _tokens(7, 6)}
    np.testing.assert_allclose(_run(stream, streams, {"x": 0})["x"], _run(fresh, streams, {"x": 0})["x"], atol=1e-6)


def test_more_streams_than_slots_is_a_clear_error(small_codec) -> None:
    """A frame for a stream when every codec slot is held raises, naming the limit."""
    _, stream = _programs(small_codec, max_streams=1)
    a, b = stream.new_state("tara", {}), stream.new_state("tara", {})
    frame = _tokens(1, 7)
    for t in frame:
        stream.postprocess([a], [t])
    with pytest.raises(RuntimeError, match="codec slot"):
        for t in frame:
            stream.postprocess([b], [t])
    assert torch.is_tensor(stream.stream_codec.snac.state)


def test_loaded_ramp_for_segments_that_start_while_frames_are_slow(small_codec) -> None:
    """With a loaded ramp step, a new segment gets it once the moving average of the step
    interval makes a frame (7 steps) slower than LOADED_FRAME_INTERVAL_S, and the light ramp
    again when steps are fast or none has been reported for a second (idle); without one, the
    ramp never changes."""
    from models.orpheus.program import LOADED_FRAME_INTERVAL_S

    program = OrpheusProgram(build_tokenizer(), small_codec, ramp_step_samples=1024, loaded_ramp_step_samples=1536)
    assert program.new_state("tara", {}).decoder.ramp_step_samples == 1024  # no steps seen yet
    slow = 1.5 * LOADED_FRAME_INTERVAL_S / 7
    for _ in range(40):
        program.note_step_interval(slow)
    assert program.frame_interval_s == pytest.approx(1.5 * LOADED_FRAME_INTERVAL_S, rel=0.05)
    assert program.new_state("tara", {}).decoder.ramp_step_samples == 1536
    now = program._clock()
    program._clock = lambda: now + 5.0  # no step for 5 s: the engine went idle
    assert program.new_state("tara", {}).decoder.ramp_step_samples == 1024
    for _ in range(40):
        program.note_step_interval(slow)
    assert program.new_state("tara", {}).decoder.ramp_step_samples == 1536  # busy again
    for _ in range(40):
        program.note_step_interval(0.004)
    assert program.new_state("tara", {}).decoder.ramp_step_samples == 1024
    fixed = OrpheusProgram(build_tokenizer(), small_codec, ramp_step_samples=1024)
    for _ in range(40):
        fixed.note_step_interval(slow)
    assert fixed.new_state("tara", {}).decoder.ramp_step_samples == 1024


def test_a_segment_due_later_skips_the_ramp_and_gets_the_whole_decode(small_codec) -> None:
    """A segment whose first audio is due beyond FAST_START_WITHIN_S (one generated ahead) runs
    no window decode: its audio is the stateful codec's alone, the whole-sequence decode,
    every sample once. The choice follows the deadline until the first frame, then holds; a
    segment that ends before its first frame gives no audio and no error."""
    from models.orpheus.program import FAST_START_WITHIN_S
    from models.orpheus.tokens import tokens_to_codes

    _, stream = _programs(small_codec)
    tokens = _tokens(6, 11)
    ahead = stream.new_state("tara", {})
    assert ahead.in_ramp
    stream.note_due(ahead, FAST_START_WITHIN_S + 0.5)
    assert not ahead.in_ramp
    stream.note_due(ahead, FAST_START_WITHIN_S)  # due soon again before its first frame: ramp
    assert ahead.in_ramp
    stream.note_due(ahead, 2.0)
    audio = []
    for i, t in enumerate(tokens):
        audio += [p for p in stream.postprocess([ahead], [t]) if p is not None]
        if i >= 6:
            stream.note_due(ahead, 0.0)  # from its first frame on the choice holds
        assert not ahead.in_ramp
    audio += [p for p in stream.finish([ahead]) if p is not None]
    got = np.concatenate(audio)
    full = small_codec.decode([c.unsqueeze(0) if c.dim() == 1 else c for c in tokens_to_codes(tokens)])[0].numpy()
    assert got.shape == full.shape == (6 * 2048,)
    np.testing.assert_allclose(got, full, atol=1e-4, rtol=0)
    assert stream.totals()["window_decodes"] == 0 and stream.totals()["codec_frames"] == 6
    assert stream.totals()["codec_rows_replayed"] == 0  # eager on the CPU: no graph replays

    soon = stream.new_state("tara", {})
    stream.note_due(soon, 0.1)  # a stream's first segment: the fast-start ramp
    first = [p for t in tokens[:21] for p in stream.postprocess([soon], [t]) if p is not None]
    assert soon.in_ramp and stream.totals()["window_decodes"] > 0 and first

    empty = stream.new_state("tara", {})
    stream.note_due(empty, 2.0)
    assert stream.finish([empty]) == [None]
    assert len(stream._free_slots) == 2 and soon.slot >= 0 and soon.slot not in stream._free_slots
