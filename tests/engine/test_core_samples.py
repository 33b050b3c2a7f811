"""EngineCore's sample accounting: every sample the backend made is sent or dropped with a reason."""

from __future__ import annotations

from engine import messages as m
from engine.core import CoreConfig, EngineCore
from tests.engine.fakes import FakeBackend

TWO_SEGMENTS = "First part of it here. Then the second part follows. "


def _core() -> EngineCore:
    return EngineCore(FakeBackend(chunks_per_job=3, chunk_samples=100),
                      CoreConfig(first_segment_min_chars=5, min_segment_chars=10,
                                 max_segment_chars=30, lookahead_jobs=1))


def _sent(out: list[m.Message]) -> int:
    return sum(len(x.pcm) // 4 for x in out if type(x) is m.Audio)  # type: ignore[attr-defined]


def _balanced(core: EngineCore) -> dict[str, float]:
    t = core.sample_totals()
    assert t["samples_made"] == t["samples_sent"] + t["samples_dropped_cancelled"] + t["samples_dropped_failed"]
    return t


def test_a_finished_stream_sent_every_sample_made() -> None:
    """Audio held for a segment generated ahead is counted once, when it is sent."""
    core = _core()
    core.open(1, None, {})
    core.add_text(1, TWO_SEGMENTS)
    out = core.end(1)
    while core.has_work():
        out += core.step()
    t = _balanced(core)
    assert t["samples_made"] == t["samples_sent"] == _sent(out) > 0
    assert t["samples_dropped_cancelled"] == 0


def test_cancel_drops_the_held_audio_with_its_reason() -> None:
    """Cancelling while the segment ahead holds audio counts that audio as dropped (cancelled)."""
    core = _core()
    core.open(1, None, {})
    core.add_text(1, TWO_SEGMENTS)
    core.flush(1)
    out = core.step()  # a chunk of the head is sent, a chunk of the segment ahead is held
    core.cancel(1)
    t = _balanced(core)
    assert (t["samples_made"], t["samples_sent"], t["samples_dropped_cancelled"]) == (200, _sent(out), 100)


def test_a_failed_stream_drops_its_held_audio_as_failed() -> None:
    """A segment that fails drops what its stream held back, counted as failed."""
    core = _core()
    core.open(1, None, {})
    core.add_text(1, "First part of it here. [[fail]] second part follows. ")
    core.flush(1)
    while core.has_work():
        core.step()
    t = _balanced(core)
    assert t["samples_dropped_failed"] == t["samples_made"] - t["samples_sent"]
