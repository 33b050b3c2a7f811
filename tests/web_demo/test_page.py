"""The demo page: loads offline from the gateway, lists voices, shows errors, reconnects."""

from __future__ import annotations

import json
import urllib.request
from typing import Any
from urllib.parse import urlparse

import msgpack
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_page_loads_everything_from_the_gateway(demo: Any) -> None:
    """Every request the page makes goes to the gateway itself: no CDN, no web fonts."""
    origin = urlparse(demo.base_url).netloc
    assert demo.requests
    assert all(urlparse(url).netloc == origin for url in demo.requests), demo.requests
    demo.wait_for_stats_reports(1)  # the worklet module (its fetch is not reported) runs
    assert any(urlparse(url).path == "/v1/stream" for url in demo.requests)
    assert not demo.errors, demo.errors


def test_voices_listed_from_the_server(demo: Any) -> None:
    """The voice menu holds the voices of /v1/voices with the default selected."""
    with urllib.request.urlopen(demo.base_url + "v1/voices") as res:
        body = json.load(res)
    options = demo.page.eval_on_selector_all("#voice option", "els => els.map(e => e.value)")
    assert options == body["voices"]
    assert demo.page.input_value("#voice") == body["default_voice"]
    assert body["model"] in demo.page.inner_text("#conn-text")


def test_msgpack_module_matches_python_in_the_browser(demo: Any) -> None:
    """In Chromium, web_demo/msgpack.js encodes and decodes a protocol message as Python msgpack does."""
    msg = {"type": "audio", "stream": "turn-1", "seq": 2, "offset": 4800, "pcm": b"\x01\x80" * 64,
           "span": [0, 5], "text": "Héllo", "ttfa_ms": 41.25, "retryable": False, "stream2": None}
    packed = msgpack.packb(msg, use_bin_type=True)
    result = demo.page.evaluate(
        """async (bytes) => {
             const m = await import('/msgpack.js');
             const v = m.decode(new Uint8Array(bytes));
             return {reencoded: Array.from(m.encode(v)), isBin: v.pcm instanceof Uint8Array};
           }""", list(packed))
    assert bytes(result["reencoded"]) == packed
    assert result["isBin"]


def test_server_error_shown_in_plain_words(demo: Any) -> None:
    """An error from the server (an unknown voice) appears as a sentence, not a code."""
    demo.page.evaluate("""() => {
        const select = document.getElementById('voice');
        select.append(new Option('no-such-voice', 'no-such-voice'));
        select.value = 'no-such-voice';
        select.dispatchEvent(new Event('change'));
        window.voxgateDemo.speak('This voice does not exist.');
    }""")
    demo.wait("window.voxgateDemo.stats().bannerVisible", timeout_s=10)
    banner = demo.page.inner_text("#banner-text")
    assert "isn't available" in banner
    assert demo.stats()["lastError"]["code"] == "unknown_voice"
    assert demo.stats()["currentTurn"]["status"] == "failed"


def test_reconnects_after_the_server_restarts(demo_factory: Any, server_factory: Any) -> None:
    """When the server goes away the page says so, then reconnects by itself and speaks again."""
    server = server_factory()
    demo = demo_factory(server.base_url).open()
    server.stop()
    demo.wait("window.voxgateDemo.stats().state === 'retrying'", timeout_s=15)
    assert "connection" in demo.page.inner_text("#banner-text").lower()
    server_factory("--port", str(server.port))
    demo.wait("window.voxgateDemo.stats().ready && window.voxgateDemo.stats().connects === 2",
              timeout_s=120)
    assert not demo.stats()["bannerVisible"]
    demo.page.evaluate("window.voxgateDemo.speak('Back again.')")
    demo.wait("(() => { const s = window.voxgateDemo.stats(); return s.currentTurn.status === 'done'"
              " && s.samplesPlayed === s.samplesReceived && s.samplesPlayed > 0; })()")


# Every element that draws something, and what of it does not show: text cut by its own box
# (an ellipsis, overflow hidden) or sticking out of the card or page it sits in.
FIND_CLIPPED = """() => {
  const out = [];
  const name = (el) => el.id ? '#' + el.id : el.tagName.toLowerCase() + '.' + [...el.classList].join('.');
  for (const el of document.querySelectorAll('body *')) {
    const box = el.getBoundingClientRect();
    if (!box.width || !box.height) continue;
    const css = getComputedStyle(el);
    const clips = css.overflowX !== 'visible' || css.textOverflow === 'ellipsis';
    if (clips && el.tagName !== 'TEXTAREA' && el.scrollWidth > el.clientWidth + 1) out.push(name(el) + ' cut');
    const frame = (el.parentElement.closest('.card, .banner, .top, .foot') || document.body).getBoundingClientRect();
    if (box.left < frame.left - 1 || box.right > frame.right + 1) out.push(name(el) + ' sticks out');
  }
  return out;
}"""

# A turn typed while another one speaks, a second (longer) voice name, an error banner: the page
# with as much to show as it gets.
BUSY_PAGE = """async () => {
  const select = document.getElementById('voice');
  select.append(new Option('a-voice-with-a-name-longer-than-a-phone-screen-is-wide', 'a-voice-with-a-name-longer-than-a-phone-screen-is-wide'));
  window.voxgateDemo.speak('The first sentence is short. The second one follows it, and then we are done.');
}"""


@pytest.mark.parametrize("width", [360, 1280])
def test_nothing_is_cut_or_sticks_out(demo_factory: Any, voxgate_server: Any, width: int) -> None:
    """At phone and desktop widths, with every figure filled in, no text is truncated or spills over."""
    demo = demo_factory(voxgate_server.base_url, width=width, height=860).open()
    demo.page.evaluate(BUSY_PAGE)
    demo.wait("window.voxgateDemo.stats().currentTurn.status === 'done'"
              " && window.voxgateDemo.stats().playingTurn !== null")
    demo.page.evaluate("window.voxgateDemo.speak('A second turn, typed while the first one speaks.')")
    demo.wait("document.getElementById('m-ttfa-server').textContent !== '–'")
    demo.page.click(".settings summary")
    demo.page.evaluate("window.voxgateDemo.showError('A long error message from the server, to see it wrap.')")
    for tab in ("#tab-llm", "#tab-type"):
        demo.page.click(tab)
        assert demo.page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
        assert demo.page.evaluate(FIND_CLIPPED) == []
    demo.screenshot(f"demo-{width}.png", full_page=True)


def test_narrow_screen_layout(demo_factory: Any, voxgate_server: Any) -> None:
    """On a phone-sized screen the cards stack in one column and nothing overflows sideways."""
    demo = demo_factory(voxgate_server.base_url, width=360, height=800).open()
    overflow = demo.page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0
    boxes = [demo.page.locator(sel).bounding_box() for sel in (".input-card", ".metrics-card")]
    assert boxes[1]["y"] >= boxes[0]["y"] + boxes[0]["height"]
    demo.screenshot("demo-narrow.png", full_page=True)
