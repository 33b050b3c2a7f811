"""The page follows the audio being heard: the timeline to playback's end, metrics and words of the playing turn."""

from __future__ import annotations

import math
from typing import Any

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# About six seconds of speech in three segments; the embedded voice makes it in well under one.
LONG = "The first sentence is short. The second one follows it, and then we are done."
SECOND = "A second turn."
DONE_AND_PLAYED = (
    "(() => { const s = window.voxgateDemo.stats();"
    " return s.currentTurn && s.currentTurn.status === 'done' && s.playerState === 'idle'"
    " && s.samplesReceived > 0 && s.samplesPlayed === s.samplesReceived; })()"
)
DONE_WHILE_PLAYING = (
    "(() => { const s = window.voxgateDemo.stats();"
    " return s.currentTurn.status === 'done' && s.playerState === 'playing'; })()"
)

# Records every highlighted word the transcript shows: [characters before it, its text].
RECORD_HIGHLIGHTS = """() => {
  window.highlights = [];
  const el = document.getElementById('transcript');
  new MutationObserver(() => {
    const now = el.querySelector('.speaking');
    if (!now) return;
    const before = el.querySelector('.spoken');
    const item = [before ? before.textContent.length : 0, now.textContent];
    const last = window.highlights[window.highlights.length - 1];
    if (!last || last[0] !== item[0] || last[1] !== item[1]) window.highlights.push(item);
  }).observe(el, { childList: true, subtree: true, characterData: true });
}"""


def test_timeline_follows_playback_to_its_end(demo: Any) -> None:
    """The server finishes long before playback does; the timeline runs on until the audio has been heard."""
    demo.page.evaluate(f"window.voxgateDemo.speak({LONG!r})")
    demo.wait(DONE_WHILE_PLAYING)
    demo.wait(DONE_AND_PLAYED)
    turn = demo.stats()["currentTurn"]
    demo.wait_for_stats_reports(3)  # a few frames drawn after playback ended
    view = demo.stats()["timeline"]
    assert view["turn"] == turn["id"]
    heard_ms = turn["samples"] / 24000 * 1000
    assert view["end"] - view["t0"] >= heard_ms  # playback cannot end before it had lasted this long
    demo.wait_for_stats_reports(10)
    assert demo.stats()["timeline"]["end"] == view["end"]  # and then the timeline stops


def test_metrics_follow_the_turn_being_played(demo: Any) -> None:
    """A turn sent while another still speaks takes over the metrics only when its own audio plays."""
    demo.page.evaluate(f"window.voxgateDemo.speak({LONG!r})")
    demo.wait(DONE_WHILE_PLAYING)
    demo.page.evaluate(f"window.voxgateDemo.speak({SECOND!r})")
    demo.wait("window.voxgateDemo.stats().currentTurn.status === 'done'")
    snap = demo.page.evaluate("""() => ({
        played: window.voxgateDemo.stats().samplesPlayed,
        turns: window.voxgateDemo.turns().slice(-2),
        chunks: document.getElementById('m-chunks').textContent,
        ttfa: document.getElementById('m-ttfa').textContent,
        transcript: document.getElementById('transcript').textContent,
    })""")
    first, second = snap["turns"]
    assert first["text"] == LONG and second["text"] == SECOND
    assert snap["played"] < first["samples"] - 24000  # the first turn still has a second or more to play
    assert snap["transcript"] == LONG
    assert snap["chunks"] == str(first["chunks"]) != str(second["chunks"])
    assert snap["ttfa"] == f"{math.floor(first['ttfaMs'] + 0.5)} ms"
    # Once the second turn's audio plays, its figures replace the first's.
    demo.wait(f"document.getElementById('transcript').textContent === {SECOND!r}")
    demo.wait(f"document.getElementById('m-chunks').textContent === '{second['chunks']}'", timeout_s=5)
    demo.wait(DONE_AND_PLAYED)
    assert demo.page.inner_text("#m-ttfa") == f"{math.floor(second['ttfaMs'] + 0.5)} ms"


def test_highlight_moves_word_by_word(demo: Any) -> None:
    """The transcript highlights one word at a time, moving forward through the text as it is heard."""
    demo.page.evaluate(RECORD_HIGHLIGHTS)
    demo.page.evaluate(f"window.voxgateDemo.speak({LONG!r})")
    demo.wait(DONE_AND_PLAYED)
    seen = demo.page.evaluate("window.highlights")
    assert seen, "nothing was highlighted"
    assert all(len(word.split()) == 1 for _, word in seen), seen
    assert all(LONG[start:].lstrip().startswith(word.strip()) for start, word in seen), seen
    starts = [start for start, _ in seen]
    assert starts == sorted(starts)
    assert len(set(starts)) >= 5, seen  # 14 words in six seconds: most of them seen on a loaded machine
