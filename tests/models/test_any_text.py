"""Every model's text path under Hypothesis, served: tiny random models (``--load-format dummy
--device cpu``) behind the real server take texts of any characters (scripts they cannot read,
emoji, controls, superscripts, one very long word) given at once or in pieces; each stream ends
with ``done`` or a documented error of its own, the engine never restarts and nothing is
logged as an exception."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect

from benchmark.fuzz_protocol import DOCUMENTED_ERRORS
from tests.conftest import VoxgateServer, assert_no_exception_logged, start_server

pytestmark = pytest.mark.slow

_SETTINGS = settings(max_examples=12, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
_TIMEOUT_S = 120.0  # a failure guard: a tiny model's stream ends in seconds
_MODELS = {  # --model and the arguments it needs on the CPU
    "tiny": (), "qwen3-tts-tiny": (), "kyutai-tts-tiny": (), "csm-tiny": (), "voxcpm2-tiny": (),
}
_PIECES = ["こんにちは世界", "مرحبا بالعالم", "Привет", "😀🎉", "¹:30", "x²", "½", "ﬁne", "\u200b", "\t\n",
           "a" * 300, "Dr. Smith paid $3.50 on 1/2/2024.", "🇫🇷", "\u0301", "Ⅻ", "..."]
_texts = st.lists(st.one_of(st.text(max_size=30), st.sampled_from(_PIECES)), min_size=1, max_size=3)


@pytest.fixture(scope="module", params=sorted(_MODELS))
def served(request: pytest.FixtureRequest) -> Iterator[tuple[VoxgateServer, dict[str, Any]]]:
    """A server for one tiny model, and the options that keep its streams short."""
    server = start_server("--model", request.param, "--load-format", "dummy", "--device", "cpu",
                          *_MODELS[request.param])
    with urllib.request.urlopen(server.base_url + "v1/voices", timeout=30) as response:
        declared = json.loads(response.read())["options"]
    options = {"seed": 0, "max_tokens": int(declared["max_tokens"].get("min") or 1)}
    yield server, options
    with urllib.request.urlopen(server.base_url + "health", timeout=10) as response:
        engine = json.loads(response.read())["engine"]
    server.stop()
    assert engine["restarts"] == 0, engine
    assert_no_exception_logged(server)


@_SETTINGS
@given(pieces=_texts)
def test_any_text_ends_its_stream(served: tuple[VoxgateServer, dict[str, Any]], pieces: list[str]) -> None:
    """The text in pieces, then ``end``: ``done``, or an error of that stream with a documented
    code; the connection stays open for another."""
    server, options = served
    with connect(server.ws_url + "?encoding=json", open_timeout=30, max_size=None) as ws:
        ws.send(json.dumps({"type": "start", "stream": "s", "options": options}))
        for piece in pieces:
            ws.send(json.dumps({"type": "text", "stream": "s", "text": piece}))
        ws.send(json.dumps({"type": "end", "stream": "s"}))
        while True:
            raw = ws.recv(timeout=_TIMEOUT_S)
            if isinstance(raw, bytes):
                continue
            msg = json.loads(raw)
            if msg.get("type") == "error":
                assert msg["code"] in DOCUMENTED_ERRORS and msg.get("stream") == "s", msg
                break
            if msg.get("type") == "done":
                assert msg["stream"] == "s"
                break
        ws.send(json.dumps({"type": "start", "stream": "t", "options": options}))
        ws.send(json.dumps({"type": "cancel", "stream": "t"}))
        while (msg := json.loads(ws.recv(timeout=_TIMEOUT_S))).get("stream") != "t" or msg["type"] != "done":
            pass
