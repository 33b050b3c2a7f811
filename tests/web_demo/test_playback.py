"""The demo page in headless Chromium against the real server: speak, play, stop, download."""

from __future__ import annotations

import math
import re
import wave
from typing import Any

import numpy as np
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SENTENCE = "Hello there, this is the voxgate demo speaking while you type."
DONE_AND_PLAYED = (
    "(() => { const s = window.voxgateDemo.stats();"
    " return s.currentTurn && s.currentTurn.status === 'done' && s.playerState === 'idle'"
    " && s.samplesReceived > 0 && s.samplesPlayed === s.samplesReceived; })()"
)


def test_typing_streams_words_and_the_worklet_plays_them(demo: Any) -> None:
    """Typed words go out one text message each; every received sample is played by the worklet."""
    page = demo.page
    page.click("#text")
    page.keyboard.type(SENTENCE, delay=12)
    page.keyboard.press("Enter")
    demo.wait("window.voxgateDemo.stats().samplesPlayed > 12000 && "
              "window.voxgateDemo.stats().playerState === 'playing'")
    demo.screenshot("demo.png")
    demo.wait(DONE_AND_PLAYED)
    stats = demo.stats()
    turn = stats["currentTurn"]
    assert turn["text"] == SENTENCE
    assert turn["textMessages"] == len(SENTENCE.split(" "))  # one per word, the last on Enter
    assert turn["serverReason"] == "end"
    assert stats["chunks"] == turn["chunks"] > 0
    assert stats["samplesPlayed"] == stats["samplesReceived"] == turn["samples"] > 24000
    assert stats["samplesDropped"] == 0
    assert stats["contextState"] == "running"
    assert stats["connects"] == 1
    assert not demo.errors, demo.errors


def test_metrics_show_numbers(demo: Any) -> None:
    """After a turn, time to first audio, chunks and audio length show as numbers on screen."""
    demo.page.evaluate("window.voxgateDemo.speak('Numbers, please.')")
    demo.wait(DONE_AND_PLAYED)
    stats = demo.stats()
    ttfa = demo.page.inner_text("#m-ttfa")
    assert re.fullmatch(r"\d+ ms", ttfa), ttfa
    assert int(ttfa.split()[0]) == math.floor(stats["ttfaMs"] + 0.5)  # JavaScript's Math.round
    assert int(demo.page.inner_text("#m-chunks")) == stats["currentTurn"]["chunks"] > 0
    assert re.fullmatch(r"\d+\.\d s", demo.page.inner_text("#m-audio"))
    assert demo.page.inner_text("#m-underruns") == str(stats["underruns"])
    server = demo.page.inner_text("#m-ttfa-server")  # the server's own TTFA from `done`
    assert server == f"{math.floor(stats['currentTurn']['serverTtfaMs'] + 0.5)} ms"


def test_spans_highlight_the_text_being_spoken(demo: Any) -> None:
    """Audio messages carry spans; the transcript highlights the span playing, then all is spoken."""
    text = "The first sentence is short. The second one follows it, and then we are done."
    demo.page.evaluate(f"window.voxgateDemo.speak({text!r})")
    demo.wait("document.querySelector('#transcript .speaking') !== null")
    highlighted = demo.page.inner_text("#transcript .speaking")
    assert highlighted.strip() and highlighted.strip() in text
    demo.wait(DONE_AND_PLAYED)
    spans = [s for s in demo.stats()["currentTurn"]["spans"] if s is not None]
    assert spans and all(0 <= a <= b <= len(text) for a, b in spans)
    demo.wait("document.querySelector('#transcript .speaking') === null")
    assert demo.page.inner_text("#transcript .spoken") == text


def test_stop_cuts_the_audio_and_a_new_turn_follows(demo: Any) -> None:
    """Stop sends cancel, clears the jitter buffer, playback stops; the next turn plays on the same socket."""
    page = demo.page
    page.click("#tab-llm")
    page.select_option("#paragraph", "2")
    page.fill("#tps", "5")  # 62 tokens: about 12 s of streaming, so Stop lands mid-turn
    page.click("#llm-start")
    demo.wait("window.voxgateDemo.stats().samplesPlayed > 12000")
    assert demo.stats()["currentTurn"]["status"] == "open"  # still streaming tokens
    page.click("#stop-llm")
    demo.wait("(() => { const s = window.voxgateDemo.stats();"
              " return s.playerState === 'idle' && s.samplesBuffered === 0; })()", timeout_s=5)
    played_at_stop = demo.stats()["samplesPlayed"]
    demo.wait_for_stats_reports(30)  # about a second of the audio clock
    stats = demo.stats()
    assert stats["samplesPlayed"] == played_at_stop
    assert stats["samplesPlayed"] < stats["samplesReceived"] or stats["samplesDropped"] >= 0
    demo.wait("window.voxgateDemo.stats().currentTurn.serverReason === 'cancelled'", timeout_s=10)
    assert demo.stats()["currentTurn"]["cutAt"] is not None
    assert demo.page.inner_text("#turn-status") == "stopped"

    page.click("#tab-type")
    page.click("#text")
    page.keyboard.type("And here is a new turn.", delay=5)
    page.keyboard.press("Enter")
    demo.wait("(() => { const s = window.voxgateDemo.stats(); return s.currentTurn.status === 'done'"
              " && s.playerState === 'idle' && s.samplesBuffered === 0; })()")
    after = demo.stats()
    assert after["samplesPlayed"] > played_at_stop
    assert after["currentTurn"]["serverReason"] == "end"
    assert after["connects"] == 1  # no reconnect
    assert not demo.errors, demo.errors


def test_download_last_utterance_as_wav(demo: Any, tmp_path: Any) -> None:
    """Download WAV saves the last turn: 16-bit mono at the server's rate, every sample, not silent."""
    demo.page.evaluate("window.voxgateDemo.speak('Save this sentence as a file.')")
    demo.wait(DONE_AND_PLAYED)
    stats = demo.stats()
    with demo.page.expect_download() as info:
        demo.page.click("#download")
    download = info.value
    assert download.suggested_filename == f"voxgate-{stats['currentTurn']['id']}.wav"
    path = tmp_path / "out.wav"
    download.save_as(path)
    with wave.open(str(path)) as wav:
        assert wav.getnchannels() == 1
        assert wav.getsampwidth() == 2
        assert wav.getframerate() == stats["sampleRate"] == 24000
        assert wav.getnframes() == stats["currentTurn"]["samples"]
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.float32) / 32768
    assert float(np.sqrt(np.mean(pcm**2))) > 0.01


def test_float_format_plays_too(demo: Any) -> None:
    """With pcm_f32le chosen in settings the turn is received and played in full."""
    demo.page.click(".settings summary")
    demo.page.select_option("#format", "pcm_f32le")
    demo.page.evaluate("window.voxgateDemo.speak('Thirty two bit floats.')")
    demo.wait(DONE_AND_PLAYED)
    assert demo.stats()["samplesPlayed"] > 0
