"""The metrics card: what time to first audio measures, and this turn's figures apart from the player's."""

from __future__ import annotations

import math
from typing import Any

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

DONE_AND_PLAYED = (
    "(() => { const s = window.voxgateDemo.stats();"
    " return s.currentTurn && s.currentTurn.status === 'done' && s.playerState === 'idle'"
    " && s.samplesReceived > 0 && s.samplesPlayed === s.samplesReceived; })()"
)


def _ms(value: float) -> str:
    return f"{math.floor(value + 0.5)} ms"  # JavaScript's Math.round


def test_time_to_first_audio_says_what_it_measures(demo: Any) -> None:
    """Typed slowly, the page and server figures include the typing; the phrase figure starts after it."""
    page = demo.page
    page.click("#text")
    # The first segment is "I am so slow," (a clause): three words go out before it is complete.
    words = ["I ", "am ", "so ", "slow, ", "and ", "then ", "the ", "rest."]
    for word in words:
        page.keyboard.type(word)
        demo.wait_for_stats_reports(6)
    page.keyboard.press("Enter")
    demo.wait(DONE_AND_PLAYED)
    turn = demo.stats()["currentTurn"]
    assert turn["kind"] == "type"
    assert turn["spans"][0] == [0, len("I am so slow,")]
    assert len(turn["sends"]) == len(words)
    typing_ms = turn["sends"][3] - turn["sends"][0]  # first word -> the word that completed the phrase
    assert typing_ms > 0
    assert turn["phraseTtfaMs"] == pytest.approx(turn["tFirstAudio"] - turn["sends"][3])
    assert turn["ttfaMs"] == pytest.approx(typing_ms + turn["phraseTtfaMs"])
    assert turn["serverTtfaMs"] > turn["phraseTtfaMs"]  # the server's figure includes the typing too
    assert page.inner_text("#m-ttfa") == _ms(turn["ttfaMs"])
    assert page.inner_text("#m-ttfa-server") == _ms(turn["serverTtfaMs"])
    assert page.inner_text("#m-ttfa-phrase") == _ms(turn["phraseTtfaMs"])
    assert "typing" in page.inner_text("#m-ttfa-note")
    labels = page.inner_text(".ttfa")
    for label in ("in this page", "at the server", "after the first phrase"):
        assert label in labels


def test_turn_figures_are_apart_from_the_players_totals(demo: Any) -> None:
    """After two turns, 'this turn' shows the second turn's audio; the player's group shows both."""
    for text in ("One turn first.", "Then a second, longer turn follows it."):
        demo.page.evaluate(f"window.voxgateDemo.speak({text!r})")
        demo.wait(DONE_AND_PLAYED)
    demo.wait_for_stats_reports(2)
    stats = demo.stats()
    first, second = demo.page.evaluate("window.voxgateDemo.turns()")[-2:]
    assert second["heard"] == second["samples"] and first["heard"] == first["samples"]
    assert demo.page.inner_text("#m-audio") == f"{second['samples'] / 24000:.1f} s"
    assert demo.page.inner_text("#m-heard") == f"{second['samples'] / 24000:.1f} s"
    assert demo.page.inner_text("#m-played") == f"{stats['samplesPlayed'] / 24000:.1f} s"
    assert stats["samplesPlayed"] >= first["samples"] + second["samples"]
    assert demo.page.inner_text("#m-turn-underruns") == str(second["underruns"])
    assert demo.page.inner_text("#m-underruns") == str(stats["underruns"])
    assert demo.page.inner_text("#m-turn").startswith(second["id"].replace("-", " "))
    heads = demo.page.eval_on_selector_all(".metrics-head h2", "els => els.map(e => e.textContent)")
    assert heads == ["This turn", "Player · all turns"]
