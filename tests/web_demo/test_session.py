"""web_demo/session.js, turn.js and words.js under node: turn order, playback per turn, word timings."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).with_name("session_harness.mjs")
MODULES = ("session.js", "turn.js", "words.js")


def _node() -> str | None:
    """A node binary: the system's, else the one bundled inside the playwright package."""
    found = shutil.which("node")
    if found:
        return found
    try:
        import playwright
    except ImportError:
        return None
    bundled = Path(playwright.__file__).parent / "driver" / "node"
    return str(bundled) if bundled.is_file() else None


NODE = _node()
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node (or pip install playwright, which bundles one)")


@pytest.fixture(scope="module")
def modules(tmp_path_factory: Any) -> Path:
    """The page's modules copied where node loads them as ES modules."""
    folder = tmp_path_factory.mktemp("web_demo")
    for name in MODULES:
        shutil.copy(REPO / "web_demo" / name, folder / name)
    (folder / "package.json").write_text('{"type": "module"}')
    return folder


def run(modules: Path, scenario: str) -> Any:
    assert NODE is not None
    out = subprocess.run([NODE, str(HARNESS), str(modules), scenario], capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(out.stdout)


def test_word_timings_spread_a_span_over_its_samples(modules: Path) -> None:
    """Each word gets samples in proportion to its code points (and the space after it); lookups clamp."""
    out = run(modules, "words")
    # "Hi 😀 there, you.": 16 code points (the emoji is one) over 1600 samples.
    assert out["words"] == [{"start": 0, "end": 2}, {"start": 3, "end": 4}, {"start": 5, "end": 11},
                            {"start": 12, "end": 16}]
    assert [(t["from"], t["to"]) for t in out["timings"]] == [(0, 300), (300, 500), (500, 1200), (1200, 1600)]
    assert [(t["start"], t["from"], t["to"]) for t in out["inner"]] == [(3, 0, 200), (5, 200, 800)]
    assert [t["start"] for t in out["at"]] == [0, 0, 0, 3, 12, 12]
    assert out["empty"] is None


def test_a_turn_finishing_before_the_one_ahead_of_it_is_still_heard(modules: Path) -> None:
    """The second turn's done arriving first does not drop its audio: it plays after the first turn's."""
    out = run(modules, "outOfOrder")
    assert out["whileFirst"] == [2400]  # held back while the first turn still feeds the player
    assert out["pushes"] == [2400, 2400, 1200, 1200]
    assert out["final"] is True
    assert out["queue"] == 0


def test_playback_is_followed_per_turn(modules: Path) -> None:
    """Heard samples and play-out are kept per turn (at the stream's rate); the shown turn is the one heard."""
    before, half, nearly, first_heard, second = run(modules, "playback")
    assert before == {"label": "before", "shown": "turn-1", "pos": 0, "finished": False,
                      "heard": [0, 0], "ended": [False, False]}
    assert (half["shown"], half["pos"], half["heard"]) == ("turn-1", 2400, [2400, 0])
    # The second turn was typed while the first speaks: the first is still the one shown.
    assert (nearly["shown"], nearly["pos"], nearly["ended"]) == ("turn-1", 4750, [False, False])
    assert (first_heard["shown"], first_heard["pos"], first_heard["ended"]) == ("turn-2", 0, [True, False])
    assert first_heard["heard"] == [4800, 0]
    assert (second["shown"], second["pos"], second["heard"]) == ("turn-2", 1200, [4800, 1200])


def test_underruns_belong_to_the_turn_playing_and_stop_cuts_at_its_word(modules: Path) -> None:
    """An underrun counts for the turn heard; Stop cancels it and keeps the text before the word heard."""
    out = run(modules, "underrunAndStop")
    assert out["underruns"] == 1
    assert out["word"] == {"start": 6, "end": 10, "from": 1200, "to": 2000}  # "beta"
    assert out["cutAt"] == 6
    assert out["status"] == "cancelled"
    assert out["cancelled"] == {"type": "cancel", "stream": "turn-1"}
    assert out["ended"] is True and out["heard"] == 1500 and out["cleared"] == 1


def test_a_segment_still_arriving_is_not_run_through(modules: Path) -> None:
    """Before a segment is complete its length is estimated from its text; once complete, measured."""
    out = run(modules, "incomplete")
    assert out["samplesPerChar"] == pytest.approx(0.07 * 24000)
    assert out["early"]["start"] == 0  # 2000 samples are nowhere near 22 characters of speech
    assert out["complete"]["start"] == 17  # the whole segment is 2000 samples: its last word


def test_phrase_figure_starts_when_the_first_segment_was_sent(modules: Path) -> None:
    """The phrase figure counts from the message carrying the first segment's end and a space, or from end."""
    out = run(modules, "phrase")
    assert out["typed"] == 50  # "slow, " at 2200 completed "I am so slow,"; audio at 2250
    assert out["ttfa"] == 1250
    assert out["llm"] == 50  # no space came after "friend": `end` (at 300) let the server cut
