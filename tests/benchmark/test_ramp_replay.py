"""benchmark.ramp_replay: the ramp's chunk sizes and a replay on a hand-made level."""

from __future__ import annotations

from benchmark.ramp_replay import ramp_chunk_sizes, replay_level


def test_ramp_chunk_sizes_match_the_program() -> None:
    """The sizes the stateful-codec program releases (tests/engine/llm and docs/orpheus.md):
    every ramp reaches the stateful codec's exact output, 5 x 2048 - 4757 samples, by frame 5."""
    assert ramp_chunk_sizes(1024) == [1024, 1024, 1024, 1024, 1387, 2048]
    assert ramp_chunk_sizes(1536) == [1024, 512, 512, 1387, 2048]
    assert ramp_chunk_sizes(2048) == [1024, 0, 363, 2048]


def test_replay_swaps_the_ramp_and_replays_the_player() -> None:
    """A stream whose frames come every 80 ms underruns with the 1024 ramp (the 100 ms start
    buffer drains) and not with the 1536 one, which starts playback a frame later."""
    old = ramp_chunk_sizes(1024)
    new = ramp_chunk_sizes(1536) + [2048]
    times = [0.1 + 0.08 * i for i in range(12)]
    stream = {"chunk_t": times, "chunk_samples": old + [2048] * 6, "is_ok": True, "t_first_text": 0.0}
    level = {"level": 1, "streams": [stream]}
    base = replay_level(level, old, old)
    alt = replay_level(level, old, new)
    assert base["on_time"] == 0.0 and alt["on_time"] == 1.0 and alt["replaced"] == 1
    assert alt["play_start_p50_ms"] > base["play_start_p50_ms"]
