"""gateway.session under Hypothesis: any frames, however malformed, get documented answers and never an exception."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmark.fuzz_protocol import check_frames, frame_sequences, frames

_SETTINGS = settings(max_examples=300, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@_SETTINGS
@given(frame_sequences)
def test_any_frame_sequence_gets_documented_answers(seq: list[bytes | str]) -> None:
    """Random frames through a session and the engine core: no exception, every map encodes,
    every error code and close code is documented, no stream outlives the connection."""
    check_frames(seq)


@_SETTINGS
@given(st.lists(st.sampled_from(["start", "text", "end"]), max_size=4), frames)
def test_a_hostile_frame_amid_a_stream_leaves_it_working(kinds: list[str], bad: bytes | str) -> None:
    """A hostile frame between valid ones of an open stream breaks nothing around it."""
    ok = {"start": '{"type": "start", "stream": "a"}',
          "text": '{"type": "text", "stream": "a", "text": "Hello there. "}',
          "end": '{"type": "end", "stream": "a"}'}
    check_frames([ok["start"], bad, *(ok[k] for k in kinds), bad, ok["end"]])
